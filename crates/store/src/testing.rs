//! What tests of the store need, here and in the crates that use it (the `testing` feature, for
//! dev-dependencies only): synthetic events and batch cursors to fill a store with, and the damage
//! issue 40's tests do on purpose to a stopped store's files — a bit flipped in a sealed block, a
//! journal cut short.
//!
//! Why one module: the same setup was copied into the store's own tests, `riptide store
//! check|repair`'s and the server's integrity suite; it depends on the store's block format and
//! its files, so a change of format must change it in one place, here beside the format.
//!
//! These helpers panic on a setup that cannot be made (a missing file, a block not on disk): they
//! run only in tests, where that is the failure to report.

use std::path::{Path, PathBuf};

use riptide_jetstream::EventKind;

use crate::event::{Event, Text};
use crate::store::{Resume, StoreOptions, BLOCK_FORMAT, BLOCK_FORMAT_ROWS};

/// Blocks of 16 events (1, 17, 33, …), a cache of 2: small stores seal several blocks.
pub const SMALL: StoreOptions = StoreOptions {
    block_events: 16,
    block_bytes: 1 << 20,
    block_cache: 2,
    segment_bytes: None,
};

/// Event `i` (seq and `time_us` both `i`): a commit by `did:plc:a` in `a.b.c` with this JSON,
/// without a zstd form.
pub fn commit<T: Text>(i: u64, json: &str) -> Event<T> {
    Event::encode(
        i,
        i as i64,
        EventKind::Commit,
        "did:plc:a",
        "a.b.c",
        json.as_bytes(),
        b"",
    )
}

/// The cursor of a batch that ends before seq `next`, made of [`commit`]s: `time_us` and the
/// upstream cursor are both `next - 1`.
pub fn resume(next: u64) -> Resume {
    Resume {
        next_seq: next,
        last_time_us: next as i64 - 1,
        upstream_cursor: Some(next - 1),
    }
}

/// The first bytes of the stored value of the sealed block of `count` events from `first`: its
/// format, count and first seq (`store.rs`, "Checksums").
pub fn block_start(count: u32, first: u64) -> Vec<u8> {
    let mut v = vec![BLOCK_FORMAT];
    v.extend_from_slice(&count.to_be_bytes());
    v.extend_from_slice(&first.to_be_bytes());
    v
}

/// Flips one bit `at` bytes into the stored value of the sealed block of `count` events from
/// `first` (a JSON block or a row block), in the `blocks` partition's segment files of the
/// stopped store at `dir`. Panics if no file holds that block.
pub fn flip_block(dir: &Path, count: u32, first: u64, at: usize) {
    let json = block_start(count, first);
    let mut rows = json.clone();
    rows[0] = BLOCK_FORMAT_ROWS;
    let mut all = Vec::new();
    files(&dir.join("partitions").join("blocks"), &mut all);
    for f in all {
        let mut b = read(&f);
        let found = [&json, &rows]
            .into_iter()
            .find_map(|n| b.windows(n.len()).position(|w| w == &n[..]));
        if let Some(i) = found {
            b[i + at] ^= 0x10;
            std::fs::write(&f, b).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            return;
        }
    }
    panic!(
        "block {first} ({count} events) not found on disk in {}",
        dir.display()
    );
}

/// Cuts the journal files of the stopped store at `dir` to half of what they hold (a journal
/// file is preallocated: what it holds ends at its last non-zero byte).
pub fn cut_journals(dir: &Path) {
    let journals = dir.join("journals");
    for f in std::fs::read_dir(&journals).unwrap_or_else(|e| panic!("{}: {e}", journals.display()))
    {
        let p = f
            .unwrap_or_else(|e| panic!("{}: {e}", journals.display()))
            .path();
        let used = read(&p).iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .and_then(|file| file.set_len(used as u64 / 2))
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    }
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every file under `d`, recursively.
fn files(d: &Path, out: &mut Vec<PathBuf>) {
    for f in std::fs::read_dir(d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
        let p = f.unwrap_or_else(|e| panic!("{}: {e}", d.display())).path();
        if p.is_dir() {
            files(&p, out);
        } else {
            out.push(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Utf8Text;
    use crate::store::Store;

    /// The helpers do what they say on a real store: the flipped block is the one named, and a
    /// cut journal loses acknowledged batches.
    #[test]
    fn a_flipped_block_and_a_cut_journal_are_found_by_the_store() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let evs: Vec<Event<Utf8Text>> = (1..=100).map(|i| commit(i, "{}")).collect();
        {
            let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, SMALL)
                .unwrap_or_else(|e| panic!("{e}"));
            s.append(&evs, &resume(101))
                .unwrap_or_else(|e| panic!("{e}"));
            s.flush().unwrap_or_else(|e| panic!("{e}"));
        }
        flip_block(dir.path(), 16, 17, 30);
        let (s, r) =
            Store::<Utf8Text>::open_with(dir.path(), 0, SMALL).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.next_seq, 101);
        let c = s.check().unwrap_or_else(|e| panic!("{e}"));
        let d: Vec<u64> = c.damaged.iter().map(|b| b.first).collect();
        assert_eq!(d, [17]);
        drop(s);

        // Ten acknowledged batches in the journal only; cut, some of them are lost.
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        {
            let (s, _) = Store::<Utf8Text>::open_with(dir.path(), 0, SMALL)
                .unwrap_or_else(|e| panic!("{e}"));
            for b in evs.chunks(10) {
                s.append(b, &resume(b[9].seq() + 1))
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        }
        cut_journals(dir.path());
        let (s, r) =
            Store::<Utf8Text>::open_with(dir.path(), 0, SMALL).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.next_seq, 101);
        let lost = s.lost_ranges().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (lost.len(), lost[0].end, lost[0].why),
            (1, 101, "journal"),
            "{lost:?}"
        );
    }
}
