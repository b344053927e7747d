"""The clients against riptide's own servers on loopback: `riptide relay` replaying the real
capture for `Firehose`, `riptide serve` having ingested it for `Jetstream`. Every event arrives,
in order, verified; plain iteration and `async for` agree; a relay that drops the connection is
followed through reconnects without a gap; a new client resumes from `cursor`.

Every wait is bounded: a watchdog closes the client after PATIENCE, which ends the iteration, so a
missing event fails the test instead of hanging it."""

import asyncio

import pytest

import riptide
from conftest import PATIENCE, Server, run_json_lines, take


def atake(client, n):
    """The first n items of an `async for`, bounded by PATIENCE."""

    async def run():
        out = []
        async for item in client:
            out.append(item)
            if len(out) == n:
                break
        return out

    async def bounded():
        try:
            return await asyncio.wait_for(run(), PATIENCE)
        except asyncio.TimeoutError:
            return []

    return asyncio.run(bounded())


def frame_key(f):
    return (f.seq, f.kind, f.did, f.rev, tuple((op.action, op.path, op.cid) for op in f.ops))


def test_firehose_receives_every_frame_verified(relay, frames_path, did_docs):
    expected = [riptide.decode_frame(b) for b in riptide.read_corpus(frames_path)]
    with riptide.Firehose(relay, cursor=0, did_docs=did_docs) as fh:
        got = take(fh, 150)
        assert fh.cursor == 150
        stats = fh.stats()
    assert len(got) == 150
    # The relay numbers its frames from 1; everything else is the capture's.
    assert [f.seq for f in got] == list(range(1, 151))
    assert [frame_key(f)[1:] for f in got] == [frame_key(f)[1:] for f in expected]
    assert all(f.verdict is not None and f.verdict.ok for f in got), [f.verdict for f in got if not f.verdict.ok]
    assert stats["verdicts"]["ok"] >= 150 and stats["messages"] >= 150
    records = [op.record for f in got for op in f.ops]
    assert records == [op.record for f in expected for op in f.ops]
    assert sum(r is not None for r in records) == 146


def test_firehose_async_and_plain_iteration_agree(relay, did_docs):
    plain = take(riptide.Firehose(relay, cursor=0, did_docs=did_docs), 150)
    asynced = atake(riptide.Firehose(relay, cursor=0, did_docs=did_docs), 150)
    unverified = take(riptide.Firehose(relay, cursor=0, verify=False), 150)
    assert len(plain) == len(asynced) == len(unverified) == 150
    assert [frame_key(f) for f in plain] == [frame_key(f) for f in asynced] == [frame_key(f) for f in unverified]
    assert all(f.verdict.ok for f in asynced)
    assert all(f.verdict is None for f in unverified)


def test_async_timeouts_lose_nothing(relay):
    """`asyncio.wait_for` around `__anext__` with a timeout shorter than a batch takes: the
    cancelled calls must leave their batches to the next ones."""

    async def run():
        it = riptide.Firehose(relay, cursor=0, verify=False).__aiter__()
        got, timeouts = [], 0
        while len(got) < 150:
            try:
                got.append(await asyncio.wait_for(it.__anext__(), 0.0005))
            except asyncio.TimeoutError:
                timeouts += 1
        it.close()
        return got, timeouts

    async def bounded():
        return await asyncio.wait_for(run(), PATIENCE)

    got, timeouts = asyncio.run(bounded())
    assert [f.seq for f in got] == list(range(1, 151))
    assert timeouts > 0


def test_firehose_resumes_from_its_cursor(relay, did_docs):
    first = riptide.Firehose(relay, cursor=0, did_docs=did_docs)
    head = take(first, 60)
    first.close()
    assert list(first) == [], "a closed client iterates no more"
    assert first.cursor == 60
    rest = take(riptide.Firehose(relay, cursor=first.cursor, did_docs=did_docs), 90)
    assert [f.seq for f in head + rest] == list(range(1, 151))


def test_firehose_reconnects_through_dropped_connections(riptide_bin, frames_path, did_docs):
    # The relay drops every connection after 40 frames: the client must reconnect (with backoff)
    # and resume after the last frame it received, four times over.
    s = Server([riptide_bin, "relay", "--replay", frames_path, "--listen", "127.0.0.1:0", "--drop-after", "40"],
               lambda l: l.strip() or None)
    try:
        with riptide.Firehose(s.address, cursor=0, did_docs=did_docs) as fh:
            got = take(fh, 150)
            stats = fh.stats()
    finally:
        s.kill()
    assert [f.seq for f in got] == list(range(1, 151))
    assert all(f.verdict.ok for f in got)
    assert stats["reconnects"] >= 3


def test_firehose_bad_url_is_a_value_error():
    with pytest.raises(ValueError):
        riptide.Firehose("not a url at all ://", verify=False)


def event_key(e):
    c = e.get("commit") or {}
    return (e["did"], e["kind"], c.get("operation"), c.get("collection"), c.get("rkey"), c.get("cid"))


@pytest.fixture
def projection(riptide_bin, frames_path):
    """The capture's Jetstream events as `riptide jetstream` projects them."""
    code, lines, err = run_json_lines([riptide_bin, "jetstream", frames_path])
    assert code == 0, err
    assert len(lines) > 140
    return lines


def test_jetstream_receives_every_event(serve, projection, corpus):
    url = f"ws://{serve}"
    with riptide.Jetstream(url, cursor=0) as js:
        plain = take(js, len(projection))
        assert js.cursor == plain[-1]["time_us"]
    assert [event_key(e) for e in plain] == [event_key(e) for e in projection]
    records = [e["commit"].get("record") for e in plain if e["kind"] == "commit"]
    assert records == [e["commit"].get("record") for e in projection if e["kind"] == "commit"]

    asynced = atake(riptide.Jetstream(url, cursor=0), len(projection))
    assert asynced == plain

    dictionary = corpus / "jetstream-dictionaries" / "legacy_subscribe.zdict"
    compressed = take(riptide.Jetstream(url, cursor=0, compress=True, zstd_dictionary=dictionary), len(projection))
    assert compressed == plain

    likes = [e for e in projection if (e.get("commit") or {}).get("collection") == "app.bsky.feed.like"]
    assert len(likes) > 50
    filtered = take(riptide.Jetstream(url, collections=["app.bsky.feed.like"], cursor=0), len(likes))
    assert [event_key(e) for e in filtered] == [event_key(e) for e in likes]


def test_jetstream_compress_needs_the_dictionary():
    with pytest.raises(ValueError, match="dictionary"):
        riptide.Jetstream("ws://127.0.0.1:1", compress=True)


def test_firehose_verifying_threads_agree_with_one(riptide_bin, frames_path, did_docs, tmp_path):
    """The capture four times over (600 frames: the repeats are stale revisions, so verdicts depend
    on each account's state, in order): any number of verifying threads gives the frames and
    verdicts of one thread, in stream order."""
    import struct

    frames = list(riptide.read_corpus(frames_path)) * 4
    path = tmp_path / "x4.bin"
    with open(path, "wb") as f:
        f.write(struct.pack(">I", len(frames)))
        for fr in frames:
            f.write(struct.pack(">I", len(fr)) + fr)
    s = Server([riptide_bin, "relay", "--replay", path, "--listen", "127.0.0.1:0", "--window", "600"],
               lambda l: l.strip() or None)
    try:
        runs = {}
        for threads in (1, 3):
            with riptide.Firehose(s.address, cursor=0, did_docs=did_docs, threads=threads) as fh:
                got = take(fh, 600)
                stats = fh.stats()
            assert len(got) == 600
            runs[threads] = ([frame_key(f) + (f.verdict.name, f.verdict.reason) for f in got], stats["verdicts"])
        assert runs[3] == runs[1]
        names = [k[-2] for k in runs[1][0]]
        assert names[:150].count("ok") == 150
        assert names.count("ok") < 600, "the repeats must exercise per-account state"
        with pytest.raises(ValueError):
            riptide.Firehose(s.address, threads=0)
    finally:
        s.kill()
