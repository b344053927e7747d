"""`riptide.Archive`: Jetstream v2's archive (`planSnapshot`, `getSegment`, `getBlock`) read from
Python, alone (`snapshot`) or followed by the live `subscribeEvents` (`replay`), each event once.

Why a module: the archive is read by `riptide_client::archive` on the clients' Rust threads
(`src/archive.rs`); this side gives it the iterator protocols of the live clients (`_clients`), so
that a consumer iterates an archive read, a replay and `riptide.Jetstream` alike and gets the same
event dicts from each.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Optional, Union

from . import _riptide
from ._clients import _Client, _dictionary


def _strs(v: Optional[Iterable[str]]) -> Optional[list]:
    return list(v) if v is not None else None


class ArchiveRead(_Client):
    """One read of the archive (`Archive.snapshot` / `Archive.replay`): an iterator of event
    dicts, plain or `async for`, in seq order, each seq once. `cursor` is the seq of the last
    event handed out: `after_seq=cursor` on a new read resumes after it. A snapshot ends when the
    archive up to its sealed tip (pinned when the read starts) is read; a replay goes on live.
    A failure is raised from iteration after the events before it (`ConnectError` family)."""

    def __init__(self, core: Any, after_seq: Optional[int]) -> None:
        super().__init__()
        self._core = core
        self._cursor = after_seq
        self._logs()

    def _cursor_of(self, item: Any) -> Optional[int]:
        return item.get("cursor")

    def stats(self) -> Dict[str, Any]:
        """The read's counters: plan_pages, segments (downloaded whole), blocks (downloaded with
        getBlock), bytes, events (from the archive), rows_rejected (payloads that are not
        DAG-CBOR: not delivered), duplicates, retries, interrupted (downloads cut short, then
        resumed), restarts (resumed from byte 0: the file changed), and `live` (a replay's live
        client's counters once it started, else None)."""
        return self._core.stats()

    def __repr__(self) -> str:
        return f"ArchiveRead(cursor={self._cursor!r}, closed={self._closed!r})"


class Archive:
    """A Jetstream v2 server's archive: `url` is the server (`http(s)://host[:port]`,
    `ws(s)://…`, `host:port`, with or without `/xrpc/…`); `token` is sent as
    `Authorization: Bearer <token>` (a server started with `--archive-token` refuses a read
    without the right one: `UnauthorizedError`).

    Limits: `range_bytes` per `getSegment` request (default 8 MiB, as the `atproto` SDK; an
    interrupted download resumes from its first missing byte with `If-Range`),
    `max_segment_bytes` (default 1 GiB; a larger segment is a `TooLargeError`), `max_attempts`
    of a request failing in a row in a way that may pass before the read ends with an
    `UnavailableError` (default 8, with backoff), `timeout` seconds for one request (default 120).

    Every segment file is verified (header, footer, xxh3 checksums, each zstd frame), every row's
    payload checked to be DAG-CBOR, and every record's CID computed from its bytes; rows are
    filtered exactly as asked (a plan is a superset). Downloading and decoding run on Rust
    threads with the GIL released."""

    def __init__(
        self,
        url: str,
        token: Optional[str] = None,
        range_bytes: Optional[int] = None,
        max_segment_bytes: Optional[int] = None,
        max_attempts: Optional[int] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self.url = url
        self._token = token
        self._limits = dict(
            range_bytes=range_bytes, max_segment_bytes=max_segment_bytes, max_attempts=max_attempts, timeout=timeout
        )

    def snapshot(
        self,
        kinds: Optional[Iterable[str]] = None,
        dids: Optional[Iterable[str]] = None,
        collections: Optional[Iterable[str]] = None,
        after_seq: Optional[int] = None,
        before_seq: Optional[int] = None,
        record_bytes: bool = False,
    ) -> ArchiveRead:
        """The archive's events after `after_seq` (exclusive) up to `before_seq` (inclusive) and
        the sealed tip: `kinds` (commit, identity, account, sync), `dids`, `collections` (NSIDs or
        `prefix.*`) as v2's filters. Each event is the dict `riptide.Jetstream` yields for it on
        v2's live wire; with `record_bytes=True` a commit with a record also has `record_bytes`,
        the DAG-CBOR its `cid` is the hash of. A filter the planner would refuse raises
        ValueError here."""
        core = _riptide._archive_snapshot(
            self.url,
            self._token,
            _strs(kinds),
            _strs(dids),
            _strs(collections),
            after_seq,
            before_seq,
            record_bytes,
            **self._limits,
        )
        return ArchiveRead(core, after_seq)

    def replay(
        self,
        kinds: Optional[Iterable[str]] = None,
        dids: Optional[Iterable[str]] = None,
        collections: Optional[Iterable[str]] = None,
        after_seq: Optional[int] = None,
        record_bytes: bool = False,
        compress: bool = False,
        zstd_dictionary: Optional[Union[bytes, str, "os.PathLike[str]"]] = None,
    ) -> ArchiveRead:
        """The archive's events after `after_seq` (as `snapshot`), then the live
        `subscribeEvents` from the seq after the archive's sealed tip, with the same filters:
        every event once across the switch. The live part reconnects as `riptide.Jetstream` does
        and fails as it does (`CursorTooOldError`, …); `compress`/`zstd_dictionary` are its
        compression (the server's dictionary fetched when not given)."""
        core = _riptide._archive_replay(
            self.url,
            self._token,
            _strs(kinds),
            _strs(dids),
            _strs(collections),
            after_seq,
            record_bytes,
            compress,
            _dictionary(zstd_dictionary) if compress else None,
            **self._limits,
        )
        return ArchiveRead(core, after_seq)

    def __repr__(self) -> str:
        return f"Archive({self.url!r}, token={'***' if self._token else None})"

