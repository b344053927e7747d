//! The planner over Jetstream's golden `.jss` files and a many-DID segment, against a second
//! planner written here from the lexicon and Jetstream's `plan.go` over the independent
//! decoder (`common::independent`: its own bloom test, its own collection bitmaps), and against
//! the rows themselves: no block holding a wanted row is ever left out.

#![allow(clippy::unwrap_used)]

mod common;

use common::independent::{self, bloom_has, IFile};
use riptide_segment::plan::{plan, Mode, PlanRequest};
use riptide_segment::{write_segment, Kind, Row, SegmentMeta, HEADER_BYTES};

fn golden(name: &str) -> Option<Vec<u8>> {
    riptide_testdata::read(&format!("jetstream-v2/segments/{name}"))
}

/// A request in the lexicon's terms.
#[derive(Clone, Debug, Default)]
struct Q {
    kinds: Vec<&'static str>,
    dids: Vec<String>,
    cols: Vec<String>,
    after: Option<u64>,
    before: Option<u64>,
}

fn kind_name(k: u8) -> &'static str {
    match k {
        1 | 2 | 3 | 7 => "commit",
        4 => "identity",
        5 => "account",
        _ => "sync",
    }
}

fn sentinel_kind(c: &str) -> Option<&'static str> {
    match c {
        "$identity" => Some("identity"),
        "$account" => Some("account"),
        "$sync" => Some("sync"),
        _ => None,
    }
}

fn col_wanted(q: &Q, c: &str) -> bool {
    q.cols.is_empty()
        || q.cols.iter().any(|w| match w.strip_suffix('*') {
            Some(prefix) => c.starts_with(prefix),
            None => w == c,
        })
}

/// The second planner: which blocks of `f` the request selects (bitmaps and blooms read by the
/// independent decoder).
fn expected_blocks(f: &IFile, q: &Q) -> Vec<usize> {
    let admits = |k: &str| q.kinds.is_empty() || q.kinds.contains(&k);
    let seg_ok = q.dids.is_empty()
        || f.seg_bloom.is_empty()
        || q.dids.iter().any(|d| bloom_has(&f.seg_bloom, d.as_bytes()));
    if !seg_ok {
        return Vec::new();
    }
    let filtered = !q.kinds.is_empty() || !q.cols.is_empty();
    (0..f.blocks.len())
        .filter(|&i| {
            let b = &f.blocks[i];
            b.count > 0
                && q.after.is_none_or(|a| b.seq.1 > a)
                && q.before.is_none_or(|z| b.seq.0 <= z)
                && (!filtered
                    || f.block_collections[i]
                        .iter()
                        .any(|c| match sentinel_kind(c) {
                            Some(k) => admits(k),
                            None => admits("commit") && col_wanted(q, c),
                        }))
                && (q.dids.is_empty()
                    || q.dids.iter().any(|d| {
                        (f.seg_bloom.is_empty() || bloom_has(&f.seg_bloom, d.as_bytes()))
                            && bloom_has(&f.block_blooms[i], d.as_bytes())
                    }))
        })
        .collect()
}

/// Whether a decoded row is one the request asks for (exactly, as a client filters).
fn row_wanted(q: &Q, r: &independent::IRow) -> bool {
    let kind = kind_name(r.kind);
    (q.kinds.is_empty() || q.kinds.contains(&kind))
        && (q.dids.is_empty() || q.dids.iter().any(|d| d.as_bytes() == r.did.as_slice()))
        && (kind != "commit" || col_wanted(q, std::str::from_utf8(&r.collection).unwrap()))
        && q.after.is_none_or(|a| r.seq > a)
        && q.before.is_none_or(|z| r.seq <= z)
}

/// Plans `q` over one file and checks it against both oracles.
fn check(file: &[u8], q: &Q) {
    let f = independent::decode(file).unwrap();
    let meta = SegmentMeta::from_file(file).unwrap();
    let req = PlanRequest::new(&q.kinds, &q.dids, &q.cols, q.after, q.before).unwrap();
    let p = plan([(3, &meta)], &req, 0);
    let want = expected_blocks(&f, q);
    let got: Vec<usize> = match p.segments.as_slice() {
        [] => Vec::new(),
        [s] => {
            assert_eq!(s.checksum, f.stored_checksum);
            assert_eq!((s.index, s.min_seq, s.max_seq), (3, f.seq.0, f.seq.1));
            match s.mode {
                Mode::Segment => {
                    assert!(want.len() * 4 >= f.blocks.len() * 3, "{q:?}: {want:?}");
                    want.clone()
                }
                Mode::Blocks => {
                    assert!(want.len() * 4 < f.blocks.len() * 3, "{q:?}: {want:?}");
                    s.blocks
                        .iter()
                        .flat_map(|r| r.first as usize..=r.last as usize)
                        .collect()
                }
            }
        }
        more => panic!("one segment planned as {}", more.len()),
    };
    assert_eq!(got, want, "{q:?}");
    assert_eq!(p.stats.blocks_matched, want.len() as u64);
    let tip = q.before.map_or(f.seq.1, |b| b.min(f.seq.1));
    assert_eq!((p.sealed_tip_seq, p.planned_through_seq), (tip, tip));
    // No false negatives: every block holding a wanted row is planned.
    for (i, b) in f.blocks.iter().enumerate() {
        if b.rows.iter().any(|r| row_wanted(q, r)) {
            assert!(got.contains(&i), "{q:?}: block {i} holds a wanted row");
        }
    }
}

/// Requests made from what a file holds: every DID, every collection and its namespace, every
/// kind, windows at each block boundary, and a DID that is not there.
fn requests(f: &IFile) -> Vec<Q> {
    let mut qs = vec![Q::default()];
    let mut dids: Vec<String> = f
        .blocks
        .iter()
        .flat_map(|b| b.rows.iter())
        .map(|r| String::from_utf8(r.did.clone()).unwrap())
        .filter(|d| !d.is_empty())
        .collect();
    dids.sort();
    dids.dedup();
    for d in dids.iter().take(40) {
        qs.push(Q {
            dids: vec![d.clone()],
            ..Q::default()
        });
    }
    qs.push(Q {
        dids: vec!["did:plc:notinthisfileatall0000".into()],
        ..Q::default()
    });
    for (c, _) in &f.collections {
        if c.starts_with('$') {
            continue;
        }
        let ns = format!("{}.*", &c[..c.rfind('.').unwrap()]);
        for cols in [vec![c.clone()], vec![ns]] {
            qs.push(Q {
                cols: cols.clone(),
                ..Q::default()
            });
            qs.push(Q {
                kinds: vec!["commit"],
                cols,
                dids: dids.iter().take(2).cloned().collect(),
                ..Q::default()
            });
        }
    }
    for k in ["commit", "identity", "account", "sync"] {
        qs.push(Q {
            kinds: vec![k],
            ..Q::default()
        });
    }
    for b in &f.blocks {
        qs.push(Q {
            after: Some(b.seq.0),
            ..Q::default()
        });
        qs.push(Q {
            before: Some(b.seq.1),
            ..Q::default()
        });
    }
    qs
}

#[test]
fn golden_files_plan_as_the_second_planner_does() {
    for name in [
        "golden_corpus_segment.jss",
        "legacy_fixed4096_blooms.jss",
        "golden_seal.bin",
    ] {
        let Some(file) = golden(name) else { return };
        let f = independent::decode(&file).unwrap();
        for q in requests(&f) {
            check(&file, &q);
        }
    }
}

/// Metadata from the header and footer alone equals the whole file's, and the checksum still
/// guards it.
#[test]
fn metadata_from_header_and_footer_only() {
    let Some(file) = golden("golden_corpus_segment.jss") else {
        return;
    };
    let f = independent::decode(&file).unwrap();
    let footer = file[f.offsets[0] as usize..].to_vec();
    let meta = SegmentMeta::from_parts(&file[..HEADER_BYTES], footer.clone()).unwrap();
    assert_eq!(meta.file_len(), file.len() as u64);
    assert_eq!(meta.header().checksum, f.stored_checksum);
    assert_eq!(meta.blocks().len(), f.blocks.len());
    for (b, i) in meta.blocks().iter().zip(&f.blocks) {
        assert_eq!(
            (b.offset, b.min_seq, b.max_seq),
            (i.offset, i.seq.0, i.seq.1)
        );
    }
    let mut bad = footer.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    assert!(SegmentMeta::from_parts(&file[..HEADER_BYTES], bad).is_err());
    assert!(SegmentMeta::from_parts(&file[..HEADER_BYTES], footer[1..].to_vec()).is_err());
    assert!(SegmentMeta::from_parts(&file[..100], footer).is_err());
}

/// Ten blocks of 300 rows by 1,000 DIDs over eight collections and the marker kinds: real bloom
/// sizes, false positives possible, none negative.
#[test]
fn a_many_did_segment_plans_as_the_second_planner_does() {
    let dids: Vec<String> = (0..1000).map(|i| format!("did:plc:user{i:020}")).collect();
    let cols = [
        "app.bsky.feed.post",
        "app.bsky.feed.like",
        "app.bsky.graph.follow",
        "app.bsky.graph.block",
        "app.bsky.actor.profile",
        "com.example.thing",
        "com.example.other.deep",
        "fyi.unravel.frontpage.post",
    ];
    let mut blocks: Vec<Vec<Row<'_>>> = Vec::new();
    let mut seq = 1000;
    for b in 0..10usize {
        let mut rows = Vec::new();
        for r in 0..300usize {
            seq += 1 + (r % 3) as u64;
            let n = (b * 7919 + r * 104_729) % 1000;
            // Block b draws from its own slice of DIDs and collections, so filters discriminate.
            let did = &dids[(n % 100) + 100 * b];
            let kind = match r % 50 {
                0 => Kind::Identity,
                1 if b % 3 == 0 => Kind::Account,
                2 if b == 4 => Kind::Sync,
                3 => Kind::Delete,
                _ => Kind::Create,
            };
            let collection = if kind.is_commit() {
                cols[(b + r % 2) % cols.len()]
            } else {
                ""
            };
            rows.push(Row {
                seq,
                witnessed_at: seq as i64,
                indexed_at: 0,
                kind,
                did,
                collection,
                rkey: if kind.is_commit() { "3kabc" } else { "" },
                rev: if kind.is_commit() { "3labc" } else { "" },
                payload: b"\xa1ax\x01",
            });
        }
        blocks.push(rows);
    }
    let refs: Vec<&[Row<'_>]> = blocks.iter().map(Vec::as_slice).collect();
    let file = write_segment(&refs).unwrap();
    let f = independent::decode(&file).unwrap();
    let mut qs = requests(&f);
    // Many DIDs at once, spread over a few blocks.
    qs.push(Q {
        dids: dids[200..260].to_vec(),
        ..Q::default()
    });
    qs.push(Q {
        dids: (0..2000)
            .map(|i| format!("did:web:absent{i}.example"))
            .collect(),
        ..Q::default()
    });
    for q in qs {
        check(&file, &q);
    }
    // Not vacuous: one DID is one block, a window of two blocks is two.
    let meta = SegmentMeta::from_file(&file).unwrap();
    let one =
        PlanRequest::new(&[] as &[&str], &dids[300..301], &[] as &[&str], None, None).unwrap();
    let p = plan([(0, &meta)], &one, 0);
    assert_eq!(p.segments[0].mode, Mode::Blocks);
    assert_eq!(p.stats.blocks_matched, 1);
}

/// A folded segment (issue 38's compaction) plans as the second planner says: emptied blocks
/// (`event_count` 0, envelope kept) are never planned, thinned ones only for what they still
/// hold, and a segment folded to nothing plans nothing.
#[test]
fn folded_segments_plan_as_the_second_planner_does() {
    let Some(file) = golden("golden_corpus_segment.jss") else {
        return;
    };
    let seg = riptide_segment::Segment::open(&file).unwrap();
    let first_block_max = seg.blocks()[0].max_seq;
    // Fold away the first block's record rows and every third record row after it.
    let folded =
        riptide_segment::compact_segment(&seg, |r| r.seq <= first_block_max || r.seq % 3 == 0)
            .unwrap()
            .unwrap();
    let f = independent::decode(&folded).unwrap();
    assert!(f.blocks.iter().any(|b| b.count == 0), "a block emptied");
    assert!(f.blocks.iter().any(|b| b.count > 0), "a block left");
    for q in requests(&independent::decode(&file).unwrap()) {
        check(&folded, &q);
    }
    // Everything folded away: nothing to plan, whatever the request.
    let empty = riptide_segment::compact_segment(&seg, |_| true)
        .unwrap()
        .unwrap();
    let meta = SegmentMeta::from_file(&empty).unwrap();
    assert!(meta.blocks().iter().all(|b| b.event_count == 0));
    let none: [&str; 0] = [];
    let req = PlanRequest::new(&none, &none, &none, None, None).unwrap();
    assert!(plan([(3, &meta)], &req, 0).segments.is_empty());
}
