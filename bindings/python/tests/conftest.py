"""What the binding's tests share: the real capture (the shared corpus, found as the Rust tests
find it), the `riptide` binary (for its JSON projections and its servers), and servers started on
loopback, port 0, that are killed when the test ends, pass or fail.

Outside CI a missing corpus or binary skips the tests that need it, with the reason; under
CI=true it fails them: CI must never pass on tests that did not run.
"""

import hashlib
import json
import os
import queue
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
IN_CI = os.environ.get("CI") == "true"
# Generous: the machine that runs these may be loaded by other builds.
PATIENCE = 120.0


def _missing(what):
    if IN_CI:
        pytest.fail(f"{what} (CI=true: not skipping)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def corpus():
    d = Path(os.environ.get("RIPTIDE_CORPUS", ROOT.parent / "shared" / "corpus"))
    if not (d / "README.md").is_file():
        _missing(f"shared corpus not found at {d} (set RIPTIDE_CORPUS)")
    return d


@pytest.fixture(scope="session")
def capture(corpus):
    return corpus / "jetstream-2026-07"


@pytest.fixture(scope="session")
def frames_path(capture):
    return capture / "firehose-frames.bin"


@pytest.fixture(scope="session")
def did_docs(capture):
    return json.loads((capture / "did_docs.json").read_text())


@pytest.fixture(scope="session")
def riptide_bin():
    env = os.environ.get("RIPTIDE_BIN")
    candidates = [Path(env)] if env else [ROOT / "target" / "release" / "riptide", ROOT / "target" / "debug" / "riptide"]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    _missing(f"no riptide binary at {', '.join(map(str, candidates))} (cargo build --release, or set RIPTIDE_BIN)")


def run_json_lines(args):
    out = subprocess.run([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    return out.returncode, [json.loads(l) for l in out.stdout.decode().splitlines() if l.strip()], out.stderr.decode()


class Server:
    """A child process killed and reaped when the test ends; its output drained on a thread."""

    def __init__(self, args, announce, stream="stdout", env=None):
        self.proc = subprocess.Popen(
            [str(a) for a in args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ, **(env or {})),
        )
        lines = queue.Queue()
        self.log = []

        def drain(pipe, name):
            for raw in pipe:
                line = raw.decode(errors="replace").rstrip("\n")
                self.log.append(line)
                if name == stream:
                    lines.put(line)

        for pipe, name in ((self.proc.stdout, "stdout"), (self.proc.stderr, "stderr")):
            threading.Thread(target=drain, args=(pipe, name), daemon=True).start()
        deadline = time.monotonic() + PATIENCE
        self.address = None
        while self.address is None:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                self.kill()
                raise AssertionError(f"{args[1]} announced no address: {self.log[-20:]}")
            try:
                self.address = announce(lines.get(timeout=min(left, 1.0)))
            except queue.Empty:
                pass

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def relay(riptide_bin, frames_path):
    """`riptide relay --replay` of the real capture on loopback: its subscribeRepos URL."""
    s = Server([riptide_bin, "relay", "--replay", frames_path, "--listen", "127.0.0.1:0"], lambda l: l.strip() or None)
    yield s.address
    s.kill()


def _metric(addr, name):
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=PATIENCE) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


def start_serve(riptide_bin, capture, corpus, data, *extra):
    """`riptide serve` on loopback (with `extra` arguments), once it has ingested (and verified)
    the real capture: the Server, its host:port in `.address`."""
    dictionary = corpus / "jetstream-dictionaries" / "legacy_subscribe.zdict"
    args = [riptide_bin, "serve", "--listen", "127.0.0.1:0", "--data", data,
            "--did-docs", capture / "did_docs.json", "--zstd-dictionary", dictionary,
            "--ingest-file", capture / "firehose-frames.bin", *extra]
    prefix = "riptide serve: ws://"
    s = Server(args, lambda l: l[len(prefix):].removesuffix("/subscribe") if l.startswith(prefix) else None,
               stream="stderr", env={"RUST_LOG": "warn"})
    deadline = time.monotonic() + PATIENCE
    while (_metric(s.address, "riptide_ingest_finished") or 0) < 1:
        if time.monotonic() > deadline:
            s.kill()
            raise AssertionError("serve never finished ingesting the capture")
        time.sleep(0.05)
    return s


@pytest.fixture
def serve(riptide_bin, capture, corpus, tmp_path):
    """`riptide serve` on loopback, having ingested (and verified) the real capture: its host:port.
    No Jetstream v2 dictionary (`getZstdDictionary` answers 404)."""
    s = start_serve(riptide_bin, capture, corpus, tmp_path / "data")
    yield s.address
    s.kill()


@pytest.fixture
def serve_v2_dictionary(riptide_bin, capture, corpus, tmp_path):
    """`serve`, with Jetstream v2's dictionary (`--zstd-dictionary-v2`): its host:port."""
    dictionary = corpus / "jetstream-dictionaries" / "subscribe_events_20260811.zdict"
    s = start_serve(riptide_bin, capture, corpus, tmp_path / "data-v2", "--zstd-dictionary-v2", dictionary)
    yield s.address
    s.kill()


def take(client, n):
    """The first n items of a plain iteration (fewer if the watchdog closed the client)."""
    timer = threading.Timer(PATIENCE, client.close)
    timer.start()
    out = []
    try:
        for item in client:
            out.append(item)
            if len(out) == n:
                break
    finally:
        timer.cancel()
    return out


class Answer:
    """An HTTP server on loopback answering every request with `status` and `body`, in one write
    (a client reads the body with the head), and counting the requests."""

    def __init__(self, status, body, content_type="text/plain"):
        self.requests = 0
        data = body.encode()
        head = (f"HTTP/1.1 {status} Whatever\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"ws://127.0.0.1:{self.sock.getsockname()[1]}"

        def serve():
            while True:
                try:
                    conn, _ = self.sock.accept()
                except OSError:
                    return
                with conn:
                    try:
                        conn.settimeout(PATIENCE)
                        request = b""
                        while b"\r\n\r\n" not in request:
                            chunk = conn.recv(4096)
                            if not chunk:
                                break
                            request += chunk
                        self.requests += 1
                        conn.sendall(head + data)
                    except OSError:
                        pass  # a client that went away: the next one is served

        threading.Thread(target=serve, daemon=True).start()

    def close(self):
        self.sock.close()


@pytest.fixture
def answer():
    """Makes `Answer` servers, closed when the test ends."""
    servers = []

    def make(status, body, content_type="text/plain"):
        servers.append(Answer(status, body, content_type))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def sha256(b):
    return hashlib.sha256(b).digest()
