"""The clients' Python half: the iterator and `async for` protocols over the native cores.

The native core (`_ClientCore`, made by `_firehose`, `_jetstream`, `_jetstream_v2`, and for
`riptide.Archive`'s reads (`_archive`) `_archive_snapshot`, `_archive_replay`) runs the
connection, the reconnects with backoff (resuming after the last event received) and the decoding
and verification on Rust threads, and hands over whole batches (`take`). This side keeps the
current batch, hands out one event at a time and tracks the cursor of the last event handed out.
A plain `for` waits in short slices with the GIL released so that Ctrl-C is seen; `async for`
waits in the event loop's default executor so that the loop stays free.

Failures (issue 39): a permanent one arrives as the last item of a batch, an exception object
(`_errors`), raised when iteration reaches it; the client then ends. The core's log lines (failed
connects, reconnects: `riptide-client`'s warnings) are taken after every batch and logged through
the logger "riptide", once per kind, then counted (`_Log`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from typing import Any, Deque, Dict, Iterable, List, Optional, Tuple, Union

from . import _riptide
from ._errors import ConnectError

# How long one wait for a batch lasts before Python gets control back (signals, cancellation).
_SLICE = 0.2
# What `subscribeEvents` URLs contain: such a URL makes `Jetstream` speak v2.
_V2_NSID = "network.bsky.jetstream.subscribeEvents"

_logger = logging.getLogger("riptide")


class _Log:
    """A client's log lines into the logger "riptide": the first line of a kind (one statement
    of the Rust client: "cannot connect to …", "connected", …) in full; the later ones of that
    kind are counted, and said as one summary line (the latest text, how many were not logged
    since the last line, how many in all) at most every `every` seconds, and when the client
    closes. A client that cannot connect for an hour logs a line a minute, not one per attempt."""

    every = 60.0

    def __init__(self) -> None:
        # kind -> [total, not logged since the last line, time of the last line, level, text]
        self._kinds: Dict[str, List[Any]] = {}

    def emit(self, lines: List[Tuple[str, int, str]]) -> None:
        now = time.monotonic()
        for kind, level, text in lines:
            k = self._kinds.get(kind)
            if k is None:
                self._kinds[kind] = [1, 0, now, level, text]
                _logger.log(level, "%s", text)
                continue
            k[0] += 1
            k[3], k[4] = level, text
            if now - k[2] >= self.every:
                self._summary(k, now)
            else:
                k[1] += 1

    def flush(self) -> None:
        """The summaries of what was not logged yet (at close)."""
        now = time.monotonic()
        for k in self._kinds.values():
            if k[1]:
                k[1] -= 1
                self._summary(k, now)

    @staticmethod
    def _summary(k: List[Any], now: float) -> None:
        _logger.log(k[3], "%s [%d more like this not logged since the last line, %d in all]", k[4], k[1], k[0])
        k[1], k[2] = 0, now


def _dictionary(zstd_dictionary: Optional[Union[bytes, str, "os.PathLike[str]"]]) -> Optional[bytes]:
    """A zstd dictionary given as bytes or as the path of its file."""
    if zstd_dictionary is None:
        return None
    if isinstance(zstd_dictionary, (str, os.PathLike)):
        with open(zstd_dictionary, "rb") as f:
            return f.read()
    return bytes(zstd_dictionary)


class _Client:
    _core: Any

    def __init__(self) -> None:
        self._batch: Deque[Any] = collections.deque()
        self._closed = False
        self._cursor: Optional[int] = None
        self._pending: Optional["asyncio.Future[Any]"] = None
        self._error: Optional[ConnectError] = None
        self._log = _Log()

    def _cursor_of(self, item: Any) -> Optional[int]:
        raise NotImplementedError

    def _pop(self) -> Any:
        item = self._batch.popleft()
        if isinstance(item, BaseException):
            self._fail(item)
        c = self._cursor_of(item)
        if c is not None:
            self._cursor = c
        return item

    def _fail(self, error: BaseException) -> None:
        """Ends the client with its permanent failure, raised."""
        if isinstance(error, ConnectError):
            self._error = error
        self.close()
        raise error

    def _logs(self) -> None:
        self._log.emit(self._core.take_log())

    def _fill(self, timeout: float) -> bool:
        """Takes the next batch; False once closed."""
        batch = self._core.take(timeout)
        self._logs()
        if batch is None:
            self._closed = True
            return False
        self._batch.extend(batch)
        return True

    def __iter__(self):
        return self

    def __next__(self) -> Any:
        while not self._batch:
            if self._closed or not self._fill(_SLICE):
                raise StopIteration
        return self._pop()

    def __aiter__(self):
        return self

    async def __anext__(self) -> Any:
        loop = asyncio.get_running_loop()
        while not self._batch:
            if self._closed:
                raise StopAsyncIteration
            # The wait runs in the executor; shielded, so that a cancelled `__anext__` (a timeout
            # around it, say) leaves the batch it was fetching to the next call instead of
            # losing it.
            if self._pending is None:
                self._pending = loop.run_in_executor(None, self._core.take, _SLICE)
            batch = await asyncio.shield(self._pending)
            self._pending = None
            self._logs()
            if batch is None:
                self._closed = True
                raise StopAsyncIteration
            self._batch.extend(batch)
        return self._pop()

    def next_batch(self, timeout: Optional[float] = None) -> list:
        """Everything received and not yet handed out, waiting up to `timeout` seconds (forever
        when None) for at least one event; empty on timeout or once closed. The fastest way to
        consume: one call per batch instead of one per event."""
        if not self._batch and not self._closed:
            waited = 0.0
            while not self._batch:
                if not self._fill(_SLICE if timeout is None else min(_SLICE, max(timeout - waited, 0.0))):
                    break
                waited += _SLICE
                if timeout is not None and waited >= timeout:
                    break
        out = list(self._batch)
        self._batch.clear()
        failed = next((i for i, item in enumerate(out) if isinstance(item, BaseException)), None)
        if failed is not None:
            # The events before the failure now, the failure at the next call.
            self._batch.append(out[failed])
            out = out[:failed]
            if not out:
                self._pop()
        for item in reversed(out):
            c = self._cursor_of(item)
            if c is not None:
                self._cursor = c
                break
        return out

    @property
    def cursor(self) -> Optional[int]:
        """The cursor of the last event handed out (a relay seq, or a Jetstream `time_us`): give it
        as `cursor=` to a new client to resume after it."""
        return self._cursor

    @property
    def last_error(self) -> Optional[ConnectError]:
        """What went wrong last: the permanent failure the client ended with (a
        `PermanentConnectError` subclass, as raised), else the transient failure it is retrying
        (a `ConnectError` whose text names the URL and the reason), else None while the current
        connection has had no trouble."""
        if self._error is not None:
            return self._error
        text = self._core.last_error()
        return ConnectError(text) if text else None

    def stats(self) -> Dict[str, Any]:
        """The client's counters: messages, bytes, connects, reconnects, connect_failures,
        decode_errors, verdicts (by name)."""
        return self._core.stats()

    def close(self) -> None:
        """Stops the connection and the Rust threads; iteration then ends (events received but
        not handed out are dropped: resume from `cursor`)."""
        self._core.close()
        self._closed = True
        self._batch.clear()
        self._logs()
        self._log.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()


class Firehose(_Client):
    """A relay firehose (`com.atproto.sync.subscribeRepos`) as an iterator of `Frame`s, plain or
    `async for`. Reconnects with backoff, resuming after the last frame received; starts after
    `cursor` when given (else live). With `verify=True` every frame is verified on a Rust thread
    (`frame.verdict`; keys from `did_docs`, a dict or a did_docs.json path, else resolved through
    `plc_url`, default https://plc.directory), on `threads` threads (default: one per CPU; each
    account's frames always on the same thread, in order, and frames handed out in stream order).
    A frame that does not decode is yielded too, as kind `invalid` with its `error`: nothing is
    dropped silently."""

    def __init__(
        self,
        url: str,
        cursor: Optional[int] = None,
        verify: bool = True,
        did_docs: Optional[Any] = None,
        plc_url: Optional[str] = None,
        threads: Optional[int] = None,
    ) -> None:
        from . import _did_docs_json

        super().__init__()
        self._core = _riptide._firehose(
            url, cursor, verify, _did_docs_json(did_docs) if verify else None, plc_url, threads
        )
        self._cursor = cursor

    def _cursor_of(self, item: Any) -> Optional[int]:
        return item.seq

    def __repr__(self) -> str:
        return f"Firehose(cursor={self._cursor!r}, closed={self._closed!r})"


class Jetstream(_Client):
    """A Jetstream server as an iterator of events (dicts, the v1 JSON), plain or `async for`.

    v1 (`/subscribe`): `collections` and `dids` are `wantedCollections` / `wantedDids`; `cursor`
    a `time_us` to start from (else live). `compress=True` asks for zstd-compressed messages and
    needs Jetstream's dictionary (`zstd_dictionary`: bytes or the path of
    `legacy_subscribe.zdict`).

    v2 (`subscribeEvents`), when the URL names `network.bsky.jetstream.subscribeEvents` or
    `v2=True`: `collections`, `dids` and `kinds` (commit, identity, account, sync) are v2's
    filters; `cursor` a seq (inclusive; a `time_us` is taken as a time); `compress=True` fetches
    the server's dictionary from `getZstdDictionary` (unless `zstd_dictionary` is given) and asks
    for `zstdDictionary=<its id>`; a server without one is read uncompressed (logged). Events come
    as v1's: `did`, `time_us`, `cursor` (v2's `seq`), `kind` and the kind's object; v2's `sync`
    and `info` events come as kinds `sync` and `info`.

    Reconnects with backoff, resuming from the last event received. A permanent failure (the
    server refusing the request with a 4xx, e.g. a bad filter; a host that does not exist) is
    raised from iteration as a `PermanentConnectError` subclass."""

    def __init__(
        self,
        url: str,
        collections: Optional[Iterable[str]] = None,
        dids: Optional[Iterable[str]] = None,
        cursor: Optional[int] = None,
        compress: bool = False,
        zstd_dictionary: Optional[Union[bytes, str, "os.PathLike[str]"]] = None,
        kinds: Optional[Iterable[str]] = None,
        v2: Optional[bool] = None,
    ) -> None:
        super().__init__()
        self._v2 = _V2_NSID in url if v2 is None else bool(v2)
        if kinds is not None and not self._v2:
            raise ValueError("kinds is a Jetstream v2 filter: give a subscribeEvents URL (or v2=True)")
        dictionary = _dictionary(zstd_dictionary) if compress else None
        cols = list(collections) if collections is not None else None
        dids_ = list(dids) if dids is not None else None
        if self._v2:
            self._core = _riptide._jetstream_v2(
                url, cols, dids_, list(kinds) if kinds is not None else None, cursor, compress, dictionary
            )
        else:
            if compress and dictionary is None:
                raise ValueError(
                    "compress=True needs Jetstream's zstd dictionary: zstd_dictionary= "
                    "(bytes, or the path of legacy_subscribe.zdict)"
                )
            self._core = _riptide._jetstream(url, cols, dids_, cursor, dictionary)
        self._cursor = cursor
        self._logs()

    def _cursor_of(self, item: Any) -> Optional[int]:
        return item.get("cursor") if self._v2 else item.get("time_us")

    def __repr__(self) -> str:
        return f"Jetstream(cursor={self._cursor!r}, closed={self._closed!r})"
