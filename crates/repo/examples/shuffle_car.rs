//! Writes a repository CAR's blocks in another order, for measuring verification on layouts other
//! than the generator's (commit, nodes root first, records in key order):
//! `cargo run --release -p riptide-repo --example shuffle_car -- IN.car OUT.car [random|cid]`.
//! `random`: a fixed pseudo-random permutation; `cid`: sorted by CID bytes (descending), the order
//! a PDS that pages its block table by CID writes (as the corpus's real `repo.car` is). The
//! commit stays first either way.
use riptide_car::{write_car, CarOptions, CarReader};

fn main() {
    let mut args = std::env::args().skip(1);
    let (input, output) = (args.next().expect("IN.car"), args.next().expect("OUT.car"));
    let order = args.next().unwrap_or_else(|| "random".into());
    let bytes = std::fs::read(input).expect("read");
    let mut reader = CarReader::new();
    let car = reader.read(&bytes, &CarOptions::repository()).expect("car");
    let roots: Vec<_> = car.roots().map(|c| c.to_buf()).collect();
    let mut blocks: Vec<_> = car.blocks().skip(1).map(|b| (b.cid, b.data)).collect();
    match order.as_str() {
        "cid" => blocks.sort_by(|a, b| b.0.as_bytes().cmp(a.0.as_bytes())),
        _ => {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            for i in (1..blocks.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                blocks.swap(i, (x % (i as u64 + 1)) as usize);
            }
        }
    }
    let first = car.block(0).expect("a block");
    let all = std::iter::once((first.cid, first.data)).chain(blocks);
    std::fs::write(output, write_car(&roots, all)).expect("write");
}
