"""The clients' Python half: the iterator and `async for` protocols over the native cores.

The native core (`_FirehoseCore`, `_JetstreamCore`) runs the connection, the reconnects with
backoff (resuming after the last event received) and the decoding and verification on Rust
threads, and hands over whole batches (`take`). This side keeps the current batch, hands out one
event at a time and tracks the cursor of the last event handed out. A plain `for` waits in short
slices with the GIL released so that Ctrl-C is seen; `async for` waits in the event loop's default
executor so that the loop stays free.
"""

from __future__ import annotations

import asyncio
import collections
import os
from typing import Any, Deque, Dict, Iterable, Optional, Union

from . import _riptide

# How long one wait for a batch lasts before Python gets control back (signals, cancellation).
_SLICE = 0.2


class _Client:
    _core: Any

    def __init__(self) -> None:
        self._batch: Deque[Any] = collections.deque()
        self._closed = False
        self._cursor: Optional[int] = None
        self._pending: Optional["asyncio.Future[Any]"] = None

    def _cursor_of(self, item: Any) -> Optional[int]:
        raise NotImplementedError

    def _pop(self) -> Any:
        item = self._batch.popleft()
        c = self._cursor_of(item)
        if c is not None:
            self._cursor = c
        return item

    def _fill(self, timeout: float) -> bool:
        """Takes the next batch; False once closed."""
        batch = self._core.take(timeout)
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
        self._core = _riptide._FirehoseCore(
            url, cursor, verify, _did_docs_json(did_docs) if verify else None, plc_url, threads
        )
        self._cursor = cursor

    def _cursor_of(self, item: Any) -> Optional[int]:
        return item.seq

    def __repr__(self) -> str:
        return f"Firehose(cursor={self._cursor!r}, closed={self._closed!r})"


class Jetstream(_Client):
    """A Jetstream server (`/subscribe`) as an iterator of events (dicts, the v1 JSON), plain or
    `async for`. `collections` and `dids` are Jetstream's `wantedCollections` / `wantedDids`;
    `cursor` a `time_us` to start from (else live). `compress=True` asks for zstd-compressed
    messages and needs Jetstream's dictionary (`zstd_dictionary`: bytes or the path of
    `legacy_subscribe.zdict`). Reconnects with backoff, resuming from the last event received."""

    def __init__(
        self,
        url: str,
        collections: Optional[Iterable[str]] = None,
        dids: Optional[Iterable[str]] = None,
        cursor: Optional[int] = None,
        compress: bool = False,
        zstd_dictionary: Optional[Union[bytes, str, "os.PathLike[str]"]] = None,
    ) -> None:
        super().__init__()
        dictionary = None
        if compress:
            if zstd_dictionary is None:
                raise ValueError(
                    "compress=True needs Jetstream's zstd dictionary: zstd_dictionary= "
                    "(bytes, or the path of legacy_subscribe.zdict)"
                )
            if isinstance(zstd_dictionary, (str, os.PathLike)):
                with open(zstd_dictionary, "rb") as f:
                    dictionary = f.read()
            else:
                dictionary = bytes(zstd_dictionary)
        self._core = _riptide._JetstreamCore(
            url,
            list(collections) if collections is not None else None,
            list(dids) if dids is not None else None,
            cursor,
            dictionary,
        )
        self._cursor = cursor

    def _cursor_of(self, item: Any) -> Optional[int]:
        return item.get("time_us")

    def __repr__(self) -> str:
        return f"Jetstream(cursor={self._cursor!r}, closed={self._closed!r})"
