"""riptide's Python binding's archive reader, timed: `riptide bench archive --binding-python PY`
runs this with a Python that has the binding installed, on the same `.jss` files it times the Rust
reader and the `atproto` SDK's on (`archive_reader.py`), followed by the timing loop of
`archive_harness.py`.

Per pass, for every file: iterating `riptide.read_segment` — the file verified, every block
decompressed, every row decoded, every payload checked to be DAG-CBOR and every record's CID
computed (in Rust, on a thread of its own, the GIL released), and every event built as the Python
dict `riptide.Archive` yields, its record as Python objects (what the SDK's
`to_messages(with_cid=True)` gives its caller too), then dropped, as the SDK's messages are.
"""

import riptide


def one_pass(files):
    n = 0
    for data in files:
        for _ in riptide.read_segment(data):
            n += 1
    return n
