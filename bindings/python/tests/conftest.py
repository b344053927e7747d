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


@pytest.fixture
def serve(riptide_bin, capture, corpus, tmp_path):
    """`riptide serve` on loopback, having ingested (and verified) the real capture: its host:port."""
    dictionary = corpus / "jetstream-dictionaries" / "legacy_subscribe.zdict"
    args = [riptide_bin, "serve", "--listen", "127.0.0.1:0", "--data", tmp_path / "data",
            "--did-docs", capture / "did_docs.json", "--zstd-dictionary", dictionary,
            "--ingest-file", capture / "firehose-frames.bin"]
    prefix = "riptide serve: ws://"
    s = Server(args, lambda l: l[len(prefix):].removesuffix("/subscribe") if l.startswith(prefix) else None,
               stream="stderr", env={"RUST_LOG": "warn"})
    deadline = time.monotonic() + PATIENCE
    while (_metric(s.address, "riptide_ingest_finished") or 0) < 1:
        assert time.monotonic() < deadline, "serve never finished ingesting the capture"
        time.sleep(0.05)
    yield s.address
    s.kill()


def sha256(b):
    return hashlib.sha256(b).digest()
