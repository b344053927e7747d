"""decode_frames on the real capture: the same frames, records and errors as decode_frame, in the
same order, whatever the number of threads; bad input raised at its position with the right
DecodeError subclass; the iterator ends cleanly and may be dropped at any point."""

import gc
import threading

import pytest

import riptide
from test_decode import flip_in_last_block

THREADS = (0, 1, 2, 3)


def summary(f):
    """Everything a Frame says, records included."""
    return (
        f.kind, f.seq, f.did, f.rev, f.since, f.time, f.commit, f.prev_data, f.blocks, f.handle,
        f.active, f.status, f.name, f.message, f.error, f.bytes,
        [(op.action, op.path, op.collection, op.rkey, op.cid, op.prev, op.record) for op in f.ops],
    )


def outcomes(it):
    """('frame', summary) or (exception class, index, offset, message) per item, to the end."""
    out = []
    while True:
        try:
            f = next(it)
        except StopIteration:
            return out
        except riptide.DecodeError as e:
            out.append((type(e), e.index, e.offset, str(e)))
        else:
            out.append(("frame", summary(f)))


@pytest.fixture(scope="module")
def frames(frames_path):
    fs = list(riptide.read_corpus(frames_path))
    assert len(fs) == 150
    return fs


@pytest.mark.parametrize("threads", THREADS)
def test_same_frames_and_records_as_decode_frame(frames, threads):
    want = [summary(riptide.decode_frame(f)) for f in frames]
    got = [summary(f) for f in riptide.decode_frames(frames, threads=threads)]
    assert got == want
    assert sum(s[8] for s in got) == 1549
    assert sum(1 for s in got for op in s[16] if op[6] is not None) == 146


def test_threads_agree_across_many_chunks(frames):
    many = frames * 7  # 1,050 frames: many chunks, every worker several times
    runs = {t: [(f.seq, f.commit, len(f.ops)) for f in riptide.decode_frames(many, threads=t)] for t in (0, 1, 2, 5)}
    assert len(runs[0]) == 1050
    assert runs[1] == runs[0] and runs[2] == runs[0] and runs[5] == runs[0]
    assert len(list(riptide.decode_frames(iter(many)))) == 1050  # a plain iterator, default threads


def test_frames_keep_the_callers_bytes(frames):
    f = next(riptide.decode_frames(frames[:1], threads=1))
    assert f.bytes is frames[0]


def bad_mix(frames):
    """Good frames with bad ones between them, each kind of error, across chunk boundaries."""
    commit = next(f for f in frames if riptide.decode_frame(f).blocks > 1)
    bad = [flip_in_last_block(commit), commit[:1], b"\xff\xff\xff", commit[: len(commit) // 2], b""]
    mix = []
    for i in range(200):
        mix.append(frames[i % len(frames)])
        if i % 37 == 5:
            mix.append(bad[(i // 37) % len(bad)])
    return mix


def expected(mix, verify_cids=True):
    out = []
    for i, data in enumerate(mix):
        try:
            out.append(("frame", summary(riptide.decode_frame(data, verify_cids=verify_cids))))
        except riptide.DecodeError as e:
            out.append((type(e), i, e.offset, str(e)))
    return out


@pytest.mark.parametrize("threads", THREADS)
def test_bad_frames_raise_their_error_in_order_and_iteration_goes_on(frames, threads):
    mix = bad_mix(frames)
    want = expected(mix)
    classes = {w[0] for w in want if w[0] != "frame"}
    assert {riptide.BadBlockCidError, riptide.TruncatedError, riptide.MalformedError} <= classes
    assert outcomes(riptide.decode_frames(mix, threads=threads)) == want
    # Without CID checks the tampered block decodes, as with decode_frame.
    assert outcomes(riptide.decode_frames(mix, verify_cids=False, threads=threads)) == expected(mix, False)


@pytest.mark.parametrize("threads", (0, 2))
def test_on_error_yield_gives_invalid_frames(frames, threads):
    mix = bad_mix(frames)
    want = expected(mix)
    got = list(riptide.decode_frames(mix, threads=threads, on_error="yield"))
    assert len(got) == len(mix)
    for f, w in zip(got, want):
        if w[0] == "frame":
            assert summary(f) == w[1]
        else:
            assert f.kind == "invalid" and f.error == w[3] and f.ops == []
    with pytest.raises(ValueError):
        riptide.decode_frames(mix, on_error="ignore")


@pytest.mark.parametrize("threads", (0, 2))
def test_the_iterator_ends_cleanly(frames, threads):
    it = riptide.decode_frames(frames[:3], threads=threads)
    assert iter(it) is it
    assert len(list(it)) == 3 and it.index == 3
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(it)
    assert list(riptide.decode_frames([], threads=threads)) == []


@pytest.mark.parametrize("threads", (0, 2))
def test_input_errors_come_after_the_frames_before_them(frames, threads):
    def gen():
        yield from frames[:100]
        raise KeyError("from the input")

    it = riptide.decode_frames(gen(), threads=threads)
    seqs = []
    with pytest.raises(KeyError, match="from the input"):
        for f in it:
            seqs.append(f.seq)
    assert seqs == [riptide.decode_frame(f).seq for f in frames[:100]]
    with pytest.raises(StopIteration):
        next(it)
    it = riptide.decode_frames(frames[:70] + ["not bytes"] + frames[:5], threads=threads)
    got = []
    with pytest.raises(TypeError, match="item 70 is str"):
        for f in it:
            got.append(f)
    assert len(got) == 70
    with pytest.raises(TypeError):
        riptide.decode_frames(42)


def test_dropping_the_iterator_early_is_safe(frames):
    many = frames * 20
    for i in range(40):
        it = riptide.decode_frames(many, threads=1 + i % 3)
        for _ in range(i % 5):
            next(it)
        del it
    gc.collect()
    # And from another thread, dropped while its workers are busy.
    def drop():
        it = riptide.decode_frames(many, threads=2)
        next(it)

    ts = [threading.Thread(target=drop) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in ts)
    assert len(list(riptide.decode_frames(frames))) == 150
