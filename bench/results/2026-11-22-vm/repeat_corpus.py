#!/usr/bin/env python3
"""Writes a frame corpus (formats.md: u32 count, then length-prefixed frames) repeated N times.

usage: repeat_corpus.py IN N OUT   e.g. the capture x2400 = 360,000 frames, 1.97 GB, for a
steady-state run of relay_ingest.sh (riptide relay renumbers seqs, so repeats are new events).
"""
import struct
import sys

src, n, dst = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with open(src, "rb") as f:
    count = struct.unpack(">I", f.read(4))[0]
    body = f.read()
with open(dst, "wb") as out:
    out.write(struct.pack(">I", count * n))
    for _ in range(n):
        out.write(body)
print(f"{dst}: {count * n} frames")
