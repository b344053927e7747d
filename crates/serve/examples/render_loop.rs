//! What the serving path's per-event work costs, without the network, on a store made by
//! `riptide serve` (see `replay_loop.rs` for how):
//!
//! ```sh
//! cargo run --release -p riptide-serve --example render_loop -- STORE_DIR render PASSES
//! cargo run --release -p riptide-serve --example render_loop -- STORE_DIR stored DICT
//! ```
//!
//! `render`: the `subscribeEvents` frame of a stored event (what a v2 replay from disk does per
//! event beyond v1), for every stored event (out of cache, as most of a long replay) and for 32
//! events again and again (in cache, as a replay renders a read batch it has just copied); beside
//! it, a plain copy of the same JSON into a new `String` (the floor: one allocation and copy).
//! Median, min and max over the passes, in ns per event.
//!
//! `stored`: what keeping more forms per event would cost, on the same events: each event's JSON
//! compressed on its own with the v1 dictionary `DICT` (the `compress=true` form, made at ingest
//! while a compressed subscriber wants it), and blocks of 4,096 events' v1 JSON or v2 frames
//! compressed together, as the store seals blocks, at zstd levels 3 and 1.

use std::time::Instant;

use riptide_serve::v2::{render_with, TimeFormat};
use riptide_serve::{Dictionary, Event, ReadLimit, Store};

/// The server's allocator (`riptide serve` runs on mimalloc: `riptide-cli`'s `alloc`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: render_loop STORE_DIR render PASSES | STORE_DIR stored DICT";
    let [_, dir, what, arg] = &args[..] else {
        return Err(usage.into());
    };
    let (store, _) = Store::open_any(std::path::Path::new(dir))?;
    let mut all: Vec<Event> = Vec::new();
    let limit = ReadLimit {
        events: 4096,
        bytes: 4 << 20,
    };
    loop {
        let n = all.len();
        store.read_from(all.last().map_or(0, |e| e.seq() + 1), limit, &mut all)?;
        if all.len() == n {
            break;
        }
    }
    if all.len() < 32 {
        return Err(format!("{} events in {dir}: too few to measure", all.len()).into());
    }
    match what.as_str() {
        "render" => render(&all, arg.parse()?),
        "stored" => stored(&all, &Dictionary::load(std::path::Path::new(arg))?)?,
        _ => return Err(usage.into()),
    }
    Ok(())
}

/// ns per event of `f` over `events`, `repeat` times a pass.
fn per_event(events: &[Event], passes: usize, repeat: usize, mut f: impl FnMut(&Event)) -> String {
    let mut ns: Vec<f64> = (0..passes)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..repeat {
                events.iter().for_each(&mut f);
            }
            t0.elapsed().as_nanos() as f64 / (repeat * events.len()) as f64
        })
        .collect();
    ns.sort_by(f64::total_cmp);
    format!(
        "{:.1} ns/event (min {:.1}, max {:.1})",
        ns[ns.len() / 2],
        ns[0],
        ns[ns.len() - 1]
    )
}

fn render(all: &[Event], passes: usize) {
    let mut times = TimeFormat::default();
    let mut frame = |e: &Event| {
        std::hint::black_box(render_with(e, &mut times));
    };
    println!("{} events, {passes} passes", all.len());
    println!(
        "render, every event: {}",
        per_event(all, passes, 1, &mut frame)
    );
    let hot = &all[..32];
    println!(
        "render, 32 in cache: {}",
        per_event(hot, passes, 3000, frame)
    );
    let copy = |e: &Event| {
        std::hint::black_box(e.text().map(|t| String::from(t.0.as_str())));
    };
    println!(
        "copy,   32 in cache: {}",
        per_event(hot, passes, 3000, copy)
    );
}

fn stored(all: &[Event], dict: &Dictionary) -> Result<(), Box<dyn std::error::Error>> {
    let n = all.len() as f64;
    let mut c = dict.compressor()?;
    let t0 = Instant::now();
    let mut bytes = 0;
    for e in all {
        bytes += c.compress(&e.json())?.len();
    }
    println!(
        "each event's JSON with the v1 dictionary: {:.2} µs/event, {:.1} B/event",
        t0.elapsed().as_secs_f64() * 1e6 / n,
        bytes as f64 / n
    );
    let mut times = TimeFormat::default();
    for (form, level) in [
        ("v1 JSON", 3),
        ("v1 JSON", 1),
        ("v2 frames", 3),
        ("v2 frames", 1),
    ] {
        let (mut raw, mut packed, mut secs) = (0, 0, 0.0);
        for block in all.chunks(4096) {
            let mut buf = Vec::new();
            for e in block {
                match form {
                    "v1 JSON" => buf.extend_from_slice(&e.json()),
                    _ => buf.extend_from_slice(
                        render_with(e, &mut times).unwrap_or_default().as_bytes(),
                    ),
                }
            }
            let t0 = Instant::now();
            packed += zstd::bulk::compress(&buf, level)?.len();
            secs += t0.elapsed().as_secs_f64();
            raw += buf.len();
        }
        println!(
            "blocks of {form}, level {level}: {:.1} B/event, {:.1} compressed, {:.2} µs/event",
            raw as f64 / n,
            packed as f64 / n,
            secs * 1e6 / n
        );
    }
    Ok(())
}
