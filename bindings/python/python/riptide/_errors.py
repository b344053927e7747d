"""The clients' exceptions, as `riptide-client` splits failures (issue 39).

A permanent failure is one that waiting cannot mend: the server refuses the request (an HTTP 4xx
other than 408 and 429, with its reason), the URL cannot work, the host name does not exist, or
a relay answers `FutureCursor` (the cursor is past its newest event). A client raises it from
iteration (after the events before it) and then ends. Everything else (a refused or reset
connection, a 5xx, 408 or 429, a timeout, a resolver that cannot be reached) is transient: the
client retries it with backoff, logs it through the logger "riptide", and keeps it in
`last_error`.

`riptide.Archive` (issue 38) reads end the same way, with the archive's own classes:
`UnauthorizedError` and `CursorTooOldError` are refusals (`RefusedError`) their reason names;
`StalledPlannerError`, `TooLargeError` and `CorruptArchiveError` are permanent; and
`UnavailableError` (a request that failed transiently on every attempt) is a plain `ConnectError`,
since a new read later may succeed.

Defined in Python rather than in the extension because `InvalidUrlError` is also a
`ValueError` (what a bad URL raised before), and a class with two bases is plain here. The
extension makes them (`src/errors.rs`) with the message as the only argument and sets the
attributes.
"""

from __future__ import annotations


class ConnectError(Exception):
    """A client could not connect, or its connection failed. Raised itself only when a one-shot
    request (Jetstream v2's `getZstdDictionary`, at construction) fails in a way that may pass
    (`.url`, `.reason`); as `last_error`, a transient failure the client is retrying."""

    url: str = ""
    reason: str = ""


class PermanentConnectError(ConnectError):
    """A failure that waiting cannot mend: the client gave up, and its iteration ends."""


class InvalidUrlError(PermanentConnectError, ValueError):
    """The URL cannot work (not ws://, wss://, http://, https:// or host:port; a bad port):
    raised by the constructor. `.url`."""


class RefusedError(PermanentConnectError):
    """The server refused the request itself: HTTP `.status` (a 4xx other than 408 and 429),
    the XRPC `.error` name (empty when the body was not an XRPC envelope) and its `.message`
    (the server's reason, or the body)."""

    status: int = 0
    error: str = ""
    message: str = ""


class UnauthorizedError(RefusedError):
    """The server wants a bearer token and was given none or a wrong one (HTTP 401
    `AuthRequired`): `riptide.Archive(url, token=...)`."""


class CursorTooOldError(RefusedError):
    """Jetstream v2's `CursorTooOld`: the cursor is below the oldest seq the server serves live.
    `.message` names that floor; read what is below it from the archive first
    (`riptide.Archive(url).replay(after_seq=...)` does both, each event once)."""


class UnavailableError(ConnectError):
    """An archive request failed in a way that may pass (connection refused or reset, a timeout,
    a 5xx, 408 or 429) on every one of its attempts, so the read ended: `.what` (the request),
    `.attempts`, `.last` (the last failure; also `.reason`), `.url`. Resume with a new read after
    the last seq handed out (`.cursor`)."""

    what: str = ""
    attempts: int = 0
    last: str = ""


class StalledPlannerError(PermanentConnectError):
    """A `planSnapshot` page did not advance (`.planned` through seq, asked after `.after_seq`,
    the read pinned to sealed tip `.tip`): a server bug, ended rather than looped on."""

    after_seq = None
    planned: int = 0
    tip: int = 0


class TooLargeError(PermanentConnectError):
    """Something the server sent is larger than allowed: `.what` (a segment, a block, a
    `planSnapshot` page), its `.bytes` and the `.limit` (`Archive(max_segment_bytes=...)` for
    a segment)."""

    what: str = ""
    bytes: int = 0
    limit: int = 0


class CorruptArchiveError(PermanentConnectError):
    """A segment, block or plan that does not verify or decode (a checksum, a zstd frame, a
    row; a plan naming something that is not a segment)."""


class UnknownHostError(PermanentConnectError):
    """The host name does not exist (the resolver said so; a resolver that cannot be reached is
    transient). `.url`, `.reason` (the resolver's answer)."""


class RelayError(PermanentConnectError):
    """The relay answered with an error frame that waiting will not change: `.name`
    (`FutureCursor`: the cursor is past its newest event) and `.message`."""

    name: str = ""
    message: str = ""


for _cls in (
    ConnectError,
    PermanentConnectError,
    InvalidUrlError,
    RefusedError,
    UnauthorizedError,
    CursorTooOldError,
    UnavailableError,
    StalledPlannerError,
    TooLargeError,
    CorruptArchiveError,
    UnknownHostError,
    RelayError,
):
    _cls.__module__ = "riptide"  # as they are exported: tracebacks say riptide.RefusedError
del _cls
