//! Mutated firehose frames: real or generated frames with one field changed, or a few bytes,
//! each labelled, deterministic from a seed (`riptide mutate`, the fault suite's mutation step).
//!
//! Why: the serve-level bugs that matter come from frames that are *almost* right — an
//! `#account` with `"did": ""` is well-formed DAG-CBOR, passes every decoder, and used to reach
//! the store and panic its writer. Byte fuzzers (`fuzz/`) rarely build such frames, because
//! they must keep the CBOR well-formed while changing one meaningful field. This module does the
//! opposite: it decodes a frame to values, changes exactly one field of its header, payload or
//! one of its ops (emptied, huge, of the wrong type, removed, an extreme integer, non-UTF-8, an
//! invalid DID, an odd `time`, a cut-short `blocks`, …), and encodes it again as canonical
//! DAG-CBOR; a share of frames get byte-level damage instead (bit flips, truncation, insertions).
//! Every frame kind in the sources is picked in turn, so rare kinds (`#account`, `#identity`,
//! `#sync`) are mutated as often as `#commit`.
//!
//! Every output frame is listed in a [`ManifestEntry`]: which source frame, which kind, which
//! field, which mutation, and whether the result is still well-formed DAG-CBOR. Frames that keep
//! a payload `seq` are renumbered `first_seq, first_seq + 1, …` in output order (unless the
//! mutation is of `seq` itself), so the stream can be served verbatim with seqs that increase.
//!
//! What it does not do: predict verdicts (a mutation of a signed field usually gives
//! `bad-signature`, of an unsigned one anything) — the fault suite checks that *some* verdict is
//! given and the server survives, not which.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use riptide_cbor::{write_head, write_text, Arena, CidBuf, Options, OwnedValue, DAG_CBOR, RAW};
use serde::Serialize;

/// Huge strings of about 1 MiB at most this many times per run (they make large corpora).
pub const MAX_MEGA: usize = 4;
/// Length of a "huge" string (over any sane field limit, far under the frame limit).
pub const HUGE: usize = 70_000;
/// Length of a "mega" string.
pub const MEGA: usize = 1 << 20;

/// Marker replaced by raw bytes after encoding (for values DAG-CBOR cannot hold, such as
/// non-UTF-8 text); made of characters no source frame contains.
const RAW_MARK: &str = "\u{1}riptide-mutate-raw\u{1}";

/// One mutated frame's label (a line of the manifest).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ManifestEntry {
    /// Position in the output corpus (0-based).
    pub index: u64,
    /// The seq written into the frame, if it has one the mutation did not touch.
    pub seq: Option<u64>,
    /// Source frame: `<source name>#<index in it>`.
    pub source: String,
    /// The source frame's header `t` (`#commit`, `#account`, …).
    pub kind: String,
    /// What was changed: `header.t`, `payload.did`, `payload.ops[0].path`, `payload` (the whole
    /// payload), `bytes` (byte-level).
    pub field: String,
    /// How: `empty-text`, `huge-text`, `missing`, `int-max`, `non-utf8`, `bit-flip`, ….
    pub mutation: String,
    /// Whether the frame is still two well-formed DAG-CBOR items.
    pub well_formed: bool,
}

/// A source: a name (for the manifest) and its frames.
#[derive(Clone, Debug)]
pub struct Source {
    /// Name used in [`ManifestEntry::source`].
    pub name: String,
    /// The frames, as in a corpus file.
    pub frames: Vec<Vec<u8>>,
}

/// A decoded source frame.
#[derive(Clone, Debug)]
struct Parsed {
    source: String,
    kind: String,
    header: BTreeMap<String, OwnedValue>,
    payload: BTreeMap<String, OwnedValue>,
}

/// Field names each kind has, whether or not a given frame carries them (so a missing optional
/// field, such as `#account`'s `status`, can be added with an odd value).
fn known_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "#commit" => &[
            "seq", "rebase", "tooBig", "repo", "commit", "rev", "since", "blocks", "ops", "blobs",
            "prevData", "time",
        ],
        "#sync" => &["seq", "did", "blocks", "rev", "time"],
        "#identity" => &["seq", "did", "time", "handle"],
        "#account" => &["seq", "did", "time", "active", "status"],
        _ => &["seq", "did", "time"],
    }
}

/// What a field holds, for choosing odd values that are odd *for it*.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hint {
    Did,
    Time,
    Seq,
    Rev,
    Handle,
    Status,
    Bool,
    Link,
    Blocks,
    Ops,
    Blobs,
    Path,
    Action,
    HeaderT,
    HeaderOp,
    Other,
}

fn hint(field: &str) -> Hint {
    match field {
        "did" | "repo" => Hint::Did,
        "time" => Hint::Time,
        "seq" => Hint::Seq,
        "rev" | "since" => Hint::Rev,
        "handle" => Hint::Handle,
        "status" => Hint::Status,
        "active" | "rebase" | "tooBig" => Hint::Bool,
        "commit" | "prevData" | "cid" | "prev" => Hint::Link,
        "blocks" => Hint::Blocks,
        "ops" => Hint::Ops,
        "blobs" => Hint::Blobs,
        "path" => Hint::Path,
        "action" => Hint::Action,
        _ => Hint::Other,
    }
}

/// A replacement: a value, or removal of the field.
enum Change {
    Set(OwnedValue),
    Remove,
}

/// Mutates frames of `sources` into `count` output frames, deterministically from `seed`.
/// Source frames that do not decode as a header and a map payload are not used; it is an error
/// (`Err` with a message) if none decode.
pub fn mutate(
    sources: &[Source],
    seed: u64,
    count: u64,
    first_seq: u64,
    byte_share: f64,
) -> Result<Vec<(Vec<u8>, ManifestEntry)>, String> {
    let mut m = Mutator::new(sources, seed)?;
    let mut out = Vec::with_capacity(count.min(1 << 20) as usize);
    for i in 0..count {
        out.push(m.next(i, first_seq.saturating_add(i), byte_share));
    }
    Ok(out)
}

/// `frames` renumbered to follow a mutated stream: each frame that decodes and has a payload
/// `seq` gets `first_seq`, `first_seq + 1`, … (re-encoded canonically: otherwise the same bytes);
/// others are copied as they are. For the unmutated frames a test sends after mutated ones.
pub fn renumber(
    name: &str,
    frames: &[Vec<u8>],
    first_index: u64,
    first_seq: u64,
) -> Vec<(Vec<u8>, ManifestEntry)> {
    let mut out = Vec::with_capacity(frames.len());
    for (i, f) in frames.iter().enumerate() {
        let index = first_index + i as u64;
        let seq = first_seq.saturating_add(i as u64);
        let source = format!("{name}#{i}");
        let mut entry = ManifestEntry {
            index,
            seq: None,
            source: source.clone(),
            kind: String::new(),
            field: "none".into(),
            mutation: "none".into(),
            well_formed: true,
        };
        let Some(mut p) = parse(&source, f) else {
            entry.well_formed = false;
            out.push((f.clone(), entry));
            continue;
        };
        entry.kind = p.kind.clone();
        if let Some(v) = p.payload.get_mut("seq") {
            *v = OwnedValue::Int(seq.min(i64::MAX as u64) as i64);
            entry.seq = Some(seq);
        }
        let mut frame = OwnedValue::Map(p.header).to_cbor();
        OwnedValue::Map(p.payload).encode(&mut frame);
        out.push((frame, entry));
    }
    out
}

/// The state of one run: the decoded sources by kind, the RNG, the budget of mega strings.
struct Mutator {
    rng: ChaCha8Rng,
    by_kind: Vec<(String, Vec<Parsed>)>,
    /// Every DID seen in the sources (for "another account's DID").
    dids: Vec<String>,
    megas: usize,
    raw: Option<Vec<u8>>,
}

impl Mutator {
    fn new(sources: &[Source], seed: u64) -> Result<Mutator, String> {
        let mut by_kind: BTreeMap<String, Vec<Parsed>> = BTreeMap::new();
        let mut dids = Vec::new();
        for s in sources {
            for (i, f) in s.frames.iter().enumerate() {
                if let Some(p) = parse(&format!("{}#{i}", s.name), f) {
                    for k in ["did", "repo"] {
                        if let Some(OwnedValue::Text(d)) = p.payload.get(k) {
                            if dids.len() < 4096 && !dids.contains(d) {
                                dids.push(d.clone());
                            }
                        }
                    }
                    by_kind.entry(p.kind.clone()).or_default().push(p);
                }
            }
        }
        if by_kind.is_empty() {
            return Err("no source frame decodes as a header and a map payload".into());
        }
        Ok(Mutator {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x6d75_7461_7465),
            by_kind: by_kind.into_iter().collect(),
            dids,
            megas: 0,
            raw: None,
        })
    }

    fn next(&mut self, index: u64, seq: u64, byte_share: f64) -> (Vec<u8>, ManifestEntry) {
        // Kinds in turn, a random frame of the kind.
        let k = (index as usize) % self.by_kind.len();
        let n = self.by_kind[k].1.len();
        let p = self.by_kind[k].1[self.rng.gen_range(0..n)].clone();
        let mut entry = ManifestEntry {
            index,
            seq: None,
            source: p.source.clone(),
            kind: p.kind.clone(),
            field: String::new(),
            mutation: String::new(),
            well_formed: true,
        };
        let mut header = OwnedValue::Map(p.header);
        let mut payload = OwnedValue::Map(p.payload);
        self.raw = None;
        let bytes_level = self.rng.gen_bool(byte_share.clamp(0.0, 1.0));
        if !bytes_level {
            let (field, mutation) = self.field_mutation(&p.kind, &mut header, &mut payload);
            entry.field = field;
            entry.mutation = mutation;
        }
        if entry.field != "payload.seq" {
            if let OwnedValue::Map(m) = &mut payload {
                if let Some(v) = m.get_mut("seq") {
                    *v = OwnedValue::Int(seq.min(i64::MAX as u64) as i64);
                    entry.seq = Some(seq);
                }
            }
        }
        let mut frame = header.to_cbor();
        payload.encode(&mut frame);
        if let Some(raw) = self.raw.take() {
            let mut mark = Vec::new();
            write_text(&mut mark, RAW_MARK);
            if let Some(at) = find(&frame, &mark) {
                frame.splice(at..at + mark.len(), raw);
                entry.well_formed = false;
            }
        }
        if bytes_level {
            entry.field = "bytes".into();
            entry.mutation = self.byte_mutation(&mut frame);
            entry.well_formed = false;
            if entry.mutation.starts_with("truncate") || entry.mutation == "empty-frame" {
                entry.seq = None;
            }
        }
        (frame, entry)
    }

    /// Changes one field of the header, the payload or one op; returns (field, mutation).
    fn field_mutation(
        &mut self,
        kind: &str,
        header: &mut OwnedValue,
        payload: &mut OwnedValue,
    ) -> (String, String) {
        let mut targets: Vec<String> = vec!["header.t".into(), "header.op".into()];
        let OwnedValue::Map(pm) = &*payload else {
            return ("payload".into(), "none".into());
        };
        let mut names: Vec<&str> = known_fields(kind).to_vec();
        for k in pm.keys() {
            if !names.contains(&k.as_str()) {
                names.push(k);
            }
        }
        targets.extend(names.iter().map(|n| format!("payload.{n}")));
        let n_ops = match pm.get("ops") {
            Some(OwnedValue::Array(a)) => a.len(),
            _ => 0,
        };
        if n_ops > 0 {
            for f in ["action", "path", "cid", "prev"] {
                targets.push(format!("payload.ops[].{f}"));
            }
        }
        targets.push("payload".into());
        targets.push("header".into());
        let target = targets[self.rng.gen_range(0..targets.len())].clone();

        if target == "payload" || target == "header" {
            let (v, label) = self.whole_map();
            if target == "payload" {
                *payload = v;
            } else {
                *header = v;
            }
            return (target, label);
        }
        if let Some(f) = target.strip_prefix("header.") {
            let h = if f == "t" {
                Hint::HeaderT
            } else {
                Hint::HeaderOp
            };
            let old = header.get(f).cloned();
            let (change, label) = self.odd(h, old.as_ref());
            if let OwnedValue::Map(hm) = header {
                apply(hm, f, change);
            }
            return (target, label);
        }
        let OwnedValue::Map(pm) = payload else {
            return (target, "none".into());
        };
        if let Some(f) = target.strip_prefix("payload.ops[].") {
            let i = self.rng.gen_range(0..n_ops);
            let old = match pm.get("ops") {
                Some(OwnedValue::Array(a)) => match a.get(i) {
                    Some(OwnedValue::Map(op)) => op.get(f).cloned(),
                    _ => None,
                },
                _ => None,
            };
            let (change, label) = self.odd(hint(f), old.as_ref());
            if let Some(OwnedValue::Array(a)) = pm.get_mut("ops") {
                if let Some(OwnedValue::Map(op)) = a.get_mut(i) {
                    apply(op, f, change);
                }
            }
            return (format!("payload.ops[{i}].{f}"), label);
        }
        let f = target
            .strip_prefix("payload.")
            .unwrap_or(&target)
            .to_string();
        let (change, label) = self.odd(hint(&f), pm.get(&f));
        apply(pm, &f, change);
        (target, label)
    }

    /// A whole header or payload replaced: not a map, an empty map, an unknown key added.
    fn whole_map(&mut self) -> (OwnedValue, String) {
        match self.rng.gen_range(0..5) {
            0 => (OwnedValue::Map(BTreeMap::new()), "empty-map".into()),
            1 => (OwnedValue::Array(vec![]), "empty-array".into()),
            2 => (OwnedValue::Int(0), "int-0".into()),
            3 => (OwnedValue::Text(String::new()), "empty-text".into()),
            _ => (OwnedValue::Null, "null".into()),
        }
    }

    /// An odd value for a field holding `old` (if any), or its removal.
    fn odd(&mut self, h: Hint, old: Option<&OwnedValue>) -> (Change, String) {
        // Half the time a value odd for the field's meaning, else a generic one.
        if self.rng.gen_bool(0.5) {
            if let Some(c) = self.specific(h, old) {
                return c;
            }
        }
        self.generic(old)
    }

    fn pick<'a>(&mut self, list: &[&'a str]) -> &'a str {
        list[self.rng.gen_range(0..list.len())]
    }

    fn specific(&mut self, h: Hint, old: Option<&OwnedValue>) -> Option<(Change, String)> {
        let t = |s: &str| Change::Set(OwnedValue::Text(s.to_owned()));
        Some(match h {
            Hint::Did => match self.rng.gen_range(0..4) {
                0 if !self.dids.is_empty() => {
                    let d = self.dids[self.rng.gen_range(0..self.dids.len())].clone();
                    (t(&d), "did-other-account".into())
                }
                1 => (
                    t(&format!("did:plc:{}", "a".repeat(8192))),
                    "did-huge".into(),
                ),
                _ => {
                    let d = self.pick(&[
                        "",
                        "did:",
                        "did:plc:",
                        "did:plc",
                        "DID:PLC:ewvi7nxzyoun6zhxrhs64oiz",
                        "did:plc:ewvi7nxzyoun6zhxrhs64oiz ",
                        "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa",
                        "did:web:",
                        "did:web:localhost%3A1",
                        "did:web:127.0.0.1",
                        "did:key:zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme",
                        "did:plc:ü",
                        "did:plc:a\u{0}b",
                        "at://did:plc:ewvi7nxzyoun6zhxrhs64oiz",
                        "not a did",
                        "did:plc:../../etc/passwd",
                    ]);
                    (t(d), format!("did-invalid:{d:?}"))
                }
            },
            Hint::Time => {
                let s = self.pick(&[
                    "",
                    "not-a-time",
                    "9999-12-31T23:59:59.999Z",
                    "0000-01-01T00:00:00Z",
                    "1970-01-01T00:00:00Z",
                    "1969-12-31T23:59:59Z",
                    "2026-13-45T25:61:61Z",
                    "-001000-01-01T00:00:00Z",
                    "+275760-09-13T00:00:00Z",
                    "2026-07-01T00:00:00.123456789123456Z",
                    "2026-07-01T00:00:00+14:00",
                    "2026-07-01",
                    "2262-04-12T00:00:00Z",
                    "18446744073709551615",
                ]);
                (t(s), format!("time-odd:{s:?}"))
            }
            Hint::Seq => {
                let (v, l) = *[
                    (i64::MAX, "int-max"),
                    (-7, "int--7"),
                    (0, "int-0"),
                    (-1, "int--1"),
                    (i64::MIN, "int-min"),
                    ((1 << 53) + 1, "int-2^53+1"),
                    (1 << 32, "int-2^32"),
                    (1, "int-1"),
                ]
                .get(self.rng.gen_range(0..8))?;
                (Change::Set(OwnedValue::Int(v)), l.into())
            }
            Hint::Rev => {
                let s = self.pick(&[
                    "",
                    "2222222222222",
                    "zzzzzzzzzzzzz",
                    "7zzzzzzzzzzzz",
                    "not-a-tid",
                    "3kabcdefghijk0",
                    "3KABCDEFGHIJK",
                ]);
                (t(s), format!("rev-odd:{s:?}"))
            }
            Hint::Handle => {
                let s = self.pick(&[
                    "",
                    "handle.invalid",
                    "a",
                    "-bad-.example.com",
                    "UPPER.Example.COM",
                    "ü.example.com",
                    "xn--.example",
                    "a..b",
                    "localhost",
                ]);
                (t(s), format!("handle-odd:{s:?}"))
            }
            Hint::Status => {
                let s = self.pick(&[
                    "",
                    "deleted",
                    "takendown",
                    "suspended",
                    "deactivated",
                    "throttled",
                    "desynchronized",
                    "unknown-status",
                ]);
                (t(s), format!("status:{s:?}"))
            }
            Hint::Bool => {
                let b = !matches!(old, Some(OwnedValue::Bool(true)));
                (Change::Set(OwnedValue::Bool(b)), format!("bool-{b}"))
            }
            Hint::Link => match self.rng.gen_range(0..3) {
                0 => (
                    Change::Set(OwnedValue::Link(CidBuf::sha256(
                        DAG_CBOR,
                        b"riptide-mutate",
                    ))),
                    "link-unknown-block".into(),
                ),
                1 => (
                    Change::Set(OwnedValue::Link(CidBuf::sha256(RAW, b"riptide-mutate"))),
                    "link-raw-codec".into(),
                ),
                _ => (Change::Set(OwnedValue::Null), "null".into()),
            },
            Hint::Blocks => {
                let car = match old {
                    Some(OwnedValue::Bytes(b)) => b.clone(),
                    _ => Vec::new(),
                };
                match self.rng.gen_range(0..5) {
                    0 if car.len() > 1 => {
                        let at = self.rng.gen_range(1..car.len());
                        (
                            Change::Set(OwnedValue::Bytes(car[..at].to_vec())),
                            format!("blocks-cut-at-{at}"),
                        )
                    }
                    1 if car.len() > 40 => {
                        // The CAR header and the start of the first block only.
                        let at = (car[0] as usize + 1 + 4).min(car.len());
                        (
                            Change::Set(OwnedValue::Bytes(car[..at].to_vec())),
                            "blocks-header-only".into(),
                        )
                    }
                    2 => (
                        Change::Set(OwnedValue::Bytes(Vec::new())),
                        "empty-bytes".into(),
                    ),
                    3 if !car.is_empty() => {
                        let mut c = car.clone();
                        let i = self.rng.gen_range(0..c.len());
                        c[i] ^= 1 << self.rng.gen_range(0..8);
                        (
                            Change::Set(OwnedValue::Bytes(c)),
                            format!("blocks-bit-flip-at-{i}"),
                        )
                    }
                    _ => {
                        let mut c = car.clone();
                        c.extend_from_slice(&[0x05, 0xff, 0xff, 0xff, 0xff, 0xff]);
                        (
                            Change::Set(OwnedValue::Bytes(c)),
                            "blocks-trailing-garbage".into(),
                        )
                    }
                }
            }
            Hint::Ops | Hint::Blobs => {
                let items = match old {
                    Some(OwnedValue::Array(a)) => a.clone(),
                    _ => Vec::new(),
                };
                match self.rng.gen_range(0..5) {
                    0 => (Change::Set(OwnedValue::Array(vec![])), "empty-array".into()),
                    1 if !items.is_empty() => {
                        let first = items[0].clone();
                        (
                            Change::Set(OwnedValue::Array(vec![first; 201])),
                            "array-201-copies".into(),
                        )
                    }
                    2 if !items.is_empty() => {
                        let mut a = items.clone();
                        a.push(items[0].clone());
                        (Change::Set(OwnedValue::Array(a)), "array-item-twice".into())
                    }
                    3 => (
                        Change::Set(OwnedValue::Array(vec![
                            OwnedValue::Null,
                            OwnedValue::Int(-7),
                            OwnedValue::Text(String::new()),
                        ])),
                        "array-of-odd-items".into(),
                    ),
                    _ => {
                        let mut op = BTreeMap::new();
                        op.insert("action".into(), OwnedValue::Text("create".into()));
                        op.insert("path".into(), OwnedValue::Text(String::new()));
                        op.insert("cid".into(), OwnedValue::Null);
                        (
                            Change::Set(OwnedValue::Array(vec![OwnedValue::Map(op)])),
                            "array-op-empty-path-null-cid".into(),
                        )
                    }
                }
            }
            Hint::Path => {
                let long = format!("app.bsky.feed.post/{}", "x".repeat(1000));
                let s = match self.rng.gen_range(0..14) {
                    13 => long.as_str(),
                    i => [
                        "",
                        "/",
                        "app.bsky.feed.post",
                        "app.bsky.feed.post/",
                        "/3kabc",
                        "a/b/c",
                        "app.bsky.feed.post/..",
                        "app.bsky.feed.post/ü",
                        "app.bsky.feed.post/a\u{0}b",
                        "../../etc/passwd",
                        "app.bsky.feed.post/self/extra",
                        "APP.BSKY.FEED.POST/x",
                        "app.bsky.feed.post/.",
                    ][i],
                };
                let label = format!("path-odd:{:?}", &s[..s.len().min(40)]);
                (t(s), label)
            }
            Hint::Action => {
                let s = self.pick(&["", "create", "update", "delete", "frobnicate", "CREATE"]);
                (t(s), format!("action:{s:?}"))
            }
            Hint::HeaderT => {
                let s = self.pick(&[
                    "#commit",
                    "#sync",
                    "#identity",
                    "#account",
                    "#info",
                    "#handle",
                    "#tombstone",
                    "#futureType",
                    "commit",
                    "",
                ]);
                (t(s), format!("t:{s:?}"))
            }
            Hint::HeaderOp => {
                let (v, l) = *[
                    (-1, "op--1"),
                    (0, "op-0"),
                    (2, "op-2"),
                    (-7, "op--7"),
                    (i64::MAX, "op-int-max"),
                ]
                .get(self.rng.gen_range(0..5))?;
                (Change::Set(OwnedValue::Int(v)), l.into())
            }
            Hint::Other => return None,
        })
    }

    /// A value odd for any field: empty, huge, of another type, removed, extreme, non-UTF-8.
    fn generic(&mut self, old: Option<&OwnedValue>) -> (Change, String) {
        let set = Change::Set;
        match self.rng.gen_range(0..22) {
            0 => (Change::Remove, "missing".into()),
            1 => (set(OwnedValue::Null), "null".into()),
            2 => (set(OwnedValue::Bool(true)), "bool-true".into()),
            3 => (set(OwnedValue::Int(0)), "int-0".into()),
            4 => (set(OwnedValue::Int(-7)), "int--7".into()),
            5 => (set(OwnedValue::Int(i64::MAX)), "int-max".into()),
            6 => (set(OwnedValue::Int(i64::MIN)), "int-min".into()),
            7 => (set(OwnedValue::Text(String::new())), "empty-text".into()),
            8 => (set(OwnedValue::Text("x".repeat(HUGE))), "huge-text".into()),
            9 if self.megas < MAX_MEGA => {
                self.megas += 1;
                (set(OwnedValue::Text("y".repeat(MEGA))), "mega-text".into())
            }
            10 => (
                set(OwnedValue::Text("a\u{0}\u{202e}\u{fffd}😀".into())),
                "text-nul-bidi-emoji".into(),
            ),
            11 => {
                // Text whose bytes are not UTF-8: not DAG-CBOR (a strict decoder refuses it).
                let mut raw = Vec::new();
                write_head(&mut raw, 3, 4);
                raw.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28]);
                self.raw = Some(raw);
                (
                    set(OwnedValue::Text(RAW_MARK.into())),
                    "non-utf8-text".into(),
                )
            }
            12 => (
                set(OwnedValue::Bytes(vec![0xff, 0xfe, 0x00])),
                "bytes-not-text".into(),
            ),
            13 => (set(OwnedValue::Bytes(Vec::new())), "empty-bytes".into()),
            14 => (set(OwnedValue::Array(vec![])), "empty-array".into()),
            15 => (set(OwnedValue::Map(BTreeMap::new())), "empty-map".into()),
            16 => (
                set(OwnedValue::Link(CidBuf::sha256(DAG_CBOR, b"x"))),
                "link".into(),
            ),
            17 => {
                let mut m = BTreeMap::new();
                m.insert("$type".into(), OwnedValue::Text("x".into()));
                m.insert("v".into(), old.cloned().unwrap_or(OwnedValue::Null));
                (set(OwnedValue::Map(m)), "wrapped-in-map".into())
            }
            18 => (
                set(OwnedValue::Array(vec![old
                    .cloned()
                    .unwrap_or(OwnedValue::Null)])),
                "wrapped-in-array".into(),
            ),
            19 => (set(OwnedValue::Int(1 << 40)), "int-2^40".into()),
            20 => (
                set(OwnedValue::Text("\u{7f}".repeat(256))),
                "text-control-chars".into(),
            ),
            _ => (set(OwnedValue::Text("true".into())), "text-true".into()),
        }
    }

    /// Damages the encoded frame: returns the label.
    fn byte_mutation(&mut self, frame: &mut Vec<u8>) -> String {
        let len = frame.len();
        if len == 0 {
            return "none".into();
        }
        // Mostly near the start (header, payload fields), sometimes anywhere.
        let span = if self.rng.gen_bool(0.7) {
            len.min(160)
        } else {
            len
        };
        let at = self.rng.gen_range(0..span);
        match self.rng.gen_range(0..9) {
            0 => {
                let n = self.rng.gen_range(1..=4);
                for _ in 0..n {
                    let i = self.rng.gen_range(0..span);
                    frame[i] ^= 1 << self.rng.gen_range(0..8);
                }
                format!("bit-flip-x{n}-near-{at}")
            }
            1 => {
                let b = *[0x00u8, 0xff, 0x7f, 0x80, 0x1b, 0x5f, 0xbf, 0xf6, 0xd8]
                    .get(self.rng.gen_range(0..9))
                    .unwrap_or(&0);
                frame[at] = b;
                format!("set-byte-{b:#04x}-at-{at}")
            }
            2 => {
                frame.truncate(at);
                format!("truncate-at-{at}")
            }
            3 => {
                let n = self.rng.gen_range(1..=8);
                let ins: Vec<u8> = (0..n).map(|_| self.rng.gen()).collect();
                frame.splice(at..at, ins);
                format!("insert-{n}-at-{at}")
            }
            4 => {
                let n = self.rng.gen_range(1..=8).min(len - at);
                frame.drain(at..at + n);
                format!("delete-{n}-at-{at}")
            }
            5 => {
                let n = self.rng.gen_range(1..=16).min(len - at);
                let dup = frame[at..at + n].to_vec();
                frame.splice(at..at, dup);
                format!("duplicate-{n}-at-{at}")
            }
            6 => {
                frame.extend_from_slice(&[0xa1, 0x61, b'x', 0x01]);
                "trailing-item".into()
            }
            7 if self.rng.gen_bool(0.2) => {
                frame.clear();
                "empty-frame".into()
            }
            _ => {
                // A head's length made huge (claims far more bytes than there are).
                frame[at] = (frame[at] & 0xe0) | 0x1b;
                format!("huge-length-head-at-{at}")
            }
        }
    }
}

fn apply(map: &mut BTreeMap<String, OwnedValue>, field: &str, change: Change) {
    match change {
        Change::Set(v) => {
            map.insert(field.to_string(), v);
        }
        Change::Remove => {
            map.remove(field);
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Decodes a frame's header and payload (strict DAG-CBOR; blocks not looked into).
fn parse(source: &str, frame: &[u8]) -> Option<Parsed> {
    let mut arena = Arena::new();
    let mut tape = arena.tape(frame);
    let opts = Options::strict();
    let (h, stop) = tape.decode_prefix(0..frame.len(), &opts).ok()?;
    let p = tape.decode(stop..frame.len(), &opts).ok()?;
    let header = match OwnedValue::from_value(tape.value(h)).ok()? {
        OwnedValue::Map(m) => m,
        _ => return None,
    };
    let payload = match OwnedValue::from_value(tape.value(p)).ok()? {
        OwnedValue::Map(m) => m,
        _ => return None,
    };
    let kind = match header.get("t") {
        Some(OwnedValue::Text(t)) => t.clone(),
        _ => return None,
    };
    Some(Parsed {
        source: source.to_string(),
        kind,
        header,
        payload,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use riptide_firehose::encode::write_message_header;

    fn frame(t: &str, payload: &[(&str, OwnedValue)]) -> Vec<u8> {
        let mut out = Vec::new();
        write_message_header(&mut out, t);
        let m: BTreeMap<String, OwnedValue> = payload
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        OwnedValue::Map(m).encode(&mut out);
        out
    }

    fn sources() -> Vec<Source> {
        let txt = |s: &str| OwnedValue::Text(s.into());
        vec![Source {
            name: "t".into(),
            frames: vec![
                frame(
                    "#account",
                    &[
                        ("seq", OwnedValue::Int(5)),
                        ("did", txt("did:plc:ewvi7nxzyoun6zhxrhs64oiz")),
                        ("time", txt("2026-07-01T00:00:00Z")),
                        ("active", OwnedValue::Bool(true)),
                    ],
                ),
                frame(
                    "#identity",
                    &[
                        ("seq", OwnedValue::Int(6)),
                        ("did", txt("did:plc:ewvi7nxzyoun6zhxrhs64oiz")),
                        ("time", txt("2026-07-01T00:00:00Z")),
                        ("handle", txt("a.example.com")),
                    ],
                ),
            ],
        }]
    }

    #[test]
    fn deterministic_and_labelled() {
        let a = mutate(&sources(), 7, 500, 1, 0.3).unwrap();
        let b = mutate(&sources(), 7, 500, 1, 0.3).unwrap();
        assert_eq!(a, b);
        let c = mutate(&sources(), 8, 500, 1, 0.3).unwrap();
        assert_ne!(a, c);
        for (i, (_, e)) in a.iter().enumerate() {
            assert_eq!(e.index, i as u64);
            assert!(!e.field.is_empty() && !e.mutation.is_empty(), "{e:?}");
        }
        // Both kinds, byte-level and field-level, every known field of #account touched.
        let kinds: std::collections::BTreeSet<&str> =
            a.iter().map(|(_, e)| e.kind.as_str()).collect();
        assert_eq!(kinds.len(), 2);
        assert!(a.iter().any(|(_, e)| e.field == "bytes"));
        for f in known_fields("#account") {
            let want = format!("payload.{f}");
            assert!(
                a.iter().any(|(_, e)| e.field == want),
                "{want} never mutated"
            );
        }
    }

    #[test]
    fn field_mutations_stay_well_formed_and_renumber() {
        let out = mutate(&sources(), 1, 2000, 100, 0.0).unwrap();
        let mut seen_empty_did = false;
        for (f, e) in &out {
            let p = parse("x", f);
            if e.well_formed && !e.field.starts_with("header") && e.field != "payload" {
                let p = p.unwrap_or_else(|| panic!("not well-formed: {e:?}"));
                if e.field != "payload.seq" {
                    if let Some(s) = e.seq {
                        assert_eq!(p.payload.get("seq"), Some(&OwnedValue::Int(s as i64)));
                        assert_eq!(s, 100 + e.index);
                    }
                }
                if e.kind == "#account"
                    && p.payload.get("did") == Some(&OwnedValue::Text(String::new()))
                {
                    seen_empty_did = true;
                }
            }
            if e.mutation == "non-utf8-text" {
                assert!(!e.well_formed);
                assert!(find(f, &[0xff, 0xfe, 0xc3, 0x28]).is_some());
            }
        }
        assert!(
            seen_empty_did,
            "the #account empty-DID frame (issue 40) is made"
        );
    }

    #[test]
    fn renumbered_frames_change_only_their_seq() {
        let s = sources();
        let out = renumber("t", &s[0].frames, 10, 500);
        assert_eq!(out.len(), 2);
        for (i, (f, e)) in out.iter().enumerate() {
            assert_eq!(
                (e.index, e.seq, e.mutation.as_str()),
                (10 + i as u64, Some(500 + i as u64), "none")
            );
            let mut p = parse("x", f).unwrap();
            let mut q = parse("x", &s[0].frames[i]).unwrap();
            p.payload.remove("seq");
            q.payload.remove("seq");
            assert_eq!(p.payload, q.payload);
        }
    }

    #[test]
    fn no_source_is_an_error() {
        let s = vec![Source {
            name: "x".into(),
            frames: vec![vec![0xff], Vec::new()],
        }];
        assert!(mutate(&s, 1, 1, 1, 0.5).is_err());
    }
}
