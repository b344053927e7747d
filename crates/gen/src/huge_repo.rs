//! One very large repository export (1 GiB and more) that is never held in memory: its CAR is
//! produced piece by piece, on demand, from the seed.
//!
//! Why: a backfill must verify the largest repositories of the network in bounded memory, and a
//! simulator that served a 1 GiB repository from a buffer would need that gigabyte itself (and
//! `riptide gen` would have to write it). Here every record is a pure function of (seed, index),
//! so the CAR can be streamed twice with the same bytes: once when the repository is created, to
//! hash each record and build the MST (only the record CIDs and the MST nodes are kept), then
//! each time it is served, regenerating every record as it is written.
//!
//! Memory: 32 bytes of digest per record plus the MST nodes (about 100 bytes per record), so
//! records are large (`record_bytes`, default 8 KiB of post text: 1 GiB is ≈ 131k records and
//! ≈ 17 MB held). Real repositories have small records; what this tests is the client's memory,
//! which sees the same CAR framing either way.
//!
//! The CAR: root = the signed commit; blocks = the commit, every MST node, then every record in
//! key order (`app.bsky.feed.post/<TID>`, TIDs increasing with the index).

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use riptide_car::CarWriter;
use riptide_cbor::{write_map_header, write_text, write_varint, CidBuf, DAG_CBOR};
use riptide_repo::mst::{self, Leaves};

use crate::account::Account;
use crate::clock::{datetime, tid, EPOCH_MICROS};
use crate::error::GenError;
use crate::hosts::mix;

/// The default size of each record's text.
pub const DEFAULT_RECORD_BYTES: usize = 8192;

/// Stream-independent seed derivation (the account differs from `--big-repo`'s).
const SALT: u64 = 0x6875_6765_2d72_6570; // "huge-rep"

/// A repository export generated on demand; see the module docs.
#[derive(Debug)]
pub struct HugeRepo {
    /// The account (its DID document must be served for the signature to check).
    pub account: Account,
    /// The commit's CID.
    pub commit: CidBuf,
    /// The commit's rev.
    pub rev: String,
    seed: u64,
    record_bytes: usize,
    clock: u16,
    /// Number of records.
    count: usize,
    /// Letters and spaces drawn from the seed; each record's text is a window of it.
    pool: String,
    /// Every record's `createdAt`.
    created_at: String,
    /// Per record, its CID (the key is recomputed from the index).
    cids: Vec<CidBuf>,
    /// The CAR header, the commit block and every MST node, framed.
    head: Vec<u8>,
    /// Total CAR length in bytes.
    len: u64,
}

/// Seconds between consecutive records' TIDs.
const STEP_MICROS: u64 = 60_000_000;

struct Keys<'a> {
    keys: &'a [String],
    cids: &'a [CidBuf],
}

impl Leaves for Keys<'_> {
    fn count(&self) -> usize {
        self.keys.len()
    }
    fn key(&self, i: usize) -> &[u8] {
        self.keys[i].as_bytes()
    }
    fn value(&self, i: usize) -> riptide_cbor::Cid<'_> {
        self.cids[i].as_cid()
    }
}

impl HugeRepo {
    /// A repository of about `target_bytes` of CAR (at least one record) with records of
    /// `record_bytes` of text each (at least 16). Hashes every record once: a few seconds per GiB.
    pub fn new(seed: u64, target_bytes: u64, record_bytes: usize) -> Result<HugeRepo, GenError> {
        let record_bytes = record_bytes.max(16);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SALT);
        let account = Account::generate(&mut rng);
        let clock = (mix(seed ^ SALT) % 1024) as u16;
        let per = record_bytes as u64 + 160;
        let count = usize::try_from((target_bytes / per).max(1))
            .map_err(|_| GenError::Config("huge repository too large".into()))?;
        let mut this = HugeRepo {
            account,
            commit: CidBuf::sha256(DAG_CBOR, b""),
            rev: String::new(),
            seed,
            record_bytes,
            clock,
            count,
            pool: letter_pool(seed, POOL + record_bytes),
            created_at: datetime(EPOCH_MICROS - 3_600_000_000),
            cids: Vec::with_capacity(count),
            head: Vec::new(),
            len: 0,
        };
        // Hashing every record is the cost (a GiB of SHA-256): spread over the cores, each
        // thread a contiguous run of indices (the result does not depend on the split).
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
        let run = count.div_ceil(threads).max(1);
        let mut cids = vec![this.commit; count];
        let body_len: u64 = std::thread::scope(|s| {
            let this = &this;
            let handles: Vec<_> = cids
                .chunks_mut(run)
                .enumerate()
                .map(|(t, slots)| {
                    s.spawn(move || {
                        let mut len = 0u64;
                        for (j, slot) in slots.iter_mut().enumerate() {
                            let rec = this.record(t * run + j);
                            *slot = CidBuf::sha256(DAG_CBOR, &rec);
                            len += framed_len(slot.as_cid().as_bytes().len() + rec.len());
                        }
                        len
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or(u64::MAX))
                .fold(0u64, u64::saturating_add)
        });
        if body_len == u64::MAX {
            return Err(GenError::Internal("a hashing thread panicked".into()));
        }
        this.cids = cids;
        let keys: Vec<String> = (0..count).map(|i| this.key(i)).collect();
        let mut nodes: Vec<(CidBuf, Vec<u8>)> = Vec::new();
        let root = mst::Builder::new()
            .build(
                &Keys {
                    keys: &keys,
                    cids: &this.cids,
                },
                &mut nodes,
            )
            .map_err(|e| GenError::Internal(e.to_string()))?;
        drop(keys);
        nodes.reverse();
        let rev = tid(EPOCH_MICROS - 60_000_000, clock);
        let mut unsigned = Vec::new();
        crate::network::commit_fields(&mut unsigned, &this.account.did, &rev, root, None);
        let sig = this.account.key.sign(&unsigned);
        let mut commit = Vec::new();
        crate::network::commit_fields(&mut commit, &this.account.did, &rev, root, Some(&sig));
        let cid = CidBuf::sha256(DAG_CBOR, &commit);
        let mut w = CarWriter::new(&[cid]);
        w.block(cid.as_cid(), &commit);
        for (c, b) in &nodes {
            w.block(c.as_cid(), b);
        }
        this.head = w.finish();
        this.len = this.head.len() as u64 + body_len;
        this.commit = cid;
        this.rev = rev;
        Ok(this)
    }

    /// Number of records.
    pub fn records(&self) -> usize {
        self.cids.len()
    }

    /// Total CAR length in bytes (what `Content-Length` says).
    pub fn car_len(&self) -> u64 {
        self.len
    }

    /// The key of record `i`.
    pub fn key(&self, i: usize) -> String {
        let t = EPOCH_MICROS - (self.count as u64 + 2) * STEP_MICROS + i as u64 * STEP_MICROS;
        format!("app.bsky.feed.post/{}", tid(t, self.clock))
    }

    /// The DAG-CBOR of record `i`: a post whose text is `record_bytes` long, `post <i> `
    /// then a window of the letter pool chosen by (seed, i). Copying from the pool keeps the
    /// second generation (every time the repository is served) cheap.
    pub fn record(&self, i: usize) -> Vec<u8> {
        let prefix = format!("post {i} ");
        let want = self.record_bytes.saturating_sub(prefix.len());
        let span = self.pool.len() - want;
        let off = (mix(self.seed ^ (i as u64).wrapping_mul(0x9e37_79b9)) % span as u64) as usize;
        let mut text = String::with_capacity(self.record_bytes);
        text.push_str(&prefix);
        // The pool is ASCII: every index is a char boundary.
        text.push_str(self.pool.get(off..off + want).unwrap_or_default());
        let mut out = Vec::with_capacity(text.len() + 64);
        // DAG-CBOR's key order: shorter keys first.
        write_map_header(&mut out, 3);
        write_text(&mut out, "text");
        write_text(&mut out, &text);
        write_text(&mut out, "$type");
        write_text(&mut out, "app.bsky.feed.post");
        write_text(&mut out, "createdAt");
        write_text(&mut out, &self.created_at);
        out
    }

    /// Number of pieces [`HugeRepo::piece`] gives: the head, then one per record.
    pub fn pieces(&self) -> usize {
        self.cids.len() + 1
    }

    /// Piece `n` of the CAR: 0 is the header, commit and MST nodes; `n ≥ 1` is record `n − 1`,
    /// framed. Concatenated in order they are the CAR. `None` past the end.
    pub fn piece(&self, n: usize) -> Option<Vec<u8>> {
        if n == 0 {
            return Some(self.head.clone());
        }
        let i = n - 1;
        let cid = self.cids.get(i)?;
        let rec = self.record(i);
        let c = cid.as_cid();
        let mut out = Vec::with_capacity(rec.len() + 48);
        write_varint(&mut out, (c.as_bytes().len() + rec.len()) as u64);
        out.extend_from_slice(c.as_bytes());
        out.extend_from_slice(&rec);
        Some(out)
    }
}

/// Size of the letter pool beyond one record's text (windows start anywhere in it).
const POOL: usize = 64 << 10;

/// `len` letters and spaces (English-like frequencies) drawn from `seed`.
fn letter_pool(seed: u64, len: usize) -> String {
    const LETTERS: &[u8; 32] = b"etaoinshrdlucmfwypvbgkqjxz      ";
    let mut h = mix(seed ^ SALT);
    (0..len)
        .map(|k| {
            if k % 8 == 0 {
                h = mix(h);
            }
            char::from(LETTERS[usize::from((h >> (8 * (k % 8))) as u8 & 31)])
        })
        .collect()
}

/// Bytes of a CAR section whose CID and data are `n` bytes (varint length prefix included).
fn framed_len(n: usize) -> u64 {
    let mut v = Vec::with_capacity(10);
    write_varint(&mut v, n as u64);
    (v.len() + n) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_a_verifying_car_of_the_announced_length() {
        let h = HugeRepo::new(3, 2 << 20, 4096).unwrap();
        assert!(h.records() > 400, "{}", h.records());
        let car: Vec<u8> = (0..h.pieces()).flat_map(|n| h.piece(n).unwrap()).collect();
        assert!(h.piece(h.pieces()).is_none());
        assert_eq!(car.len() as u64, h.car_len());
        let key = h.account.key.public_key();
        let report = riptide_repo::verify_repo(&car, Some(&key)).unwrap();
        assert_eq!(report.records, h.records());
        // The same seed gives the same bytes; another seed another repository.
        let again = HugeRepo::new(3, 2 << 20, 4096).unwrap();
        assert_eq!(again.commit, h.commit);
        assert_eq!(again.piece(7), h.piece(7));
        assert_ne!(HugeRepo::new(4, 2 << 20, 4096).unwrap().commit, h.commit);
    }
}
