# The timing loop of the Python archive readers (`archive_reader.py`: the `atproto` SDK's;
# `archive_binding.py`: riptide's binding), shared: `riptide bench archive` runs a reader's text
# followed by this one with `python -c`, so the reader defines `one_pass(files) -> events` first.
# Arguments: WARMUP PASSES FILE...; prints one JSON object: events per pass and each measured
# pass's seconds.

import json as _json
import sys as _sys
import time as _time


def _run(one_pass):
    warmup, passes, paths = int(_sys.argv[1]), int(_sys.argv[2]), _sys.argv[3:]
    files = []
    for p in paths:
        with open(p, "rb") as f:
            files.append(f.read())
    for _ in range(warmup):
        one_pass(files)
    secs, events = [], 0
    for _ in range(passes):
        t0 = _time.perf_counter()
        events = one_pass(files)
        secs.append(_time.perf_counter() - t0)
    print(_json.dumps({"events": events, "secs": secs}))


_run(one_pass)  # noqa: F821 (defined by the reader before this text)
