"""The clients' failures (issue 39), against real servers on loopback: a test HTTP server that
answers every request with one status and body, a port nobody listens on, a `.invalid` host,
`riptide relay` asked for a cursor past its head, and `riptide serve` given a bad filter.

Permanent failures (a 4xx other than 408/429 with the server's reason, a host that does not
exist, a bad URL, `FutureCursor`) are raised from iteration as `PermanentConnectError`
subclasses, once, and end the client; transient ones are retried, logged through the logger
"riptide" once per kind with a count, and kept in `last_error`."""

import asyncio
import logging
import re
import socket
import time

import pytest

import riptide
from conftest import PATIENCE, free_port, take

V2 = "/xrpc/network.bsky.jetstream.subscribeEvents"


CLIENTS = {
    "firehose": lambda url: riptide.Firehose(url, verify=False),
    "jetstream": lambda url: riptide.Jetstream(url),
    "jetstream-v2": lambda url: riptide.Jetstream(url, v2=True),
}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_4xx_is_raised_once_with_the_servers_reason(answer, client):
    srv = answer(404, "no such endpoint on this server")
    c = CLIENTS[client](srv.url)
    with pytest.raises(riptide.RefusedError) as raised:
        take(c, 1)
    e = raised.value
    assert isinstance(e, riptide.PermanentConnectError) and isinstance(e, riptide.ConnectError)
    assert (e.status, e.error, e.message) == (404, "", "no such endpoint on this server")
    assert srv.url in str(e) and "no such endpoint on this server" in str(e)
    assert c.last_error is e
    assert list(c) == [], "the client ended"
    assert srv.requests == 1, "not retried"


def test_async_for_and_next_batch_raise_it_too(answer):
    srv = answer(404, "gone")

    async def run():
        async for _ in riptide.Jetstream(srv.url):
            pass

    with pytest.raises(riptide.RefusedError, match="gone"):
        asyncio.run(asyncio.wait_for(run(), PATIENCE))
    fh = riptide.Firehose(srv.url, verify=False)
    with pytest.raises(riptide.RefusedError, match="gone"):
        fh.next_batch(timeout=PATIENCE)
    assert fh.next_batch(timeout=0.1) == []
    assert srv.requests == 2


def test_an_xrpc_error_keeps_its_name_and_message(answer):
    srv = answer(400, '{"error":"InvalidRequest","message":"cursor must be a number"}', "application/json")
    with pytest.raises(riptide.RefusedError) as raised:
        take(riptide.Jetstream(srv.url + V2), 1)
    e = raised.value
    assert (e.status, e.error, e.message) == (400, "InvalidRequest", "cursor must be a number")


@pytest.mark.parametrize("status", [408, 429, 503])
def test_408_429_and_5xx_are_retried(answer, status):
    srv = answer(status, "try later")
    fh = riptide.Firehose(srv.url, verify=False)
    deadline = time.monotonic() + PATIENCE
    while srv.requests < 3:
        assert time.monotonic() < deadline, f"HTTP {status} was not retried"
        assert fh.next_batch(timeout=0.2) == []
    e = fh.last_error
    assert type(e) is riptide.ConnectError, "transient: the base class"
    assert str(status) in str(e) and srv.url in str(e)
    fh.close()


def test_a_refused_port_is_retried_logged_once_then_counted(caplog):
    caplog.set_level(logging.INFO, logger="riptide")
    url = f"ws://127.0.0.1:{free_port()}"
    fh = riptide.Firehose(url, verify=False)
    deadline = time.monotonic() + PATIENCE
    while fh.stats()["connect_failures"] < 4:
        assert time.monotonic() < deadline, fh.stats()
        assert fh.next_batch(timeout=0.2) == []
    e = fh.last_error
    assert type(e) is riptide.ConnectError
    assert url in str(e) and "refused" in str(e).lower()

    def lines():
        return [r for r in caplog.records if r.name == "riptide" and "cannot connect" in r.getMessage()]

    assert len(lines()) == 1, [r.getMessage() for r in lines()]
    first = lines()[0]
    assert first.levelno == logging.WARNING and url in first.getMessage()
    seen = fh.stats()["connect_failures"]
    fh.close()
    after = fh.stats()["connect_failures"]
    # At close, one summary: the latest failure, how many others were not logged, how many in
    # all (the first line, this one and those).
    assert len(lines()) == 2
    m = re.search(r"\[(\d+) more like this not logged since the last line, (\d+) in all\]", lines()[1].getMessage())
    assert m, lines()[1].getMessage()
    assert int(m[1]) == int(m[2]) - 2 and seen <= int(m[2]) <= after


def test_summaries_count_every_failure(monkeypatch, caplog):
    """With a short interval, a summary line comes every interval; the counts add up exactly."""
    monkeypatch.setattr(riptide._clients._Log, "every", 0.5)
    caplog.set_level(logging.INFO, logger="riptide")
    fh = riptide.Firehose(f"ws://127.0.0.1:{free_port()}", verify=False)
    deadline = time.monotonic() + PATIENCE
    start = time.monotonic()
    while fh.stats()["connect_failures"] < 8:
        assert time.monotonic() < deadline, fh.stats()
        fh.next_batch(timeout=0.2)
    fh.close()
    elapsed = time.monotonic() - start
    said = [r.getMessage() for r in caplog.records if r.name == "riptide" and "cannot connect" in r.getMessage()]
    total = 1
    for line in said[1:]:
        m = re.search(r"\[(\d+) more like this not logged since the last line, (\d+) in all\]", line)
        assert m, line
        total += int(m[1]) + 1
        assert int(m[2]) == total, said
    assert total >= 8
    assert len(said) <= 2 + elapsed / 0.5, "at most one line per interval (and the one at close)"


def test_a_host_that_does_not_exist_is_raised():
    host = "riptide-test.invalid"
    try:
        socket.getaddrinfo(host, 443)
        pytest.fail(f"{host} resolved")
    except socket.gaierror as e:
        offline = e.errno == socket.EAI_AGAIN
    fh = riptide.Firehose(f"wss://{host}", verify=False)
    if offline:
        # A resolver that cannot be asked is transient: retried, and said in last_error.
        deadline = time.monotonic() + PATIENCE
        while fh.last_error is None:
            assert time.monotonic() < deadline
            assert fh.next_batch(timeout=0.2) == []
        assert type(fh.last_error) is riptide.ConnectError
        fh.close()
        return
    with pytest.raises(riptide.UnknownHostError) as raised:
        take(fh, 1)
    assert host in raised.value.url and raised.value.reason
    assert host in str(raised.value)


def test_a_bad_url_is_an_invalid_url_error():
    for make in CLIENTS.values():
        with pytest.raises(riptide.InvalidUrlError) as raised:
            make("ws://host:99999")
        assert isinstance(raised.value, ValueError) and isinstance(raised.value, riptide.PermanentConnectError)
        assert raised.value.url == "ws://host:99999"


def test_a_cursor_past_the_relays_head_is_future_cursor(relay):
    fh = riptide.Firehose(relay, cursor=1_000_000, verify=False)
    with pytest.raises(riptide.RelayError) as raised:
        take(fh, 1)
    assert raised.value.name == "FutureCursor"
    assert fh.last_error is raised.value


def test_a_bad_filter_is_refused_by_serve(serve):
    with pytest.raises(riptide.RefusedError) as raised:
        take(riptide.Jetstream(f"ws://{serve}", collections=["not a collection!"], cursor=0), 1)
    assert raised.value.status == 400 and "invalid collection" in raised.value.message, raised.value
    with pytest.raises(riptide.RefusedError) as raised:
        take(riptide.Jetstream(f"ws://{serve}{V2}", kinds=["like"], cursor=0), 1)
    e = raised.value
    assert (e.status, e.error) == (400, "InvalidRequest") and "unknown kind" in e.message, e
