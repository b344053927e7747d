//! Times the phases of whole-repository verification separately, many times, for profiling:
//! `cargo run --release -p riptide-repo --example walk_phases -- FILE.car [PHASE] [N]`
//! (PHASE: car, walk, lookups (walk and look every record up) or all).
use std::time::Instant;

use riptide_car::{CarOptions, CarReader};
use riptide_repo::mst::Walker;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: walk_phases FILE.car [car|walk|all] [N]");
    let phase = args.next().unwrap_or_else(|| "all".into());
    let n: usize = args.next().map_or(10, |s| s.parse().expect("N"));
    let bytes = std::fs::read(path).expect("read");
    let mut reader = CarReader::new();
    let car = reader.read(&bytes, &CarOptions::repository()).expect("car");
    let (_, commit) = riptide_repo::commit_of(&car).expect("commit");
    let data = commit.data().to_buf();
    let mut walker = Walker::new();
    for _ in 0..n {
        let t = Instant::now();
        match phase.as_str() {
            "car" => {
                let mut r = CarReader::new();
                r.read(&bytes, &CarOptions::repository()).expect("car");
            }
            "lookups" => {
                let mut found = 0usize;
                walker
                    .walk(&car, data.as_cid(), |_, cid, _| {
                        found += usize::from(car.position(cid).is_some())
                    })
                    .expect("walk");
                std::hint::black_box(found);
            }
            "walk" => {
                let mut keys = 0usize;
                walker
                    .walk(&car, data.as_cid(), |k, _, _| keys += k.len())
                    .expect("walk");
            }
            _ => {
                let r = riptide_repo::verify_repo(&bytes, None).expect("verify");
                let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
                let total = ms(t.elapsed());
                let t = Instant::now();
                std::hint::black_box(riptide_sha::sha256(std::hint::black_box(&bytes)));
                let bound = ms(t.elapsed());
                println!(
                    "all: {total:.1} ms car {:.1} walk {:.1} rebuild {:.1} sha256 {bound:.1} ratio {:.3}",
                    ms(r.timings.car),
                    ms(r.timings.walk),
                    ms(r.timings.rebuild),
                    bound / total
                );
                continue;
            }
        }
        println!("{phase}: {:.1} ms", t.elapsed().as_secs_f64() * 1e3);
    }
}
