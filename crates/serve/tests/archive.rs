//! The archive endpoints over real HTTP on loopback: segments written from the real capture's
//! events (`riptide_jetstream::rows`), Jetstream's golden `.jss` files copied into a temporary
//! directory, and files made to be exactly 8 MiB, damaged or renamed under the server.
//!
//! The client is a few lines of HTTP/1.1 over a socket (below), so that every status, header and
//! byte the server sends is what the test sees. Expected bytes come from the files on disk;
//! block frames are located with a block index parsed here from the format's description, not
//! with the server's reader.

#![allow(clippy::unwrap_used)]

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use riptide_segment::plan::{self, PlanRequest};
use riptide_segment::{
    decode_block_frame, segment_name, write_segment, OwnedRow, Row, SegmentMeta,
};
use riptide_serve::archive::{Archive, ArchiveConfig, Quota, SealedSegments};
use riptide_serve::{App, Metrics, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PREFIX: &str = "/xrpc/network.bsky.jetstream.";

/// A response as it came off the wire.
#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!("{e}: {}", String::from_utf8_lossy(&self.body));
        })
    }
    /// The XRPC error name of an error response.
    fn error(&self) -> String {
        self.json()["error"].as_str().unwrap().to_owned()
    }
}

/// One HTTP/1.1 request (`Connection: close`); the whole response.
async fn http(
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        req.push_str(&format!(
            "Content-Length: {}\r\nContent-Type: application/json\r\n",
            body.len()
        ));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    s.write_all(body).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), s.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = std::str::from_utf8(&raw[..end]).unwrap();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .map(|l| {
            let (k, v) = l.split_once(':').unwrap();
            (k.trim().to_owned(), v.trim().to_owned())
        })
        .collect();
    Resp {
        status,
        headers,
        body: raw[end + 4..].to_vec(),
    }
}

async fn get(addr: SocketAddr, target: &str, headers: &[(&str, &str)]) -> Resp {
    http(addr, "GET", target, headers, b"").await
}

/// The capture's 152 events as rows, seqs 1..=152, as `riptide corpus segments` makes them.
fn corpus_rows() -> Option<Vec<OwnedRow>> {
    let file = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin")?;
    let frames = riptide_firehose::corpus::split_frames(&file).unwrap();
    let mut dec = riptide_firehose::FrameDecoder::new();
    let mut proj = riptide_jetstream::Projector::new();
    let mut rows = Vec::new();
    for f in &frames {
        let frame = dec.decode(f.bytes).unwrap();
        let riptide_jetstream::rows::FrameRows { rows: got, drops } =
            riptide_jetstream::rows::frame_rows(&mut proj, &frame).unwrap();
        assert!(drops.is_empty());
        for r in got {
            let seq = rows.len() as u64 + 1;
            let row = Row {
                seq,
                witnessed_at: 1_783_123_200_000_000 + seq as i64,
                ..r
            };
            rows.push(row.to_owned_row());
        }
    }
    assert_eq!(rows.len(), 152);
    Some(rows)
}

/// Writes `rows` as segment `index` of `block_rows`-row blocks; the file's bytes.
fn write(dir: &Path, index: u64, rows: &[OwnedRow], block_rows: usize) -> Vec<u8> {
    let blocks: Vec<Vec<Row<'_>>> = rows
        .chunks(block_rows)
        .map(|b| b.iter().map(OwnedRow::as_row).collect())
        .collect();
    let refs: Vec<&[Row<'_>]> = blocks.iter().map(Vec::as_slice).collect();
    let bytes = write_segment(&refs).unwrap();
    std::fs::write(dir.join(segment_name(index)), &bytes).unwrap();
    bytes
}

/// The capture in four segments of five 8-row blocks (the last has four blocks): the files.
fn capture_segments(dir: &Path) -> Option<(Vec<OwnedRow>, Vec<Vec<u8>>)> {
    let rows = corpus_rows()?;
    let files = rows
        .chunks(40)
        .enumerate()
        .map(|(i, c)| write(dir, i as u64, c, 8))
        .collect();
    Some((rows, files))
}

/// A server whose archive is `dir` (scanned now); the log's directory lives with the guard.
async fn serve(dir: &Path, config: ArchiveConfig) -> (SocketAddr, Arc<App>, tempfile::TempDir) {
    let logdir = tempfile::tempdir().unwrap();
    let log = common::open_log(logdir.path());
    let archive = Arc::new(Archive::new(
        Arc::new(SealedSegments::scan(dir).unwrap()),
        config,
    ));
    let app = App::new(
        log,
        Arc::new(Metrics::default()),
        ServerConfig {
            archive: Some(archive),
            ..ServerConfig::default()
        },
    );
    (common::listen(app.clone()).await, app, logdir)
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Block `i`'s bare frame, located from the header (footer offset at 58, block count at 14)
/// and the 52-byte index entries (offset, then u32 compressed size).
fn frame_of(file: &[u8], i: usize) -> &[u8] {
    let footer = le64(file, 58) as usize;
    let e = footer + 52 * i;
    let off = le64(file, e) as usize;
    let size = u32::from_le_bytes(file[e + 8..e + 12].try_into().unwrap()) as usize;
    &file[off + 8..off + 8 + size]
}

fn etag_of(file: &[u8]) -> String {
    format!("\"{:016x}\"", le64(file, 4))
}

#[tokio::test]
async fn segments_are_listed_and_served_with_ranges_and_validators() {
    let dir = tempfile::tempdir().unwrap();
    let Some((rows, files)) = capture_segments(dir.path()) else {
        return;
    };
    let (addr, app, _g) = serve(dir.path(), ArchiveConfig::default()).await;

    // listSegments: pages, every field from the file itself.
    let r = get(addr, &format!("{PREFIX}listSegments?limit=3"), &[]).await;
    assert_eq!(r.status, 200);
    let page = r.json();
    assert_eq!(page["segments"].as_array().unwrap().len(), 3);
    assert_eq!(page["cursor"], "3");
    let r = get(addr, &format!("{PREFIX}listSegments?limit=3&cursor=3"), &[]).await;
    let last = r.json();
    assert_eq!(last["segments"].as_array().unwrap().len(), 1);
    assert!(last.get("cursor").is_none());
    let all = get(addr, &format!("{PREFIX}listSegments?limit=5000"), &[])
        .await
        .json();
    let listed = all["segments"].as_array().unwrap();
    assert_eq!(listed.len(), 4);
    let mut seq = 0;
    for (i, (s, f)) in listed.iter().zip(&files).enumerate() {
        assert_eq!(s["name"], segment_name(i as u64));
        assert_eq!(s["index"], i);
        assert_eq!(s["sizeBytes"], f.len());
        assert_eq!(
            format!("\"{}\"", s["checksum"].as_str().unwrap()),
            etag_of(f)
        );
        assert_eq!(s["minSeq"], seq + 1);
        let n = s["eventCount"].as_u64().unwrap();
        seq += n;
        assert_eq!(s["maxSeq"], seq);
        assert_eq!(
            s["minWitnessedAt"],
            rows[(s["minSeq"].as_u64().unwrap() - 1) as usize].witnessed_at
        );
        assert_eq!(s["maxWitnessedAt"], rows[(seq - 1) as usize].witnessed_at);
    }
    assert_eq!(seq, 152);
    for bad in [
        "limit=0",
        "limit=-1",
        "limit=x",
        "cursor=abc",
        "limit=1&limit=2",
    ] {
        let r = get(addr, &format!("{PREFIX}listSegments?{bad}"), &[]).await;
        assert_eq!(
            (r.status, r.error().as_str()),
            (400, "InvalidRequest"),
            "{bad}"
        );
    }

    // getSegment: the whole file, ranges, conditionals, HEAD.
    let f = &files[1];
    let len = f.len();
    let url = format!("{PREFIX}getSegment?name={}", segment_name(1));
    let tag = etag_of(f);
    let r = get(addr, &url, &[]).await;
    assert_eq!((r.status, r.body.as_slice()), (200, f.as_slice()));
    assert_eq!(r.header("etag"), Some(tag.as_str()));
    assert_eq!(r.header("accept-ranges"), Some("bytes"));
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    for (range, start, end) in [
        ("bytes=0-99".to_string(), 0, 100),
        (format!("bytes={}-", len - 10), len - 10, len),
        ("bytes=-256".to_string(), len - 256, len),
        (format!("bytes=100-{}", len + 1000), 100, len),
        (format!("bytes={}-{}", len - 1, len - 1), len - 1, len),
    ] {
        let r = get(addr, &url, &[("Range", &range)]).await;
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(r.body, &f[start..end], "{range}");
        assert_eq!(
            r.header("content-range").unwrap(),
            format!("bytes {start}-{}/{len}", end - 1)
        );
        assert_eq!(
            r.header("content-length").unwrap(),
            (end - start).to_string()
        );
    }
    let r = get(addr, &url, &[("Range", &format!("bytes={}-", len + 1))]).await;
    assert_eq!(r.status, 416);
    assert_eq!(r.header("content-range").unwrap(), format!("bytes */{len}"));
    // At the very end: 204, the Python SDK's end of file (archive.rs).
    let r = get(
        addr,
        &url,
        &[("Range", &format!("bytes={len}-{}", len + 8_388_607))],
    )
    .await;
    assert_eq!((r.status, r.body.len()), (204, 0));
    // A list of ranges: the whole file.
    let r = get(addr, &url, &[("Range", "bytes=0-1,5-6")]).await;
    assert_eq!((r.status, r.body.len()), (200, len));
    let r = get(addr, &url, &[("If-None-Match", &tag)]).await;
    assert_eq!((r.status, r.body.len()), (304, 0));
    assert_eq!(r.header("etag"), Some(tag.as_str()));
    let r = get(addr, &url, &[("If-None-Match", "\"0000000000000000\"")]).await;
    assert_eq!(r.status, 200);
    let r = get(addr, &url, &[("Range", "bytes=10-19"), ("If-Range", &tag)]).await;
    assert_eq!((r.status, r.body.as_slice()), (206, &f[10..20]));
    let r = get(
        addr,
        &url,
        &[
            ("Range", "bytes=10-19"),
            ("If-Range", "\"0123456789abcdef\""),
        ],
    )
    .await;
    assert_eq!((r.status, r.body.as_slice()), (200, f.as_slice()));
    let r = http(addr, "HEAD", &url, &[], b"").await;
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.header("content-length").unwrap(), len.to_string());
    assert_eq!(r.header("etag"), Some(tag.as_str()));

    for (q, status, error) in [
        ("name=seg_0000000009.jss", 404, "SegmentNotFound"),
        ("name=seg_000000001.jss", 400, "InvalidRequest"),
        ("name=seg_000000000A.jss", 400, "InvalidRequest"),
        ("name=..%2Fseg_0000000001.jss", 400, "InvalidRequest"),
        ("", 400, "InvalidRequest"),
    ] {
        let r = get(addr, &format!("{PREFIX}getSegment?{q}"), &[]).await;
        assert_eq!((r.status, r.error().as_str()), (status, error), "{q}");
    }

    // getBlock: every block's bare frame, decoding to the rows written.
    let mut seen = 0;
    for (s, f) in files.iter().enumerate() {
        let blocks = u32::from_le_bytes(f[14..18].try_into().unwrap()) as usize;
        for b in 0..blocks {
            let r = get(
                addr,
                &format!(
                    "{PREFIX}getBlock?segment={}&blockIndex={b}",
                    segment_name(s as u64)
                ),
                &[],
            )
            .await;
            assert_eq!(r.status, 200);
            assert_eq!(r.body, frame_of(f, b));
            assert_eq!(
                r.header("etag").unwrap(),
                format!("\"{:016x}:{b}\"", le64(f, 4))
            );
            let body = decode_block_frame(&r.body).unwrap();
            let got = riptide_segment::decode_block(&body).unwrap();
            for g in got {
                assert_eq!(g.to_owned_row(), rows[seen]);
                seen += 1;
            }
        }
        let r = get(
            addr,
            &format!(
                "{PREFIX}getBlock?segment={}&blockIndex={blocks}",
                segment_name(s as u64)
            ),
            &[],
        )
        .await;
        assert_eq!((r.status, r.error().as_str()), (404, "BlockNotFound"));
    }
    assert_eq!(seen, 152);
    for (q, status, error) in [
        (
            "segment=seg_0000000009.jss&blockIndex=0",
            404,
            "SegmentNotFound",
        ),
        (
            "segment=seg_0000000000.jss&blockIndex=-1",
            400,
            "InvalidRequest",
        ),
        (
            "segment=seg_0000000000.jss&blockIndex=one",
            400,
            "InvalidRequest",
        ),
        ("segment=seg_0000000000.jss", 400, "InvalidRequest"),
        ("blockIndex=0", 400, "InvalidRequest"),
        (
            "segment=seg_0000000000.jss&blockIndex=99999999999999999999",
            400,
            "InvalidRequest",
        ),
    ] {
        let r = get(addr, &format!("{PREFIX}getBlock?{q}"), &[]).await;
        assert_eq!((r.status, r.error().as_str()), (status, error), "{q}");
    }
    let m = get(addr, "/metrics", &[]).await;
    let text = String::from_utf8(m.body).unwrap();
    assert!(text.contains("riptide_archive_segments 4\n"), "{text}");
    assert!(text.contains("riptide_archive_segments_rejected_total 0\n"));
    assert!(
        app.archive
            .metrics
            .bytes_out
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    );
}

/// A segment rewritten under the server (as compaction does, by rename): a client resuming with
/// `If-Range` naming the old generation gets the whole new file, never a splice.
#[tokio::test]
async fn if_range_with_a_changed_file_gets_the_whole_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let Some(rows) = corpus_rows() else { return };
    let old = write(dir.path(), 0, &rows[..100], 10);
    let (addr, _app, _g) = serve(dir.path(), ArchiveConfig::default()).await;
    let url = format!("{PREFIX}getSegment?name={}", segment_name(0));
    let r = get(addr, &url, &[("Range", "bytes=0-999")]).await;
    assert_eq!((r.status, r.body.as_slice()), (206, &old[..1000]));
    let old_tag = r.header("etag").unwrap().to_owned();

    // The new generation: a different block layout of the same seqs, renamed into place.
    let tmp = tempfile::tempdir_in(dir.path()).unwrap();
    let new = write(tmp.path(), 0, &rows[..100], 7);
    std::fs::rename(
        tmp.path().join(segment_name(0)),
        dir.path().join(segment_name(0)),
    )
    .unwrap();
    assert_ne!(etag_of(&new), old_tag);

    let r = get(
        addr,
        &url,
        &[("Range", "bytes=1000-"), ("If-Range", &old_tag)],
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body, new);
    assert_eq!(r.header("etag").unwrap(), etag_of(&new));
    let r = get(
        addr,
        &url,
        &[("Range", "bytes=1000-"), ("If-Range", &etag_of(&new))],
    )
    .await;
    assert_eq!((r.status, r.body.as_slice()), (206, &new[1000..]));
    // The archive's view follows the file: listSegments and blocks are the new generation's.
    let l = get(addr, &format!("{PREFIX}listSegments"), &[])
        .await
        .json();
    assert_eq!(
        format!("\"{}\"", l["segments"][0]["checksum"].as_str().unwrap()),
        etag_of(&new)
    );
    let r = get(
        addr,
        &format!("{PREFIX}getBlock?segment={}&blockIndex=14", segment_name(0)),
        &[],
    )
    .await;
    assert_eq!((r.status, r.body.as_slice()), (200, frame_of(&new, 14)));
}

/// A file of exactly 8 MiB, read as the Python SDK reads it (8 MiB ranges until a short or empty
/// chunk): one full range, then a 204 at the end, and the bytes are the file's.
#[tokio::test]
async fn a_file_of_exactly_8_mib_reads_as_the_python_sdk_reads_it() {
    const CHUNK: usize = 8 << 20;
    let dir = tempfile::tempdir().unwrap();
    // Incompressible payloads (xorshift), then one row sized so that the file is exactly 8 MiB.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut noise = |n: usize| -> Vec<u8> {
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let row = |seq: u64, payload: Vec<u8>| OwnedRow {
        seq,
        witnessed_at: seq as i64,
        indexed_at: 0,
        kind: riptide_segment::Kind::Create,
        did: format!("did:plc:{seq:024}"),
        collection: "app.bsky.feed.post".into(),
        rkey: format!("3k{seq}"),
        rev: "3l".into(),
        payload,
    };
    let base: Vec<OwnedRow> = (1..=7).map(|s| row(s, noise(1 << 20))).collect();
    let tail = noise(1 << 20);
    let mut extra = 1 << 19;
    let mut file = Vec::new();
    for _ in 0..40 {
        let mut rows = base.clone();
        rows.push(row(8, tail[..extra].to_vec()));
        let blocks: Vec<Vec<Row<'_>>> = rows
            .chunks(2)
            .map(|c| c.iter().map(OwnedRow::as_row).collect())
            .collect();
        let refs: Vec<&[Row<'_>]> = blocks.iter().map(Vec::as_slice).collect();
        file = write_segment(&refs).unwrap();
        if file.len() == CHUNK {
            break;
        }
        extra =
            (extra as i64 + CHUNK as i64 - file.len() as i64).clamp(1, tail.len() as i64) as usize;
    }
    assert_eq!(file.len(), CHUNK, "could not size the file");
    std::fs::write(dir.path().join(segment_name(5)), &file).unwrap();
    let (addr, _app, _g) = serve(dir.path(), ArchiveConfig::default()).await;
    let url = format!("{PREFIX}getSegment?name={}", segment_name(5));
    let (mut got, mut start, mut statuses) = (Vec::new(), 0usize, Vec::new());
    loop {
        let range = format!("bytes={start}-{}", start + CHUNK - 1);
        let r = get(
            addr,
            &url,
            &[("Range", &range), ("Authorization", "Bearer k")],
        )
        .await;
        statuses.push(r.status);
        assert!((200..300).contains(&r.status), "{range}: {}", r.status);
        if r.body.is_empty() {
            break;
        }
        let n = r.body.len();
        got.extend_from_slice(&r.body);
        if n < CHUNK {
            break;
        }
        start += n;
    }
    assert_eq!(statuses, [206, 204]);
    assert!(got == file);
}

/// `planSnapshot` over HTTP: the lexicon's shape, the planner's answer, pages at the entry cap
/// that always advance and together cover the uncut plan, and the lexicon's 400s.
#[tokio::test]
async fn plans_page_at_the_entry_cap_and_refuse_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let Some((rows, files)) = capture_segments(dir.path()) else {
        return;
    };
    let cap = 2;
    let (addr, _app, _g) = serve(
        dir.path(),
        ArchiveConfig {
            plan_max_entries: cap,
            ..ArchiveConfig::default()
        },
    )
    .await;
    let metas: Vec<SegmentMeta> = files
        .iter()
        .map(|f| SegmentMeta::from_file(f).unwrap())
        .collect();
    let post = |body: serde_json::Value| async move {
        http(
            addr,
            "POST",
            &format!("{PREFIX}planSnapshot"),
            &[],
            body.to_string().as_bytes(),
        )
        .await
    };

    // Ten accounts' events: scattered over blocks of every segment.
    let mut dids: Vec<&str> = rows.iter().map(|r| r.did.as_str()).collect();
    dids.sort_unstable();
    dids.dedup();
    let want_dids: Vec<&str> = dids.iter().copied().step_by(dids.len() / 10).collect();
    let uncut = plan::plan(
        metas.iter().enumerate().map(|(i, m)| (i as u64, m)),
        &PlanRequest::new(&[] as &[&str], &want_dids, &[] as &[&str], None, None).unwrap(),
        0,
    );
    assert!(
        uncut.stats.entries > cap as u64,
        "the plan needs more than one page"
    );
    let mut planned_blocks = Vec::new();
    let (mut after, mut tip, mut pages) = (0u64, None::<u64>, 0);
    loop {
        let mut req = serde_json::json!({"dids": want_dids, "afterSeq": after});
        if let Some(t) = tip {
            req["beforeSeq"] = t.into();
        }
        let r = post(req).await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        let p = r.json();
        pages += 1;
        assert!(p["stats"]["entries"].as_u64().unwrap() <= cap as u64);
        // A cut page stops examining where it is cut, as Jetstream counts.
        assert!((1..=4).contains(&p["stats"]["segmentsExamined"].as_u64().unwrap()));
        let through = p["plannedThroughSeq"].as_u64().unwrap();
        assert!(through > after, "page {pages} did not advance past {after}");
        assert_eq!(p["sealedTipSeq"], 152);
        for s in p["segments"].as_array().unwrap() {
            let index = s["index"].as_u64().unwrap();
            let m = &metas[index as usize];
            assert_eq!(s["name"], segment_name(index));
            assert_eq!(s["checksum"], format!("{:016x}", m.header().checksum));
            assert_eq!(
                (s["minSeq"].as_u64(), s["maxSeq"].as_u64()),
                (Some(m.header().min_seq), Some(m.header().max_seq))
            );
            match s["mode"].as_str().unwrap() {
                "segment" => {
                    assert!(s.get("blocks").is_none());
                    planned_blocks.extend((0..m.blocks().len()).map(|b| (index, b)));
                }
                "blocks" => {
                    for r in s["blocks"].as_array().unwrap() {
                        let (a, z) = (r["first"].as_u64().unwrap(), r["last"].as_u64().unwrap());
                        assert!(a <= z);
                        planned_blocks.extend((a..=z).map(|b| (index, b as usize)));
                    }
                }
                other => panic!("mode {other}"),
            }
        }
        tip = Some(p["sealedTipSeq"].as_u64().unwrap());
        after = through;
        if through >= 152 {
            break;
        }
    }
    assert!(pages > 1);
    // Every row of the wanted accounts is in a planned block (no false negatives end to end).
    for (index, m) in metas.iter().enumerate() {
        for (b, info) in m.blocks().iter().enumerate() {
            let held = rows[(info.min_seq - 1) as usize..info.max_seq as usize]
                .iter()
                .any(|r| want_dids.contains(&r.did.as_str()));
            if held {
                assert!(
                    planned_blocks.contains(&(index as u64, b)),
                    "segment {index} block {b}"
                );
            }
        }
    }

    for (body, why) in [
        (
            serde_json::json!({"afterSeq": 5, "beforeSeq": 5}),
            "beforeSeq must be greater",
        ),
        (serde_json::json!({"kinds": ["commits"]}), "invalid kind"),
        (
            serde_json::json!({"kinds": ["identity"], "collections": ["app.bsky.feed.post"]}),
            "kinds excludes commit",
        ),
        (serde_json::json!({"dids": ["not-a-did"]}), "invalid DID"),
        (
            serde_json::json!({"collections": ["app.*"]}),
            "invalid collection wildcard",
        ),
        (serde_json::json!({"afterSeq": -1}), "afterSeq must be >= 0"),
        (
            serde_json::json!({"afterSeq": "1"}),
            "afterSeq must be an integer",
        ),
        (
            serde_json::json!({"dids": "did:plc:x"}),
            "dids must be an array",
        ),
        (serde_json::json!([1]), "JSON object"),
        (
            serde_json::json!({"dids": (0..10_001).map(|i| format!("did:plc:{i}")).collect::<Vec<_>>()}),
            "too many DIDs",
        ),
        (
            serde_json::json!({"collections": vec!["app.bsky.feed.post"; 101]}),
            "too many collections",
        ),
    ] {
        let r = post(body).await;
        assert_eq!((r.status, r.error().as_str()), (400, "InvalidRequest"));
        assert!(
            r.json()["message"].as_str().unwrap().contains(why),
            "{:?}",
            r.json()
        );
    }
    let r = http(
        addr,
        "POST",
        &format!("{PREFIX}planSnapshot"),
        &[],
        b"{not json",
    )
    .await;
    assert_eq!((r.status, r.error().as_str()), (400, "InvalidRequest"));
    // An empty body is an empty request: the whole archive, one page of whole segments.
    let r = http(addr, "POST", &format!("{PREFIX}planSnapshot"), &[], b"").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["segments"][0]["mode"], "segment");
    // 10,000 DIDs are accepted.
    let many: Vec<String> = (0..10_000).map(|i| format!("did:plc:{i:024}")).collect();
    assert_eq!(post(serde_json::json!({"dids": many})).await.status, 200);
}

/// `--archive-token` and the byte quota over HTTP.
#[tokio::test]
async fn bearer_token_and_byte_quota() {
    let dir = tempfile::tempdir().unwrap();
    let Some((_, files)) = capture_segments(dir.path()) else {
        return;
    };
    let (addr, _app, _g) = serve(
        dir.path(),
        ArchiveConfig {
            token: Some("k3y".into()),
            ..ArchiveConfig::default()
        },
    )
    .await;
    let list = format!("{PREFIX}listSegments");
    for h in [
        vec![],
        vec![("Authorization", "Bearer nope")],
        vec![("Authorization", "Basic k3y")],
    ] {
        let r = get(addr, &list, &h).await;
        assert_eq!(
            (r.status, r.error().as_str()),
            (401, "AuthRequired"),
            "{h:?}"
        );
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    assert_eq!(
        get(addr, &list, &[("Authorization", "Bearer k3y")])
            .await
            .status,
        200
    );
    let r = http(addr, "POST", &format!("{PREFIX}planSnapshot"), &[], b"{}").await;
    assert_eq!(r.status, 401);
    // Without a token, any key and none are accepted.
    let (open, _app2, _g2) = serve(dir.path(), ArchiveConfig::default()).await;
    assert_eq!(get(open, &list, &[]).await.status, 200);
    assert_eq!(
        get(open, &list, &[("Authorization", "Bearer whatever")])
            .await
            .status,
        200
    );

    let quota = files[0].len() as u64;
    let (addr, app, _g3) = serve(
        dir.path(),
        ArchiveConfig {
            quota: Some(Quota {
                bytes: quota,
                window: Duration::from_secs(60),
            }),
            ..ArchiveConfig::default()
        },
    )
    .await;
    let seg0 = format!("{PREFIX}getSegment?name={}", segment_name(0));
    let alice = [("Authorization", "Bearer alice")];
    // HEAD and 304 send nothing and cost nothing.
    assert_eq!(http(addr, "HEAD", &seg0, &alice, b"").await.status, 200);
    assert_eq!(
        get(
            addr,
            &seg0,
            &[alice[0], ("If-None-Match", &etag_of(&files[0]))]
        )
        .await
        .status,
        304
    );
    // A block first, then the whole segment: admitted while under the quota, which it passes.
    let block0 = format!("{PREFIX}getBlock?segment={}&blockIndex=0", segment_name(1));
    assert_eq!(get(addr, &block0, &alice).await.status, 200);
    assert_eq!(get(addr, &seg0, &alice).await.status, 200);
    let r = get(addr, &block0, &alice).await;
    assert_eq!((r.status, r.error().as_str()), (429, "RateLimitExceeded"));
    let after: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&after), "{after}");
    // Another client has its own quota.
    assert_eq!(
        get(addr, &seg0, &[("Authorization", "Bearer bob")])
            .await
            .status,
        200
    );
    let text = String::from_utf8(get(addr, "/metrics", &[]).await.body).unwrap();
    assert!(
        text.contains("riptide_archive_over_quota_total 1\n"),
        "{text}"
    );
    assert_eq!(
        app.archive
            .metrics
            .over_quota
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

/// Files that are not sealed, valid segments are refused at scan, counted, and not served;
/// Jetstream's own golden files are served byte for byte.
#[tokio::test]
async fn bad_files_are_counted_and_golden_files_served() {
    let dir = tempfile::tempdir().unwrap();
    let Some(golden) = riptide_testdata::read("jetstream-v2/segments/golden_corpus_segment.jss")
    else {
        return;
    };
    let legacy =
        riptide_testdata::read("jetstream-v2/segments/legacy_fixed4096_blooms.jss").unwrap();
    std::fs::write(dir.path().join(segment_name(0)), &golden).unwrap();
    std::fs::write(dir.path().join(segment_name(1)), &legacy).unwrap();
    let mut damaged = golden.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40; // in the footer: the checksum catches it
    std::fs::write(dir.path().join(segment_name(2)), &damaged).unwrap();
    std::fs::write(
        dir.path().join(segment_name(3)),
        &golden[..golden.len() / 2],
    )
    .unwrap();
    std::fs::write(dir.path().join("seg_4.jss"), &golden).unwrap();
    std::fs::create_dir(dir.path().join("tmp")).unwrap();
    std::fs::write(dir.path().join("tmp").join(segment_name(5)), &golden).unwrap();
    let (addr, app, _g) = serve(dir.path(), ArchiveConfig::default()).await;
    assert_eq!(app.archive.segments().snapshot().len(), 2);
    let text = String::from_utf8(get(addr, "/metrics", &[]).await.body).unwrap();
    assert!(
        text.contains("riptide_archive_segments_rejected_total 3\n"),
        "{text}"
    );
    for (i, f) in [(0u64, &golden), (1, &legacy)] {
        let r = get(
            addr,
            &format!("{PREFIX}getSegment?name={}", segment_name(i)),
            &[],
        )
        .await;
        assert_eq!((r.status, &r.body), (200, f));
        let blocks = u32::from_le_bytes(f[14..18].try_into().unwrap()) as usize;
        for b in 0..blocks {
            let r = get(
                addr,
                &format!(
                    "{PREFIX}getBlock?segment={}&blockIndex={b}",
                    segment_name(i)
                ),
                &[],
            )
            .await;
            assert_eq!(r.body, frame_of(f, b));
        }
    }
    for i in [2, 3, 5] {
        let r = get(
            addr,
            &format!("{PREFIX}getSegment?name={}", segment_name(i)),
            &[],
        )
        .await;
        assert_eq!((r.status, r.error().as_str()), (404, "SegmentNotFound"));
    }
    // A sealed file added later (as the store will add it) is served at once; a bad one is not.
    std::fs::write(dir.path().join(segment_name(7)), &golden).unwrap();
    app.archive
        .segments()
        .add(&dir.path().join(segment_name(7)))
        .unwrap();
    let r = get(
        addr,
        &format!("{PREFIX}getSegment?name={}", segment_name(7)),
        &[],
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(app
        .archive
        .segments()
        .add(&dir.path().join(segment_name(2)))
        .is_err());
    assert_eq!(
        app.archive
            .segments()
            .rejected
            .load(std::sync::atomic::Ordering::Relaxed),
        4
    );
}
