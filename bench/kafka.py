#!/usr/bin/env python3
"""Scale-out benchmark: ingest -> Apache Kafka -> edge against single-node `riptide serve`.

usage: bench/kafka.py [--bin target/release/riptide] [--frames N] [--accounts N] [--rate R]
                      [--edges N] [--keep]

On a generated, chain-consistent network (`riptide gen`), with a one-broker Kafka from
deploy/kafka/start (loopback), it measures:

1. single node: `serve --ingest-file` (unpaced) until ingest finished: events/s and the
   server's CPU per event (utime+stime from /proc);
2. scale-out, unpaced: `serve --publish --ingest-file` and N edges (`serve --from`) until every
   edge stored every event: events/s end to end, the ingest node's CPU per event and what it
   adds to the single node's, each edge's and the broker's CPU per event;
3. scale-out, paced at --rate events/s: end-to-end latency p50/p99 (the edges'
   `riptide_ingest_publish_seconds`: from the ingest node's time_us stamp, taken before its Kafka
   commit, to the edge's store), from the histogram buckets;
4. edge replay to one consumer: a v1 client reading the whole store from cursor 0 of an edge,
   events/s (needs the Python `websockets` package; skipped with a note without it).

It prints one JSON object with the figures, the 1-minute load before and after, and the date.
Numbers from a loaded machine are not benchmarks: record `uptime` with them and re-measure on a
quiet machine. Everything runs on loopback and stops by itself (each wait is bounded).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_s(pid):
    """utime + stime of a process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def metrics(addr):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=30) as r:
        return r.read().decode()


def metric(addr, name):
    for line in metrics(addr).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def wait_metric(addr, name, at_least, limit_s):
    deadline = time.time() + limit_s
    while True:
        try:
            if metric(addr, name) >= at_least:
                return time.time()
        except OSError:
            pass
        if time.time() > deadline:
            raise SystemExit(f"{addr}: {name} never reached {at_least} in {limit_s}s")
        time.sleep(0.2)


def quantiles(addr, name, qs):
    """Quantiles from a Prometheus histogram's cumulative buckets (upper bounds)."""
    buckets = []
    for line in metrics(addr).splitlines():
        m = re.match(name + r'_bucket\{le="([^"]+)"\} (\S+)', line)
        if m:
            le = float("inf") if m.group(1) == "+Inf" else float(m.group(1))
            buckets.append((le, float(m.group(2))))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    out = {}
    for q in qs:
        want = q * total
        out[q] = next((le for le, c in buckets if c >= want), None)
    return out, total


class Proc:
    def __init__(self, args, log):
        self.log = open(log, "w")
        self.p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.addr = None

    def url(self, limit_s=600):
        # The first stdout line is the URL (a standby prints it only when it publishes).
        line = self.p.stdout.readline().strip()
        if not line:
            raise SystemExit(f"{self.p.args}: exited before printing its URL")
        self.addr = line.removeprefix("ws://").removesuffix("/subscribe")
        return self.addr

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.log.close()


def serve(bin_, data, extra, log):
    p = Proc([bin_, "serve", "--listen", "127.0.0.1:0", "--data", data] + extra, log)
    p.url()
    return p


def replay_rate(addr, n):
    try:
        import asyncio
        import websockets  # noqa: F401
    except ImportError:
        return None

    async def run():
        import websockets
        t0 = time.time()
        got = 0
        async with websockets.connect(f"ws://{addr}/subscribe?cursor=0", max_size=None) as ws:
            while got < n:
                await asyncio.wait_for(ws.recv(), 120)
                got += 1
        return got / (time.time() - t0)

    return asyncio.run(run())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", default=os.path.join(ROOT, "target/release/riptide"))
    ap.add_argument("--frames", type=int, default=20000)
    ap.add_argument("--accounts", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=500, help="paced phase, events/s")
    ap.add_argument("--paced-seconds", type=int, default=20)
    ap.add_argument("--edges", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    a = ap.parse_args()
    load0 = load()
    tmp = tempfile.mkdtemp(prefix="riptide-bench-kafka-")
    kdir = os.path.join(tmp, "kafka")
    procs = []
    try:
        net = os.path.join(tmp, "net")
        subprocess.run([a.bin, "gen", "--seed", "1", "--accounts", str(a.accounts), "--events",
                        str(a.frames), "--out", net, "--threads", "2"], check=True)
        frames = os.path.join(net, "firehose-frames.bin")
        docs = os.path.join(net, "did_docs.json")
        common = ["--did-docs", docs]
        bootstrap = subprocess.run([os.path.join(ROOT, "deploy/kafka/start"), kdir],
                                   check=True, capture_output=True, text=True).stdout.split()[0]
        with open(os.path.join(kdir, "node-1/pid")) as f:
            broker = int(f.read())

        # 1. Single node.
        s = serve(a.bin, os.path.join(tmp, "single"), common + ["--ingest-file", frames],
                  os.path.join(tmp, "single.log"))
        procs.append(s)
        t0, c0 = time.time(), cpu_s(s.p.pid)
        t1 = wait_metric(s.addr, "riptide_ingest_finished", 1, 1800)
        events = metric(s.addr, "riptide_log_next_seq") - 1
        single = {"events": events, "events_per_s": events / (t1 - t0),
                  "cpu_us_per_event": (cpu_s(s.p.pid) - c0) / events * 1e6}
        s.stop()

        # 2. Scale-out, unpaced.
        url = f"kafka://{bootstrap}/bench?partitions=8"
        b0 = cpu_s(broker)
        edges = [serve(a.bin, os.path.join(tmp, f"edge{i}"), ["--from", url],
                       os.path.join(tmp, f"edge{i}.log")) for i in range(a.edges)]
        procs += edges
        e0 = [cpu_s(e.p.pid) for e in edges]
        ing = serve(a.bin, os.path.join(tmp, "ingest"),
                    common + ["--publish", url, "--ingest-file", frames],
                    os.path.join(tmp, "ingest.log"))
        # From its URL: topics made, lease held, publisher ready (ingest starts with them).
        t0 = time.time()
        procs.append(ing)
        c0 = 0.0  # the ingest node's whole life is the run
        for e in edges:
            t1 = wait_metric(e.addr, "riptide_log_next_seq", events + 1, 1800)
        ingest_cpu = cpu_s(ing.p.pid) - c0
        scale = {
            "events_per_s_end_to_end": events / (t1 - t0),
            "ingest_cpu_us_per_event": ingest_cpu / events * 1e6,
            "added_cpu_us_per_event": ingest_cpu / events * 1e6 - single["cpu_us_per_event"],
            "edge_cpu_us_per_event": [(cpu_s(e.p.pid) - c) / events * 1e6
                                      for e, c in zip(edges, e0)],
            "broker_cpu_us_per_event": (cpu_s(broker) - b0) / events * 1e6,
        }
        ing.stop()
        for e in edges:
            e.stop()

        # 3. Paced: end-to-end latency.
        url2 = f"kafka://{bootstrap}/bench-paced?partitions=8"
        n = a.rate * a.paced_seconds
        edge = serve(a.bin, os.path.join(tmp, "edge-paced"), ["--from", url2],
                     os.path.join(tmp, "edge-paced.log"))
        procs.append(edge)
        ing = serve(a.bin, os.path.join(tmp, "ingest-paced"),
                    common + ["--publish", url2, "--ingest-file", frames,
                              "--ingest-rate", str(a.rate)], os.path.join(tmp, "ingest-paced.log"))
        procs.append(ing)
        wait_metric(edge.addr, "riptide_log_next_seq", min(n, events) + 1, 1800)
        q, count = quantiles(edge.addr, "riptide_ingest_publish_seconds", [0.5, 0.99])
        latency = {"rate": a.rate, "samples": count, "p50_s_le": q[0.5], "p99_s_le": q[0.99]}
        ing.stop()

        # 4. Edge replay to one consumer.
        replay = replay_rate(edge.addr, int(metric(edge.addr, "riptide_log_next_seq") - 1) // 2)
        edge.stop()

        out = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_before": load0, "load_after": load(),
            "frames": a.frames, "accounts": a.accounts, "edges": a.edges,
            "single_node": single, "scale_out": scale, "latency": latency,
            "edge_replay_events_per_s": replay,
            "note": "latency quantiles are histogram bucket upper bounds; re-measure on a quiet machine",
        }
        print(json.dumps(out, indent=2))
    finally:
        for p in procs:
            p.stop()
        subprocess.run([os.path.join(ROOT, "deploy/kafka/stop"), kdir], capture_output=True)
        if a.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
