"""The Python peer of riptide's cross-SDK benchmark (see bench/README.md): the `atproto` package.

decode-unverified: Frame.from_bytes (header and payload via libipld), parse_subscribe_repos_message
(the typed commit), CAR.from_bytes (libipld.decode_car: every block decoded as DAG-CBOR; no block
hash check, so no verified row). sigs: the commit decoded and re-encoded without `sig` with libipld,
atproto_crypto.verify_signature with the did:key built from the key's bytes.

python-decode (issue 21: Python consumers): every frame decoded from Python and every record of
every commit turned into a dict, by several ways in ONE process, their passes interleaved (pass 1
of each way, then pass 2 of each, ...) so that load from other work hits them alike. Ways:
- `atproto`: the firehose path of its documentation (Frame.from_bytes, parse_subscribe_repos_message,
  CAR.from_bytes, the record of each op from `car.blocks`; no CID is checked);
- `riptide`: the binding of this repository, `riptide.decode_frames(frames)` (default threads: one
  Rust decoding thread per CPU while the Python thread builds the objects), every block's CID
  checked, `op.record` (a dict in atproto JSON form) for each op;
- `riptide-1`: the same with `threads=0`: everything on the calling thread (single-threaded);
- `riptide-frame`: `riptide.decode_frame` per frame in a Python loop (single-threaded).
Every way must turn the same number of records into dicts (checked before timing).

python-firehose (issue 21): a local relay (`riptide relay`) replays N frames; each pass a new client
from cursor 0 receives all N and touches every op (action, path, record); the ways run in one
process, passes interleaved. `riptide`: riptide.Firehose, every frame verified (signature, Sync 1.1
proof) with DID_DOCS on its Rust threads (default: one verifying thread per CPU); `riptide-1`: the
same on one verifying thread (like for like with `riptide tail --verify`). `atproto`:
FirehoseSubscribeReposClient, parse_subscribe_repos_message and CAR.from_bytes per commit (nothing
verified).

usage: bench.py [--warmup N --passes N] decode FILE LABEL | sigs FILE | python-decode WAY[,WAY...] FILE LABEL
       | python-firehose WAY[,WAY...] URL N DID_DOCS LABEL
"""

import json
import statistics
import struct
import sys
import time

import libipld
from atproto import CAR, parse_subscribe_repos_message
from atproto_crypto.consts import P256_JWT_ALG, SECP256K1_JWT_ALG
from atproto_crypto.did import format_did_key
from atproto_crypto.verify import verify_signature
from atproto_subscription.frames import Frame


def measure(warmup, passes, work, f):
    for _ in range(warmup):
        f()
    rates = []
    for _ in range(passes):
        t = time.perf_counter()
        f()
        rates.append(work / (time.perf_counter() - t))
    return statistics.median(rates), min(rates), max(rates)


def emit(benchmark, variant, unit, r, bpf, errors):
    print(json.dumps({"benchmark": benchmark, "sdk": "python-atproto", "variant": variant, "unit": unit,
                      "median": r[0], "min": r[1], "max": r[2], "blocks_per_frame": bpf, "errors": errors}))


def frames(data):
    (n,) = struct.unpack_from(">I", data, 0)
    off, out = 4, []
    for _ in range(n):
        (l,) = struct.unpack_from(">I", data, off)
        out.append(data[off + 4:off + 4 + l])
        off += 4 + l
    return out


def decode_frame(f):
    frame = Frame.from_bytes(f)
    if frame.type not in ("#commit", "#sync"):
        parse_subscribe_repos_message(frame)
        return 0
    msg = parse_subscribe_repos_message(frame)
    car = CAR.from_bytes(msg.blocks)
    return len(car.blocks)


def decode(opts, file, label):
    fs = frames(open(file, "rb").read())
    blocks = errors = 0
    for f in fs:
        try:
            blocks += decode_frame(f)
        except Exception:
            errors += 1

    def one_pass():
        for f in fs:
            try:
                decode_frame(f)
            except Exception:
                pass

    r = measure(opts["warmup"], opts["passes"], len(fs), one_pass)
    emit("decode-unverified", label, "frames/s", r, blocks / len(fs), errors)


def sigs(opts, file):
    data = open(file, "rb").read()
    (n,) = struct.unpack_from(">I", data, 0)
    off, entries = 4, []
    for _ in range(n):
        k256 = data[off] == 1
        (l,) = struct.unpack_from(">H", data, off + 1)
        signed = data[off + 3:off + 3 + l]
        off += 3 + l
        (l,) = struct.unpack_from(">H", data, off)
        pubkey = data[off + 2:off + 2 + l]
        off += 2 + l
        did_key = format_did_key(SECP256K1_JWT_ALG if k256 else P256_JWT_ALG, pubkey)
        entries.append((signed, did_key))

    def full(e):
        commit = libipld.decode_dag_cbor(e[0])
        sig = commit.pop("sig")
        return verify_signature(e[1], libipld.encode_dag_cbor(commit), sig)

    good = []
    for e in entries:
        try:
            if full(e):
                good.append(e)
        except Exception:
            pass

    def one_pass():
        ok = sum(1 for e in good if full(e))
        assert ok == len(good), f"verified {ok} of {len(good)}"

    r = measure(opts["warmup"], opts["passes"], len(good), one_pass)
    emit("sigs", "full", "verifies/s", r, None, len(entries) - len(good))


def records_atproto(f):
    frame = Frame.from_bytes(f)
    msg = parse_subscribe_repos_message(frame)
    if frame.type != "#commit":
        return 0, 0
    car = CAR.from_bytes(msg.blocks)
    n = 0
    for op in msg.ops:
        if op.cid is not None:
            rec = car.blocks.get(op.cid)
            assert isinstance(rec, dict)
            n += 1
    return n, len(car.blocks)


def records_riptide(f):
    import riptide

    frame = riptide.decode_frame(f)
    n = 0
    for op in frame.ops:
        rec = op.record
        if rec is not None:
            assert isinstance(rec, dict)
            n += 1
    return n, frame.blocks


def pass_per_frame(one):
    """A pass of a per-frame way: (records, blocks, errors)."""
    def run(fs):
        records = blocks = errors = 0
        for f in fs:
            try:
                r, b = one(f)
                records += r
                blocks += b
            except Exception:
                errors += 1
        return records, blocks, errors
    return run


def pass_decode_frames(threads):
    """A pass of `riptide.decode_frames` (all frames of the pass through one iterator)."""
    import riptide

    def run(fs):
        records = blocks = errors = 0
        it = riptide.decode_frames(fs, threads=threads)
        while True:
            try:
                frame = next(it)
            except StopIteration:
                break
            except riptide.DecodeError:
                errors += 1
                continue
            blocks += frame.blocks
            for op in frame.ops:
                rec = op.record
                if rec is not None:
                    assert isinstance(rec, dict)
                    records += 1
        return records, blocks, errors
    return run


PYTHON_DECODE_WAYS = {
    # way: (sdk column of the table, pass function)
    "atproto": ("python-atproto", lambda: pass_per_frame(records_atproto)),
    "riptide": ("riptide-python", lambda: pass_decode_frames(None)),
    "riptide-1": ("riptide-python, 1 thread", lambda: pass_decode_frames(0)),
    "riptide-frame": ("riptide-python, decode_frame", lambda: pass_per_frame(records_riptide)),
}


def python_decode(opts, ways, file, label):
    fs = frames(open(file, "rb").read())
    runs = {w: PYTHON_DECODE_WAYS[w][1]() for w in ways}
    work = {w: run(fs) for w, run in runs.items()}  # also imports and warms everything
    for w, (records, blocks, errors) in work.items():
        print(f"{w}: {records} records as dicts, {blocks} blocks, {errors} errors per pass", file=sys.stderr)
    records = {r for r, _, _ in work.values()}
    if len(records) != 1:
        sys.exit(f"python-decode: the ways turn different numbers of records into dicts: {work}")
    for _ in range(opts["warmup"]):
        for run in runs.values():
            run(fs)
    rates = {w: [] for w in ways}
    for _ in range(opts["passes"]):
        for w, run in runs.items():
            t = time.perf_counter()
            run(fs)
            rates[w].append(len(fs) / (time.perf_counter() - t))
    for w in ways:
        r = rates[w]
        print(json.dumps({"benchmark": "python-decode", "sdk": PYTHON_DECODE_WAYS[w][0], "variant": label,
                          "unit": "frames/s", "median": statistics.median(r), "min": min(r), "max": max(r),
                          "blocks_per_frame": work[w][1] / len(fs), "errors": work[w][2]}))


def firehose_riptide(url, n, did_docs, threads=None):
    """Seconds to receive, verify and walk n frames from the relay (from its start)."""
    import riptide

    t = time.perf_counter()
    seen = ops = 0
    with riptide.Firehose(url, cursor=0, verify=True, did_docs=did_docs, threads=threads) as fh:
        for frame in fh:
            if not frame.verdict.ok:
                raise RuntimeError(f"frame {frame.seq}: {frame.verdict}")
            for op in frame.ops:
                op.action, op.path, op.record
                ops += 1
            seen += 1
            if seen == n:
                break
    return time.perf_counter() - t, ops


def firehose_atproto(url, n, _did_docs):
    """The same with atproto's client (which verifies nothing): records from each commit's CAR."""
    from atproto import FirehoseSubscribeReposClient, models

    base = url.split("/xrpc/")[0] + "/xrpc"
    client = FirehoseSubscribeReposClient(base_uri=base, params={"cursor": 0})
    state = {"seen": 0, "ops": 0}

    def on_message(frame):
        msg = parse_subscribe_repos_message(frame)
        if isinstance(msg, models.ComAtprotoSyncSubscribeRepos.Commit):
            car = CAR.from_bytes(msg.blocks)
            for op in msg.ops:
                op.action, op.path, car.blocks.get(op.cid) if op.cid else None
                state["ops"] += 1
        state["seen"] += 1
        if state["seen"] == n:
            client.stop()

    t = time.perf_counter()
    client.start(on_message)
    return time.perf_counter() - t, state["ops"]


FIREHOSE_WAYS = {
    # way: (sdk column of the table, run)
    "riptide": ("riptide-python", firehose_riptide),
    "riptide-1": ("riptide-python, 1 thread", lambda url, n, docs: firehose_riptide(url, n, docs, threads=1)),
    "atproto": ("python-atproto", firehose_atproto),
}


def python_firehose(opts, ways, url, n, did_docs_path, label):
    """The ways in one process, their passes interleaved; every way must walk the same ops."""
    did_docs = json.load(open(did_docs_path))
    ops = {w: FIREHOSE_WAYS[w][1](url, n, did_docs)[1] for w in ways}
    print(f"ops per pass: {ops}", file=sys.stderr)
    if len(set(ops.values())) != 1:
        sys.exit(f"python-firehose: the ways walk different numbers of ops: {ops}")
    for _ in range(opts["warmup"]):
        for w in ways:
            FIREHOSE_WAYS[w][1](url, n, did_docs)
    rates = {w: [] for w in ways}
    for _ in range(opts["passes"]):
        for w in ways:
            rates[w].append(n / FIREHOSE_WAYS[w][1](url, n, did_docs)[0])
    for w in ways:
        r = rates[w]
        print(json.dumps({"benchmark": "python-firehose", "sdk": FIREHOSE_WAYS[w][0], "variant": label,
                          "unit": "frames/s", "median": statistics.median(r), "min": min(r), "max": max(r),
                          "blocks_per_frame": None, "errors": 0}))


def main():
    opts, args, it = {"warmup": 2, "passes": 5}, [], iter(sys.argv[1:])
    for a in it:
        if a in ("--warmup", "--passes"):
            opts[a[2:]] = int(next(it))
        else:
            args.append(a)
    if args[:1] == ["decode"] and len(args) >= 3:
        decode(opts, args[1], args[2])
    elif args[:1] == ["sigs"] and len(args) == 2:
        sigs(opts, args[1])
    elif (args[:1] == ["python-decode"] and len(args) == 4
          and all(w in PYTHON_DECODE_WAYS for w in args[1].split(","))):
        python_decode(opts, args[1].split(","), args[2], args[3])
    elif (args[:1] == ["python-firehose"] and len(args) == 6
          and all(w in FIREHOSE_WAYS for w in args[1].split(","))):
        python_firehose(opts, args[1].split(","), args[2], int(args[3]), args[4], args[5])
    else:
        sys.exit("usage: bench.py [--warmup N --passes N] decode FILE LABEL | sigs FILE | "
                 "python-decode WAY[,WAY...] FILE LABEL (ways: " + ",".join(PYTHON_DECODE_WAYS) + ") | python-firehose WAY[,WAY...] URL N DID_DOCS LABEL (ways: " + ",".join(FIREHOSE_WAYS) + ")")


main()
