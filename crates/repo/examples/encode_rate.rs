//! Times the canonical encoding of MST nodes (`encode_node`, the writer a commit proof's
//! inverted path and the tree builder use), per entry, over the first 2,000 nodes of a
//! repository export in walk order, re-encoded in cache. Every encoding is first checked to be
//! the node's own block.
//!
//! `cargo run --release -p riptide-repo --example encode_rate -- [FILE.car]` (default: the corpus's
//! real `jetstream-2026-07/repo.car`).

use std::time::Instant;

use riptide_car::{CarOptions, CarReader};
use riptide_cbor::{Arena, Cid, CidBuf};
use riptide_repo::mst::{decode_node, encode_node, NodeData, Walker};

/// An entry as `encode_node` takes it, owned: full key, record CID, right subtree.
type Entry = (Vec<u8>, CidBuf, Option<CidBuf>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        format!(
            "{}/../../../shared/corpus/jetstream-2026-07/repo.car",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let bytes = std::fs::read(&path)?;
    let mut reader = CarReader::new();
    let car = reader.read(&bytes, &CarOptions::repository())?;
    let (_, commit) = riptide_repo::commit_of(&car)?;
    let mut blocks: Vec<(CidBuf, &[u8])> = Vec::new();
    Walker::new().walk_nodes(
        &car,
        commit.data(),
        |_, _, _| {},
        |cid: Cid<'_>, block| {
            if blocks.len() < 2000 {
                blocks.push((cid.to_buf(), block));
            }
        },
    )?;
    let mut arena = Arena::new();
    let mut nodes: Vec<(Option<CidBuf>, Vec<Entry>)> = Vec::new();
    for (cid, block) in &blocks {
        let mut d = NodeData::new();
        decode_node(&mut arena, cid.as_cid(), block, None, &mut d)?;
        let entries = (0..d.len())
            .map(|i| {
                (
                    d.key(i).to_vec(),
                    d.value(i).to_buf(),
                    d.right(i).map(|c| c.to_buf()),
                )
            })
            .collect();
        nodes.push((d.left().map(|c| c.to_buf()), entries));
    }
    type Borrowed<'a> = Vec<(&'a [u8], Cid<'a>, Option<Cid<'a>>)>;
    let borrowed: Vec<Borrowed<'_>> = nodes
        .iter()
        .map(|(_, es)| {
            es.iter()
                .map(|(k, v, r)| (&k[..], v.as_cid(), r.as_ref().map(|c| c.as_cid())))
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    for (i, (left, _)) in nodes.iter().enumerate() {
        out.clear();
        encode_node(&mut out, left.as_ref().map(|c| c.as_cid()), &borrowed[i]);
        if out != blocks[i].1 {
            return Err(format!("node {i} does not re-encode to its block").into());
        }
    }
    let entries: usize = nodes.iter().map(|n| n.1.len()).sum();
    let (passes, reps) = (50, 20);
    let mut times = Vec::with_capacity(passes);
    for _ in 0..passes {
        let t = Instant::now();
        for _ in 0..reps {
            for (i, (left, _)) in nodes.iter().enumerate() {
                out.clear();
                encode_node(&mut out, left.as_ref().map(|c| c.as_cid()), &borrowed[i]);
                std::hint::black_box(&out);
            }
        }
        times.push(t.elapsed().as_secs_f64() * 1e9 / (reps * entries) as f64);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{path}: {} nodes, {entries} entries; encode_node {:.1} ns an entry (median of {passes}; min {:.1}, max {:.1})",
        nodes.len(),
        times[passes / 2],
        times[0],
        times[passes - 1]
    );
    Ok(())
}
