"""Runs inside the venv `check` makes (atproto 0.0.73 from PyPI): the SDK's
`atproto_jetstream.JetstreamClient` against `riptide serve` on loopback.

Every scenario must receive exactly the events expected, each exactly once, in seq order:

  1. the real capture (jetstream-2026-07), from cursor 0, uncompressed: all 152 events, seqs
     1..152, each equal to `riptide jetstream`'s v1 projection of the capture (records, CIDs,
     upstream identity/account objects) in v2's shape, `time` with six fractional digits;
  2. the same compressed: the SDK fetches getZstdDictionary, connects with
     zstdDictionary=20260811, and must end up `compressed`;
  3. filters: kinds+collections, dids, kinds=identity+account;
  4. a cursor: from seq 100;
  5. resume: a server ingesting slowly is killed (-9) and restarted on the same port and data
     directory mid-stream; the client reconnects from its cursor and still gets every event once;
  6. a server without a v2 dictionary: the SDK's compression falls back, all events uncompressed;
  7. a generated network with #sync frames (`riptide gen`): #sync checked on the raw frames (the
     SDK cannot parse one, see check_sync), every other event through the SDK.

Environment: RIPTIDE (the binary), RIPTIDE_CORPUS.
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from atproto_client.models.utils import get_model_as_dict
from atproto_jetstream import JetstreamClient, parse_subscribe_events_message
from atproto_jetstream.models import MessageFrame

RIPTIDE = os.environ["RIPTIDE"]
CORPUS = os.environ["RIPTIDE_CORPUS"]
CAP = os.path.join(CORPUS, "jetstream-2026-07")
FRAMES = os.path.join(CAP, "firehose-frames.bin")
DOCS = os.path.join(CAP, "did_docs.json")
DICT = os.path.join(CORPUS, "jetstream-dictionaries", "subscribe_events_20260811.zdict")
NSID = "network.bsky.jetstream.subscribeEvents"
PATIENCE = 120.0
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class CheckFailed(Exception):
    pass


def log(msg):
    print(f"[jetstream-v2-check] {msg}", file=sys.stderr, flush=True)


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


class Server:
    """`riptide serve` as a child process, announced address parsed from stderr."""

    def __init__(self, data, args, port=0):
        cmd = [RIPTIDE, "serve", "--listen", f"127.0.0.1:{port}", "--data", data] + args
        env = dict(os.environ, RUST_LOG="warn")
        self.p = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        self.lines = []
        found = threading.Event()
        self.addr = None

        def read():
            for line in self.p.stderr:
                self.lines.append(line)
                m = re.match(r"riptide serve: ws://(\S+)/subscribe", line)
                if m and not found.is_set():
                    self.addr = m.group(1)
                    found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(PATIENCE):
            self.kill()
            raise CheckFailed("riptide serve never announced its address:\n" + "".join(self.lines[-20:]))

    def metric(self, name):
        with urllib.request.urlopen(f"http://{self.addr}/metrics", timeout=PATIENCE) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise CheckFailed(f"no metric {name}")

    def wait_metric(self, name, at_least):
        deadline = time.monotonic() + PATIENCE
        while self.metric(name) < at_least:
            expect(time.monotonic() < deadline, f"{name} never reached {at_least}")
            time.sleep(0.05)

    def kill(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)
        self.p.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def receive(addr, params, n, compress, on_message=None):
    """Runs a JetstreamClient until it has delivered `n` messages with a seq and then nothing
    more for a second; its messages and the client."""
    client = JetstreamClient(params=params, base_uri=f"ws://{addr}/xrpc", compress=compress, recv_timeout=PATIENCE)
    got, errors = [], []
    enough = threading.Event()

    def handle(m):
        got.append(m)
        if getattr(m, "seq", None) is not None and on_message:
            on_message(m, len([x for x in got if getattr(x, "seq", None) is not None]))
        if len([x for x in got if getattr(x, "seq", None) is not None]) >= n:
            enough.set()

    def run():
        try:
            client.start(handle, errors.append)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            enough.set()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    expect(enough.wait(PATIENCE), f"{params}: {len(got)} of {n} messages in {PATIENCE} s")
    time.sleep(1.0)  # anything more would be a duplicate or a filter leak
    client.stop()
    t.join(PATIENCE)
    expect(not errors, f"{params}: client errors: {errors!r}")
    return got, client


def as_v1(m):
    """What a v2 message says, as the SDK's models give it, keyed for comparison with
    [`expected`]: the whole payload dict (records through the SDK's record models)."""
    d = get_model_as_dict(m)
    ty = d.get("$type")
    expect(ty and ty.startswith(NSID + "#"), f"$type {ty!r}")
    expect(TIME_RE.match(m.time), f"time {m.time!r} is not RFC 3339 with six fractional digits")
    if ty == NSID + "#commit":
        expect(("record" in d) == (m.operation != "delete"), f"record on {m.operation}: {d}")
        expect(("cid" in d) == (m.operation != "delete"), f"cid on {m.operation}: {d}")
    d.pop("time")
    return d


def expected(v1):
    """The same for a v1 event (seq in `cursor`): the v2 payload it must become, parsed by the
    same SDK models."""
    kind = v1["kind"]
    payload = {"$type": f"{NSID}#{kind}", "seq": v1["cursor"], "did": v1["did"],
               "time": "2026-01-01T00:00:00.000000Z"}
    if kind == "commit":
        payload.update(v1["commit"])
    else:
        payload[kind] = v1[kind]
    d = get_model_as_dict(parse_subscribe_events_message(MessageFrame(payload=payload)))
    d.pop("time")
    return d


def strip(v1):
    v = dict(v1)
    v.pop("time_us", None)
    return v


def seqs(msgs):
    return [m.seq for m in msgs if getattr(m, "seq", None) is not None]


def check_capture(tmp, want):
    data = os.path.join(tmp, "capture")
    srv = Server(data, ["--ingest-file", FRAMES, "--did-docs", DOCS, "--zstd-dictionary-v2", DICT])
    try:
        srv.wait_metric("riptide_ingest_finished", 1)
        expect(srv.metric("riptide_events_stored_total") == len(want), "stored events")

        got, c = receive(srv.addr, {"cursor": 0}, len(want), compress=False)
        expect(not c.compressed, "uncompressed client reports compression")
        expect(seqs(got) == list(range(1, len(want) + 1)), f"seqs {seqs(got)[:5]}...")
        v2 = [as_v1(m) for m in got]
        for i, (a, b) in enumerate(zip(v2, want)):
            expect(a == b, f"event {i + 1}: v2 {json.dumps(a)[:400]}\n  v1 {json.dumps(b)[:400]}")
        log(f"1. uncompressed from cursor 0: {len(got)} events, each once, equal to v1's")

        got, c = receive(srv.addr, {"cursor": 0}, len(want), compress=True)
        expect(c.compressed, "the SDK did not end up compressed with the 20260811 dictionary")
        expect([as_v1(m) for m in got] == v2, "compressed stream differs")
        log(f"2. compressed (zstdDictionary=20260811): {len(got)} events, equal")

        did = want[10]["did"]
        commit = NSID + "#commit"
        for params, pred in [
            ({"cursor": 0, "kinds": ["commit"], "collections": ["app.bsky.feed.like"]},
             lambda e: e["$type"] == commit and e["collection"] == "app.bsky.feed.like"),
            ({"cursor": 0, "dids": [did]}, lambda e: e["did"] == did),
            ({"cursor": 0, "kinds": ["identity", "account"]}, lambda e: e["$type"] != commit),
            ({"cursor": 0, "collections": ["app.bsky.graph.*"]},
             lambda e: e["$type"] != commit or e["collection"].startswith("app.bsky.graph.")),
        ]:
            exp = [e for e in want if pred(e)]
            expect(exp, f"{params}: nothing expected")
            got, _ = receive(srv.addr, params, len(exp), compress=True)
            expect([as_v1(m) for m in got] == exp, f"{params}: got {seqs(got)}, want {[e['seq'] for e in exp]}")
            log(f"3. filter {params}: {len(got)} events")

        got, _ = receive(srv.addr, {"cursor": 100}, len(want) - 99, compress=True)
        expect(seqs(got) == list(range(100, len(want) + 1)), f"from 100: {seqs(got)[:3]}")
        log(f"4. from cursor 100: {len(got)} events")
    finally:
        srv.kill()


def check_resume(tmp, want):
    """Kill -9 and restart mid-stream: the SDK reconnects with its cursor, dedups the inclusive
    overlap, and gets every event once."""
    data = os.path.join(tmp, "resume")
    port = free_port()
    args = ["--ingest-file", FRAMES, "--did-docs", DOCS, "--zstd-dictionary-v2", DICT, "--ingest-rate", "30"]
    state = {"srv": Server(data, args, port), "stored_at_kill": None, "killed_at": None}

    def on_message(m, n):
        if n == 40 and state["killed_at"] is None:
            state["stored_at_kill"] = state["srv"].metric("riptide_events_stored_total")
            state["srv"].kill()
            state["killed_at"] = m.seq
            state["srv"] = Server(data, args, port)

    try:
        got, c = receive(state["srv"].addr, {"cursor": 0}, len(want), compress=True, on_message=on_message)
        expect(state["killed_at"] == 40, "the server was not restarted")
        expect(state["stored_at_kill"] < len(want), f"ingest had finished before the kill ({state['stored_at_kill']})")
        expect(seqs(got) == list(range(1, len(want) + 1)), f"seqs across the restart: {seqs(got)}")
        expect([as_v1(m) for m in got] == want, "events across the restart differ")
        expect(c.cursor == len(want), f"client cursor {c.cursor}")
        log(f"5. kill -9 at message 40 ({int(state['stored_at_kill'])} stored), restart, resume: "
            f"{len(got)} events, each once")
    finally:
        state["srv"].kill()


def check_no_dictionary(tmp, want):
    srv = Server(os.path.join(tmp, "nodict"), ["--ingest-file", FRAMES, "--did-docs", DOCS])
    try:
        srv.wait_metric("riptide_ingest_finished", 1)
        got, c = receive(srv.addr, {"cursor": 0}, len(want), compress=True)
        expect(not c.compressed, "compressed without a dictionary?")
        expect([as_v1(m) for m in got] == want, "events differ")
        log(f"6. no v2 dictionary: the SDK falls back to uncompressed, {len(got)} events")
    finally:
        srv.kill()


def raw_frames(addr, query, n):
    """`n` message frames of a v2 subscription, as JSON, read with the `websockets` library the
    SDK itself uses (not through the SDK's models)."""
    from websockets.sync.client import connect

    out = []
    with connect(f"ws://{addr}/xrpc/{NSID}?{query}", subprotocols=["xrpc.v1.json"], max_size=1 << 25) as ws:
        while len(out) < n:
            out.append(json.loads(ws.recv(timeout=PATIENCE)))
    return out


def check_sync(tmp):
    """#sync on a generated network. The SDK 0.0.73 cannot parse a #sync message: its model
    types `sync.blocks` as a string or bytes, while the atproto JSON form of bytes (and Jetstream
    v2's, `encoder_test.go`) is `{"$bytes": …}`. So #sync is checked on the raw frames, and the
    SDK is checked to receive every other kind of the same stream, each once."""
    gen = os.path.join(tmp, "gen")
    subprocess.run([RIPTIDE, "gen", "--seed", "7", "--accounts", "10", "--events", "1500", "--out", gen],
                   check=True, stderr=subprocess.DEVNULL)
    # --no-resync: the upstream #syncs are stored as they came (with resync, each would be
    # resynced from hosts this check does not run, and replaced by riptide's own #sync).
    srv = Server(os.path.join(tmp, "gendata"), [
        "--ingest-file", os.path.join(gen, "firehose-frames.bin"),
        "--did-docs", os.path.join(gen, "did_docs.json"), "--zstd-dictionary-v2", DICT,
        "--no-resync"])
    try:
        srv.wait_metric("riptide_ingest_finished", 1)
        stored = int(srv.metric("riptide_events_stored_total"))
        frames = raw_frames(srv.addr, "cursor=0", stored)
        expect([f["payload"]["seq"] for f in frames] == list(range(1, stored + 1)), "raw seqs")
        syncs = [f["payload"] for f in frames if f["payload"]["$type"] == NSID + "#sync"]
        expect(len(syncs) >= 2, f"{len(syncs)} #sync messages")
        for p in syncs:
            expect(p["sync"]["did"] == p["did"] and isinstance(p["sync"]["blocks"]["$bytes"], str), f"{p}")
        others = {f["payload"]["seq"] for f in frames} - {p["seq"] for p in syncs}
        got, _ = receive(srv.addr, {"cursor": 0, "kinds": ["commit", "identity", "account"]},
                         len(others), compress=True)
        expect(seqs(got) == sorted(others), "the non-#sync events through the SDK")
        log(f"7. generated network: {stored} events; {len(syncs)} #sync on the raw wire, the other "
            f"{len(got)} through the SDK, each once")
    finally:
        srv.kill()


def main():
    p = subprocess.run([RIPTIDE, "jetstream", FRAMES], check=True, stdout=subprocess.PIPE, text=True)
    want = [strip(json.loads(line)) for line in p.stdout.splitlines() if line.strip()]
    expect(len(want) == 152, f"the capture projects to {len(want)} events")
    for i, e in enumerate(want):
        e["cursor"] = i + 1
    want = [expected(e) for e in want]
    tmp = tempfile.mkdtemp(prefix="jetstream-v2-oracle-")
    t0 = time.monotonic()
    try:
        check_capture(tmp, want)
        check_resume(tmp, want)
        check_no_dictionary(tmp, want)
        check_sync(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"all checks passed in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    try:
        main()
    except CheckFailed as e:
        print(f"jetstream-v2 oracle check FAILED: {e}", file=sys.stderr)
        sys.exit(1)
