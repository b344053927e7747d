"""A whole archive read over HTTP, timed: `riptide.Archive(url).snapshot()` (riptide's Python
binding) or the `atproto` SDK's `JetstreamClient.snapshot()`, against the same server (a
`riptide serve` whose archive holds the segments), each consumed with a plain `for` loop.

Unlike `riptide bench archive` (decoding only, files in memory), this includes planSnapshot, the
downloads over loopback and the hand-over of each event to Python code: what a user of either
library sees. Run it with the Python that has the library:

  PY archive_http.py riptide|sdk ADDR TOKEN WARMUP PASSES

Prints one JSON object: events per pass and each measured pass's seconds.
"""

import json
import sys
import time


def riptide_pass(addr, token):
    import riptide

    n = 0
    for _ in riptide.Archive(f"http://{addr}", token=token).snapshot():
        n += 1
    return n


def sdk_pass(addr, token):
    from atproto_jetstream import JetstreamClient

    n = 0
    for _ in JetstreamClient(base_uri=f"ws://{addr}/xrpc", api_key=token).snapshot():
        n += 1
    return n


def main():
    which, addr, token, warmup, passes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    one = {"riptide": riptide_pass, "sdk": sdk_pass}[which]
    for _ in range(warmup):
        one(addr, token)
    secs, events = [], 0
    for _ in range(passes):
        t0 = time.perf_counter()
        events = one(addr, token)
        secs.append(time.perf_counter() - t0)
    print(json.dumps({"reader": which, "events": events, "secs": secs}))


if __name__ == "__main__":
    main()
