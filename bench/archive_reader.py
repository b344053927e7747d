"""The Python `atproto` SDK's archive reader, timed: `riptide bench archive --python PY` runs this
with the SDK's venv Python on the same `.jss` files it times riptide's reader on, followed by the
timing loop of `archive_harness.py` (arguments WARMUP PASSES FILE...; one JSON object out).

Per pass, for every file: the SDK's own functions, as `snapshot()` uses them after a download
(`atproto_jetstream.archive.downloader.iter_block_frames`, `segment.decode_block`,
`events.to_messages` with `with_cid=True`: every record decoded by libipld and its CID computed).
"""

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
