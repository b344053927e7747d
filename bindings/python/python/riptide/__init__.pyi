"""Type stubs for riptide (the Python bindings of riptide, an AT Protocol firehose toolkit)."""

import os
from types import TracebackType
from typing import Any, AsyncIterator, Dict, Iterable, Iterator, List, Mapping, Optional, Tuple, Type, Union

__version__: str

_Path = Union[str, "os.PathLike[str]"]
_DidDocs = Union[Mapping[str, Any], _Path]

class DecodeError(ValueError):
    """A frame that does not decode."""

    offset: int
    """Byte offset in the frame."""
    name: str
    """`truncated`, `malformed`, `limits` or `bad-block-cid`."""
    index: int
    """The frame's position in the input (raised by `decode_frames` only)."""

class TruncatedError(DecodeError): ...
class MalformedError(DecodeError): ...
class LimitsError(DecodeError): ...
class BadBlockCidError(DecodeError): ...

class CorpusError(ValueError):
    """A corpus file that does not follow the format."""

    index: int
    offset: int

class RepoOp:
    """One op of a commit."""

    @property
    def action(self) -> str:
        """`create`, `update` or `delete`."""
    @property
    def path(self) -> str:
        """`collection/rkey`."""
    @property
    def collection(self) -> str: ...
    @property
    def rkey(self) -> str: ...
    @property
    def cid(self) -> Optional[str]:
        """The new record's CID (None for delete)."""
    @property
    def prev(self) -> Optional[str]:
        """The previous record's CID (update, delete; Sync 1.1)."""
    @property
    def record(self) -> Optional[Dict[str, Any]]:
        """The record in atproto JSON form, built on first access (None for delete, or when the
        record block is not in the frame)."""

class Verdict:
    """The verdict on one frame."""

    @property
    def ok(self) -> bool: ...
    @property
    def name(self) -> str:
        """`ok`, `bad-signature`, `bad-block-cid`, `missing-block`, `inversion-mismatch`,
        `malformed`, `limits` or `unknown-key`."""
    @property
    def reason(self) -> Optional[str]: ...
    @property
    def kind(self) -> str: ...
    @property
    def seq(self) -> Optional[int]: ...
    @property
    def did(self) -> Optional[str]: ...
    def __bool__(self) -> bool: ...

class Frame:
    """A decoded firehose frame."""

    @property
    def kind(self) -> str:
        """`commit`, `sync`, `identity`, `account`, `info`, `error`, `unknown`; `invalid` (clients,
        and decode_frames with on_error="yield") for a frame that does not decode."""
    @property
    def seq(self) -> Optional[int]: ...
    @property
    def did(self) -> Optional[str]: ...
    @property
    def rev(self) -> Optional[str]: ...
    @property
    def since(self) -> Optional[str]: ...
    @property
    def time(self) -> Optional[str]: ...
    @property
    def commit(self) -> Optional[str]: ...
    @property
    def prev_data(self) -> Optional[str]: ...
    @property
    def blocks(self) -> int: ...
    @property
    def ops(self) -> List[RepoOp]: ...
    @property
    def handle(self) -> Optional[str]: ...
    @property
    def active(self) -> Optional[bool]: ...
    @property
    def status(self) -> Optional[str]: ...
    @property
    def name(self) -> Optional[str]: ...
    @property
    def message(self) -> Optional[str]: ...
    @property
    def error(self) -> Optional[str]: ...
    @property
    def verdict(self) -> Optional[Verdict]: ...
    @property
    def bytes(self) -> bytes: ...

class FrameIterator(Iterator[Frame]):
    """What `decode_frames` returns: the decoded frames, in input order."""

    def __iter__(self) -> "FrameIterator": ...
    def __next__(self) -> Frame:
        """The next frame. A frame that does not decode raises its DecodeError subclass (with
        `.index`, its position in the input; `on_error="raise"`), after which iteration may go
        on with the next frame."""
    @property
    def index(self) -> int:
        """Frames handed out (or raised) so far: the input position of the next one."""

def decode_frames(
    frames: Iterable[Union[bytes, bytearray]],
    verify_cids: bool = True,
    threads: Optional[int] = None,
    on_error: str = "raise",
) -> FrameIterator:
    """Decodes many frames as `decode_frame` does (every block's CID checked unless
    `verify_cids=False`), on `threads` Rust threads with the GIL released, in batches, while the
    calling thread builds the Python objects of the frames already decoded; frames come out in
    input order. `threads=0` decodes on the calling thread (still in batches, GIL released);
    default: one thread per CPU (at most 8). A frame that does not decode raises its DecodeError
    subclass at its position (`.index`), or with `on_error="yield"` comes out as a Frame of kind
    `invalid` with its `.error`. What the input iterable raises (or an item that is not bytes:
    TypeError) is raised after the frames before it."""

class RepoReport:
    """What verify_repo found."""

    @property
    def ok(self) -> bool: ...
    @property
    def name(self) -> str: ...
    @property
    def reason(self) -> Optional[str]: ...
    @property
    def did(self) -> Optional[str]: ...
    @property
    def rev(self) -> Optional[str]: ...
    @property
    def commit(self) -> Optional[str]: ...
    @property
    def data(self) -> Optional[str]: ...
    @property
    def records(self) -> Optional[int]: ...
    @property
    def mst_nodes(self) -> Optional[int]: ...
    @property
    def blocks(self) -> Optional[int]: ...
    @property
    def bytes(self) -> int: ...
    @property
    def signature_checked(self) -> bool: ...
    def __bool__(self) -> bool: ...

def read_corpus(path: _Path) -> Iterator[bytes]: ...
def decode_frame(data: bytes, verify_cids: bool = True) -> Frame: ...
def verify_repo(car: bytes, key: Optional[str] = None) -> RepoReport: ...
def list_records(car: bytes) -> List[Tuple[str, str]]: ...
class SegmentEvents(Iterator[Dict[str, Any]]):
    def __iter__(self) -> "SegmentEvents": ...
    def __next__(self) -> Dict[str, Any]: ...

def read_segment(data: bytes, record_bytes: bool = False) -> SegmentEvents:
    """Every event of a whole `.jss` segment file, as `Archive.snapshot` yields them (the file
    verified, each payload checked, each record's CID computed), decoded block by block on a Rust
    thread; CorruptArchiveError from iteration when the file does not verify."""

class Verifier:
    def __init__(self, did_docs: Optional[_DidDocs] = None, plc_url: Optional[str] = None) -> None: ...
    def verify(self, data: bytes) -> Verdict: ...
    def counts(self) -> Dict[str, int]: ...

class ConnectError(Exception):
    """A client could not connect (as `last_error`: a transient failure being retried; raised
    itself only by a one-shot request at construction, v2's getZstdDictionary)."""
    url: str
    reason: str

class PermanentConnectError(ConnectError):
    """A failure that waiting cannot mend: raised from iteration, which then ends."""

class InvalidUrlError(PermanentConnectError, ValueError):
    """The URL cannot work (raised by the constructor)."""
    url: str

class RefusedError(PermanentConnectError):
    """The server refused the request: an HTTP 4xx other than 408 and 429, with its reason."""
    status: int
    error: str
    message: str

class UnauthorizedError(RefusedError):
    """HTTP 401 `AuthRequired`: a missing or wrong bearer token (`Archive(token=...)`)."""

class CursorTooOldError(RefusedError):
    """v2's `CursorTooOld`: the cursor is below the live floor (`.message` names it); read the
    archive first (`Archive.replay`)."""

class UnavailableError(ConnectError):
    """An archive request failed transiently on every attempt; the read ended."""
    what: str
    attempts: int
    last: str

class StalledPlannerError(PermanentConnectError):
    """A `planSnapshot` page did not advance."""
    after_seq: Optional[int]
    planned: int
    tip: int

class TooLargeError(PermanentConnectError):
    """A segment, block or plan page over its limit."""
    what: str
    bytes: int
    limit: int

class CorruptArchiveError(PermanentConnectError):
    """A segment, block or plan that does not verify or decode."""

class UnknownHostError(PermanentConnectError):
    """The host name does not exist."""
    url: str
    reason: str

class RelayError(PermanentConnectError):
    """An error frame waiting will not change (`FutureCursor`)."""
    name: str
    message: str

class _Client:
    @property
    def cursor(self) -> Optional[int]: ...
    @property
    def last_error(self) -> Optional[ConnectError]: ...
    def stats(self) -> Dict[str, Any]: ...
    def close(self) -> None: ...
    def __exit__(
        self, t: Optional[Type[BaseException]], v: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None: ...
    async def __aexit__(
        self, t: Optional[Type[BaseException]], v: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None: ...

class Firehose(_Client):
    def __init__(
        self,
        url: str,
        cursor: Optional[int] = None,
        verify: bool = True,
        did_docs: Optional[_DidDocs] = None,
        plc_url: Optional[str] = None,
        threads: Optional[int] = None,
    ) -> None: ...
    def __iter__(self) -> Iterator[Frame]: ...
    def __next__(self) -> Frame: ...
    def __aiter__(self) -> AsyncIterator[Frame]: ...
    async def __anext__(self) -> Frame: ...
    def next_batch(self, timeout: Optional[float] = None) -> List[Frame]: ...
    def __enter__(self) -> "Firehose": ...
    async def __aenter__(self) -> "Firehose": ...

class Jetstream(_Client):
    def __init__(
        self,
        url: str,
        collections: Optional[Iterable[str]] = None,
        dids: Optional[Iterable[str]] = None,
        cursor: Optional[int] = None,
        compress: bool = False,
        zstd_dictionary: Optional[Union[bytes, _Path]] = None,
        kinds: Optional[Iterable[str]] = None,
        v2: Optional[bool] = None,
    ) -> None: ...
    def __iter__(self) -> Iterator[Dict[str, Any]]: ...
    def __next__(self) -> Dict[str, Any]: ...
    def __aiter__(self) -> AsyncIterator[Dict[str, Any]]: ...
    async def __anext__(self) -> Dict[str, Any]: ...
    def next_batch(self, timeout: Optional[float] = None) -> List[Dict[str, Any]]: ...
    def __enter__(self) -> "Jetstream": ...
    async def __aenter__(self) -> "Jetstream": ...

class ArchiveRead(_Client):
    """One archive read (`Archive.snapshot` / `Archive.replay`): event dicts in seq order, each
    once; `cursor` is the last seq handed out."""
    def __iter__(self) -> Iterator[Dict[str, Any]]: ...
    def __next__(self) -> Dict[str, Any]: ...
    def __aiter__(self) -> AsyncIterator[Dict[str, Any]]: ...
    async def __anext__(self) -> Dict[str, Any]: ...
    def next_batch(self, timeout: Optional[float] = None) -> List[Dict[str, Any]]: ...
    def __enter__(self) -> "ArchiveRead": ...
    async def __aenter__(self) -> "ArchiveRead": ...

class Archive:
    """A Jetstream v2 server's archive (planSnapshot, getSegment, getBlock)."""
    url: str
    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        range_bytes: Optional[int] = None,
        max_segment_bytes: Optional[int] = None,
        max_attempts: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> None: ...
    def snapshot(
        self,
        kinds: Optional[Iterable[str]] = None,
        dids: Optional[Iterable[str]] = None,
        collections: Optional[Iterable[str]] = None,
        after_seq: Optional[int] = None,
        before_seq: Optional[int] = None,
        record_bytes: bool = False,
    ) -> ArchiveRead: ...
    def replay(
        self,
        kinds: Optional[Iterable[str]] = None,
        dids: Optional[Iterable[str]] = None,
        collections: Optional[Iterable[str]] = None,
        after_seq: Optional[int] = None,
        record_bytes: bool = False,
        compress: bool = False,
        zstd_dictionary: Optional[Union[bytes, _Path]] = None,
    ) -> ArchiveRead: ...
