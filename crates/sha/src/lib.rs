//! SHA-256 of many short messages, several at a time.
//!
//! Why this exists: riptide hashes a great many *short* messages — every CAR block against its
//! CID (records are a few hundred bytes), every MST key for its height (one 64-byte block each).
//! `sha2` hashes one stream, and one stream cannot use what the CPU has:
//! - With SHA-NI one 64-byte block is a chain of dependent `sha256rnds2` instructions, and per
//!   call overhead (state setup, padding, finalization) is large next to a short message. Two
//!   messages interleaved round by round ([`sha256_pair`], [`Pairs`]) pay it once for both.
//! - SHA-NI is still one unit doing one block at a time: on the development machine (Sapphire
//!   Rapids VM) two interleaved lanes gain nothing on long messages, ~100 cycles per block either
//!   way. With AVX-512, sixteen messages' rounds run in the integer vector units instead, one
//!   32-bit lane each (`x16`): measured 1.5× SHA-NI's throughput on a stream of records and MST
//!   nodes (`examples/lanes.rs`). [`Checker`] refills lanes as messages end, so messages of any
//!   length keep them busy; [`ShortBatch`] hashes up to sixteen one-block messages at once.
//!
//! - ARMv8's SHA2 instructions are a dependent chain per message in the same way: on AArch64 the
//!   two lanes run on them (`arm`), behind the same API.
//!
//! No maintained crate hashes independent messages in lanes, so the lane code is written here;
//! the SHA-NI and ARMv8 rounds are the standard sequences, the AVX-512 rounds are FIPS 180-4
//! written with `vprord`/`vpternlogd`, and every result is tested against `sha2`. Without those
//! instructions (or on another architecture) everything falls back to `sha2`, which gives the
//! same digests.
//!
//! Which kernel runs is decided at run time, once per process, from the CPU ([`Kernel::best_for`]
//! for batches, [`Checker::new`] for streams, [`ShortBatch`], [`sha256_pair`]); the environment
//! variable `RIPTIDE_SHA_KERNEL` caps that choice ([`cap`]), so that one machine can measure the
//! path of a CPU without AVX-512 or without SHA-NI.
//!
//! What it does not do: incremental hashing of one long message (a single stream is already at
//! full speed in `sha2`, use it) or any other hash.

#![allow(unsafe_code)] // SIMD intrinsics behind a run-time CPU check: see `x86`, `arm`, `x16`.

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// SHA-256 of `data` (one message; `sha2` itself).
#[inline]
pub fn sha256(data: &[u8]) -> Digest {
    use sha2::Digest as _;
    sha2::Sha256::digest(data).into()
}

/// SHA-256 of two independent messages, computed together (see the module docs).
#[inline]
pub fn sha256_pair(a: &[u8], b: &[u8]) -> (Digest, Digest) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        if cap::sha_ni_enabled() {
            let short = short_limit();
            return match (a.len() <= short, b.len() <= short) {
                (true, true) => two::pair(a, b),
                (true, false) => (two::one(a), sha256(b)),
                (false, true) => (sha256(a), two::one(b)),
                (false, false) => (sha256(a), sha256(b)),
            };
        }
    }
    (sha256(a), sha256(b))
}

/// Longest message hashed in lanes. Beyond a few blocks the per-message overhead the lanes save
/// is small and `sha2`'s single stream is as fast (measured with `examples/lanes.rs` on the
/// development machine, a Sapphire Rapids VM: pairs 2.1× `sha2` at 30 bytes, 1.3× at 250,
/// 0.9× at 1,000).
pub const SHORT: usize = 512;

/// Longest message [`sha256_pair`] and [`sha256_short`] hash in two lanes on this CPU: [`SHORT`],
/// or any length where two lanes beat `sha2` at every length (AMD Zen, where SHA-NI has latency
/// to spare: see [`wide_beats_sha_ni`]; and AArch64, where nothing competes with the pairs).
#[inline]
pub fn short_limit() -> usize {
    if wide_beats_sha_ni() {
        SHORT
    } else {
        usize::MAX
    }
}

/// SHA-256 of one message through the same lean path as [`sha256_pair`] when it is at most
/// [`short_limit`] bytes (`sha2` otherwise).
#[inline]
pub fn sha256_short(a: &[u8]) -> Digest {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        if a.len() <= short_limit() && cap::sha_ni_enabled() {
            return two::one(a);
        }
    }
    sha256(a)
}

/// Whether the two-lane path is in use on this CPU (otherwise [`sha256_pair`] calls `sha2`
/// twice): the CPU has SHA-NI (x86-64) or the SHA2 instructions (AArch64), and
/// `RIPTIDE_SHA_KERNEL` does not rule it out ([`cap`]).
pub fn lanes_available() -> bool {
    cap::sha_ni_enabled()
}

/// Checks a stream of messages against expected digests, two at a time, in order.
///
/// Push `(message, expected, tag)`; [`Pairs::push`] hashes once it holds two and returns the
/// first mismatch (in push order) among them; call [`Pairs::finish`] for the last odd one. The
/// tag travels with the message so the caller learns *which* one failed. Mismatches are
/// reported in the order the messages were pushed, so the result is exactly that of checking
/// them one by one.
#[derive(Debug)]
pub struct Pairs<'a, T> {
    held: Option<(&'a [u8], &'a [u8], T)>,
}

impl<T> Default for Pairs<'_, T> {
    fn default() -> Self {
        Pairs { held: None }
    }
}

impl<'a, T> Pairs<'a, T> {
    /// An empty checker.
    pub fn new() -> Self {
        Pairs::default()
    }

    /// Adds a message whose SHA-256 must equal `expected` (32 bytes). Returns the tag of the
    /// first message that did not match, when this push completed a pair.
    #[inline]
    pub fn push(&mut self, message: &'a [u8], expected: &'a [u8], tag: T) -> Result<(), T> {
        match self.held.take() {
            None => {
                self.held = Some((message, expected, tag));
                Ok(())
            }
            Some((m0, e0, t0)) => {
                let (d0, d1) = sha256_pair(m0, message);
                if d0[..] != *e0 {
                    return Err(t0);
                }
                if d1[..] != *expected {
                    return Err(tag);
                }
                Ok(())
            }
        }
    }

    /// Checks the message still held, if any.
    #[inline]
    pub fn finish(&mut self) -> Result<(), T> {
        match self.held.take() {
            Some((m, e, t)) if sha256_short(m)[..] != *e => Err(t),
            _ => Ok(()),
        }
    }
}

/// Checks a stream of messages against expected digests with as many lanes as the CPU has:
/// sixteen in AVX-512 registers where available ([`Lanes`]), else two SHA-NI lanes ([`Pairs`]),
/// else `sha2` one by one. The contract is that of [`Pairs`]: push `(message, expected, tag)`;
/// an error is the tag of the first mismatching message *in push order*, exactly as checking
/// them one by one would find; [`Checker::finish`] checks what is still in flight.
#[derive(Debug)]
pub enum Checker<'a, T> {
    /// Sixteen AVX-512 lanes.
    Lanes(Box<Lanes<'a, T>>),
    /// Two SHA-NI lanes (or `sha2`).
    Pairs(Pairs<'a, T>),
}

impl<'a, T> Checker<'a, T> {
    /// The fastest checker for a long stream on this CPU: sixteen AVX-512 lanes where the CPU
    /// has them (and `RIPTIDE_SHA_KERNEL` allows them, [`cap`]), else two SHA-NI lanes, else
    /// `sha2`.
    ///
    /// On every vendor, AMD included: a stream refills each lane as its message ends, so all
    /// sixteen stay busy to the end, unlike a batch's last messages ([`Kernel::best_for`] keeps
    /// SHA-NI pairs for batches on AMD, where they win). Measured on an AMD EPYC (Zen 4), the
    /// SHA-256 checks of repository CARs of 87 KB to 72 MB took 6–13% less time in sixteen lanes
    /// than in SHA-NI pairs (`RIPTIDE_SHA_KERNEL=avx512x16` against the vendor rule,
    /// `riptide bench repo`, 2026-11-24).
    pub fn new() -> Self {
        if cap::wide_enabled() {
            if let Some(l) = Lanes::new() {
                return Checker::Lanes(Box::new(l));
            }
        }
        Checker::Pairs(Pairs::new())
    }

    /// The checker that is fastest for about `total` bytes of messages: sixteen lanes cost
    /// sixteen blocks' work per step however many are busy, so they only pay off on a long
    /// stream (a firehose commit's few blocks hash faster in SHA-NI pairs; a repository
    /// export's hundreds of thousands faster in lanes). See [`LANES_MIN_BYTES`].
    pub fn for_bytes(total: usize) -> Self {
        if total >= LANES_MIN_BYTES {
            Checker::new()
        } else {
            Checker::Pairs(Pairs::new())
        }
    }

    /// Adds a message whose SHA-256 must equal `expected` (32 bytes). An error is the tag of the
    /// first message, in push order, that did not match; it may be reported some pushes late.
    #[inline]
    pub fn push(&mut self, message: &'a [u8], expected: &'a [u8], tag: T) -> Result<(), T> {
        match self {
            Checker::Lanes(l) => l.push(message, expected, tag),
            Checker::Pairs(p) => p.push(message, expected, tag),
        }
    }

    /// Checks every message still in flight.
    pub fn finish(&mut self) -> Result<(), T> {
        match self {
            Checker::Lanes(l) => l.finish(),
            Checker::Pairs(p) => p.finish(),
        }
    }
}

impl<T> Default for Checker<'_, T> {
    fn default() -> Self {
        Checker::new()
    }
}

/// Below this many bytes of messages [`Checker::for_bytes`] uses two SHA-NI lanes: a stream of
/// a few dozen blocks leaves most of sixteen lanes idle while the longest message finishes.
pub const LANES_MIN_BYTES: usize = 64 * 1024;

/// Sixteen messages hashed at once in AVX-512 registers (`x16`), each lane refilled with the
/// next message as soon as its own is done, so messages of different lengths keep every lane
/// busy. See [`Checker`] for the contract.
#[derive(Debug)]
pub struct Lanes<'a, T> {
    #[cfg(target_arch = "x86_64")]
    states: x16::States,
    lanes: [Lane<'a>; 16],
    /// Each busy lane's push number and tag.
    tags: [Option<(u64, T)>; 16],
    /// Bit `i` set: lane `i` holds a message.
    busy: u16,
    pushed: u64,
    /// The earliest (push number, tag) that did not match.
    failed: Option<(u64, T)>,
}

/// One lane's message: the full blocks not yet compressed, then its padded tail, built when the
/// lane reaches it (by then the full blocks before it have pulled its bytes into cache).
#[derive(Clone, Copy, Debug)]
struct Lane<'a> {
    /// The message from the next full block on, tail included.
    rest: &'a [u8],
    len: u64,
    tail: [u8; 128],
    /// Tail blocks in `tail` (0 until it is built) and the next one to compress.
    tail_blocks: u8,
    tail_next: u8,
    expected: &'a [u8],
}

impl Default for Lane<'_> {
    fn default() -> Self {
        Lane {
            rest: &[],
            len: 0,
            tail: [0; 128],
            tail_blocks: 0,
            tail_next: 0,
            expected: &[],
        }
    }
}

impl<'a> Lane<'a> {
    #[inline]
    fn load(&mut self, m: &'a [u8], expected: &'a [u8]) {
        self.rest = m;
        self.len = m.len() as u64;
        self.tail_blocks = 0;
        self.tail_next = 0;
        self.expected = expected;
    }

    /// The next block, and whether it is the message's last.
    #[inline]
    fn next_block(&mut self) -> (&[u8; 64], bool) {
        if let Some((b, rest)) = self.rest.split_first_chunk::<64>() {
            self.rest = rest;
            return (b, false);
        }
        if self.tail_blocks == 0 {
            self.tail_blocks = pad_tail(self.rest, self.len, &mut self.tail) as u8;
        }
        let k = self.tail_next as usize;
        self.tail_next += 1;
        let last = self.tail_next == self.tail_blocks;
        // `tail` is 128 bytes and `k` < `tail_blocks` ≤ 2.
        match self.tail[k * 64..].first_chunk::<64>() {
            Some(b) => (b, last),
            None => (&IDLE, true),
        }
    }
}

/// What idle lanes compress (their results are never read).
static IDLE: [u8; 64] = [0; 64];

impl<'a, T> Lanes<'a, T> {
    /// Sixteen lanes, if this CPU has AVX-512 (F and BW), whatever `RIPTIDE_SHA_KERNEL` says
    /// (an explicit choice; [`Checker::new`] is the one that follows it).
    pub fn new() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        if x16::available() {
            return Some(Lanes {
                states: x16::States::default(),
                lanes: [Lane::default(); 16],
                tags: std::array::from_fn(|_| None),
                busy: 0,
                pushed: 0,
                failed: None,
            });
        }
        None
    }

    /// See [`Checker::push`].
    #[inline]
    pub fn push(&mut self, message: &'a [u8], expected: &'a [u8], tag: T) -> Result<(), T> {
        while self.busy == u16::MAX {
            self.step();
            if self.failed.is_some() {
                // An earlier-pushed message still in flight may fail too: finish them all, the
                // earliest failure wins.
                return self.finish();
            }
        }
        let i = (!self.busy).trailing_zeros() as usize;
        self.lanes[i].load(message, expected);
        #[cfg(target_arch = "x86_64")]
        self.states.reset(i);
        self.tags[i] = Some((self.pushed, tag));
        self.pushed += 1;
        self.busy |= 1 << i;
        Ok(())
    }

    /// See [`Checker::finish`].
    pub fn finish(&mut self) -> Result<(), T> {
        while self.busy != 0 {
            self.step();
        }
        match self.failed.take() {
            Some((_, t)) => Err(t),
            None => Ok(()),
        }
    }

    /// One block of every busy lane; lanes whose message ends are checked and freed.
    fn step(&mut self) {
        let mut blocks: [&[u8; 64]; 16] = [&IDLE; 16];
        let mut last: u16 = 0;
        for (i, (lane, slot)) in self.lanes.iter_mut().zip(blocks.iter_mut()).enumerate() {
            if self.busy & (1 << i) != 0 {
                let (b, is_last) = lane.next_block();
                *slot = b;
                last |= u16::from(is_last) << i;
            }
        }
        #[cfg(target_arch = "x86_64")]
        x16::compress(&mut self.states, &blocks);
        let mut done = last;
        while done != 0 {
            let i = done.trailing_zeros() as usize;
            done &= done - 1;
            self.busy &= !(1 << i);
            let ok = self.lane_matches(i);
            if let (false, Some((n, t))) = (ok, self.tags[i].take()) {
                if self.failed.as_ref().is_none_or(|(f, _)| n < *f) {
                    self.failed = Some((n, t));
                }
            }
        }
    }

    #[inline]
    fn lane_matches(&self, i: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            self.states.digest_is(i, self.lanes[i].expected)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = i;
            false
        }
    }
}

/// Up to sixteen one-block messages (at most [`ShortBatch::MAX_LEN`] bytes each), hashed
/// together: in sixteen AVX-512 lanes where the CPU has them, else two SHA-NI lanes, else `sha2`.
///
/// Why: an MST walk needs SHA-256 of every key (its height) and keys are short, but a node holds
/// only a few; a walk that queues keys across nodes fills sixteen lanes. The batch keeps its own
/// padded copy of each message, so callers may reuse the memory a key came from.
#[derive(Clone, Debug)]
pub struct ShortBatch {
    blocks: [[u8; 64]; 16],
    lens: [u8; 16],
    n: usize,
}

impl Default for ShortBatch {
    fn default() -> Self {
        ShortBatch {
            blocks: [[0; 64]; 16],
            lens: [0; 16],
            n: 0,
        }
    }
}

impl ShortBatch {
    /// Longest message that fits one padded block.
    pub const MAX_LEN: usize = 55;
    /// Messages per batch.
    pub const LANES: usize = 16;

    /// An empty batch.
    pub fn new() -> Self {
        ShortBatch::default()
    }

    /// Messages queued.
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether no message is queued.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Whether the batch holds [`ShortBatch::LANES`] messages.
    pub fn is_full(&self) -> bool {
        self.n == Self::LANES
    }

    /// Queues `m`; returns false (queuing nothing) when the batch is full or `m` is longer than
    /// [`ShortBatch::MAX_LEN`].
    #[inline]
    pub fn push(&mut self, m: &[u8]) -> bool {
        if self.n == Self::LANES || m.len() > Self::MAX_LEN {
            return false;
        }
        // One block: `m` is at most 55 bytes.
        pad_tail(m, m.len() as u64, &mut self.blocks[self.n]);
        self.lens[self.n] = m.len() as u8;
        self.n += 1;
        true
    }

    /// Message `i` as queued (still readable after [`ShortBatch::digests`], until the next
    /// push).
    pub fn message(&self, i: usize) -> &[u8] {
        &self.blocks[i][..usize::from(self.lens[i])]
    }

    /// The digests of the queued messages, in queue order (entries past [`ShortBatch::len`]
    /// are unspecified); the batch is emptied.
    pub fn digests(&mut self) -> [Digest; 16] {
        let n = std::mem::take(&mut self.n);
        #[cfg(target_arch = "x86_64")]
        if cap::wide_enabled() {
            let mut out = [[0u8; 32]; 16];
            let mut st = x16::States::default();
            for i in 0..16 {
                st.reset(i);
            }
            let refs: [&[u8; 64]; 16] = std::array::from_fn(|i| &self.blocks[i]);
            x16::compress(&mut st, &refs);
            for (i, o) in out.iter_mut().enumerate().take(n) {
                *o = st.digest(i);
            }
            return out;
        }
        self.digests_without_lanes(n)
    }

    /// The leading zero bits of each queued message's digest (0 to 256), in queue order (entries
    /// past [`ShortBatch::len`] are unspecified); the batch is emptied. What counting them in
    /// [`ShortBatch::digests`] gives, without writing the digests out: an MST key's height is
    /// this count halved, and nothing else of its digest is needed.
    pub fn leading_zeros(&mut self) -> [u32; 16] {
        #[cfg(target_arch = "x86_64")]
        if cap::wide_enabled() {
            self.n = 0;
            let mut st = x16::States::default();
            for i in 0..16 {
                st.reset(i);
            }
            let refs: [&[u8; 64]; 16] = std::array::from_fn(|i| &self.blocks[i]);
            x16::compress(&mut st, &refs);
            // The state is word-major: word `w` of lane `i` is `st.0[w][i]`.
            return std::array::from_fn(|i| leading_zero_bits(st.0.iter().map(|w| w[i])));
        }
        let d = self.digests();
        std::array::from_fn(|i| leading_zero_bits(digest_words(&d[i])))
    }

    /// [`ShortBatch::digests`] on a CPU without AVX-512: SHA-NI pairs or `sha2`.
    fn digests_without_lanes(&self, n: usize) -> [Digest; 16] {
        let mut out = [[0u8; 32]; 16];
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        if cap::sha_ni_enabled() {
            // The blocks are padded already: compress them two at a time, straight (through
            // `sha256_pair`, which pads each message again, the walk of a 200,000-record
            // repository took 3 ms longer, measured with `RIPTIDE_SHA_KERNEL=shani2`).
            for (pair, d) in self.blocks[..n.next_multiple_of(2)]
                .chunks_exact(2)
                .zip(out.chunks_exact_mut(2))
            {
                let (x, y) = two::padded_pair(&pair[0], &pair[1]);
                d[0] = x;
                d[1] = y;
            }
            return out;
        }
        let mut i = 0;
        while i < n {
            if i + 1 < n {
                let (a, b) = sha256_pair(self.message(i), self.message(i + 1));
                out[i] = a;
                out[i + 1] = b;
            } else {
                out[i] = sha256_short(self.message(i));
            }
            i += 2;
        }
        out
    }
}

/// Leading zero bits of a digest given as its big-endian 32-bit words, first word first.
#[inline]
fn leading_zero_bits(words: impl Iterator<Item = u32>) -> u32 {
    let mut zeros = 0;
    for w in words {
        if w != 0 {
            return zeros + w.leading_zeros();
        }
        zeros += 32;
    }
    zeros
}

/// A digest as its eight big-endian words.
#[inline]
fn digest_words(d: &Digest) -> impl Iterator<Item = u32> + '_ {
    d.as_chunks::<4>().0.iter().map(|w| u32::from_be_bytes(*w))
}

/// Writes the padded end of a message into `out`: `rest` (the bytes after its last full block,
/// fewer than 64), `0x80`, zeros, and the length of the whole message (`len` bytes) in bits.
/// Returns the blocks written: 1, or 2 when `rest` leaves no room for the length. `out` must
/// hold them (128 bytes always do; 64 when `rest` is at most 55 bytes).
#[inline]
fn pad_tail(rest: &[u8], len: u64, out: &mut [u8]) -> usize {
    let blocks = if rest.len() < 56 { 1 } else { 2 };
    let end = blocks * 64;
    out[..rest.len()].copy_from_slice(rest);
    out[rest.len()] = 0x80;
    out[rest.len() + 1..end - 8].fill(0);
    out[end - 8..end].copy_from_slice(&len.wrapping_mul(8).to_be_bytes());
    blocks
}

/// SHA-256 initial state (FIPS 180-4 §5.3.3).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const H0: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// SHA-256 round constants (FIPS 180-4 §4.2.2).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

#[cfg(target_arch = "x86_64")]
mod x16;

/// The two-lane kernel of this architecture ([`Kernel::ShaNi2`]): SHA-NI on x86-64, the SHA2
/// instructions on AArch64.
#[cfg(target_arch = "aarch64")]
use arm as two;
#[cfg(target_arch = "x86_64")]
use x86 as two;

mod batch;
pub use batch::{wide_beats_sha_ni, Kernel};

pub mod cap;
pub use cap::{kernel_cap, kernel_from_env, KERNEL_ENV};

/// Rounds for group `g` on every listed lane, each lane's words rotating through four variables;
/// groups 0–3 use the loaded words, later ones schedule first. Architecture-neutral: `schedule`
/// and `rounds4!` are those of the module it expands in (`x86`, `arm`).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! group {
    ($g:expr, $(($st:ident, $w0:ident, $w1:ident, $w2:ident, $w3:ident)),+) => {{
        $(
            if $g >= 4 {
                $w0 = schedule($w0, $w1, $w2, $w3);
            }
        )+
        $( rounds4!($st, $w0, $g); )+
    }};
}

/// All sixteen groups of one block: the word variables rotate by one each group. Fully unrolled
/// so state and words stay in registers and the lanes' instructions interleave.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! block {
    ($(($st:ident, $a:ident, $b:ident, $c:ident, $d:ident)),+) => {{
        group!(0, $(($st, $a, $b, $c, $d)),+);
        group!(1, $(($st, $b, $c, $d, $a)),+);
        group!(2, $(($st, $c, $d, $a, $b)),+);
        group!(3, $(($st, $d, $a, $b, $c)),+);
        group!(4, $(($st, $a, $b, $c, $d)),+);
        group!(5, $(($st, $b, $c, $d, $a)),+);
        group!(6, $(($st, $c, $d, $a, $b)),+);
        group!(7, $(($st, $d, $a, $b, $c)),+);
        group!(8, $(($st, $a, $b, $c, $d)),+);
        group!(9, $(($st, $b, $c, $d, $a)),+);
        group!(10, $(($st, $c, $d, $a, $b)),+);
        group!(11, $(($st, $d, $a, $b, $c)),+);
        group!(12, $(($st, $a, $b, $c, $d)),+);
        group!(13, $(($st, $b, $c, $d, $a)),+);
        group!(14, $(($st, $c, $d, $a, $b)),+);
        group!(15, $(($st, $d, $a, $b, $c)),+);
    }};
}

/// The two-lane code over one architecture's primitives (SHA-NI in `x86`, the ARMv8 SHA2
/// instructions in `arm`): its `State`, `load_state`, `store_state`, `add_state`, `load_words`,
/// `schedule` and `rounds4!`. From them, the compression of one block on one or two lanes and
/// the drivers: padding, pairing blocks of two messages, refilling a lane when its message ends.
/// Written once, expanded at the end of each architecture's module (after the `rounds4!` it
/// uses) so that every function carries that module's target features (`$features`) and the
/// compressions inline into the drivers.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
macro_rules! two_lanes {
    ($features:literal) => {
        /// One block on each of two lanes, interleaved.
        #[inline]
        #[target_feature(enable = $features)]
        fn compress2(sa: &mut State, sb: &mut State, a: &[u8], b: &[u8]) {
            let (save_a, save_b) = (*sa, *sb);
            let (mut x, mut y) = (*sa, *sb);
            let (mut a0, mut a1, mut a2, mut a3) = (
                load_words(&a[0..16]),
                load_words(&a[16..32]),
                load_words(&a[32..48]),
                load_words(&a[48..64]),
            );
            let (mut b0, mut b1, mut b2, mut b3) = (
                load_words(&b[0..16]),
                load_words(&b[16..32]),
                load_words(&b[32..48]),
                load_words(&b[48..64]),
            );
            block!((x, a0, a1, a2, a3), (y, b0, b1, b2, b3));
            *sa = add_state(x, save_a);
            *sb = add_state(y, save_b);
        }

        /// One block on one lane.
        #[inline]
        #[target_feature(enable = $features)]
        fn compress1(s: &mut State, a: &[u8]) {
            let save = *s;
            let mut x = *s;
            let (mut a0, mut a1, mut a2, mut a3) = (
                load_words(&a[0..16]),
                load_words(&a[16..32]),
                load_words(&a[32..48]),
                load_words(&a[48..64]),
            );
            block!((x, a0, a1, a2, a3));
            *s = add_state(x, save);
        }

        /// A message as the 64-byte blocks SHA-256 compresses: its full blocks, then one or two
        /// padding blocks holding the tail, `0x80`, zeros and the bit length.
        struct Blocks<'a> {
            full: &'a [u8],
            tail: [u8; 128],
            tail_blocks: usize,
        }

        impl<'a> Blocks<'a> {
            #[inline(always)]
            fn new(m: &'a [u8]) -> Blocks<'a> {
                let n_full = m.len() / 64;
                let (full, rest) = m.split_at(n_full * 64);
                let mut tail = [0u8; 128];
                let tail_blocks = $crate::pad_tail(rest, m.len() as u64, &mut tail);
                Blocks {
                    full,
                    tail,
                    tail_blocks,
                }
            }
        }

        pub(super) fn one(a: &[u8]) -> Digest {
            // SAFETY: as in `pair`.
            unsafe { one_lanes(a) }
        }

        #[target_feature(enable = $features)]
        fn one_lanes(a: &[u8]) -> Digest {
            let ba = Blocks::new(a);
            let mut sa = load_state(&H0);
            for block in ba.full.chunks_exact(64) {
                compress1(&mut sa, block);
            }
            for block in ba.tail[..ba.tail_blocks * 64].chunks_exact(64) {
                compress1(&mut sa, block);
            }
            store_state(sa)
        }

        pub(super) fn pair(a: &[u8], b: &[u8]) -> (Digest, Digest) {
            // SAFETY: `pair` is only called after `available()` found the target features
            // `pair_lanes` enables.
            unsafe { pair_lanes(a, b) }
        }

        #[target_feature(enable = $features)]
        fn pair_lanes(a: &[u8], b: &[u8]) -> (Digest, Digest) {
            let (ba, bb) = (Blocks::new(a), Blocks::new(b));
            let init = load_state(&H0);
            let (mut sa, mut sb) = (init, init);
            // Both messages as block iterators: full blocks from the input, then the padded tail.
            let mut ia = ba
                .full
                .chunks_exact(64)
                .chain(ba.tail[..ba.tail_blocks * 64].chunks_exact(64));
            let mut ib = bb
                .full
                .chunks_exact(64)
                .chain(bb.tail[..bb.tail_blocks * 64].chunks_exact(64));
            loop {
                match (ia.next(), ib.next()) {
                    (Some(x), Some(y)) => compress2(&mut sa, &mut sb, x, y),
                    (Some(x), None) => {
                        compress1(&mut sa, x);
                        for x in ia.by_ref() {
                            compress1(&mut sa, x);
                        }
                        break;
                    }
                    (None, Some(y)) => {
                        compress1(&mut sb, y);
                        for y in ib.by_ref() {
                            compress1(&mut sb, y);
                        }
                        break;
                    }
                    (None, None) => break,
                }
            }
            (store_state(sa), store_state(sb))
        }

        /// The digests of two messages that are one padded block each (`ShortBatch`'s form): the
        /// compression alone, without [`pair`]'s padding of the messages.
        pub(super) fn padded_pair(a: &[u8; 64], b: &[u8; 64]) -> (Digest, Digest) {
            // SAFETY: as in `pair`: called only after `available()`.
            unsafe { padded_pair_lanes(a, b) }
        }

        #[target_feature(enable = $features)]
        fn padded_pair_lanes(a: &[u8; 64], b: &[u8; 64]) -> (Digest, Digest) {
            let init = load_state(&H0);
            let (mut sa, mut sb) = (init, init);
            compress2(&mut sa, &mut sb, a, b);
            (store_state(sa), store_state(sb))
        }

        /// One message's blocks, walked one at a time by a lane of [`stream`].
        struct Cursor<'a> {
            msg: &'a [u8],
            n_full: usize,
            tail: [u8; 128],
            total: usize,
            next: usize,
        }

        impl<'a> Cursor<'a> {
            #[inline(always)]
            fn new(m: &'a [u8]) -> Cursor<'a> {
                let n_full = m.len() / 64;
                let mut tail = [0u8; 128];
                let tail_blocks = $crate::pad_tail(&m[n_full * 64..], m.len() as u64, &mut tail);
                Cursor {
                    msg: m,
                    n_full,
                    tail,
                    total: n_full + tail_blocks,
                    next: 0,
                }
            }

            /// Block `k` (< `total`): from the message, or its padded tail.
            #[inline(always)]
            fn block(&self, k: usize) -> &[u8] {
                if k < self.n_full {
                    &self.msg[k * 64..k * 64 + 64]
                } else {
                    let t = (k - self.n_full) * 64;
                    &self.tail[t..t + 64]
                }
            }
        }

        /// A busy lane of [`stream`]: which message, its blocks, its state.
        struct Lane<'a> {
            index: usize,
            cursor: Cursor<'a>,
            state: State,
        }

        /// `out[i]` = SHA-256 of `msgs[i]` (`out` at least as long as `msgs`), two lanes
        /// refilled as messages end, so lengths that differ keep both busy.
        pub(super) fn stream(msgs: &[&[u8]], out: &mut [Digest]) {
            // SAFETY: as in `pair`: called only after `available()`.
            unsafe { stream_lanes(msgs, out) }
        }

        #[target_feature(enable = $features)]
        fn stream_lanes(msgs: &[&[u8]], out: &mut [Digest]) {
            let init = load_state(&H0);
            let mut queued = 0;
            let mut load = || {
                let lane = msgs.get(queued).map(|m| Lane {
                    index: queued,
                    cursor: Cursor::new(m),
                    state: init,
                });
                queued += 1;
                lane
            };
            let mut a = load();
            let mut b = load();
            loop {
                match (&mut a, &mut b) {
                    (Some(x), Some(y)) => {
                        let (kx, ky) = (x.cursor.next, y.cursor.next);
                        compress2(
                            &mut x.state,
                            &mut y.state,
                            x.cursor.block(kx),
                            y.cursor.block(ky),
                        );
                        x.cursor.next += 1;
                        y.cursor.next += 1;
                    }
                    (Some(x), None) | (None, Some(x)) => {
                        let k = x.cursor.next;
                        compress1(&mut x.state, x.cursor.block(k));
                        x.cursor.next += 1;
                    }
                    (None, None) => break,
                }
                for lane in [&mut a, &mut b] {
                    if let Some(l) = lane {
                        if l.cursor.next == l.cursor.total {
                            if let Some(o) = out.get_mut(l.index) {
                                *o = store_state(l.state);
                            }
                            *lane = load();
                        }
                    }
                }
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! The two-lane SHA-NI compression. The intrinsics are safe to call inside functions that
    //! enable their target features; the one `unsafe` is entering such a function, which is
    //! sound only after the run-time check in [`available`].

    use std::arch::x86_64::*;

    use super::Digest;

    use super::{H0, K};

    /// Whether this CPU has SHA-NI and the SSE levels the rounds use (cached by std).
    #[inline]
    pub(super) fn available() -> bool {
        std::arch::is_x86_feature_detected!("sha")
            && std::arch::is_x86_feature_detected!("sse4.1")
            && std::arch::is_x86_feature_detected!("ssse3")
    }

    /// The state as SHA-NI keeps it: (ABEF, CDGH).
    type State = (__m128i, __m128i);

    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn load_state(h: &[u32; 8]) -> State {
        let dcba = _mm_set_epi32(h[3] as i32, h[2] as i32, h[1] as i32, h[0] as i32);
        let hgfe = _mm_set_epi32(h[7] as i32, h[6] as i32, h[5] as i32, h[4] as i32);
        let cdab = _mm_shuffle_epi32(dcba, 0xB1);
        let efgh = _mm_shuffle_epi32(hgfe, 0x1B);
        let abef = _mm_alignr_epi8(cdab, efgh, 8);
        let cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
        (abef, cdgh)
    }

    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn store_state((abef, cdgh): State) -> Digest {
        let feba = _mm_shuffle_epi32(abef, 0x1B);
        let dchg = _mm_shuffle_epi32(cdgh, 0xB1);
        let dcba = _mm_blend_epi16(feba, dchg, 0xF0);
        let hgef = _mm_alignr_epi8(dchg, feba, 8);
        let words = [
            _mm_extract_epi32(dcba, 0),
            _mm_extract_epi32(dcba, 1),
            _mm_extract_epi32(dcba, 2),
            _mm_extract_epi32(dcba, 3),
            _mm_extract_epi32(hgef, 0),
            _mm_extract_epi32(hgef, 1),
            _mm_extract_epi32(hgef, 2),
            _mm_extract_epi32(hgef, 3),
        ];
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(words) {
            o.copy_from_slice(&(w as u32).to_be_bytes());
        }
        out
    }

    /// 16 big-endian message bytes as four words.
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn load_words(b: &[u8]) -> __m128i {
        let mut lo = [0u8; 8];
        let mut hi = [0u8; 8];
        lo.copy_from_slice(&b[..8]);
        hi.copy_from_slice(&b[8..16]);
        let v = _mm_set_epi64x(i64::from_le_bytes(hi), i64::from_le_bytes(lo));
        let swap = _mm_set_epi64x(
            0x0C0D_0E0F_0809_0A0Bu64 as i64,
            0x0405_0607_0001_0203u64 as i64,
        );
        _mm_shuffle_epi8(v, swap)
    }

    /// The round constants for rounds 4g..4g+3, as SHA-NI takes them.
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn k4(g: usize) -> __m128i {
        _mm_set_epi32(
            K[4 * g + 3] as i32,
            K[4 * g + 2] as i32,
            K[4 * g + 1] as i32,
            K[4 * g] as i32,
        )
    }

    /// Four rounds on one lane with message words `w` (already scheduled) for group `g`.
    macro_rules! rounds4 {
        ($st:ident, $w:expr, $g:expr) => {{
            let t = _mm_add_epi32($w, k4($g));
            $st.1 = _mm_sha256rnds2_epu32($st.1, $st.0, t);
            $st.0 = _mm_sha256rnds2_epu32($st.0, $st.1, _mm_shuffle_epi32(t, 0x0E));
        }};
    }

    /// The next four message words from the previous sixteen (`w0` oldest).
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn schedule(w0: __m128i, w1: __m128i, w2: __m128i, w3: __m128i) -> __m128i {
        let t1 = _mm_sha256msg1_epu32(w0, w1);
        let t2 = _mm_alignr_epi8(w3, w2, 4);
        _mm_sha256msg2_epu32(_mm_add_epi32(t1, t2), w3)
    }

    /// The state after a block: its value before plus what the rounds left.
    #[inline]
    #[target_feature(enable = "sha,sse2,ssse3,sse4.1")]
    fn add_state(x: State, save: State) -> State {
        (_mm_add_epi32(x.0, save.0), _mm_add_epi32(x.1, save.1))
    }

    two_lanes!("sha,sse2,ssse3,sse4.1");
}

#[cfg(target_arch = "aarch64")]
mod arm {
    //! The two-lane compression with the ARMv8 SHA2 instructions (`sha256h`, `sha256h2`,
    //! `sha256su0`, `sha256su1`). Each instruction does four rounds and the next four depend on
    //! its result, so one message is a chain of dependent instructions, as with SHA-NI; two
    //! messages interleaved give the core two independent chains. The intrinsics are safe inside
    //! functions that enable their target features; the one `unsafe` is entering such a
    //! function, which is sound only after the run-time check in [`available`].
    //!
    //! Written with the intrinsics, not measured here: the development machines are x86-64, so
    //! this path is tested against `sha2` under emulation (`.ci/aarch64`) and its speed is
    //! for an ARM machine to measure (`examples/lanes.rs`).

    use std::arch::aarch64::*;

    use super::Digest;

    use super::{H0, K};

    /// Whether this CPU has the SHA2 instructions (cached by std; NEON is part of AArch64).
    #[inline]
    pub(super) fn available() -> bool {
        std::arch::is_aarch64_feature_detected!("sha2")
    }

    /// The state as the instructions take it: (ABCD, EFGH), word `a` in lane 0.
    type State = (uint32x4_t, uint32x4_t);

    #[inline]
    #[target_feature(enable = "neon,sha2")]
    fn load_state(h: &[u32; 8]) -> State {
        (
            from_words([h[0], h[1], h[2], h[3]]),
            from_words([h[4], h[5], h[6], h[7]]),
        )
    }

    /// Four words into a vector, lane `i` = `w[i]`.
    #[inline]
    #[target_feature(enable = "neon,sha2")]
    fn from_words(w: [u32; 4]) -> uint32x4_t {
        // Lane by lane rather than `vld1q_u32`, which takes a raw pointer: no `unsafe` here.
        let v = vdupq_n_u32(w[0]);
        let v = vsetq_lane_u32::<1>(w[1], v);
        let v = vsetq_lane_u32::<2>(w[2], v);
        vsetq_lane_u32::<3>(w[3], v)
    }

    #[inline]
    #[target_feature(enable = "neon,sha2")]
    fn store_state((abcd, efgh): State) -> Digest {
        let words = [
            vgetq_lane_u32::<0>(abcd),
            vgetq_lane_u32::<1>(abcd),
            vgetq_lane_u32::<2>(abcd),
            vgetq_lane_u32::<3>(abcd),
            vgetq_lane_u32::<0>(efgh),
            vgetq_lane_u32::<1>(efgh),
            vgetq_lane_u32::<2>(efgh),
            vgetq_lane_u32::<3>(efgh),
        ];
        let mut out = [0u8; 32];
        for (o, w) in out.chunks_exact_mut(4).zip(words) {
            o.copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// 16 big-endian message bytes as four words.
    #[inline]
    #[target_feature(enable = "neon,sha2")]
    fn load_words(b: &[u8]) -> uint32x4_t {
        let word = |i: usize| {
            let mut w = [0u8; 4];
            w.copy_from_slice(&b[4 * i..4 * i + 4]);
            u32::from_be_bytes(w)
        };
        from_words([word(0), word(1), word(2), word(3)])
    }

    /// The round constants for rounds 4g..4g+3.
    #[inline]
    #[target_feature(enable = "neon,sha2")]
    fn k4(g: usize) -> uint32x4_t {
        from_words([K[4 * g], K[4 * g + 1], K[4 * g + 2], K[4 * g + 3]])
    }

    /// Four rounds on one lane with message words `w` (already scheduled) for group `g`.
    macro_rules! rounds4 {
        ($st:ident, $w:expr, $g:expr) => {{
            let t = vaddq_u32($w, k4($g));
            let abcd = $st.0;
            $st.0 = vsha256hq_u32($st.0, $st.1, t);
            $st.1 = vsha256h2q_u32($st.1, abcd, t);
        }};
    }

    /// The next four message words from the previous sixteen (`w0` oldest).
    #[inline]
    #[target_feature(enable = "neon,sha2")]
    fn schedule(w0: uint32x4_t, w1: uint32x4_t, w2: uint32x4_t, w3: uint32x4_t) -> uint32x4_t {
        vsha256su1q_u32(vsha256su0q_u32(w0, w1), w2, w3)
    }

    /// The state after a block: its value before plus what the rounds left.
    #[inline]
    #[target_feature(enable = "neon,sha2")]
    fn add_state(x: State, save: State) -> State {
        (vaddq_u32(x.0, save.0), vaddq_u32(x.1, save.1))
    }

    two_lanes!("neon,sha2");
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(d: &Digest) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn lanes_are_used_where_the_cpu_has_sha_ni() {
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            lanes_available(),
            std::arch::is_x86_feature_detected!("sha")
                && std::arch::is_x86_feature_detected!("sse4.1")
                && kernel_cap() != Some(Kernel::Sha2)
        );
        #[cfg(target_arch = "aarch64")]
        assert_eq!(
            lanes_available(),
            std::arch::is_aarch64_feature_detected!("sha2") && kernel_cap() != Some(Kernel::Sha2)
        );
    }

    #[test]
    fn known_vectors() {
        // FIPS 180-2 examples.
        let (a, b) = sha256_pair(b"abc", b"");
        assert_eq!(
            hex(&a),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(&b),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        let (c, d) = sha256_pair(long, b"abc");
        assert_eq!(
            hex(&c),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(d, a);
    }

    #[test]
    fn every_length_pairing_around_block_edges() {
        let data: Vec<u8> = (0..400u32).map(|i| (i * 31 + 7) as u8).collect();
        let lens = [
            0, 1, 31, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 200, 400,
        ];
        for &la in &lens {
            for &lb in &lens {
                let (x, y) = sha256_pair(&data[..la], &data[400 - lb..]);
                assert_eq!(x, sha256(&data[..la]), "{la} {lb}");
                assert_eq!(y, sha256(&data[400 - lb..]), "{la} {lb}");
            }
        }
    }

    #[test]
    fn pairs_reports_the_first_mismatch_in_order() {
        let msgs: Vec<Vec<u8>> = (0..7u8).map(|i| vec![i; 10 + 30 * i as usize]).collect();
        let digests: Vec<Digest> = msgs.iter().map(|m| sha256(m)).collect();
        let run = |bad: &[usize]| -> Result<(), usize> {
            let mut wrong = digests.clone();
            for &i in bad {
                wrong[i][5] ^= 1;
            }
            let mut p = Pairs::new();
            for (i, (m, e)) in msgs.iter().zip(&wrong).enumerate() {
                p.push(m, e, i)?;
            }
            p.finish()
        };
        assert_eq!(run(&[]), Ok(()));
        assert_eq!(run(&[3]), Err(3));
        assert_eq!(run(&[2]), Err(2));
        assert_eq!(run(&[6]), Err(6));
        assert_eq!(run(&[1, 4]), Err(1));
        assert_eq!(run(&[5, 4]), Err(4));
    }

    /// Runs `msgs` through a checker with the given digests; the first failing index or Ok.
    fn check_all<'a>(
        mut c: Checker<'a, usize>,
        msgs: &'a [Vec<u8>],
        digests: &'a [Digest],
    ) -> Result<(), usize> {
        for (i, (m, e)) in msgs.iter().zip(digests).enumerate() {
            c.push(m, e, i)?;
        }
        c.finish()
    }

    #[test]
    fn checker_reports_the_first_mismatch_in_push_order() {
        // Lengths from 0 to 2,000 bytes so lanes finish out of order; 100 messages so lanes
        // are refilled many times.
        let msgs: Vec<Vec<u8>> = (0..100usize)
            .map(|i| vec![i as u8; (i * 397) % 2001])
            .collect();
        let digests: Vec<Digest> = msgs.iter().map(|m| sha256(m)).collect();
        let run = |bad: &[usize]| {
            let mut wrong = digests.clone();
            for &i in bad {
                wrong[i][31] ^= 1;
            }
            // Sixteen lanes where the CPU has them, whichever `new` prefers here.
            let lanes = Lanes::new().map(|l| check_all(Checker::Lanes(Box::new(l)), &msgs, &wrong));
            (
                check_all(Checker::new(), &msgs, &wrong),
                check_all(Checker::Pairs(Pairs::new()), &msgs, &wrong),
                lanes,
            )
        };
        for bad in [
            &[][..],
            &[0],
            &[99],
            &[5, 3],
            &[40, 17, 18],
            &[98, 97],
            &[16, 1],
        ] {
            let (new, pairs, lanes) = run(bad);
            let expect = bad.iter().min().map_or(Ok(()), |&i| Err(i));
            assert_eq!(new, expect, "{bad:?}");
            assert_eq!(pairs, expect, "{bad:?}");
            if let Some(lanes) = lanes {
                assert_eq!(lanes, expect, "{bad:?}");
            }
        }
    }

    #[test]
    fn lanes_exist_where_the_cpu_has_avx512() {
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            matches!(Checker::<()>::new(), Checker::Lanes(_)),
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && !matches!(kernel_cap(), Some(Kernel::Sha2 | Kernel::ShaNi2))
        );
    }

    #[test]
    fn short_batch_equals_sha2() {
        // 16, 16 and 7 messages: full batches and an odd one (SHA-NI compresses pairs).
        let msgs: Vec<Vec<u8>> = (0..39usize)
            .map(|i| vec![i as u8 ^ 0x5a; i * 7 % 56])
            .collect();
        let mut b = ShortBatch::new();
        for chunk in msgs.chunks(16) {
            for m in chunk {
                assert!(b.push(m));
            }
            assert_eq!(b.is_full(), chunk.len() == 16);
            assert!(!b.push(&[0; 56]) || chunk.len() < 16);
            for (i, m) in chunk.iter().enumerate() {
                assert_eq!(b.message(i), &m[..]);
            }
            let without = b.digests_without_lanes(chunk.len());
            let d = b.digests();
            assert!(b.is_empty());
            assert_eq!(d[..chunk.len()], without[..chunk.len()]);
            for (i, m) in chunk.iter().enumerate() {
                assert_eq!(d[i], sha256(m), "{i}");
            }
            // The same batch again, for its leading zero bits only.
            for m in chunk {
                assert!(b.push(m));
            }
            let z = b.leading_zeros();
            assert!(b.is_empty());
            for (i, m) in chunk.iter().enumerate() {
                let want = leading_zero_bits(digest_words(&sha256(m)));
                let bits: String = sha256(m).iter().map(|x| format!("{x:08b}")).collect();
                assert_eq!(
                    want as usize,
                    bits.len() - bits.trim_start_matches('0').len()
                );
                assert_eq!(z[i], want, "{i}");
            }
        }
        assert!(!b.push(&[1; 56]), "56 bytes do not fit one block");
        // Digests do not start with 32 zero bits; the count goes on across words all the same.
        assert_eq!(leading_zero_bits([0, 0, 1 << 20].into_iter()), 64 + 11);
        assert_eq!(leading_zero_bits([0u32; 8].into_iter()), 256);
        let mut d = [0u8; 32];
        d[..5].copy_from_slice(&[0x12, 0x34, 0x56, 0x78, 0x9a]);
        assert_eq!(
            digest_words(&d).take(2).collect::<Vec<_>>(),
            [0x1234_5678, 0x9a00_0000]
        );
    }

    proptest! {
        #[test]
        fn checker_equals_sha2(msgs in proptest::collection::vec(
                                   proptest::collection::vec(any::<u8>(), 0..300), 0..60),
                               bad in proptest::option::of(0usize..60)) {
            let mut digests: Vec<Digest> = msgs.iter().map(|m| sha256(m)).collect();
            let bad = bad.filter(|&b| b < msgs.len());
            if let Some(b) = bad {
                digests[b][0] ^= 0x80;
            }
            let expect = bad.map_or(Ok(()), Err);
            prop_assert_eq!(check_all(Checker::new(), &msgs, &digests), expect);
            prop_assert_eq!(check_all(Checker::Pairs(Pairs::new()), &msgs, &digests), expect);
            if let Some(l) = Lanes::new() {
                prop_assert_eq!(check_all(Checker::Lanes(Box::new(l)), &msgs, &digests), expect);
            }
        }
    }

    proptest! {
        #[test]
        fn pair_equals_sha2(a in proptest::collection::vec(any::<u8>(), 0..700),
                            b in proptest::collection::vec(any::<u8>(), 0..700)) {
            let (x, y) = sha256_pair(&a, &b);
            prop_assert_eq!(x, sha256(&a));
            prop_assert_eq!(y, sha256(&b));
            prop_assert_eq!(sha256_short(&a), sha256(&a));
        }

        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        #[test]
        fn lanes_equal_sha2_at_any_length(a in proptest::collection::vec(any::<u8>(), 0..1500),
                                          b in proptest::collection::vec(any::<u8>(), 0..1500)) {
            if lanes_available() {
                let (x, y) = two::pair(&a, &b);
                prop_assert_eq!(x, sha256(&a));
                prop_assert_eq!(y, sha256(&b));
                prop_assert_eq!(two::one(&a), sha256(&a));
            }
        }
    }
}
