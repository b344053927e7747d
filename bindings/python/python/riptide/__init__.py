"""riptide: the AT Protocol firehose, verified, from Python.

The decoder, Sync 1.1 verifier, repository verification and clients of riptide (Rust), with the
heavy work done in Rust outside the GIL. Names and messages are those of the `riptide` CLI.

    import json, riptide

    verifier = riptide.Verifier(did_docs=json.load(open("did_docs.json")))
    for data in riptide.read_corpus("firehose-frames.bin"):
        frame = riptide.decode_frame(data)          # every block's CID checked
        verdict = verifier.verify(data)             # signature + Sync 1.1 proof
        for op in frame.ops:
            print(verdict.name, op.action, op.collection, op.rkey, op.record)

    # Many frames: decoded (CIDs checked) on Rust threads while Python handles the previous ones.
    for frame in riptide.decode_frames(riptide.read_corpus("firehose-frames.bin")):
        for op in frame.ops:
            print(frame.seq, op.path, op.record)
"""

from __future__ import annotations

import json as _json
import os as _os
from typing import Any, Iterator, Mapping, Optional, Union

from . import _riptide
from ._riptide import (
    BadBlockCidError,
    CorpusError,
    DecodeError,
    Frame,
    LimitsError,
    MalformedError,
    RepoOp,
    RepoReport,
    TruncatedError,
    Verdict,
    __version__,
    FrameIterator,
    decode_frame,
    decode_frames,
    list_records,
    SegmentEvents,
    read_segment,
    verify_repo,
)
from ._archive import Archive, ArchiveRead
from ._clients import Firehose, Jetstream
from ._errors import (
    ConnectError,
    CorruptArchiveError,
    CursorTooOldError,
    InvalidUrlError,
    PermanentConnectError,
    RefusedError,
    RelayError,
    StalledPlannerError,
    TooLargeError,
    UnauthorizedError,
    UnavailableError,
    UnknownHostError,
)

__all__ = [
    "Archive",
    "ArchiveRead",
    "BadBlockCidError",
    "ConnectError",
    "CorpusError",
    "CorruptArchiveError",
    "CursorTooOldError",
    "DecodeError",
    "Firehose",
    "Frame",
    "FrameIterator",
    "InvalidUrlError",
    "Jetstream",
    "LimitsError",
    "MalformedError",
    "PermanentConnectError",
    "RefusedError",
    "RelayError",
    "RepoOp",
    "RepoReport",
    "SegmentEvents",
    "StalledPlannerError",
    "TooLargeError",
    "TruncatedError",
    "UnauthorizedError",
    "UnavailableError",
    "UnknownHostError",
    "Verdict",
    "Verifier",
    "__version__",
    "decode_frame",
    "decode_frames",
    "list_records",
    "read_corpus",
    "read_segment",
    "verify_repo",
]


def read_corpus(path: Union[str, "os.PathLike[str]"]) -> Iterator[bytes]:
    """The frames of a corpus file (`u32 count`, then `u32 length` + frame each, big-endian), in
    order. Raises CorpusError (with `.index` and `.offset`) when the file does not follow the
    format, before yielding anything."""
    with open(path, "rb") as f:
        data = f.read()
    return iter(_riptide.split_corpus(data))


def _did_docs_json(did_docs: Any) -> Optional[bytes]:
    """`did_docs` as the JSON text the native side parses: a dict (DID → DID document), or the path
    of a `did_docs.json` file."""
    if did_docs is None:
        return None
    if isinstance(did_docs, (str, _os.PathLike)):
        with open(did_docs, "rb") as f:
            return f.read()
    if isinstance(did_docs, Mapping):
        return _json.dumps(dict(did_docs)).encode()
    raise TypeError(f"did_docs must be a dict (DID -> DID document) or a path, not {type(did_docs).__name__}")


class Verifier:
    """Verifies firehose frames as `riptide verify` does: every block's CID, the commit signature
    with the account's key, the Sync 1.1 proof (`prevData`). Keys come from `did_docs` (a dict
    DID -> DID document, or the path of a did_docs.json file) or, without it, from resolution
    through `plc_url` (default https://plc.directory) and did:web.

    Stateful across frames like the Rust verifier: keep one account's frames on one verifier, in
    order. `verify` releases the GIL."""

    __slots__ = ("_inner",)

    def __init__(self, did_docs: Optional[Mapping[str, Any]] = None, plc_url: Optional[str] = None) -> None:
        self._inner = _riptide._Verifier(_did_docs_json(did_docs), plc_url)

    def verify(self, data: bytes) -> Verdict:
        """The verdict on one frame (`.ok`, `.name`, `.reason`)."""
        return self._inner.verify(data)

    def counts(self) -> dict:
        """Verdicts so far, by name (zeros included)."""
        return dict(self._inner.counts())

    def __repr__(self) -> str:
        return f"Verifier(counts={self.counts()!r})"
