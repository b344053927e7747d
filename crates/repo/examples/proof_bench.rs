//! Times `verify_commit_proof_in` on one reused tree, as the firehose verifier calls it (and,
//! separately, the CAR read alone) over the real `#commit` frames of the corpus capture
//! `jetstream-2026-07/firehose-frames.bin`.
//!
//! `cargo run --release -p riptide-repo --example proof_bench -- [corpus dir]`; `ROUNDS=N` sets
//! how many times the capture is gone through (default 200): fewer for many alternated runs of
//! two builds, more for a profile.

use std::time::Instant;

use riptide_car::{CarOptions, CarReader};
use riptide_cbor::{Arena, CidBuf, Options};
use riptide_repo::{verify_commit_proof_in, Action, ProofOp, Tree};

type Op = (Action, String, Option<CidBuf>, Option<CidBuf>);
/// A `#commit` frame: CAR bytes, commit CID, prevData, ops.
type Frame = (Vec<u8>, CidBuf, Option<CidBuf>, Vec<Op>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| format!("{}/../../../shared/corpus", env!("CARGO_MANIFEST_DIR")));
    let file = std::fs::read(format!("{dir}/jetstream-2026-07/firehose-frames.bin"))?;
    let be = |at: usize| -> usize {
        let mut b = [0u8; 4];
        b.copy_from_slice(&file[at..at + 4]);
        u32::from_be_bytes(b) as usize
    };
    let mut frames: Vec<Frame> = Vec::new();
    let mut arena = Arena::new();
    let mut pos = 4;
    for _ in 0..be(0) {
        let len = be(pos);
        let frame = &file[pos + 4..pos + 4 + len];
        pos += 4 + len;
        let mut tape = arena.tape(frame);
        let (h, stop) = tape.decode_prefix(0..frame.len(), &Options::strict())?;
        let b = tape.decode(stop..frame.len(), &Options::strict())?;
        let doc = tape.finish();
        if doc.value(h).get("t").and_then(|t| t.as_str()) != Some("#commit") {
            continue;
        }
        let body = doc.value(b);
        let link =
            |v: Option<riptide_cbor::Value<'_>>| v.and_then(|v| v.as_link()).map(|c| c.to_buf());
        let mut ops = Vec::new();
        for op in body
            .get("ops")
            .and_then(|o| o.array())
            .into_iter()
            .flatten()
        {
            let action = op
                .get("action")
                .and_then(|a| a.as_str())
                .and_then(Action::parse)
                .ok_or("action")?;
            let path = op
                .get("path")
                .and_then(|p| p.as_str())
                .ok_or("path")?
                .to_owned();
            ops.push((action, path, link(op.get("cid")), link(op.get("prev"))));
        }
        let blocks = body
            .get("blocks")
            .and_then(|b| b.as_bytes())
            .ok_or("blocks")?
            .to_vec();
        frames.push((
            blocks,
            link(body.get("commit")).ok_or("commit")?,
            link(body.get("prevData")),
            ops,
        ));
    }
    let mut reader = CarReader::new();
    let rounds: usize = match std::env::var("ROUNDS") {
        Ok(r) => r
            .parse()
            .map_err(|_| format!("ROUNDS={r:?}: not a count"))?,
        Err(_) => 200,
    };
    let t = Instant::now();
    let mut nodes = 0;
    // One tree for every proof, as the firehose verifier keeps one.
    let mut tree = Tree::new();
    for _ in 0..rounds {
        for (blocks, commit, prev, ops) in &frames {
            let car = reader.read(blocks, &CarOptions::default())?;
            let ops: Vec<ProofOp<'_>> = ops
                .iter()
                .map(|(a, p, c, pr)| ProofOp {
                    action: *a,
                    path: p,
                    cid: *c,
                    prev: *pr,
                })
                .collect();
            let v = verify_commit_proof_in(
                &mut tree,
                &car,
                commit.as_cid(),
                &ops,
                prev.as_ref().map(|c| c.as_cid()),
            )?;
            nodes += v.nodes_loaded;
        }
    }
    let n = rounds * frames.len();
    let el = t.elapsed();
    println!(
        "{n} commit proofs (CAR read + hash check + inversion) in {el:?}: {:.1} us each, {:.0}/s, {:.1} nodes each",
        el.as_secs_f64() * 1e6 / n as f64,
        n as f64 / el.as_secs_f64(),
        nodes as f64 / n as f64
    );
    let t = Instant::now();
    for _ in 0..rounds {
        for (blocks, _, _, _) in &frames {
            let _ = reader.read(blocks, &CarOptions::default())?;
        }
    }
    let car_only = t.elapsed();
    println!(
        "  of which CAR read + block hashing: {:.1} us each",
        car_only.as_secs_f64() * 1e6 / n as f64
    );
    Ok(())
}
