//! A backfill's landing written as rows ([`Store::append_landing`]): the rows go straight into
//! sealed row blocks, with no v1 event made for them.
//!
//! Why a write of its own: a backfill (`riptide backfill --data`) lands whole repositories, one
//! create per record, hundreds of thousands of rows in a few seconds, and the store keeps them
//! as `.jss` rows (module docs, "Row blocks"): the v1 JSON of a sealed row is never read, it is
//! rendered again from the row when its block is loaded. Through [`Store::append_with_progress`]
//! each row came with its event (its JSON rendered into a buffer of its own), was encoded alone
//! into `recent_rows` and its event into `recent` until the next batch sealed it, then decoded
//! again to be sealed and removed from both: per record a JSON value, four writes to the journal
//! and memtables, and their allocations and copies (`bench/README.md`, "CPU per GB").
//!
//! Here a batch's rows, with the length each one's event would have (the writer renders each
//! once to check it, [`Event::value_len_of_row`], and keeps no event), are sealed with the
//! unsealed events before them in whole blocks exactly as [`Store::append_rows`] would seal the
//! same events: the same sealing condition, the same cuts (`seal`, by count and by the events'
//! bytes), so the blocks are the ones that write would make. Only the rows past the last whole
//! block, fewer than a block, become events and wait unsealed in `recent` and `recent_rows` the
//! usual way (for the next batch's sealing and for the readers of the in-memory tail). Everything
//! else is the same as any batch's: the folding's tombstones of every row, the `times` entry of
//! every event (`seq_at_time` reads each), the chain state and progress entries beside them, one
//! atomic durable fjall batch.
//!
//! A landing the rows of which cannot all be row blocks (a column too long for a `.jss` row),
//! or over unsealed events without rows (a writer that hands none wrote them), is written as
//! [`Store::append_all`] writes it, with its events made here: the same result, without the
//! saving.

use super::*;

/// A landing's row for [`Store::append_landing`]: the row, and the length of the stored value
/// its v1 event would have ([`Event::value_len_of_row`] at the row's seq and display time),
/// which a block's byte bound counts.
#[derive(Clone, Copy, Debug)]
pub struct LandingRow<'a> {
    /// The row (its seq is the event's; its display time the event's `time_us`).
    pub row: Row<'a>,
    /// The length of its event's stored value without a zstd form.
    pub value_len: usize,
}

impl Sealable for LandingRow<'_> {
    fn seq(&self) -> u64 {
        self.row.seq
    }
    fn time_us(&self) -> i64 {
        self.row.display_time_us()
    }
    fn value_len(&self) -> usize {
        self.value_len
    }
    fn value(&self) -> Option<&[u8]> {
        None
    }
}

/// An unsealed event or a landing's row, in the one sequence that is sealed.
enum Unit<'a, 'r, T> {
    Event(&'a Event<T>),
    Row(&'a LandingRow<'r>),
}

impl<T: Text> Sealable for Unit<'_, '_, T> {
    fn seq(&self) -> u64 {
        match self {
            Unit::Event(e) => e.seq(),
            Unit::Row(r) => r.seq(),
        }
    }
    fn time_us(&self) -> i64 {
        match self {
            Unit::Event(e) => e.time_us(),
            Unit::Row(r) => r.time_us(),
        }
    }
    fn value_len(&self) -> usize {
        match self {
            Unit::Event(e) => Sealable::value_len(*e),
            Unit::Row(r) => r.value_len,
        }
    }
    fn value(&self) -> Option<&[u8]> {
        None
    }
}

impl<T: Text> Store<T> {
    /// Writes a backfill landing's `rows` (consecutive seqs following the store's, each with
    /// its event's length), `accounts` and `progress` in one atomic, durable batch, as
    /// [`Self::append_with_progress`] writes the same rows with their events, but without the
    /// events of the rows it seals (module docs). `resume` is the state after them. A row whose
    /// seq or display time is not its place's is refused with the whole batch
    /// ([`StoreError::Rows`]), nothing written.
    pub fn append_landing(
        &self,
        rows: &[LandingRow<'_>],
        accounts: &[(Box<str>, AccountState)],
        progress: &[(Box<str>, Vec<u8>)],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        for w in rows.windows(2) {
            if w[1].row.seq != w[0].row.seq + 1 {
                return Err(StoreError::Rows {
                    seq: w[1].row.seq,
                    what: "a landing's seqs are not consecutive",
                });
            }
        }
        let writing = lock(&self.writing);
        let pending = {
            let p = lock(&self.pending);
            match &p.rows {
                Some(r) if rows.iter().all(|r| r.row.validate().is_ok()) => {
                    Some((p.events.clone(), r.clone(), p.rows_stored, p.bytes))
                }
                _ => None,
            }
        };
        let Some((unsealed, unsealed_rows, rows_stored, unsealed_bytes)) = pending else {
            // Written the usual way (module docs); `append_all` takes the writer's lock again.
            drop(writing);
            return self.append_as_events(rows, accounts, progress, resume);
        };
        let added: usize = rows.iter().map(|r| r.value_len).sum();
        let total = unsealed.len() + rows.len();
        let sealing = total >= self.options.block_events.max(1)
            || unsealed_bytes + added >= self.options.block_bytes;
        // As `append_all` cuts: row blocks whole where there are more than one's worth.
        let split = match sealing {
            false => 0,
            true if total > MAX_BLOCK_ROWS => total - total % MAX_BLOCK_ROWS,
            true => total,
        };
        let sealed_old = split.min(unsealed.len());
        let sealed_new = split - sealed_old;

        let mut b = self.batch();
        let plain: Vec<Row<'_>> = rows.iter().map(|r| r.row).collect();
        self.folding.write_tombstones(&mut b, &plain);
        self.write_beside(&mut b, accounts, &[], progress);
        let mut row_bytes = 0;
        let mut sealed_end = None;
        if split > 0 {
            let decoded: Vec<Row<'_>> = unsealed_rows[..sealed_old]
                .iter()
                .map(|r| crate::rows::decode_row(r))
                .collect::<Option<_>>()
                .ok_or_else(|| StoreError::Rows {
                    seq: unsealed.first().map_or(0, Event::seq),
                    what: "an unsealed row does not decode",
                })?;
            let units: Vec<Unit<'_, '_, T>> = unsealed[..sealed_old]
                .iter()
                .map(Unit::Event)
                .chain(rows[..sealed_new].iter().map(Unit::Row))
                .collect();
            let all_rows: Vec<Row<'_>> = decoded
                .into_iter()
                .chain(plain[..sealed_new].iter().copied())
                .collect();
            for (first, v) in seal(&units, Some(&all_rows), self.options)? {
                row_bytes += row_block_bytes(&v);
                b.insert(&self.blocks, first.to_be_bytes(), v);
            }
            for e in &unsealed[..sealed_old] {
                b.remove(&self.recent, e.seq().to_be_bytes());
                if rows_stored {
                    b.remove(&self.recent_rows, e.seq().to_be_bytes());
                }
            }
            self.drop_damaged_unsealed(&mut b);
            sealed_end = units.last().map(|u| u.seq() + 1);
        }
        // The rows left unsealed wait as events, with their rows, the usual way.
        let mut json = Vec::new();
        let mut left: Vec<Event<T>> = Vec::with_capacity(rows.len() - sealed_new);
        let mut left_rows: Vec<Bytes> = Vec::with_capacity(rows.len() - sealed_new);
        for r in &plain[sealed_new..] {
            let bad = |what| StoreError::Rows { seq: r.seq, what };
            let e: Event<T> = crate::rows::event_of_row(r, &mut json)
                .map_err(|_| bad("a landing's row does not render"))?;
            let encoded =
                Bytes::from(crate::rows::encode_row(r).ok_or_else(|| bad("a column too long"))?);
            b.insert(&self.recent, r.seq.to_be_bytes(), e.raw().clone());
            b.insert(&self.recent_rows, r.seq.to_be_bytes(), encoded.clone());
            left.push(e);
            left_rows.push(encoded);
        }
        self.commit_batch(
            b,
            plain.iter().map(|r| (r.seq, r.display_time_us())),
            resume,
            row_bytes,
        )?;
        // Durable: now the in-memory view follows.
        let mut p = lock(&self.pending);
        if let Some(end) = sealed_end {
            self.sealed_end.store(end, Relaxed);
            lock(&self.damaged_unsealed).clear();
            p.events.drain(..sealed_old);
            if let Some(r) = p.rows.as_mut() {
                r.drain(..sealed_old);
            }
        }
        p.events.extend(left);
        if let Some(r) = p.rows.as_mut() {
            r.extend(left_rows);
        }
        p.bytes = p.events.iter().map(|e| sealed_value(e).len()).sum();
        p.rows_stored = !p.events.is_empty();
        Ok(())
    }

    /// [`Self::append_landing`] the usual way: each row's event made, all of it through
    /// [`Self::append_all`] (as JSON blocks if a row cannot be a `.jss` row).
    fn append_as_events(
        &self,
        rows: &[LandingRow<'_>],
        accounts: &[(Box<str>, AccountState)],
        progress: &[(Box<str>, Vec<u8>)],
        resume: &Resume,
    ) -> Result<(), StoreError> {
        let mut json = Vec::new();
        let events = rows
            .iter()
            .map(|r| {
                crate::rows::event_of_row(&r.row, &mut json).map_err(|_| StoreError::Rows {
                    seq: r.row.seq,
                    what: "a landing's row does not render",
                })
            })
            .collect::<Result<Vec<Event<T>>, _>>()?;
        let plain: Vec<Row<'_>> = rows.iter().map(|r| r.row).collect();
        let all_rows = plain.iter().all(|r| r.validate().is_ok());
        self.append_all(
            &events,
            all_rows.then_some(&plain[..]),
            accounts,
            &[],
            progress,
            resume,
        )
    }
}
