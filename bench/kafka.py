#!/usr/bin/env python3
"""Scale-out benchmark: ingest -> Apache Kafka -> edge against single-node `riptide serve`.

usage: bench/kafka.py [--bin target/release/riptide] [--frames N] [--accounts N] [--rate R]
                      [--paced-seconds S] [--edges N] [--keep]

On a generated, chain-consistent network (`riptide gen`), with a one-broker Kafka from
deploy/kafka/start (loopback), it measures:

1. single node: `serve --ingest-file` (unpaced) until ingest finished: events/s and the
   server's CPU per event (utime+stime from /proc);
2. scale-out, unpaced: `serve --publish --ingest-file` and N edges (`serve --from`) until every
   edge stored every event: events/s end to end, the ingest node's CPU per event and what it
   adds to the single node's, each edge's CPU per event, and the broker's: its CPU over the
   run minus its idle CPU (measured for 5 s before) over the same time, per event;
3. latency, paced at --rate frames/s for --paced-seconds: a live v1 client on the edge records,
   for every event, its arrival time minus the event's `time_us` (stamped by the ingest node
   when it renders the event, before its Kafka transaction): real quantiles (p50, p90, p99,
   max) over every event, not histogram buckets. The same client on a single node paced the
   same way gives the single node's stamp-to-client latency: the difference is what Kafka adds
   (transaction commit, the edge's poll, its durable store write); the ingest node's transaction
   count and mean commit time come with it;
4. edge replay to one consumer: a v1 client reading the edge's whole store from cursor 0 as
   fast as it can, events/s; the same client on the single node's store from step 1 alongside.

Steps 3 and 4 need the Python `websockets` package (e.g. in a venv: `python3 -m venv /tmp/v &&
/tmp/v/bin/pip install websockets`, then run this script with /tmp/v/bin/python); without it
they are skipped with a note.

It prints one JSON object with the figures, the 1-minute load before and after, and the date.
Numbers from a loaded machine are not benchmarks: record `uptime` with them and re-measure on a
quiet machine. Everything runs on loopback and stops by itself (each wait is bounded).
"""

import argparse
import json
import os
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


def have_websockets():
    try:
        import websockets  # noqa: F401
        return True
    except ImportError:
        return False


def replay_rate(addr):
    """A v1 client reading an idle server's store from cursor 0 to its end (no message for
    2 s): events/s from the first message to the last, and how many."""
    if not have_websockets():
        return None
    import asyncio
    import websockets

    async def run():
        async with websockets.connect(f"ws://{addr}/subscribe?cursor=0", max_size=None,
                                      compression=None) as ws:
            await asyncio.wait_for(ws.recv(), 120)
            t0 = t1 = time.time()
            got = 1
            while True:
                try:
                    await asyncio.wait_for(ws.recv(), 2)
                except asyncio.TimeoutError:
                    break
                t1 = time.time()
                got += 1
        return {"events": got, "events_per_s": (got - 1) / max(t1 - t0, 1e-9)}

    return asyncio.run(run())


class LatencyClient:
    """A live v1 client on its own thread: for each event, arrival time minus `time_us`."""

    def __init__(self, addr):
        import threading
        self.addr, self.samples, self.error = addr, [], None
        self.connected = threading.Event()
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run, daemon=True)
        self.t.start()
        if not self.connected.wait(60):
            raise SystemExit(f"{addr}: the latency client did not connect")

    def run(self):
        import asyncio
        import websockets

        async def go():
            async with websockets.connect(f"ws://{self.addr}/subscribe", max_size=None,
                                          compression=None) as ws:
                self.connected.set()
                while not self.stop.is_set():
                    try:
                        m = await asyncio.wait_for(ws.recv(), 0.5)
                    except asyncio.TimeoutError:
                        continue
                    now = time.time()
                    t = json.loads(m)["time_us"]
                    self.samples.append(now - t / 1e6)

        try:
            asyncio.run(go())
        except Exception as e:  # reported with the figures
            self.error = repr(e)
            self.connected.set()

    def finish(self, want, limit_s):
        deadline = time.time() + limit_s
        while len(self.samples) < want and time.time() < deadline:
            time.sleep(0.2)
        self.stop.set()
        self.t.join(5)
        xs = sorted(self.samples)
        if not xs:
            return {"samples": 0, "error": self.error}
        q = lambda p: xs[min(len(xs) - 1, int(p * len(xs)))]
        return {"samples": len(xs), "p50_ms": q(0.5) * 1e3, "p90_ms": q(0.9) * 1e3,
                "p99_ms": q(0.99) * 1e3, "max_ms": xs[-1] * 1e3, "error": self.error}


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

        # 1. Single node (its store is kept for step 4).
        s = serve(a.bin, os.path.join(tmp, "single"), common + ["--ingest-file", frames],
                  os.path.join(tmp, "single.log"))
        procs.append(s)
        t0, c0 = time.time(), cpu_s(s.p.pid)
        t1 = wait_metric(s.addr, "riptide_ingest_finished", 1, 1800)
        events = metric(s.addr, "riptide_log_next_seq") - 1
        single = {"events": events, "events_per_s": events / (t1 - t0),
                  "cpu_us_per_event": (cpu_s(s.p.pid) - c0) / events * 1e6}
        single_node = s

        # The broker's idle CPU (a JVM and KRaft controller are never quite idle).
        b0, tb = cpu_s(broker), time.time()
        time.sleep(5)
        broker_idle = (cpu_s(broker) - b0) / (time.time() - tb)

        # 2. Scale-out, unpaced.
        url = f"kafka://{bootstrap}/bench?partitions=8"
        edges = [serve(a.bin, os.path.join(tmp, f"edge{i}"), ["--from", url],
                       os.path.join(tmp, f"edge{i}.log")) for i in range(a.edges)]
        procs += edges
        e0 = [cpu_s(e.p.pid) for e in edges]
        b0, tb = cpu_s(broker), time.time()
        ing = serve(a.bin, os.path.join(tmp, "ingest"),
                    common + ["--publish", url, "--ingest-file", frames],
                    os.path.join(tmp, "ingest.log"))
        # From its URL: topics made, lease held, publisher ready (ingest starts with them).
        t0 = time.time()
        procs.append(ing)
        for e in edges:
            t1 = wait_metric(e.addr, "riptide_log_next_seq", events + 1, 1800)
        ingest_cpu = cpu_s(ing.p.pid)  # its whole life is the run
        broker_s = cpu_s(broker) - b0
        broker_net = broker_s - broker_idle * (time.time() - tb)
        scale = {
            "events_per_s_end_to_end": events / (t1 - t0),
            "ingest_cpu_us_per_event": ingest_cpu / events * 1e6,
            "added_cpu_us_per_event": ingest_cpu / events * 1e6 - single["cpu_us_per_event"],
            "edge_cpu_us_per_event": [(cpu_s(e.p.pid) - c) / events * 1e6
                                      for e, c in zip(edges, e0)],
            "broker_cpu_us_per_event": broker_s / events * 1e6,
            "broker_idle_cpu_s_per_s": broker_idle,
            "broker_cpu_us_per_event_minus_idle": broker_net / events * 1e6,
        }
        ing.stop()

        # 4. Edge replay to one consumer, and the single node's alongside (same client).
        replay = {"edge": replay_rate(edges[0].addr),
                  "single_node": replay_rate(single_node.addr)}
        single_node.stop()
        for e in edges:
            e.stop()

        # 3. Paced: stamp-to-client latency through Kafka, and on a single node.
        latency = {"rate_frames_per_s": a.rate, "seconds": a.paced_seconds}
        n = min(a.rate * a.paced_seconds, a.frames)
        if have_websockets():
            url2 = f"kafka://{bootstrap}/bench-paced?partitions=8"
            edge = serve(a.bin, os.path.join(tmp, "edge-paced"), ["--from", url2],
                         os.path.join(tmp, "edge-paced.log"))
            procs.append(edge)
            client = LatencyClient(edge.addr)
            ing = serve(a.bin, os.path.join(tmp, "ingest-paced"),
                        common + ["--publish", url2, "--ingest-file", frames,
                                  "--ingest-rate", str(a.rate)],
                        os.path.join(tmp, "ingest-paced.log"))
            procs.append(ing)
            # v1 sends every event but #sync: about one a frame.
            latency["kafka"] = client.finish(int(n * 0.95), a.paced_seconds * 3 + 120)
            # The ingest node's side of it: one transaction per ingest batch, begin to committed.
            txns = metric(ing.addr, "riptide_kafka_commit_seconds_count")
            latency["kafka_transactions"] = txns
            latency["kafka_commit_ms_mean"] = (
                metric(ing.addr, "riptide_kafka_commit_seconds_sum") / txns * 1e3 if txns else None)
            ing.stop()
            # The replay of a store written slowly (many small batches), for comparison.
            replay["edge_paced_store"] = replay_rate(edge.addr)
            edge.stop()
            s = serve(a.bin, os.path.join(tmp, "single-paced"),
                      common + ["--ingest-file", frames, "--ingest-rate", str(a.rate)],
                      os.path.join(tmp, "single-paced.log"))
            procs.append(s)
            # Connected after the server started: the first events may pass unseen.
            client = LatencyClient(s.addr)
            latency["single_node"] = client.finish(int(n * 0.9), a.paced_seconds * 3 + 120)
            s.stop()
        else:
            latency["note"] = "skipped: the Python websockets package is not installed"

        out = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_before": load0, "load_after": load(),
            "frames": a.frames, "accounts": a.accounts, "edges": a.edges,
            "single_node": single, "scale_out": scale, "latency": latency,
            "replay_to_one_consumer": replay,
            "note": "numbers from a loaded machine are not benchmarks; re-measure on a quiet one",
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
