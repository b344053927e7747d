"""`riptide.Archive` (Jetstream v2's archive: `planSnapshot`, `getSegment`, `getBlock`) against a
real `riptide serve` on loopback, set up as `crates/cli/tests/tail_archive.rs` and
`oracles/jetstream-v2/archive_check.py` set it up: its archive holds the real capture's first 100
frames' events (`riptide corpus segments`, 8 rows a block, 5 blocks a segment), its live store
all of the capture, both numbered 1.. in frame order, so a replay must switch at the archive's
sealed tip. It requires a bearer token (`--archive-token`).

The expected events are not read from the segments: they are `riptide jetstream`'s v1
projection of the capture (seq n is its n-th line), whose `cid` comes from the firehose's CAR
blocks; each record's CID is also recomputed here with hashlib over the DAG-CBOR bytes the reader
exposes (`record_bytes=True`). Where the archive ends is the server's word (`sealedTipSeq` of a
raw `planSnapshot`). Every event is also compared, whole, with what `riptide.Jetstream` yields for
the same seq on the live v2 wire (but `time_us`: the archive rows carry the segment tool's
times)."""

import asyncio
import base64
import hashlib
import json
import struct
import urllib.request
from collections import Counter

import pytest

import riptide
from conftest import PATIENCE, run_json_lines, start_serve, take

TOKEN = "s3cret-archive-key"
V2 = "/xrpc/network.bsky.jetstream.subscribeEvents"


def head_frames(frames, n, out):
    """The capture's first `n` frames, in the corpus file format."""
    raw = frames.read_bytes()
    at = 4
    for _ in range(n):
        (length,) = struct.unpack(">I", raw[at:at + 4])
        at += 4 + length
    out.write_bytes(struct.pack(">I", n) + raw[4:at])


class Setup:
    pass


@pytest.fixture(scope="module")
def arch(riptide_bin, corpus, tmp_path_factory):
    capture = corpus / "jetstream-2026-07"
    frames = capture / "firehose-frames.bin"
    t = Setup()
    code, t.v1, err = run_json_lines([riptide_bin, "jetstream", frames])
    assert code == 0, err
    assert len(t.v1) == 152
    tmp = tmp_path_factory.mktemp("archive")
    head_frames(frames, 100, tmp / "head.bin")
    t.segments = tmp / "data" / "segments"
    code, _, err = run_json_lines([riptide_bin, "corpus", "segments", tmp / "head.bin", "--out", t.segments,
                                   "--block-rows", "8", "--segment-blocks", "5"])
    assert code == 0, err
    server = start_serve(riptide_bin, capture, corpus, tmp / "data", "--archive-token", TOKEN)
    t.addr = server.address
    t.url = f"http://{t.addr}"
    req = urllib.request.Request(
        f"{t.url}/xrpc/network.bsky.jetstream.planSnapshot", data=b"{}", method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=PATIENCE) as r:
        t.sealed = json.loads(r.read())["sealedTipSeq"]
    assert 50 < t.sealed < 152, t.sealed
    # The live v2 wire's dicts for every seq (the same server).
    t.live = take(riptide.Jetstream(f"ws://{t.addr}{V2}", cursor=0), 152)
    assert [e["cursor"] for e in t.live] == list(range(1, 153))
    yield t
    server.kill()


def key(e):
    """What identifies an event across sources: seq, kind, DID, and for a commit its operation,
    collection, rkey and CID."""
    c = e.get("commit") or {}
    return (e["cursor"], e["kind"], e["did"], c.get("operation"), c.get("collection"), c.get("rkey"), c.get("cid"))


def expected(t, pred, upto):
    """The v1 projection's events (seq n = line n) up to seq `upto` that `pred` keeps."""
    out = []
    for n, e in enumerate(t.v1[:upto], start=1):
        k = key(dict(e, cursor=n))
        if pred(k):
            out.append(k)
    return out


def no_time(e):
    return {k: v for k, v in e.items() if k != "time_us"}


def cid_of(data):
    """CIDv1, dag-cbor (0x71), sha2-256, as base32 text: computed here, not by riptide."""
    raw = bytes([0x01, 0x71, 0x12, 0x20]) + hashlib.sha256(data).digest()
    return "b" + base64.b32encode(raw).decode().lower().rstrip("=")


def read_all(r):
    got = take(r, 10**9)
    assert r._closed, "the read did not end"
    return got


def test_snapshot_is_the_archive_each_event_once_with_its_cid(arch):
    t = arch
    r = riptide.Archive(t.url, token=TOKEN).snapshot(record_bytes=True)
    got = read_all(r)
    assert [key(e) for e in got] == expected(t, lambda k: True, t.sealed)
    assert r.cursor == t.sealed
    s = r.stats()
    assert s["events"] == t.sealed and s["rows_rejected"] == 0 and s["plan_pages"] >= 1
    assert s["segments"] + s["blocks"] >= 1 and s["bytes"] > 0 and s["live"] is None
    records = 0
    for e in got:
        c = e.get("commit")
        if c and c["operation"] != "delete":
            assert cid_of(c.pop("record_bytes")) == c["cid"]
            records += 1
    assert records > 50
    # The same dicts as the live v2 client's for the same seqs (times aside).
    assert [no_time(e) for e in got] == [no_time(e) for e in t.live[:t.sealed]]
    # And the records the v1 projection took from the CAR.
    for e in got:
        if e["kind"] == "commit" and e["commit"]["operation"] != "delete":
            assert e["commit"]["record"] == t.v1[e["cursor"] - 1]["commit"]["record"]


def cases(t):
    per_did = Counter(key(dict(e, cursor=0))[2] for e in t.v1)
    did = per_did.most_common(1)[0][0]
    return [
        (dict(dids=[did]), lambda k: k[2] == did),
        (dict(kinds=["commit"], collections=["app.bsky.feed.like"]),
         lambda k: k[1] == "commit" and k[4] == "app.bsky.feed.like"),
        (dict(collections=["app.bsky.graph.*"]), lambda k: k[1] != "commit" or k[4].startswith("app.bsky.graph.")),
        (dict(kinds=["identity", "account"]), lambda k: k[1] != "commit"),
    ]


def test_filters_snapshot_and_replay_each_event_once(arch):
    t = arch
    a = riptide.Archive(t.url, token=TOKEN)
    fetched = Counter()
    for kw, pred in cases(t):
        want = expected(t, pred, t.sealed)
        snap = a.snapshot(**kw)
        assert [key(e) for e in read_all(snap)] == want, kw
        fetched.update({k: snap.stats()[k] for k in ("segments", "blocks")})
        # Archive then live: every matching event of the capture once across the switch.
        everything = expected(t, pred, 152)
        assert everything, kw
        with a.replay(**kw) as r:
            got = take(r, len(everything))
            s = r.stats()
        assert [key(e) for e in got] == everything, kw
        assert s["events"] == len(want), (kw, s)
        live = len(everything) - len(want)
        if live:
            assert s["live"] is not None and s["live"]["messages"] >= live, (kw, s)

    # The planner chose whole segments for some reads and single blocks (getBlock) for others.
    assert fetched["segments"] >= 1 and fetched["blocks"] >= 1, fetched

    # A window: after seq 37 (exclusive) through seq 90 (inclusive).
    r = a.snapshot(after_seq=37, before_seq=90)
    assert [key(e) for e in read_all(r)] == expected(t, lambda k: k[0] > 37, 90)
    # A replay from inside the archive, and one from past its end (live only).
    for after in (59, t.sealed + 10):
        want = expected(t, lambda k: k[0] > after, 152)
        with a.replay(after_seq=after) as r:
            assert [key(e) for e in take(r, len(want))] == want
            assert r.cursor == 152
    # compress=True on a server without a v2 dictionary: the live part read uncompressed.
    want = expected(t, lambda k: True, 152)
    with a.replay(compress=True) as r:
        assert [key(e) for e in take(r, len(want))] == want


def test_async_iteration(arch):
    t = arch

    async def run():
        out = []
        async for e in riptide.Archive(t.url, token=TOKEN).snapshot(kinds=["commit"]):
            out.append(e)
        return out

    got = asyncio.run(asyncio.wait_for(run(), PATIENCE))
    assert [key(e) for e in got] == expected(t, lambda k: k[1] == "commit", t.sealed)


def test_read_segment_reads_each_file(arch):
    t = arch
    via_http = read_all(riptide.Archive(t.url, token=TOKEN).snapshot())
    files = sorted(t.segments.glob("seg_*.jss"))
    assert len(files) >= 2
    got = [e for f in files for e in riptide.read_segment(f.read_bytes())]
    assert got == via_http
    bad = bytearray(files[0].read_bytes())
    bad[300] ^= 0xFF
    with pytest.raises(riptide.CorruptArchiveError):
        list(riptide.read_segment(bytes(bad)))
    with pytest.raises(riptide.CorruptArchiveError):
        next(riptide.read_segment(b"jss0"))
    # A truncated file: the error, once, then nothing.
    it = riptide.read_segment(files[-1].read_bytes()[:-1])
    with pytest.raises(riptide.CorruptArchiveError):
        next(it)
    assert list(it) == []


def test_a_wrong_or_missing_token_is_refused_once(arch):
    for token in ("wrong", None):
        r = riptide.Archive(arch.url, token=token).snapshot()
        with pytest.raises(riptide.UnauthorizedError) as raised:
            read_all(r)
        e = raised.value
        assert isinstance(e, riptide.RefusedError) and isinstance(e, riptide.PermanentConnectError)
        assert (e.status, e.error) == (401, "AuthRequired")
        assert "bearer token" in str(e) and arch.url in str(e)
        assert r.last_error is e
        # The read ended: nothing more, no second error.
        assert list(r) == []


def test_limits_and_requests_that_cannot_work(arch):
    a = riptide.Archive(arch.url, token=TOKEN, max_segment_bytes=1000)
    with pytest.raises(riptide.TooLargeError) as raised:
        read_all(a.snapshot())
    assert raised.value.limit == 1000 and raised.value.bytes > 1000
    with pytest.raises(ValueError, match="kind"):
        riptide.Archive(arch.url).snapshot(kinds=["nope"])
    with pytest.raises(ValueError):
        riptide.Archive(arch.url).snapshot(after_seq=10, before_seq=5)
    with pytest.raises(riptide.InvalidUrlError):
        riptide.Archive("ftp://nowhere").snapshot()
    with pytest.raises(ValueError, match="max_attempts"):
        riptide.Archive(arch.url, max_attempts=0).snapshot()


def test_failures_of_the_server_are_typed(answer):
    # Transient on every attempt: unavailable, with the attempts and the last reason.
    srv = answer(503, "busy")
    r = riptide.Archive(srv.url, max_attempts=2).snapshot()
    with pytest.raises(riptide.UnavailableError) as raised:
        read_all(r)
    e = raised.value
    assert not isinstance(e, riptide.PermanentConnectError) and isinstance(e, riptide.ConnectError)
    assert e.attempts == 2 and "planSnapshot" in e.what and "503" in e.last and srv.requests == 2

    # A planner that stops advancing: an error, not a loop.
    stalled = {"plannedThroughSeq": 5, "sealedTipSeq": 10, "segments": [],
               "stats": {"segmentsExamined": 0, "segmentsMatched": 0, "blocksMatched": 0, "entries": 0}}
    srv = answer(200, json.dumps(stalled), "application/json")
    with pytest.raises(riptide.StalledPlannerError) as raised:
        read_all(riptide.Archive(srv.url).snapshot())
    assert (raised.value.after_seq, raised.value.planned, raised.value.tip) == (5, 5, 10)
    assert srv.requests == 2

    # A plan naming something that is not a segment file.
    odd = dict(stalled, plannedThroughSeq=10,
               segments=[{"name": "../etc/passwd", "index": 0, "checksum": "0", "minSeq": 1, "maxSeq": 10,
                          "mode": "segment"}])
    srv = answer(200, json.dumps(odd), "application/json")
    with pytest.raises(riptide.CorruptArchiveError, match="not a segment file"):
        read_all(riptide.Archive(srv.url).snapshot())


def test_cursor_too_old_is_typed(answer):
    srv = answer(400, '{"error":"CursorTooOld","message":"cursor 1 is below the live floor 51"}', "application/json")
    with pytest.raises(riptide.CursorTooOldError) as raised:
        take(riptide.Jetstream(srv.url + V2, cursor=1), 1)
    e = raised.value
    assert isinstance(e, riptide.RefusedError)
    assert (e.status, e.error) == (400, "CursorTooOld") and "floor 51" in e.message


def test_next_batch_and_close_mid_read(arch):
    t = arch
    r = riptide.Archive(t.url, token=TOKEN, range_bytes=4096).snapshot()
    got = []
    while len(got) < t.sealed:
        batch = r.next_batch(timeout=PATIENCE)
        assert batch, f"no events after {len(got)}"
        got.extend(batch)
    assert [key(e) for e in got] == expected(t, lambda k: True, t.sealed)
    assert r.next_batch(timeout=PATIENCE) == [] and r._closed
    assert r.stats()["segments"] >= 1
    # Closed after the first event: iteration ends, nothing hangs.
    r = riptide.Archive(t.url, token=TOKEN).replay()
    assert next(r)["cursor"] == 1
    r.close()
    assert list(r) == []
