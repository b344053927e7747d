//! The records of `TOPIC.backfill`: a verified repository as the backfill workers publish it and
//! the ingest node lands it (documented for other consumers in `docs/kafka.md`).
//!
//! Why a binary format and not the `--jsonl` line: a repository served by the ingest node must
//! land as the store sink lands it (`riptide_backfill::StoreSink`, `serve --backfill`): rows
//! whose payload is each record's DAG-CBOR as the account signed it, at the repository's rev,
//! and the account's chain state seeded from its commit (CID, rev, data root). JSON loses the
//! DAG-CBOR (a projection cannot be turned back into the signed bytes), so the topic carries
//! the bytes, with their CIDs and the signed commit block: a consumer can check every record
//! against its CID and the commit against its CID (and its signature with the DID document).
//!
//! Why not the one-row `.jss` body the events topic's `riptide-row` header carries: the rows
//! have a seq and a time, which the workers do not assign (one seq space, the ingest node's);
//! they repeat the DID and rev per record; and a collection or record key over 255 bytes, which
//! their syntax allows, cannot be one.
//!
//! One repository is one or more records (**chunks**, keyed by the DID, so in one partition),
//! each at most [`CHUNK_BYTES`] of record bytes (a single larger record is a chunk of its own),
//! all in the worker's one transaction. Value, big-endian: [`MAGIC`] (`RPTKF1`: the version is
//! its last byte), the DID (u16 length), the rev (u8 length), the commit CID and the data CID
//! (binary, u8 length each), the signed commit block (u32 length), the chunk's index and the
//! repository's chunk count (u32 each), the chunk's record count (u32), then per record its
//! collection (u8 length), record key (u16 length), CID (u8 length) and DAG-CBOR (u32 length).

use riptide_backfill::{Record, Verified};
use riptide_cbor::CidBuf;

/// The first bytes of a value: the format and its version.
pub const MAGIC: &[u8; 6] = b"RPTKF1";

/// Record bytes per chunk, at most (a record larger than this is a chunk alone; the topic takes
/// records up to [`crate::MAX_RECORD_BYTES`]).
pub const CHUNK_BYTES: usize = 1 << 20;

/// Why a value is not a chunk of a repository.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BadRepoRecord {
    /// Another format: a worker older than this one (its JSON line), or another writer.
    #[error("not a repository record of this version (it starts {0:?}; expected \"RPTKF1\"; a JSON line is a worker older than the format)")]
    Magic(String),
    /// The value ends inside a field.
    #[error("the value ends inside {0}")]
    Truncated(&'static str),
    /// A text field is not UTF-8.
    #[error("{0} is not UTF-8")]
    Utf8(&'static str),
    /// A CID does not parse.
    #[error("{0} is not a CID")]
    Cid(&'static str),
    /// The chunk's index is not below its count.
    #[error("chunk {index} of {count}")]
    Chunk {
        /// Its index.
        index: u32,
        /// The count.
        count: u32,
    },
    /// Bytes after the last record.
    #[error("{0} bytes after the last record")]
    Trailing(usize),
    /// The record's key is not the DID in its value.
    #[error("the record's key is not its repository's DID {0}")]
    Key(String),
}

/// Why a complete repository's chunks do not rebuild ([`rebuild`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BadRepository {
    /// No chunk at all.
    #[error("a repository of no chunk")]
    Empty,
    /// A chunk does not decode.
    #[error(transparent)]
    Chunk(#[from] BadRepoRecord),
    /// A block is not the one its CID names (the record's bytes, or the commit's).
    #[error("a block is not its CID's: {0}")]
    Block(String),
}

/// A repository's chunk values, keyed by its DID, decoded and rebuilt as the [`Verified`] the
/// sinks take ([`Verified::from_records`]: every block checked against its CID). The chunks are
/// one repository's, in order (the ingest node's assembly checks that as they arrive).
pub fn rebuild<V: AsRef<[u8]>>(
    key: &[u8],
    values: &[V],
    source: &str,
) -> Result<Verified, BadRepository> {
    let chunks = values
        .iter()
        .map(|v| decode(key, v.as_ref()))
        .collect::<Result<Vec<_>, _>>()?;
    let c = chunks.first().ok_or(BadRepository::Empty)?;
    Verified::from_records(
        c.did,
        c.rev,
        c.commit,
        c.data,
        c.commit_block,
        chunks.iter().flat_map(|c| c.records()),
        source,
    )
    .map_err(|e| BadRepository::Block(e.to_string()))
}

/// One chunk of a repository, read from a value (borrowing it).
#[derive(Debug)]
pub struct Chunk<'a> {
    /// The account.
    pub did: &'a str,
    /// The commit's rev.
    pub rev: &'a str,
    /// The commit block's CID.
    pub commit: CidBuf,
    /// The MST root.
    pub data: CidBuf,
    /// The signed commit block.
    pub commit_block: &'a [u8],
    /// This chunk's index.
    pub index: u32,
    /// How many chunks the repository is.
    pub count: u32,
    cids: Vec<CidBuf>,
    /// (collection, rkey, DAG-CBOR) per record; `cids[i]` is record `i`'s.
    fields: Vec<(&'a str, &'a str, &'a [u8])>,
}

impl Chunk<'_> {
    /// The chunk's records, in the repository's MST key order.
    pub fn records(&self) -> impl ExactSizeIterator<Item = Record<'_>> + Clone + '_ {
        self.fields
            .iter()
            .zip(&self.cids)
            .map(|(&(collection, rkey, bytes), cid)| Record {
                collection,
                rkey,
                cid,
                bytes,
            })
    }
}

fn header(out: &mut Vec<u8>, repo: &Verified, commit_block: &[u8], index: u32, count: u32) {
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(repo.did.len() as u16).to_be_bytes());
    out.extend_from_slice(repo.did.as_bytes());
    out.push(repo.rev.len() as u8);
    out.extend_from_slice(repo.rev.as_bytes());
    for c in [&repo.commit, &repo.data] {
        out.push(c.as_bytes().len() as u8);
        out.extend_from_slice(c.as_bytes());
    }
    out.extend_from_slice(&(commit_block.len() as u32).to_be_bytes());
    out.extend_from_slice(commit_block);
    out.extend_from_slice(&index.to_be_bytes());
    out.extend_from_slice(&count.to_be_bytes());
}

fn record(out: &mut Vec<u8>, r: &Record<'_>) {
    out.push(r.collection.len() as u8);
    out.extend_from_slice(r.collection.as_bytes());
    out.extend_from_slice(&(r.rkey.len() as u16).to_be_bytes());
    out.extend_from_slice(r.rkey.as_bytes());
    out.push(r.cid.as_bytes().len() as u8);
    out.extend_from_slice(r.cid.as_bytes());
    out.extend_from_slice(&(r.bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(r.bytes);
}

/// Whether a field fits its length prefix (a DID, a rev, collection and record key are far
/// shorter by their syntax; the worker verified them as the MST's keys).
fn fits(r: &Record<'_>) -> bool {
    r.collection.len() <= u8::MAX as usize && r.rkey.len() <= u16::MAX as usize
}

/// `repo` as the values of its chunks, each at most `chunk_bytes` of record bytes (one at
/// least, for a repository with no records: its commit still seeds the account's chain
/// state); and the records left out, whose collection or key do not fit the format (none that
/// the atproto syntax allows). `None` when the repository has no commit block (it always has:
/// it was verified).
pub fn encode(repo: &Verified, chunk_bytes: usize) -> Option<(Vec<Vec<u8>>, u64)> {
    let commit_block = repo.commit_block()?;
    if repo.did.len() > u16::MAX as usize || repo.rev.len() > u8::MAX as usize {
        return None;
    }
    // Cut the records into chunks first: the header carries the count.
    let mut cuts: Vec<Vec<Record<'_>>> = vec![Vec::new()];
    let (mut size, mut left_out) = (0usize, 0u64);
    for r in repo.records() {
        if !fits(&r) {
            left_out += 1;
            continue;
        }
        let last = cuts.last_mut().expect("one chunk at least");
        if !last.is_empty() && size + r.bytes.len() > chunk_bytes {
            cuts.push(Vec::new());
            size = 0;
        }
        size += r.bytes.len();
        cuts.last_mut().expect("one chunk at least").push(r);
    }
    let count = cuts.len() as u32;
    let values = cuts
        .iter()
        .enumerate()
        .map(|(i, recs)| {
            let body: usize = recs.iter().map(|r| r.bytes.len() + 80).sum();
            let mut out = Vec::with_capacity(body + commit_block.len() + 200);
            header(&mut out, repo, commit_block, i as u32, count);
            out.extend_from_slice(&(recs.len() as u32).to_be_bytes());
            recs.iter().for_each(|r| record(&mut out, r));
            out
        })
        .collect();
    Some((values, left_out))
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], BadRepoRecord> {
        if self.b.len() < n {
            return Err(BadRepoRecord::Truncated(what));
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(head)
    }
    fn u8(&mut self, what: &'static str) -> Result<usize, BadRepoRecord> {
        Ok(self.take(1, what)?[0] as usize)
    }
    fn u16(&mut self, what: &'static str) -> Result<usize, BadRepoRecord> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]) as usize)
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, BadRepoRecord> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn text(&mut self, len: usize, what: &'static str) -> Result<&'a str, BadRepoRecord> {
        std::str::from_utf8(self.take(len, what)?).map_err(|_| BadRepoRecord::Utf8(what))
    }
    fn cid(&mut self, what: &'static str) -> Result<CidBuf, BadRepoRecord> {
        let n = self.u8(what)?;
        CidBuf::from_bytes(self.take(n, what)?).map_err(|_| BadRepoRecord::Cid(what))
    }
}

/// Reads a chunk from the record `key` → `value` (the key must be its DID).
pub fn decode<'a>(key: &[u8], value: &'a [u8]) -> Result<Chunk<'a>, BadRepoRecord> {
    if value.len() < MAGIC.len() || &value[..MAGIC.len()] != MAGIC {
        let start = &value[..value.len().min(MAGIC.len())];
        return Err(BadRepoRecord::Magic(
            String::from_utf8_lossy(start).into_owned(),
        ));
    }
    let mut r = Reader {
        b: &value[MAGIC.len()..],
    };
    let n = r.u16("the DID")?;
    let did = r.text(n, "the DID")?;
    if key != did.as_bytes() {
        return Err(BadRepoRecord::Key(did.to_owned()));
    }
    let n = r.u8("the rev")?;
    let rev = r.text(n, "the rev")?;
    let commit = r.cid("the commit CID")?;
    let data = r.cid("the data CID")?;
    let n = r.u32("the commit block")? as usize;
    let commit_block = r.take(n, "the commit block")?;
    let index = r.u32("the chunk index")?;
    let count = r.u32("the chunk count")?;
    if index >= count {
        return Err(BadRepoRecord::Chunk { index, count });
    }
    let n = r.u32("the record count")? as usize;
    // Each record takes 8 bytes at least: a count past that is a damaged value, not a reason
    // to reserve memory.
    let cap = n.min(r.b.len() / 8);
    let (mut cids, mut fields) = (Vec::with_capacity(cap), Vec::with_capacity(cap));
    for _ in 0..n {
        let len = r.u8("a collection")?;
        let collection = r.text(len, "a collection")?;
        let len = r.u16("a record key")?;
        let rkey = r.text(len, "a record key")?;
        cids.push(r.cid("a record's CID")?);
        let len = r.u32("a record")? as usize;
        fields.push((collection, rkey, r.take(len, "a record")?));
    }
    if !r.b.is_empty() {
        return Err(BadRepoRecord::Trailing(r.b.len()));
    }
    Ok(Chunk {
        did,
        rev,
        commit,
        data,
        commit_block,
        index,
        count,
        cids,
        fields,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_backfill::Collections;

    /// The corpus's real repository, verified as a worker verifies it (signature aside: its
    /// DID document is not in the corpus).
    fn verified() -> Option<Verified> {
        let bytes = riptide_testdata::read("jetstream-2026-07/repo.car")?;
        let did = "did:plc:53iucmf5ldftgqyf2ac7hmhd";
        Some(
            riptide_backfill::verify_car(Box::new(bytes), did, None, &Collections::all(), "test")
                .unwrap(),
        )
    }

    /// `collection/rkey<TAB>cid` lines, as goat lists the corpus repository.
    fn lines<'a>(recs: impl Iterator<Item = Record<'a>>) -> Vec<String> {
        recs.map(|r| format!("{}/{}\t{}", r.collection, r.rkey, r.cid))
            .collect()
    }

    #[test]
    fn a_repository_round_trips_in_chunks_and_rebuilds_as_verified() {
        let Some(repo) = verified() else {
            return;
        };
        assert!(repo.kept() > 10, "{repo:?}");
        // Small chunks: several of them, in order, every record once.
        let (values, left_out) = encode(&repo, 4096).unwrap();
        assert_eq!(left_out, 0);
        assert!(values.len() > 1, "{}", values.len());
        let mut got = Vec::new();
        for (i, v) in values.iter().enumerate() {
            let c = decode(repo.did.as_bytes(), v).unwrap();
            assert_eq!((c.index, c.count), (i as u32, values.len() as u32));
            assert_eq!((c.did, c.rev), (repo.did.as_str(), repo.rev.as_str()));
            assert_eq!((c.commit, c.data), (repo.commit, repo.data));
            assert_eq!(Some(c.commit_block), repo.commit_block());
            let body: usize = c.records().map(|r| r.bytes.len()).sum();
            assert!(body <= 4096 || c.records().len() == 1, "{body}");
            got.extend(c.records().map(|r| {
                (
                    format!("{}/{}", r.collection, r.rkey),
                    *r.cid,
                    r.bytes.to_vec(),
                )
            }));
        }
        let want: Vec<_> = repo
            .records()
            .map(|r| {
                (
                    format!("{}/{}", r.collection, r.rkey),
                    *r.cid,
                    r.bytes.to_vec(),
                )
            })
            .collect();
        assert_eq!(got, want);
        // The independent oracle: goat's listing of the same repository.
        let goat =
            riptide_testdata::read_string("jetstream-2026-07/car_expected_records.tsv").unwrap();
        let goat: Vec<String> = goat.lines().map(str::to_owned).collect();
        assert_eq!(lines(repo.records()), goat);

        // One chunk by default; rebuilt, it is the same repository, its commit block included.
        let (values, _) = encode(&repo, CHUNK_BYTES).unwrap();
        assert_eq!(values.len(), 1);
        let c = decode(repo.did.as_bytes(), &values[0]).unwrap();
        let back = rebuild(repo.did.as_bytes(), &values, "kafka").unwrap();
        assert_eq!((back.did.as_str(), back.rev.as_str()), (c.did, c.rev));
        assert_eq!(back.commit_block(), repo.commit_block());
        let pairs = |v: &Verified| -> Vec<_> {
            v.records()
                .map(|r| {
                    (
                        r.collection.to_owned(),
                        r.rkey.to_owned(),
                        *r.cid,
                        r.bytes.to_vec(),
                    )
                })
                .collect()
        };
        assert_eq!(pairs(&back), pairs(&repo));
        assert_eq!(lines(back.records()), lines(repo.records()));
    }

    #[test]
    fn damage_is_a_typed_error_never_a_panic() {
        let Some(repo) = verified() else {
            return;
        };
        let (values, _) = encode(&repo, CHUNK_BYTES).unwrap();
        let v = &values[0];
        let key = repo.did.as_bytes();
        // The JSON line of an older worker.
        let json = br#"{"did":"did:plc:x","rev":"3l"}"#;
        assert!(matches!(decode(key, json), Err(BadRepoRecord::Magic(_))));
        assert!(matches!(
            decode(b"did:plc:other", v),
            Err(BadRepoRecord::Key(_))
        ));
        // Every cut is an error, whichever field it falls in.
        for n in 0..v.len() {
            assert!(decode(key, &v[..n]).is_err(), "cut at {n}");
        }
        // Every byte flipped: an error or a chunk, never a panic; a chunk that decodes rebuilds
        // or is refused, never a panic either.
        for n in 0..v.len() {
            let mut bad = v.clone();
            bad[n] ^= 0xff;
            if decode(key, &bad).is_ok() {
                let _ = rebuild(key, &[&bad], "kafka");
            }
        }
        let mut longer = v.clone();
        longer.push(0);
        assert_eq!(
            decode(key, &longer).unwrap_err(),
            BadRepoRecord::Trailing(1)
        );
        // A record whose bytes are not its CID's is refused when the repository is rebuilt.
        let c = decode(key, v).unwrap();
        let mut recs: Vec<_> = c.records().collect();
        let other = recs[1].bytes;
        recs[0].bytes = other;
        assert!(Verified::from_records(
            c.did,
            c.rev,
            c.commit,
            c.data,
            c.commit_block,
            recs.iter().copied(),
            "kafka",
        )
        .is_err());
    }
}
