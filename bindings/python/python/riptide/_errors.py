"""The clients' exceptions, as `riptide-client` splits failures (issue 39).

A permanent failure is one that waiting cannot mend: the server refuses the request (an HTTP 4xx
other than 408 and 429, with its reason), the URL cannot work, the host name does not exist, or
a relay answers `FutureCursor` (the cursor is past its newest event). A client raises it from
iteration (after the events before it) and then ends. Everything else (a refused or reset
connection, a 5xx, 408 or 429, a timeout, a resolver that cannot be reached) is transient: the
client retries it with backoff, logs it through the logger "riptide", and keeps it in
`last_error`.

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


class UnknownHostError(PermanentConnectError):
    """The host name does not exist (the resolver said so; a resolver that cannot be reached is
    transient). `.url`, `.reason` (the resolver's answer)."""


class RelayError(PermanentConnectError):
    """The relay answered with an error frame that waiting will not change: `.name`
    (`FutureCursor`: the cursor is past its newest event) and `.message`."""

    name: str = ""
    message: str = ""


for _cls in (ConnectError, PermanentConnectError, InvalidUrlError, RefusedError, UnknownHostError, RelayError):
    _cls.__module__ = "riptide"  # as they are exported: tracebacks say riptide.RefusedError
del _cls
