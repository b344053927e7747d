//! `riptide bench serve`: the three figures of issue 6, each a median of passes with min and max.
//!
//! 1. **Verified ingest** (in process): the capture repeated `--repeat` times (upstream seqs are
//!    positions, so every frame is new) through the full pipeline — verify on `--workers` threads, project,
//!    render, zstd with the dictionary, durable fjall batches — into a fresh store. Events/s, and
//!    the process's CPU time per event (user + system, all threads): on a shared machine the
//!    wall-clock rate follows the CPU share we get, CPU-µs per event does not; `2 cores ×
//!    1e6 / cpu_us_per_event` is the rate the pipeline would reach with both cores to itself.
//!    **Steady state** (`ingest_steady_cpu_us_per_event`): the same, counted only from the moment
//!    the in-memory tail first evicts an event to the end of the pass, as a server that has run
//!    a while works (each new event's memory taking an old one's). Until then every event is
//!    fresh memory: in a profile of the generated stream's pass, page faults zeroing new pages
//!    took 2.7% of ingest CPU before that moment and 0.55% after. Null when fewer than
//!    10,000 events follow it (the tail holds 65,536: use a long stream or `--repeat`).
//!    **Chain state** (`--chain`): the pipeline's per-account checks. A corpus repeated is
//!    nothing but replays to them (every repeat a `rev-regression`, so cheaper than real work),
//!    so with `--repeat` above 1 the ingest figure is stateless and `--chain on|both` is refused;
//!    on a generated stream (`riptide gen`, `--repeat 1`) the default `both` runs each pass twice,
//!    stateless then stateful, into fresh stores, and reports the CPU ratio of the two per pass.
//! 2. **Replay to one consumer** (in process, loopback): a tokio-tungstenite client with
//!    `?cursor=0` reads every stored event; events/s from connect to last event. The stored JSON
//!    goes to the socket as is (no re-encoding). Twice: from the in-memory tail (what does not
//!    fit in it, from the store) and from disk (a log over the same store with an empty tail, as
//!    for a cursor older than the tail); each plain and with `compress=true`. The zstd frames
//!    are made at send time: sealed events keep only their JSON (`riptide_store::store`), and
//!    ingest ran with no `compress=true` subscriber, so it made none (`riptide_serve::log`).
//!    With `--zstd-at-ingest` (as if a compressed subscriber were connected during ingest),
//!    ingest makes them (~2.8 CPU-µs an event) and a replay from memory sends them as they are.
//!    `v2_to_v1_replay_memory` / `_disk` compare the wires' median events/s;
//!    `v2_to_v1_replay_memory_paired` / `_disk_paired` take v2 ÷ v1 within each pass (the two
//!    replays run one after the other), so a slow moment of the machine, which hits both, cancels:
//!    on the development VM single passes swing ±15% and a run's ratio of medians ±7%. The two
//!    plain replays alternate their order (v1 first on even passes, v2 on odd ones), so neither
//!    wire always runs in the other's wake (a warm or cold cache, a clock that just changed).
//! 3. **Live subscribers** (a child `riptide serve` process, so its memory is measured alone):
//!    `--subscribers` live clients while the server ingests at `--rate` frames/s; VmRSS of the
//!    server before and with the clients, per-subscriber memory, and events each client got. The
//!    in-memory tail keeps filling during the run (it is bounded, not per subscriber); its growth,
//!    read from `/metrics`, is subtracted from the per-subscriber figure. Beside it, whether
//!    verified ingest kept up (issue 17 item 8): frames and events ingested per second during the
//!    window against the offered rate, how many seconds the stored stream is behind the offered
//!    one (taking the end of the warm-up, before any subscriber, as on schedule), the ingest
//!    queue's maximum, subscriber streams that ended and slow drops by reason. And how fairly the
//!    events went round (issue 22): per subscriber min, 10th percentile, median and max, how many
//!    got none, Jain's fairness index (1: all the same; 1/n: one got everything) and the events
//!    delivered per second to all of them, whose v2/v1 ratio is `v2_to_v1_live_delivered`.
//! 4. **Replaying readers** (`--replayers`, issue 17 item 10): N readers from cursor 0 at once
//!    on a child server that keeps ingesting; how many reach the tip they connected at.
//!
//! **The store** (issue 20): after each ingest pass the memtables are flushed and the segment
//! files' bytes per event reported (`store_bytes_per_event`; journals aside: a journal file is
//! preallocated, 32 MiB however little it holds), beside what the previous layout (2: one value
//! per event with both forms) keeps for the very same events (`store_bytes_per_event_layout2`),
//! so the ratio comes from one run. Replays also report the process's CPU-µs per event
//! (`replay_cpu_us_per_event`, by variant), which a loaded machine does not skew as it does the
//! rates. Replays count each wire's events (v1 never sends `#sync`, which generated streams
//! have), and one that stops short fails after 30 s without a message instead of waiting.
//!
//! Jetstream v2 (`subscribeEvents`) beside v1: figure 2 is also measured on
//! `/xrpc/network.bsky.jetstream.subscribeEvents?cursor=0` (memory and disk; also compressed
//! when `--zstd-dictionary-v2` is given), and figure 3 is run a second time with v2 subscribers
//! (`live_v2`), on a fresh server. v2's frames are made per event from the stored v1 JSON and
//! cached by seq (`riptide_serve::v2`), so a replay renders every frame and live fan-out renders
//! each once; these are the figures that show what that costs against v1.

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use riptide_serve::{
    ingest, router, App, IngestConfig, Keys, Log, Metrics, ServerConfig, Store, TailLimits,
};

use super::bench::Stats;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Corpus file (the real capture).
    file: PathBuf,
    /// DID documents for verification.
    #[arg(long)]
    did_docs: PathBuf,
    /// zstd dictionary (the legacy Jetstream one).
    #[arg(long)]
    zstd_dictionary: PathBuf,
    /// Times the corpus is repeated for ingest and replay.
    #[arg(long, default_value_t = 400)]
    repeat: u64,
    /// Measured passes of ingest and of replay.
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// Live subscribers for the memory run (0 skips it).
    #[arg(long, default_value_t = 1000)]
    subscribers: usize,
    /// Ingest rate (frames/s) during the memory run.
    #[arg(long, default_value_t = 5000.0)]
    rate: f64,
    /// Seconds of the memory run with subscribers connected.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Verification threads (default: as `riptide serve`, two per core).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..))]
    workers: Option<u8>,
    /// Verification off (`--no-verify`) for the ingest figure.
    #[arg(long)]
    no_verify: bool,
    /// Jetstream v2's dictionary (subscribe_events_20260811.zdict): also measure compressed v2
    /// replay.
    #[arg(long, value_name = "PATH")]
    zstd_dictionary_v2: Option<PathBuf>,
    /// Chain-state checks in the ingest figure: off, on, or both (each pass twice, the ratio
    /// reported). Default: both with --repeat 1, off otherwise (a repeated corpus is replays).
    #[arg(long, value_enum)]
    chain: Option<ChainMode>,
    /// Which wires the live run measures, each on a fresh server.
    #[arg(long, value_enum, default_value_t = LiveWire::Both)]
    live_wire: LiveWire,
    /// The live server's pause after each subscriber batch while ingest is behind, in ms (0:
    /// none); default: serve's own (not a serve contract: see `riptide_serve::server`).
    #[arg(long, value_name = "MS")]
    pressure_pause_ms: Option<u64>,
    /// Readers replaying from cursor 0 at once (issue 17 item 10), on each live wire, after
    /// `--replay-history` seconds of ingest at `--rate` (0 skips the run).
    #[arg(long, default_value_t = 0)]
    replayers: usize,
    /// Seconds of ingest stored before the replayers connect.
    #[arg(long, default_value_t = 20)]
    replay_history: u64,
    /// Ingest as if a `compress=true` subscriber were connected: every event's zstd form is made
    /// at ingest (`riptide_serve::log`; without this nobody asks and none is), and replays
    /// from memory with `compress=true` send those forms.
    #[arg(long)]
    zstd_at_ingest: bool,
}

/// The wires of the live run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LiveWire {
    Both,
    V1,
    V2,
}

/// Whether ingest checks chain state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ChainMode {
    Off,
    On,
    Both,
}

/// The two wires in the order a pass replays them: v1 first on even passes, v2 first on odd
/// ones (module docs).
fn wire_order(pass: usize) -> [Wire; 2] {
    if pass.is_multiple_of(2) {
        [Wire::V1, Wire::V2]
    } else {
        [Wire::V2, Wire::V1]
    }
}

/// The two wires measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    V1,
    V2,
}

impl Wire {
    /// The subscription URL path and query for a replay from the start (`cursor`) or live.
    fn path(self, cursor: bool, zstd: Option<u32>) -> String {
        let mut p = match self {
            Wire::V1 => "/subscribe".to_string(),
            Wire::V2 => riptide_serve::v2::SUBSCRIBE_EVENTS.to_string(),
        };
        let mut q = Vec::new();
        if cursor {
            q.push("cursor=0".to_string());
        }
        if let Some(id) = zstd {
            q.push(format!("zstdDictionary={id}"));
        }
        if !q.is_empty() {
            p.push('?');
            p.push_str(&q.join("&"));
        }
        p
    }
}

pub fn run(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(bench(a))
}

async fn bench(a: ServeArgs) -> anyhow::Result<ExitCode> {
    let file = Bytes::from(super::read_file(&a.file)?);
    let frames: Vec<Bytes> = super::corpus_frames(&a.file, &file)?
        .iter()
        .map(|f| file.slice(f.offset..f.offset + f.bytes.len()))
        .collect();
    let keys = Keys::from_docs(super::load_did_docs(&a.did_docs)?);
    let dict = super::load_dictionary(&a.zstd_dictionary)?;
    let dict_v2 = a
        .zstd_dictionary_v2
        .as_deref()
        .map(super::load_dictionary)
        .transpose()?;
    let mut v2_rates = Vec::new();
    let mut v2_disk_rates = Vec::new();
    let mut v2_zstd_rates = Vec::new();
    let mut ingest_rates = Vec::new();
    let mut ingest_cpu = Vec::new();
    let mut replay_rates = Vec::new();
    let mut disk_rates = Vec::new();
    let mut events_per_pass = 0;
    let mut events_v1 = 0;
    let mut store_bytes = Vec::new();
    let mut store_block_bytes = Vec::new();
    let mut store_bytes_layout2 = Vec::new();
    // CPU-µs per event of each replay, by variant.
    let mut replay_cpu: std::collections::BTreeMap<&'static str, Vec<f64>> = Default::default();
    let mut v1_zstd_rates = Vec::new();
    let mut v1_disk_zstd_rates = Vec::new();
    let mut v2_disk_zstd_rates = Vec::new();
    let workers = a
        .workers
        .map_or_else(riptide_serve::default_workers, usize::from);
    let chain = a.chain.unwrap_or(if a.repeat == 1 && !a.no_verify {
        ChainMode::Both
    } else {
        ChainMode::Off
    });
    anyhow::ensure!(
        chain == ChainMode::Off || (a.repeat == 1 && !a.no_verify),
        "--chain on/both needs --repeat 1 and verification: a repeated corpus is all replays to \
         chain state (generate a long stream with `riptide gen` instead)"
    );
    let mut chain_rates = Vec::new();
    let mut chain_cpu = Vec::new();
    let mut chain_ratio = Vec::new();
    let mut steady_cpu = Vec::new();
    for pass in 0..a.passes {
        if chain == ChainMode::Both {
            // The stateful run first, into a store of its own; the stateless one below.
            let dir = tempfile::tempdir()?;
            let p = ingest_pass(&a, &keys, &dict, workers, true, &frames, dir.path()).await?;
            let rate = p.summary.events as f64 / p.secs;
            eprintln!(
                "pass {pass}: ingest with chain state, {} events: {rate:.0} events/s; {:.1} CPU-µs/event",
                p.summary.events, p.cpu_us
            );
            chain_rates.push(rate);
            chain_cpu.push(p.cpu_us);
        }
        let dir = tempfile::tempdir()?;
        let p = ingest_pass(
            &a,
            &keys,
            &dict,
            workers,
            chain == ChainMode::On,
            &frames,
            dir.path(),
        )
        .await?;
        let (log, metrics, s, secs, cpu_us) = (p.log, p.metrics, p.summary, p.secs, p.cpu_us);
        events_per_pass = s.events;
        ingest_rates.push(s.events as f64 / secs);
        ingest_cpu.push(cpu_us);
        let steady = match p.steady_cpu_us {
            Some(c) => {
                steady_cpu.push(c);
                format!("; {c:.1} once the tail was full")
            }
            None => String::new(),
        };
        if let Some(&c) = chain_cpu.last() {
            chain_ratio.push(c / cpu_us);
        }
        eprintln!(
            "pass {pass}: ingest {} frames, {} events in {secs:.2}s: {:.0} events/s; {cpu_us:.1} CPU-µs/event{steady}",
            s.frames,
            s.events,
            s.events as f64 / secs
        );

        // What the store keeps on disk, its memtables flushed (journals aside).
        log.store().flush()?;
        let disk = log.store().disk_usage();
        let per = |b: u64| b as f64 / s.events.max(1) as f64;
        store_bytes.push(per(disk.segment_bytes));
        store_block_bytes.push(per(disk.block_bytes));
        eprintln!(
            "pass {pass}: store on disk: {} bytes of segments, {:.1} bytes/event ({:.1} of them the event blocks, {:.1} the unsealed events); {} bytes with the journals",
            disk.segment_bytes,
            per(disk.segment_bytes),
            per(disk.block_bytes),
            per(disk.recent_bytes),
            disk.bytes
        );
        // The same events as the previous layout kept them (both forms each), for the ratio.
        let all = all_events(&log, &dict)?;
        let old_dir = tempfile::tempdir()?;
        let old = riptide_store::store::layout2_bytes(old_dir.path(), &all)?;
        drop((all, old_dir));
        store_bytes_layout2.push(per(old));
        eprintln!(
            "pass {pass}: the same events in the previous layout (2): {old} bytes, {:.1} bytes/event; ratio {:.3}",
            per(old),
            disk.segment_bytes as f64 / old.max(1) as f64
        );
        // Each wire's share of the events (v1 skips `#sync`): what a full replay delivers.
        let counts = wire_counts(&log)?;
        events_v1 = counts.v1;
        // Replay to one consumer from the store just written, from the in-memory tail (the
        // events older than it, if the pass does not fit, from the store).
        let (tail_events, _) = log.tail_size();
        let from_tail = (tail_events as u64).min(s.events);
        let d1 = &dict;
        let one = |log: Arc<Log>, wire, c| replay(log, metrics.clone(), counts, wire, c, d1);
        // The two wires' plain replays, v1 first on even passes and v2 first on odd ones, so
        // that neither always runs in the other's wake (module docs, "paired").
        for wire in wire_order(pass) {
            let (name, rates, label, events) = match wire {
                Wire::V1 => ("memory_v1", &mut replay_rates, "", counts.v1),
                Wire::V2 => ("memory_v2", &mut v2_rates, "v2 ", counts.v2),
            };
            let rate = rec(
                &mut replay_cpu,
                name,
                one(log.clone(), wire, Compress::None).await?,
            );
            rates.push(rate);
            eprintln!(
                "pass {pass}: {label}replay {events} events ({from_tail} in the tail) from memory: {rate:.0} events/s"
            );
        }
        let rate = rec(
            &mut replay_cpu,
            "memory_v1_compressed",
            one(log.clone(), Wire::V1, Compress::V1).await?,
        );
        v1_zstd_rates.push(rate);
        eprintln!("pass {pass}: replay from memory, compress=true: {rate:.0} events/s");
        if let Some(d) = &dict_v2 {
            let rate = rec(
                &mut replay_cpu,
                "memory_v2_zstd",
                one(log.clone(), Wire::V2, Compress::V2(d.clone())).await?,
            );
            v2_zstd_rates.push(rate);
            eprintln!("pass {pass}: v2 replay from memory, zstd: {rate:.0} events/s");
        }
        // The same from disk: a log over the same store with an empty tail.
        let disk = Arc::new(Log::new(
            log.store().clone(),
            s.resume.next_seq,
            TailLimits {
                max_events: 0,
                max_bytes: 0,
            },
        ));
        for wire in wire_order(pass) {
            let (name, rates, label, events) = match wire {
                Wire::V1 => ("disk_v1", &mut disk_rates, "", counts.v1),
                Wire::V2 => ("disk_v2", &mut v2_disk_rates, "v2 ", counts.v2),
            };
            let reads0 = metrics.replay_reads.load(Relaxed);
            let rate = rec(
                &mut replay_cpu,
                name,
                one(disk.clone(), wire, Compress::None).await?,
            );
            rates.push(rate);
            eprintln!(
                "pass {pass}: {label}replay {events} events from disk: {rate:.0} events/s ({} store reads)",
                metrics.replay_reads.load(Relaxed) - reads0
            );
        }
        let rate = rec(
            &mut replay_cpu,
            "disk_v1_compressed",
            one(disk.clone(), Wire::V1, Compress::V1).await?,
        );
        v1_disk_zstd_rates.push(rate);
        eprintln!("pass {pass}: replay from disk, compress=true: {rate:.0} events/s");
        if let Some(d) = &dict_v2 {
            let rate = rec(
                &mut replay_cpu,
                "disk_v2_zstd",
                one(disk, Wire::V2, Compress::V2(d.clone())).await?,
            );
            v2_disk_zstd_rates.push(rate);
            eprintln!("pass {pass}: v2 replay from disk, zstd: {rate:.0} events/s");
        }
    }
    // Per pass, v2 ÷ v1 of the two replays made one after the other (module docs).
    let paired =
        |v2: &[f64], v1: &[f64]| Stats::of(v2.iter().zip(v1).map(|(b, a)| b / a).collect()).json();
    let paired_memory = paired(&v2_rates, &replay_rates);
    let paired_disk = paired(&v2_disk_rates, &disk_rates);
    let ingest = Stats::of(ingest_rates);
    let cpu = Stats::of(ingest_cpu);
    let mut out = serde_json::json!({
        "machine": super::bench::machine(),
        "date": super::bench::utc_now(),
        "passes": a.passes,
        "events_per_pass": events_per_pass,
        "verify": !a.no_verify,
        "workers": workers,
        "zstd_at_ingest": a.zstd_at_ingest,
        "ingest_events_per_s": ingest.json(),
        "ingest_cpu_us_per_event": cpu.json(),
        "ingest_events_per_s_two_idle_cores": Stats::of(vec![2e6 / cpu.max, 2e6 / cpu.median, 2e6 / cpu.min]).json(),
        "replay_memory_events_per_s": Stats::of(replay_rates).json(),
        "replay_disk_events_per_s": Stats::of(disk_rates).json(),
        "replay_memory_compressed_events_per_s": Stats::of(v1_zstd_rates).json(),
        "replay_disk_compressed_events_per_s": Stats::of(v1_disk_zstd_rates).json(),
        "events_per_pass_v1": events_v1,
        "store_bytes_per_event": Stats::of(store_bytes).json(),
        "replay_cpu_us_per_event": replay_cpu
            .into_iter()
            .map(|(k, v)| (k.to_string(), Stats::of(v).json()))
            .collect::<serde_json::Map<_, _>>(),
        "store_block_bytes_per_event": Stats::of(store_block_bytes).json(),
        "store_bytes_per_event_layout2": Stats::of(store_bytes_layout2).json(),
        "store_layout": riptide_store::store::LAYOUT_VERSION,
        "chain": format!("{chain:?}").to_lowercase(),
    });
    // Null when the stream was too short to fill the tail and run STEADY_MIN_EVENTS past it.
    out["ingest_steady_cpu_us_per_event"] = serde_json::Value::Null;
    if !steady_cpu.is_empty() {
        let st = Stats::of(steady_cpu);
        out["ingest_steady_cpu_us_per_event"] = st.json();
        out["ingest_steady_events_per_s_two_idle_cores"] =
            Stats::of(vec![2e6 / st.max, 2e6 / st.median, 2e6 / st.min]).json();
    }
    if chain == ChainMode::Both {
        out["ingest_chain_events_per_s"] = Stats::of(chain_rates).json();
        out["ingest_chain_cpu_us_per_event"] = Stats::of(chain_cpu).json();
        // Per pass: CPU per event with chain state over CPU per event without.
        out["chain_cpu_ratio"] = Stats::of(chain_ratio).json();
    }
    out["v2_replay_memory_events_per_s"] = Stats::of(v2_rates).json();
    out["v2_replay_disk_events_per_s"] = Stats::of(v2_disk_rates).json();
    if !v2_zstd_rates.is_empty() {
        out["v2_replay_memory_zstd_events_per_s"] = Stats::of(v2_zstd_rates).json();
        out["v2_replay_disk_zstd_events_per_s"] = Stats::of(v2_disk_zstd_rates).json();
    }
    if a.subscribers > 0 {
        if a.live_wire != LiveWire::V2 {
            out["live"] = live(&a, Wire::V1).await?;
        }
        if a.live_wire != LiveWire::V1 {
            out["live_v2"] = live(&a, Wire::V2).await?;
        }
    }
    // Issue 22's contract: v2 within 10% of v1 (ratios of the medians; ≥ 0.9).
    let ratio = |v2: &str, v1: &str| {
        let m = |k: &str| out[k]["median"].as_f64().unwrap_or(0.0);
        (m(v1) > 0.0).then(|| m(v2) / m(v1))
    };
    let memory = ratio(
        "v2_replay_memory_events_per_s",
        "replay_memory_events_per_s",
    );
    let disk = ratio("v2_replay_disk_events_per_s", "replay_disk_events_per_s");
    out["v2_to_v1_replay_memory"] = serde_json::json!(memory);
    out["v2_to_v1_replay_disk"] = serde_json::json!(disk);
    out["v2_to_v1_replay_memory_paired"] = paired_memory;
    out["v2_to_v1_replay_disk_paired"] = paired_disk;
    if let (Some(v1), Some(v2)) = (
        out.get("live")
            .and_then(|l| l["delivered_events_per_s"].as_f64()),
        out.get("live_v2")
            .and_then(|l| l["delivered_events_per_s"].as_f64()),
    ) {
        out["v2_to_v1_live_delivered"] = serde_json::json!((v1 > 0.0).then(|| v2 / v1));
    }
    if a.replayers > 0 {
        if a.live_wire != LiveWire::V2 {
            out["replayers"] = replayers(&a, Wire::V1).await?;
        }
        if a.live_wire != LiveWire::V1 {
            out["replayers_v2"] = replayers(&a, Wire::V2).await?;
        }
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(ExitCode::SUCCESS)
}

/// What one ingest pass left: the log over its store, its metrics and what it did.
struct IngestPass {
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    summary: riptide_serve::IngestSummary,
    secs: f64,
    cpu_us: f64,
    /// CPU-µs per event once the in-memory tail is full (see [`steady_point`]), when at least
    /// [`STEADY_MIN_EVENTS`] events followed that point.
    steady_cpu_us: Option<f64>,
}

/// Fewest events after the tail fills for a pass to report a steady-state figure.
const STEADY_MIN_EVENTS: u64 = 10_000;

/// The process CPU time and events stored at the moment the log first evicted an event from its
/// in-memory tail: from then on ingest runs as a long-lived server does, the tail at capacity and
/// each new event's memory taking an old one's. Before it, every event is fresh memory (on this
/// allocator, pages faulted in and zeroed), which a server pays once after it starts.
async fn steady_point(log: Arc<Log>, metrics: Arc<Metrics>) -> (f64, u64) {
    loop {
        let stored = metrics.events_stored.load(Relaxed);
        let (in_tail, _) = log.tail_size();
        if stored > in_tail as u64 {
            return (cpu_secs(), stored);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One ingest of the corpus `--repeat` times (upstream seqs are positions, so every frame is new
/// to the dispatcher) into a fresh store at `dir`.
async fn ingest_pass(
    a: &ServeArgs,
    keys: &Keys,
    dict: &riptide_serve::Dictionary,
    workers: usize,
    stateful: bool,
    frames: &[Bytes],
    dir: &std::path::Path,
) -> anyhow::Result<IngestPass> {
    let (store, resume) = Store::open(dir, dict.id())?;
    let log = Arc::new(Log::new(store, resume.next_seq, TailLimits::default()));
    let metrics = Arc::new(Metrics::default());
    let mut cfg = if a.no_verify {
        IngestConfig::trusting()
    } else {
        IngestConfig::verifying(keys.clone())
    };
    cfg.dictionary = Some(dict.clone());
    cfg.workers = workers;
    cfg.stateful = stateful;
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    let compressed_subscriber = a.zstd_at_ingest.then(|| log.zstd_demand().join());
    let cpu0 = cpu_secs();
    let t0 = Instant::now();
    let h = ingest::spawn(cfg, log.clone(), metrics.clone(), resume, rx)?;
    let steady = tokio::spawn(steady_point(log.clone(), metrics.clone()));
    let n = frames.len() as u64;
    for pos in 1..=n * a.repeat {
        tx.send((pos, frames[((pos - 1) % n) as usize].clone()).into())
            .await?;
    }
    drop(tx);
    let summary = tokio::task::spawn_blocking(move || h.join()).await??;
    let secs = t0.elapsed().as_secs_f64();
    let cpu1 = cpu_secs();
    let cpu_us = (cpu1 - cpu0) * 1e6 / summary.events.max(1) as f64;
    let steady_cpu_us = if steady.is_finished() {
        let (cpu_w, stored_w) = steady.await?;
        let after = metrics.events_stored.load(Relaxed) - stored_w;
        (after >= STEADY_MIN_EVENTS).then(|| (cpu1 - cpu_w) * 1e6 / after as f64)
    } else {
        steady.abort();
        None
    };
    drop(compressed_subscriber);
    Ok(IngestPass {
        log,
        metrics,
        summary,
        secs,
        cpu_us,
        steady_cpu_us,
    })
}

/// This process's CPU time so far (user + system, every thread), in seconds.
pub(crate) fn cpu_secs() -> f64 {
    // Fields 14 and 15 of /proc/self/stat, in clock ticks (100 per second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|x| x.parse().ok())
        .collect();
    f.iter().sum::<u64>() as f64 / 100.0
}

/// How many events each wire sends of a store: v1 never sends `#sync` events (protocol §4.1),
/// v2 sends them all. Counted by reading the store (the in-memory tail holds the same events).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WireCounts {
    v1: u64,
    v2: u64,
}

/// Every stored event with its zstd form (made again for those read from sealed blocks, as a
/// `compress=true` subscriber gets it), oldest first.
fn all_events(
    log: &Log,
    dict: &riptide_serve::Dictionary,
) -> anyhow::Result<Vec<riptide_serve::Event>> {
    let mut c = dict.compressor()?;
    let (mut from, mut out) = (0, Vec::new());
    let limit = riptide_serve::ReadLimit {
        events: 4096,
        bytes: 4 << 20,
    };
    loop {
        let n = out.len();
        log.read(from, limit, &mut out)?;
        let Some(last) = out.last().filter(|_| out.len() > n) else {
            break;
        };
        from = last.seq() + 1;
    }
    for e in &mut out {
        if e.zstd_len() == 0 {
            let z = c.compress(&e.json())?;
            let coll = e.collection().to_vec();
            let did = String::from_utf8_lossy(e.did()).into_owned();
            *e = riptide_serve::Event::encode(
                e.seq(),
                e.time_us(),
                e.kind(),
                &did,
                &String::from_utf8_lossy(&coll),
                &e.json(),
                &z,
            );
        }
    }
    Ok(out)
}

fn wire_counts(log: &Log) -> anyhow::Result<WireCounts> {
    let (mut from, mut n) = (0, WireCounts { v1: 0, v2: 0 });
    let mut batch = Vec::new();
    let limit = riptide_serve::ReadLimit {
        events: 4096,
        bytes: 4 << 20,
    };
    loop {
        batch.clear();
        log.store().read_from(from, limit, &mut batch)?;
        let Some(last) = batch.last() else {
            return Ok(n);
        };
        from = last.seq() + 1;
        n.v2 += batch.len() as u64;
        n.v1 += batch.iter().filter(|e| e.kind().sent_on_v1()).count() as u64;
    }
}

/// Longest wait for the next message of a replay: a replay that stops short (the server sent
/// fewer events than expected) is an error, not a hang.
const REPLAY_IDLE: Duration = Duration::from_secs(30);

/// The bench's consumers' WebSocket settings (replay, live and replayers): tungstenite's, with a
/// 16 KiB read buffer (about one server batch, `ReadLimit`) instead of 128 KiB. tungstenite
/// zero-fills the free part of its read buffer before every read, including the reads that find
/// the socket empty; at 128 KiB that was ~1,250 instructions an event on the replay consumer,
/// which shares the two cores with the server it measures, and more on `subscribeEvents`, whose
/// larger frames make more reads (callgrind: +330 an event over v1); a thousand live consumers
/// also held 128 MB of buffers. `crates/serve/examples/replay_loop.rs` has the same.
fn client_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default().read_buffer_size(16 << 10)
}

/// Replay compression: none, v1's `compress=true`, or v2 with its dictionary.
#[derive(Clone, Debug)]
enum Compress {
    None,
    V1,
    V2(riptide_serve::Dictionary),
}

/// Serves `log` on loopback and reads every event of `counts` with one `?cursor=0` client of
/// `wire`: events/s from connect to the last event.
async fn replay(
    log: Arc<Log>,
    metrics: Arc<Metrics>,
    counts: WireCounts,
    wire: Wire,
    compress: Compress,
    v1_dict: &riptide_serve::Dictionary,
) -> anyhow::Result<Replay> {
    let events = match wire {
        Wire::V1 => counts.v1,
        Wire::V2 => counts.v2,
    };
    let (zstd, v2_dict) = match &compress {
        Compress::V2(d) => (Some(d.id()), Some(d.clone())),
        _ => (None, None),
    };
    let app = App::new(
        log,
        metrics,
        ServerConfig {
            v1_dictionary: Some(v1_dict.clone()),
            v2_dictionary: v2_dict,
            ..ServerConfig::default()
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, router(app)).await });
    let t0 = Instant::now();
    let mut url = format!("ws://{addr}{}", wire.path(true, zstd));
    if matches!(compress, Compress::V1) {
        url.push_str("&compress=true");
    }
    let cpu0 = cpu_secs();
    let (mut ws, _) =
        tokio_tungstenite::connect_async_with_config(url, Some(client_config()), false).await?;
    let mut got = 0u64;
    while got < events {
        match tokio::time::timeout(REPLAY_IDLE, ws.next()).await {
            Ok(Some(Ok(m))) if m.is_text() || m.is_binary() => got += 1,
            Ok(Some(Ok(_))) => {}
            Ok(_) => anyhow::bail!("replay stream ended after {got} of {events} events"),
            Err(_) => anyhow::bail!(
                "replay stalled: nothing for {}s after {got} of {events} events",
                REPLAY_IDLE.as_secs()
            ),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu_us = (cpu_secs() - cpu0) * 1e6 / got.max(1) as f64;
    server.abort();
    Ok(Replay {
        rate: got as f64 / secs,
        cpu_us,
    })
}

/// Keeps `r`'s CPU per event under `name` (and says it); its rate.
fn rec(
    cpu: &mut std::collections::BTreeMap<&'static str, Vec<f64>>,
    name: &'static str,
    r: Replay,
) -> f64 {
    eprintln!("  replay {name}: {:.2} CPU-µs/event", r.cpu_us);
    cpu.entry(name).or_default().push(r.cpu_us);
    r.rate
}

/// One replay's figures: events/s, and the process's CPU-µs per event (server and client
/// together; on a shared machine the rate follows the CPU share, this does not).
#[derive(Clone, Copy, Debug)]
struct Replay {
    rate: f64,
    cpu_us: f64,
}

/// The child server's `/metrics` text (`None` if it did not answer within 5 s).
async fn scrape(addr: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        let req = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(Duration::from_secs(5), get)
        .await
        .ok()
        .flatten()
}

/// The value of the sample `name` (with its labels, if any: `x{reason="y"}`) in a `/metrics`
/// text.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// What the live run reads from the child's `/metrics` at one moment.
#[derive(Clone, Copy, Debug, Default)]
struct Sample {
    /// When it was read.
    at: Option<Instant>,
    /// The last upstream seq stored: the file source's seqs are frame positions, so this is the
    /// frames ingested.
    upstream_seq: f64,
    events_stored: f64,
    ingest_queue: f64,
    tail_bytes: f64,
    ingest_finished: bool,
    /// Subscribers dropped as too slow, by reason (`SlowDrop::ALL` order).
    drops: [f64; 3],
}

impl Sample {
    async fn read(addr: &str) -> Sample {
        let Some(b) = scrape(addr).await else {
            return Sample::default();
        };
        let m = |n: &str| metric(&b, n).unwrap_or(0.0);
        let drop = |r: &str| {
            m(&format!(
                "riptide_slow_consumer_drops_total{{reason=\"{r}\"}}"
            ))
        };
        Sample {
            at: Some(Instant::now()),
            upstream_seq: m("riptide_upstream_seq"),
            events_stored: m("riptide_events_stored_total"),
            ingest_queue: m("riptide_ingest_queue_frames"),
            tail_bytes: m("riptide_tail_bytes"),
            ingest_finished: m("riptide_ingest_finished") > 0.0,
            drops: [drop("write-timeout"), drop("pong-timeout"), drop("behind")],
        }
    }

    /// Frames and events ingested per second from `self` to `later` (0 if either is missing).
    fn rates(&self, later: &Sample) -> (f64, f64) {
        match (self.at, later.at) {
            (Some(a), Some(b)) if b > a => {
                let secs = (b - a).as_secs_f64();
                (
                    (later.upstream_seq - self.upstream_seq) / secs,
                    (later.events_stored - self.events_stored) / secs,
                )
            }
            _ => (0.0, 0.0),
        }
    }

    /// Seconds the ingested stream is behind the offered one: the frames the source offered
    /// since `base` (at `rate` per second) and ingest has not stored yet, over the rate. Assumes
    /// ingest was on schedule at `base` (the end of the warm-up, before any subscriber).
    fn lag_behind(&self, base: &Sample, rate: f64) -> f64 {
        match (base.at, self.at) {
            (Some(a), Some(b)) => {
                let offered = base.upstream_seq + rate * (b - a).as_secs_f64();
                ((offered - self.upstream_seq) / rate).max(0.0)
            }
            _ => 0.0,
        }
    }
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Subscribers connecting at once (the handshakes of a saturated server are slow; one at a time
/// the connect phase took minutes).
const CONNECT_AT_ONCE: usize = 32;

/// A child `riptide serve` ingesting the corpus at `--rate` from a fresh store in `dir`, with
/// room for `clients` connections from this address; its address once it accepts connections.
async fn child_server(
    a: &ServeArgs,
    dir: &std::path::Path,
    clients: usize,
    seconds: f64,
) -> anyhow::Result<(tokio::process::Child, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    // Frames for far longer than the run can take: the source must not run dry before or during
    // the measured window (a saturated server can take minutes to accept every subscriber, and a
    // source that had run dry made every subscriber receive nothing in the window).
    let repeat = ((a.rate * (seconds + 600.0)) / 150.0).ceil() as u64 + 1;
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.args([
        "serve",
        "--listen",
        &addr,
        "--ingest-repeat",
        &repeat.to_string(),
        "--ingest-rate",
        &a.rate.to_string(),
        // The file repeated is replays to chain state; this run measures fan-out.
        "--stateless",
        // Every subscriber comes from this address, and /metrics must still be answered.
        "--max-connections-per-ip",
        &(clients + 64).to_string(),
        "--max-connections",
        &(clients + 256).max(10_000).to_string(),
    ])
    .arg("--data")
    .arg(dir)
    .arg("--did-docs")
    .arg(&a.did_docs)
    .arg("--zstd-dictionary")
    .arg(&a.zstd_dictionary)
    .arg("--ingest-file")
    .arg(&a.file)
    .env("RUST_LOG", "warn")
    // Its URL line (stdout) would land in this command's report.
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .kill_on_drop(true);
    if let Some(ms) = a.pressure_pause_ms {
        cmd.env(riptide_serve::server::PRESSURE_PAUSE_ENV, ms.to_string());
    }
    let child = cmd.spawn()?;
    let t0 = Instant::now();
    while tokio::net::TcpStream::connect(&addr).await.is_err() {
        anyhow::ensure!(
            t0.elapsed() < Duration::from_secs(20),
            "server did not start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((child, addr))
}

async fn live(a: &ServeArgs, wire: Wire) -> anyhow::Result<serde_json::Value> {
    let dir = tempfile::tempdir()?;
    let (mut child, addr) = child_server(a, dir.path(), a.subscribers, a.seconds as f64).await?;
    let pid = child.id().unwrap_or(0);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_before = rss_kib(pid);
    let warm = Sample::read(&addr).await;
    let counts: Vec<Arc<AtomicU64>> = (0..a.subscribers)
        .map(|_| Arc::new(AtomicU64::new(0)))
        .collect();
    // Streams that ended (closed by the server, or failed) before the end of the run.
    let closed = Arc::new(AtomicU64::new(0));
    let url = format!("ws://{addr}{}", wire.path(false, None));
    let connects = futures_util::stream::iter(counts.iter().cloned().map(|c| {
        let (url, closed) = (url.clone(), closed.clone());
        async move {
            let (mut ws, _) =
                tokio_tungstenite::connect_async_with_config(url, Some(client_config()), false)
                    .await?;
            Ok::<_, anyhow::Error>(tokio::spawn(async move {
                while let Some(Ok(m)) = ws.next().await {
                    if m.is_text() || m.is_binary() {
                        c.fetch_add(1, Relaxed);
                    }
                }
                closed.fetch_add(1, Relaxed);
            }))
        }
    }))
    .buffer_unordered(CONNECT_AT_ONCE)
    .collect::<Vec<_>>()
    .await;
    let tasks = connects.into_iter().collect::<Result<Vec<_>, _>>()?;
    let connected = Instant::now();
    let start = Sample::read(&addr).await;
    let closed_before = closed.load(Relaxed);
    let mut rss_max = 0;
    let mut queue_max = start.ingest_queue;
    let mut lag_max = start.lag_behind(&warm, a.rate);
    let start_counts: Vec<u64> = counts.iter().map(|c| c.load(Relaxed)).collect();
    while connected.elapsed() < Duration::from_secs(a.seconds) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss_max = rss_max.max(rss_kib(pid));
        let s = Sample::read(&addr).await;
        if s.at.is_some() {
            queue_max = queue_max.max(s.ingest_queue);
            lag_max = lag_max.max(s.lag_behind(&warm, a.rate));
        }
    }
    let secs = connected.elapsed().as_secs_f64();
    let end = Sample::read(&addr).await;
    let closed_during = closed.load(Relaxed) - closed_before;
    let mut got: Vec<u64> = counts
        .iter()
        .zip(&start_counts)
        .map(|(c, s)| c.load(Relaxed) - s)
        .collect();
    got.sort_unstable();
    let (min, max) = (
        got.first().copied().unwrap_or(0),
        got.last().copied().unwrap_or(0),
    );
    let median = got.get(got.len() / 2).copied().unwrap_or(0);
    let p10 = got.get(got.len() / 10).copied().unwrap_or(0);
    let none = got.iter().filter(|&&n| n == 0).count();
    let total: u64 = got.iter().sum();
    let fairness = jain(&got);
    let _ = child.kill().await;
    for t in tasks {
        t.abort();
    }
    let tail_growth_kib = (end.tail_bytes - warm.tail_bytes).max(0.0) as u64 / 1024;
    let per_sub = (rss_max.saturating_sub(rss_before)) as f64 / a.subscribers as f64;
    let per_sub_net =
        (rss_max.saturating_sub(rss_before + tail_growth_kib)) as f64 / a.subscribers as f64;
    let (frames_s, events_s) = start.rates(&end);
    let (connect_frames_s, _) = warm.rates(&start);
    let lag_end = end.lag_behind(&warm, a.rate);
    let lag_max = lag_max.max(lag_end);
    let drops: Vec<f64> = (0..3).map(|i| end.drops[i] - start.drops[i]).collect();
    let wire_name = match wire {
        Wire::V1 => "subscribe",
        Wire::V2 => "subscribeEvents",
    };
    eprintln!(
        "live ({wire:?}): {} subscribers, {secs:.1}s at {} frames/s: server RSS {} KiB before, {} KiB max with subscribers ({per_sub:.1} KiB each; {per_sub_net:.1} KiB each without the tail's growth of {tail_growth_kib} KiB); events per subscriber {min}..{max}, median {median} ({:.0}/s each)",
        a.subscribers, a.rate, rss_before, rss_max, median as f64 / secs
    );
    eprintln!(
        "live ({wire:?}): delivered {:.0} events/s to all subscribers; fairness (Jain) {fairness:.3}, 10th percentile {p10}, {none} subscribers with no event",
        total as f64 / secs
    );
    eprintln!(
        "live ({wire:?}): ingest {frames_s:.0} frames/s ({events_s:.0} events/s) of {} offered ({:.0}%; {connect_frames_s:.0} frames/s while subscribers connected), behind the offered stream {lag_end:.1}s at the end (max {lag_max:.1}s), ingest queue max {queue_max:.0} frames; subscribers closed {closed_during} (slow drops write-timeout/pong-timeout/behind {}/{}/{}){}",
        a.rate,
        100.0 * frames_s / a.rate,
        drops[0],
        drops[1],
        drops[2],
        if end.ingest_finished { "; THE SOURCE RAN DRY: figures invalid" } else { "" },
    );
    Ok(serde_json::json!({
        "wire": wire_name,
        "subscribers": a.subscribers,
        "rate_frames_per_s": a.rate,
        "pressure_pause_ms": a.pressure_pause_ms,
        "seconds": secs,
        "rss_kib_before": rss_before,
        "rss_kib_max": rss_max,
        "per_subscriber_kib": per_sub,
        "tail_growth_kib": tail_growth_kib,
        "per_subscriber_kib_without_tail_growth": per_sub_net,
        "events_per_subscriber_min": min,
        "events_per_subscriber_median": median,
        "events_per_subscriber_max": max,
        "events_per_subscriber_p10": p10,
        "subscribers_with_no_event": none,
        "fairness_jain": fairness,
        "delivered_events_per_s": total as f64 / secs,
        "ingest_frames_per_s": frames_s,
        "ingest_events_per_s": events_s,
        "ingest_ratio_to_offered": frames_s / a.rate,
        "ingest_frames_per_s_while_connecting": connect_frames_s,
        "ingest_behind_seconds_end": lag_end,
        "ingest_behind_seconds_max": lag_max,
        "ingest_queue_frames_max": queue_max,
        "source_ran_dry": end.ingest_finished,
        "subscribers_closed_during_run": closed_during,
        "slow_consumer_drops": {
            "write-timeout": drops[0], "pong-timeout": drops[1], "behind": drops[2],
        },
    }))
}

/// Jain's fairness index of what each subscriber received: 1 when all received the same, 1/n
/// when one received everything (and 1 when nobody received anything: nobody was favoured).
fn jain(got: &[u64]) -> f64 {
    let sum: f64 = got.iter().map(|&n| n as f64).sum();
    let squares: f64 = got.iter().map(|&n| (n as f64) * (n as f64)).sum();
    if squares == 0.0 {
        return 1.0;
    }
    sum * sum / (got.len() as f64 * squares)
}

/// The seq of a text event: v1's `"cursor":N`, v2's `"seq":N` (the first of them in the frame:
/// the envelope's, before the record).
fn event_seq(text: &str, wire: Wire) -> Option<u64> {
    let key = match wire {
        Wire::V1 => "\"cursor\":",
        Wire::V2 => "\"seq\":",
    };
    let rest = &text[text.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Most time a replayer is given to reach the tip it connected at.
const REPLAY_LIMIT: Duration = Duration::from_secs(600);

/// Issue 17 item 10: `--replayers` readers connect at once with cursor 0 to a child server that
/// stored `--replay-history` seconds of ingest and goes on ingesting at `--rate`; each reads until
/// it has the event that was the newest when it connected. How many finished, how many streams
/// ended first (and the server's slow drops by reason), their times, and whether ingest kept up
/// meanwhile.
async fn replayers(a: &ServeArgs, wire: Wire) -> anyhow::Result<serde_json::Value> {
    let dir = tempfile::tempdir()?;
    let limit = REPLAY_LIMIT.as_secs_f64();
    let (mut child, addr) =
        child_server(a, dir.path(), a.replayers, a.replay_history as f64 + limit).await?;
    tokio::time::sleep(Duration::from_secs(a.replay_history)).await;
    let start = Sample::read(&addr).await;
    let body = scrape(&addr).await.unwrap_or_default();
    let target = metric(&body, "riptide_log_next_seq").unwrap_or(1.0) as u64 - 1;
    let path = match wire {
        Wire::V1 => "/subscribe?cursor=0".to_string(),
        Wire::V2 => format!("{}?cursor=0", riptide_serve::v2::SUBSCRIBE_EVENTS),
    };
    let t0 = Instant::now();
    let clients = (0..a.replayers).map(|_| {
        let url = format!("ws://{addr}{path}");
        async move {
            let (mut ws, _) =
                tokio_tungstenite::connect_async_with_config(url, Some(client_config()), false)
                    .await?;
            let until = tokio::time::Instant::now() + REPLAY_LIMIT;
            let mut got = 0u64;
            loop {
                match tokio::time::timeout_at(until, ws.next()).await {
                    Ok(Some(Ok(m))) if m.is_text() => {
                        got += 1;
                        let text = m.to_text().unwrap_or_default();
                        if event_seq(text, wire).is_some_and(|s| s >= target) {
                            return Ok::<_, anyhow::Error>((Some(t0.elapsed()), got));
                        }
                    }
                    Ok(Some(Ok(_))) => {}
                    // The stream ended (dropped, closed) or the time is up.
                    Ok(_) | Err(_) => return Ok((None, got)),
                }
            }
        }
    });
    let results: Vec<(Option<Duration>, u64)> = futures_util::future::join_all(clients)
        .await
        .into_iter()
        .collect::<anyhow::Result<_>>()?;
    let end = Sample::read(&addr).await;
    let _ = child.kill().await;
    let mut times: Vec<f64> = results
        .iter()
        .filter_map(|(t, _)| t.map(|t| t.as_secs_f64()))
        .collect();
    times.sort_by(f64::total_cmp);
    let finished = times.len();
    let stopped: Vec<u64> = results
        .iter()
        .filter(|(t, _)| t.is_none())
        .map(|(_, n)| *n)
        .collect();
    let drops: Vec<f64> = (0..3).map(|i| end.drops[i] - start.drops[i]).collect();
    let (frames_s, _) = start.rates(&end);
    let pick = |q: f64| {
        times
            .get(((times.len() as f64 - 1.0) * q) as usize)
            .copied()
    };
    eprintln!(
        "replayers ({wire:?}): {} from cursor 0 to seq {target}: {finished} finished (seconds min/median/max {:.1}/{:.1}/{:.1}), {} did not (events they had: {:?}); slow drops write-timeout/pong-timeout/behind {}/{}/{}; ingest meanwhile {frames_s:.0} frames/s of {} offered",
        a.replayers,
        pick(0.0).unwrap_or(0.0),
        pick(0.5).unwrap_or(0.0),
        pick(1.0).unwrap_or(0.0),
        stopped.len(),
        stopped.iter().take(10).collect::<Vec<_>>(),
        drops[0],
        drops[1],
        drops[2],
        a.rate,
    );
    Ok(serde_json::json!({
        "wire": match wire { Wire::V1 => "subscribe", Wire::V2 => "subscribeEvents" },
        "replayers": a.replayers,
        "history_seconds": a.replay_history,
        "target_seq": target,
        "rate_frames_per_s": a.rate,
        "finished": finished,
        "not_finished": stopped.len(),
        "seconds_to_finish_min": pick(0.0),
        "seconds_to_finish_median": pick(0.5),
        "seconds_to_finish_max": pick(1.0),
        "ingest_frames_per_s": frames_s,
        "slow_consumer_drops": {
            "write-timeout": drops[0], "pong-timeout": drops[1], "behind": drops[2],
        },
    }))
}
