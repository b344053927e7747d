#!/usr/bin/env bash
# Seeds the fuzz corpora (fuzz/corpus/<target>/, gitignored) from the shared corpus, so every run
# starts from real data: firehose frames, the CARs inside them, repo.car, and every CAR block.
# Usage: fuzz/seed.sh [path/to/shared/corpus]   (default: $RIPTIDE_CORPUS, else ../../shared/corpus)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
src="${1:-${RIPTIDE_CORPUS:-$here/../../shared/corpus}}"
if [ ! -f "$src/README.md" ]; then
    echo "shared corpus not found at $src (pass its path or set RIPTIDE_CORPUS)" >&2
    exit 1
fi
mkdir -p "$here/corpus/cbor_decode" "$here/corpus/car_read" "$here/corpus/frame_decode" "$here/corpus/json_to_cbor" "$here/corpus/repo_verify" "$here/corpus/frame_batch" "$here/corpus/commit_proof" "$here/corpus/segment_read"
python3 - "$src" "$here/corpus" <<'PY'
import base64, json, os, sys

src, out = sys.argv[1], sys.argv[2]

def put(target, name, data):
    with open(os.path.join(out, target, name), "wb") as f:
        f.write(data)

def varint(b, i):
    v = s = 0
    while True:
        x = b[i]; i += 1
        v |= (x & 0x7F) << s; s += 7
        if x < 0x80:
            return v, i

def head(b, i):
    ib = b[i]; i += 1
    major, info = ib >> 5, ib & 0x1F
    if info < 24:
        return major, info, i
    n = {24: 1, 25: 2, 26: 4, 27: 8}[info]
    return major, int.from_bytes(b[i:i + n], "big"), i + n

def skip(b, i):
    """Index after the CBOR item at i (definite lengths only, as in DAG-CBOR)."""
    major, arg, i = head(b, i)
    if major in (2, 3):
        return i + arg
    if major == 4:
        for _ in range(arg):
            i = skip(b, i)
    elif major == 5:
        for _ in range(2 * arg):
            i = skip(b, i)
    elif major == 6:
        i = skip(b, i)
    return i

def car_blocks(car):
    hlen, i = varint(car, 0)
    i += hlen
    while i < len(car):
        n, j = varint(car, i)
        section = car[j:j + n]
        cid_len = 36 if section[:1] == b"\x01" else 34
        yield section[cid_len:]
        i = j + n

def blocks_field(frame):
    """The `blocks` byte string (a CAR) of a #commit payload, or None."""
    i = skip(frame, 0)  # header
    major, pairs, i = head(frame, i)
    if major != 5:
        return None
    for _ in range(pairs):
        _, klen, k = head(frame, i)
        key = frame[k:k + klen]
        i = k + klen
        if key == b"blocks":
            _, vlen, v = head(frame, i)
            return frame[v:v + vlen]
        i = skip(frame, i)
    return None

counts = {"cbor_decode": 0, "car_read": 0, "frame_decode": 0, "frame_batch": 0, "json_to_cbor": 0, "repo_verify": 0, "commit_proof": 0, "segment_read": 0}
all_frames = []
frames = open(os.path.join(src, "jetstream-2026-07/firehose-frames.bin"), "rb").read()
count = int.from_bytes(frames[:4], "big")
pos = 4
for n in range(count):
    flen = int.from_bytes(frames[pos:pos + 4], "big")
    frame = frames[pos + 4:pos + 4 + flen]
    pos += 4 + flen
    put("frame_decode", f"frame-{n:03}", frame); counts["frame_decode"] += 1
    all_frames.append(frame)
    car = blocks_field(frame)
    if car:
        put("commit_proof", f"frame-{n:03}", frame); counts["commit_proof"] += 1
        put("car_read", f"frame-{n:03}.car", car); counts["car_read"] += 1
        for k, block in enumerate(car_blocks(car)):
            put("cbor_decode", f"frame-{n:03}-block-{k:02}", block); counts["cbor_decode"] += 1

# frame_batch: runs of consecutive frames (batches of 1 to 40), separated by ff fe.
for n, size in enumerate((1, 2, 5, 16, 17, 33, 40)):
    put("frame_batch", f"frames-{size:02}", b"\xff\xfe".join(all_frames[n * 7:n * 7 + size]))
    counts["frame_batch"] += 1

repo = open(os.path.join(src, "jetstream-2026-07/repo.car"), "rb").read()
put("car_read", "repo.car", repo); counts["car_read"] += 1
put("repo_verify", "repo.car", repo); counts["repo_verify"] += 1
for k, block in enumerate(car_blocks(repo)):
    put("cbor_decode", f"repo-block-{k:03}", block); counts["cbor_decode"] += 1

put("cbor_decode", "feedpost_record.cbor", open(os.path.join(src, "indigo-sync/feedpost_record.cbor"), "rb").read())
counts["cbor_decode"] += 1
for k, fx in enumerate(json.load(open(os.path.join(src, "interop/data-model/data-model-fixtures.json")))):
    b64 = fx["cbor_base64"]
    put("cbor_decode", f"interop-fixture-{k}", base64.b64decode(b64 + "=" * (-len(b64) % 4)))
    counts["cbor_decode"] += 1

dm = os.path.join(src, "interop/data-model")
for name in ("data-model-fixtures.json", "data-model-valid.json", "data-model-invalid.json"):
    for k, e in enumerate(json.load(open(os.path.join(dm, name)))):
        put("json_to_cbor", f"{name[:-5]}-{k}", json.dumps(e["json"], ensure_ascii=False).encode())
        counts["json_to_cbor"] += 1
for k, line in enumerate(open(os.path.join(src, "jetstream-golden/golden_v1.jsonl"), encoding="utf-8")):
    record = json.loads(line).get("commit", {}).get("record")
    if record is not None:
        put("json_to_cbor", f"golden-record-{k}", json.dumps(record, ensure_ascii=False).encode())
        counts["json_to_cbor"] += 1
for name in ("cid_syntax_valid.txt", "cid_syntax_invalid.txt"):
    for k, line in enumerate(open(os.path.join(src, "interop/syntax", name), encoding="utf-8")):
        if line.strip() and not line.startswith("#"):
            put("json_to_cbor", f"{name[:-4]}-{k}", line.strip().encode())
            counts["json_to_cbor"] += 1

seg = os.path.join(src, "jetstream-v2/segments")
for name in sorted(os.listdir(seg)):
    put("segment_read", name, open(os.path.join(seg, name), "rb").read())
    counts["segment_read"] += 1

for t, c in counts.items():
    print(f"{t}: {c} seeds")
PY
