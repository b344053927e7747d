"""decode_frame and read_corpus on the real capture: counts against the corpus manifest, every
field and record against the Rust JSON projection (`riptide decode --json`), and bad input as
typed exceptions with byte offsets, never a crash."""

import random
import struct

import pytest

import riptide
from conftest import run_json_lines


def test_version():
    assert isinstance(riptide.__version__, str) and riptide.__version__.count(".") == 2


def test_the_capture_decodes_to_150_frames_and_1549_blocks(frames_path):
    frames = list(riptide.read_corpus(frames_path))
    assert len(frames) == 150
    decoded = [riptide.decode_frame(f) for f in frames]
    assert sum(d.blocks for d in decoded) == 1549
    kinds = {}
    for d in decoded:
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    assert kinds == {"commit": 148, "identity": 1, "account": 1}
    actions = {}
    for d in decoded:
        for op in d.ops:
            actions[op.action] = actions.get(op.action, 0) + 1
    # The manifest: 144 creates, 2 updates, 4 deletes.
    assert actions == {"create": 144, "update": 2, "delete": 4}
    seqs = [d.seq for d in decoded]
    assert seqs == list(range(31527015322, 31527015472))


def test_records_equal_the_rust_json_projection(frames_path, riptide_bin):
    code, lines, err = run_json_lines([riptide_bin, "decode", frames_path, "--json"])
    assert code == 0, err
    assert len(lines) == 150
    records = 0
    for data, want in zip(riptide.read_corpus(frames_path), lines):
        f = riptide.decode_frame(data)
        assert f.kind == want["kind"]
        assert f.seq == want.get("seq")
        assert f.did == want.get("did")
        if f.kind != "commit":
            assert f.ops == []
            continue
        assert (f.rev, f.since, f.time, f.commit, f.prev_data, f.blocks) == (
            want["rev"], want["since"], want["time"], want["commit"], want["prevData"], want["blocks"])
        assert len(f.ops) == len(want["ops"])
        for op, w in zip(f.ops, want["ops"]):
            assert (op.action, op.path, op.cid, op.prev) == (w["action"], w["path"], w["cid"], w["prev"])
            assert f"{op.collection}/{op.rkey}" == op.path
            if op.action == "delete":
                assert op.record is None and "record" not in w
            else:
                assert w["record"] is not None
                assert op.record == w["record"]
                assert op.record is op.record, "built once, then cached"
                records += 1
    assert records == 146


def test_records_carry_links_in_atproto_json_form(frames_path):
    links = 0
    for data in riptide.read_corpus(frames_path):
        for op in riptide.decode_frame(data).ops:
            stack = [op.record]
            while stack:
                v = stack.pop()
                if isinstance(v, dict):
                    if "$link" in v:
                        assert set(v) == {"$link"} and v["$link"].startswith(("bafy", "bafk"))
                        links += 1
                    stack.extend(v.values())
                elif isinstance(v, list):
                    stack.extend(v)
    assert links >= 5  # blob refs (likes and reposts hold their CIDs as text)


def flip_in_last_block(frame: bytes) -> bytes:
    """A byte flipped in the middle of the CAR's last block (which stays valid DAG-CBOR length-wise,
    but no longer hashes to its CID)."""
    f = riptide.decode_frame(frame)
    assert f.kind == "commit" and f.blocks > 1
    # The last block ends the frame's `blocks` CAR; the payload's later fields follow it, so find
    # a text byte inside the last record: a record's `$type` value is near its start.
    last_record = [op for op in f.ops if op.record is not None][-1]
    needle = last_record.record["$type"].encode()
    at = frame.rfind(needle)
    assert at > 0
    b = bytearray(frame)
    b[at + 2] ^= 0x01
    return bytes(b)


def test_decode_errors_are_typed_with_offsets(frames_path):
    frames = list(riptide.read_corpus(frames_path))
    commit = frames[0]
    # Truncated.
    with pytest.raises(riptide.DecodeError) as e:
        riptide.decode_frame(commit[: len(commit) // 2])
    assert isinstance(e.value, (riptide.TruncatedError, riptide.MalformedError))
    assert isinstance(e.value.offset, int) and 0 <= e.value.offset <= len(commit)
    assert "frame byte" in str(e.value)
    with pytest.raises(riptide.TruncatedError):
        riptide.decode_frame(commit[:1])
    # Not CBOR at all.
    with pytest.raises(riptide.MalformedError) as e:
        riptide.decode_frame(b"\xff\xff\xff")
    assert e.value.name == "malformed" and e.value.offset == 0
    # An empty frame.
    with pytest.raises(riptide.DecodeError):
        riptide.decode_frame(b"")
    # A block that does not hash to its CID, unless CIDs are not checked.
    for i, frame in enumerate(frames):
        if riptide.decode_frame(frame).blocks > 1:
            break
    bad = flip_in_last_block(frames[i])
    with pytest.raises(riptide.BadBlockCidError) as e:
        riptide.decode_frame(bad)
    assert e.value.name == "bad-block-cid"
    assert "does not hash" in str(e.value)
    assert 0 < e.value.offset < len(bad)
    assert riptide.decode_frame(bad, verify_cids=False).blocks == riptide.decode_frame(frames[i]).blocks
    # Subclasses of ValueError, as Python users catch bad input.
    assert issubclass(riptide.DecodeError, ValueError)
    with pytest.raises(TypeError):
        riptide.decode_frame("not bytes")


def test_every_prefix_and_random_corruption_raises_or_decodes(frames_path):
    rng = random.Random(21)
    frames = list(riptide.read_corpus(frames_path))
    frame = frames[0]
    for n in range(len(frame)):
        with pytest.raises(riptide.DecodeError):
            riptide.decode_frame(frame[:n])
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        b = bytearray(rng.choice(frames))
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        try:
            f = riptide.decode_frame(bytes(b), verify_cids=rng.random() < 0.5)
            for op in f.ops:
                try:
                    op.record
                except ValueError:
                    pass
            outcomes["ok"] += 1
        except riptide.DecodeError:
            outcomes["error"] += 1
    assert outcomes["error"] > 0 and sum(outcomes.values()) == 3000


def test_read_corpus_rejects_a_bad_file(tmp_path, frames_path):
    good = frames_path.read_bytes()
    p = tmp_path / "bad.bin"
    p.write_bytes(good[:-1])
    with pytest.raises(riptide.CorpusError) as e:
        riptide.read_corpus(p)
    assert "frame 149" in str(e.value) and e.value.index == 149
    p.write_bytes(struct.pack(">I", 1 << 30))
    with pytest.raises(riptide.CorpusError):
        riptide.read_corpus(p)
    with pytest.raises(OSError):
        riptide.read_corpus(tmp_path / "missing.bin")
