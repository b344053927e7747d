"""The Python `atproto` SDK's archive reader, timed: `riptide bench archive --python PY` runs this
with the SDK's venv Python on the same `.jss` files it times riptide's reader on.

Per pass, for every file: the SDK's own functions, as `snapshot()` uses them after a download
(`atproto_jetstream.archive.downloader.iter_block_frames`, `segment.decode_block`,
`events.to_messages` with `with_cid=True`: every record decoded by libipld and its CID computed).
Prints one JSON object: events per pass and each measured pass's seconds.

  PY archive_reader.py WARMUP PASSES FILE...
"""

import json
import sys
import time

from atproto_jetstream.archive.downloader import iter_block_frames
from atproto_jetstream.archive.events import to_messages
from atproto_jetstream.archive.segment import decode_block


def one_pass(files):
    n = 0
    for data in files:
        for frame in iter_block_frames(data):
            for _ in to_messages(decode_block(frame), with_cid=True):
                n += 1
    return n


def main():
    warmup, passes, paths = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    files = []
    for p in paths:
        with open(p, "rb") as f:
            files.append(f.read())
    for _ in range(warmup):
        one_pass(files)
    secs, events = [], 0
    for _ in range(passes):
        t0 = time.perf_counter()
        events = one_pass(files)
        secs.append(time.perf_counter() - t0)
    print(json.dumps({"events": events, "secs": secs}))


if __name__ == "__main__":
    main()
