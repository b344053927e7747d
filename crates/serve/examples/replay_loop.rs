//! Replays a store to one loopback consumer again and again, for profiling the serving path
//! (`perf record` / `perf stat` on this process), one wire and one source at a time:
//!
//! ```sh
//! riptide serve --data /tmp/s --ingest-file gen/firehose-frames.bin --did-docs gen/did_docs.json \
//!   --zstd-dictionary legacy_subscribe.zdict --stateless     # stop it once ingest finished
//! cargo run --release -p riptide-serve --example replay_loop -- /tmp/s v1|v2 memory|disk PASSES
//! ```
//!
//! `memory` loads every stored event into the in-memory tail first; `disk` reads through an
//! empty tail. Prints events/s per pass. For CPU per event, run it under
//! `perf stat -e task-clock` with PASSES and with 0 passes (the setup) and divide the difference
//! by the events (`bench/results/2026-11-24-vm/v2fast.md`).

use std::sync::Arc;
use std::time::Instant;

use futures_util::StreamExt;
use riptide_serve::{router, App, Log, Metrics, ReadLimit, ServerConfig, Store, TailLimits};

/// The server's allocator (`riptide serve` runs on mimalloc: `riptide-cli`'s `alloc`), so the
/// profile shows what the server pays per frame.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, wire, source, passes] = &args[..] else {
        return Err("usage: replay_loop STORE_DIR v1|v2 memory|disk PASSES".into());
    };
    let passes: usize = passes.parse()?;
    let (store, resume) = Store::open_any(std::path::Path::new(dir))?;
    let mut all = Vec::new();
    let limit = ReadLimit {
        events: 4096,
        bytes: 4 << 20,
    };
    loop {
        let n = all.len();
        store.read_from(
            all.last().map_or(0, |e: &riptide_serve::Event| e.seq() + 1),
            limit,
            &mut all,
        )?;
        if all.len() == n {
            break;
        }
    }
    let tail = if source == "memory" {
        TailLimits {
            max_events: all.len() + 1,
            max_bytes: usize::MAX,
        }
    } else {
        TailLimits {
            max_events: 0,
            max_bytes: 0,
        }
    };
    let log = Arc::new(Log::new(store, resume.next_seq, tail));
    if source == "memory" {
        log.publish(&all);
    }
    let expect = match wire.as_str() {
        "v1" => all.iter().filter(|e| e.kind().sent_on_v1()).count(),
        _ => all.len(),
    } as u64;
    drop(all);
    let store = log.store().clone();
    let app = App::new(log, Arc::new(Metrics::default()), ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router(app)).await });
    let path = match wire.as_str() {
        "v1" => "/subscribe?cursor=0".to_string(),
        _ => format!("{}?cursor=0", riptide_serve::v2::SUBSCRIBE_EVENTS),
    };
    for pass in 0..passes {
        let t0 = Instant::now();
        // The consumer's read buffer, 16 KiB as `riptide bench serve`'s replay consumer (which
        // says why); `READ_KIB` to try another.
        let kib: usize = std::env::var("READ_KIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(16);
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .read_buffer_size(kib << 10);
        let (mut ws, _) = tokio_tungstenite::connect_async_with_config(
            format!("ws://{addr}{path}"),
            Some(config),
            false,
        )
        .await?;
        let (mut got, mut bytes) = (0u64, 0u64);
        while got < expect {
            match ws.next().await {
                Some(Ok(m)) if m.is_text() || m.is_binary() => {
                    got += 1;
                    bytes += m.len() as u64;
                }
                Some(Ok(_)) => {}
                _ => return Err(format!("stream ended after {got} of {expect}").into()),
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        println!(
            "pass {pass}: {wire} {source} {got} events: {:.0} events/s, {:.0} bytes/event",
            got as f64 / secs,
            bytes as f64 / got.max(1) as f64
        );
    }
    let c = store.block_cache_stats();
    eprintln!(
        "block cache: {} loads ({} ahead), {} hits",
        c.loads, c.ahead, c.hits
    );
    Ok(())
}
