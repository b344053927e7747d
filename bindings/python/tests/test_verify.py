"""Verifier and verify_repo on real data: the capture's 148 commits verify with its DID documents,
the same verdicts as `riptide verify --json`; tampered frames get the CLI's verdict names; repo.car
lists what indigo's goat lists."""

import hashlib
import json
import subprocess

import pytest

import riptide
from conftest import run_json_lines


def test_the_capture_verifies_148_of_148_commits(frames_path, did_docs):
    v = riptide.Verifier(did_docs=did_docs)
    verdicts = [v.verify(f) for f in riptide.read_corpus(frames_path)]
    assert len(verdicts) == 150
    commits = [x for x in verdicts if x.kind == "commit"]
    assert len(commits) == 148
    assert all(x.ok and x.name == "ok" and x.reason is None and bool(x) for x in commits)
    assert all(x.ok for x in verdicts)
    assert v.counts()["ok"] == 150 and sum(v.counts().values()) == 150


def test_verdicts_equal_the_cli(frames_path, capture, riptide_bin):
    code, lines, err = run_json_lines([riptide_bin, "verify", frames_path, "--did-docs", capture / "did_docs.json", "--json"])
    assert code == 0, err
    v = riptide.Verifier(did_docs=capture / "did_docs.json")  # a path works too
    for data, want in zip(riptide.read_corpus(frames_path), lines):
        got = v.verify(data)
        assert (got.name, got.reason, got.kind, got.seq, got.did) == (
            want["verdict"], want["reason"], want["kind"], want["seq"], want["did"])


def resign_with_a_flipped_signature(frame: bytes) -> bytes:
    """The frame with one bit of the commit's signature flipped and the commit block's CID
    recomputed everywhere it appears (payload `commit`, CAR root, block header), so that every
    block still hashes to its CID and only the signature is wrong."""
    sig_key = b"\x63sig\x58\x40"  # "sig": bytes(64)
    s = frame.find(sig_key)
    assert s > 0
    # The commit block: the CAR section (varint length, 36-byte CIDv1 dag-cbor sha2-256, data)
    # that contains the signature.
    start = None
    c = frame.rfind(b"\x01\x71\x12\x20", 0, s)
    while c > 0:
        for k in (1, 2, 3):
            n, shift, ok = 0, 0, True
            for i, byte in enumerate(frame[c - k:c]):
                n |= (byte & 0x7F) << shift
                shift += 7
                if (byte & 0x80 == 0) != (i == k - 1):
                    ok = False
            data = frame[c + 36:c + n]
            if ok and n > 36 and c + n > s and hashlib.sha256(data).digest() == frame[c + 4:c + 36]:
                start, end = c + 36, c + n
                break
        if start is not None:
            break
        c = frame.rfind(b"\x01\x71\x12\x20", 0, c)
    assert start is not None, "commit block not found"
    old = hashlib.sha256(frame[start:end]).digest()
    b = bytearray(frame)
    b[s + len(sig_key) + 10] ^= 0x01
    new = hashlib.sha256(bytes(b[start:end])).digest()
    assert frame.count(old) >= 3  # payload `commit`, CAR root, the block's CID
    return bytes(b).replace(old, new)


def test_tampered_block_and_signature_get_the_cli_verdicts(frames_path, did_docs):
    from test_decode import flip_in_last_block

    frames = list(riptide.read_corpus(frames_path))
    i = next(i for i, f in enumerate(frames) if riptide.decode_frame(f).blocks > 1)
    v = riptide.Verifier(did_docs=did_docs)
    bad_block = v.verify(flip_in_last_block(frames[i]))
    assert (bad_block.ok, bad_block.name) == (False, "bad-block-cid")
    assert "does not hash" in bad_block.reason
    assert bad_block.kind == "commit" and bad_block.did == riptide.decode_frame(frames[i]).did

    forged = resign_with_a_flipped_signature(frames[i])
    assert riptide.decode_frame(forged).commit != riptide.decode_frame(frames[i]).commit
    bad_sig = v.verify(forged)
    assert (bad_sig.ok, bad_sig.name) == (False, "bad-signature"), bad_sig
    assert bad_sig.reason.startswith("signature:")
    # The genuine frame still verifies on the same verifier.
    assert v.verify(frames[i]).ok

    # Without the account's document: unknown-key.
    fewer = {d: doc for d, doc in did_docs.items() if d != bad_sig.did}
    assert riptide.Verifier(did_docs=fewer).verify(frames[i]).name == "unknown-key"
    # Garbage is malformed, not a crash.
    for junk in (b"", b"\x00", b"\xa0" * 10, frames[i][:100]):
        assert riptide.Verifier(did_docs=did_docs).verify(junk).name == "malformed"


def test_bad_did_docs_raise_value_error():
    with pytest.raises(ValueError):
        riptide.Verifier(did_docs={"did:plc:x": {"id": "did:plc:y"}})
    with pytest.raises(TypeError):
        riptide.Verifier(did_docs=42)


def test_repo_car_lists_what_goat_lists(capture):
    car = (capture / "repo.car").read_bytes()
    expected = [tuple(l.split("\t")) for l in (capture / "car_expected_records.tsv").read_text().splitlines() if l]
    assert len(expected) > 10
    assert riptide.list_records(car) == expected
    r = riptide.verify_repo(car)
    assert r.ok and r.name == "ok" and r.reason is None
    assert r.records == len(expected)
    assert r.signature_checked is False
    want = (capture / "car_expected_commit.txt").read_text()
    assert f"DID: {r.did}\n" in want and f"Data CID: {r.data}\n" in want and f"Revision: {r.rev}\n" in want
    assert r.did == "did:plc:53iucmf5ldftgqyf2ac7hmhd"


def test_verify_repo_verdicts(capture, did_docs):
    car = (capture / "repo.car").read_bytes()
    # A key that is not the account's (another account's, from the capture): bad-signature.
    other = next(iter(did_docs.values()))
    key = "did:key:" + other["verificationMethod"][0]["publicKeyMultibase"]
    r = riptide.verify_repo(car, key=key)
    assert (r.ok, r.name) == (False, "bad-signature") and r.reason
    with pytest.raises(ValueError):
        riptide.verify_repo(car, key="did:key:nonsense")
    # A flipped byte in the last block: bad-block-cid.
    b = bytearray(car)
    b[-5] ^= 0x01
    r = riptide.verify_repo(bytes(b))
    assert (r.ok, r.name) == (False, "bad-block-cid"), r
    with pytest.raises(ValueError):
        riptide.list_records(bytes(b))
    # Truncated and empty: malformed.
    assert riptide.verify_repo(car[: len(car) // 2]).name == "malformed"
    assert riptide.verify_repo(b"").name == "malformed"


def test_keys_resolved_through_a_plc_directory(riptide_bin, tmp_path):
    """Without did_docs, keys come from a PLC directory: `riptide sim` serves one (and a relay) for
    a generated network; every frame must get the verdict `riptide verify` gives with the
    network's own documents."""
    from conftest import Server

    net = tmp_path / "net"
    gen = subprocess.run([str(riptide_bin), "gen", "--seed", "21", "--accounts", "5", "--events", "60", "--out", str(net)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
    assert gen.returncode == 0, gen.stderr.decode()
    code, want, err = run_json_lines([riptide_bin, "verify", net / "firehose-frames.bin", "--did-docs", net / "did_docs.json", "--json"])
    assert len(want) >= 60 and sum(w["kind"] == "commit" for w in want) > 10, err
    sim = Server([riptide_bin, "sim", "--from", net, "--listen", "127.0.0.1:0"], lambda l: l.strip() or None)
    try:
        v = riptide.Verifier(plc_url=sim.address)
        got = [v.verify(f) for f in riptide.read_corpus(net / "firehose-frames.bin")]
        assert [(g.name, g.reason) for g in got] == [(w["verdict"], w["reason"]) for w in want]
        assert sum(g.ok for g in got) > 10
        # The same through the sim's relay, verified on the client's thread.
        relay = sim.address.replace("http://", "ws://") + "/xrpc/com.atproto.sync.subscribeRepos"
        from test_clients import take

        frames = take(riptide.Firehose(relay, cursor=0, plc_url=sim.address), len(want))
        assert [f.verdict.name for f in frames] == [w["verdict"] for w in want]
    finally:
        sim.kill()
