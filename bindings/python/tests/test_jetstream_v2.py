"""`riptide.Jetstream` speaking Jetstream v2 (`subscribeEvents`) to `riptide serve` having ingested
the real capture: the events are the ones the v1 client yields for the same server (the same
dicts: v2's `seq` is riptide's v1 `cursor`, its `time` the same `time_us`), filtered by v2's
`kinds`, and compressed with the dictionary the client fetches from `getZstdDictionary` itself."""

import logging

import pytest

import riptide
from conftest import free_port, run_json_lines, take

V2 = "/xrpc/network.bsky.jetstream.subscribeEvents"


@pytest.fixture
def events(riptide_bin, frames_path):
    """How many Jetstream events the capture makes (`riptide jetstream`)."""
    code, lines, err = run_json_lines([riptide_bin, "jetstream", frames_path])
    assert code == 0, err
    assert len(lines) > 140
    return len(lines)


def test_v2_yields_the_events_of_v1(serve, events, caplog):
    caplog.set_level(logging.INFO, logger="riptide")
    v1 = take(riptide.Jetstream(f"ws://{serve}", cursor=0), events)
    assert len(v1) == events
    with riptide.Jetstream(f"ws://{serve}{V2}", cursor=0) as js:
        v2 = take(js, events)
        assert js.cursor == v2[-1]["cursor"]
    assert v2 == v1
    # `v2=True` with the base URL is the same.
    assert take(riptide.Jetstream(f"ws://{serve}", v2=True, cursor=0), events) == v1

    # This server has no v2 dictionary: compress=True reads it uncompressed, and says so once.
    assert take(riptide.Jetstream(f"ws://{serve}{V2}", cursor=0, compress=True), events) == v1
    said = [r.getMessage() for r in caplog.records if "no zstd dictionary" in r.getMessage()]
    assert len(said) == 1 and "DictionaryNotFound" in said[0]

    # v2's filters: kinds, collections.
    kinds = ["identity", "account"]
    others = [e for e in v1 if e["kind"] in kinds]
    assert len(others) > 0
    assert take(riptide.Jetstream(f"ws://{serve}{V2}", cursor=0, kinds=kinds), len(others)) == others
    likes = [e for e in v1 if e["kind"] == "commit" and e["commit"]["collection"] == "app.bsky.feed.like"]
    got = take(riptide.Jetstream(f"ws://{serve}{V2}", cursor=0, collections=["app.bsky.feed.like"]), len(likes))
    assert got == likes

    # Resuming from `.cursor` (inclusive): the event at the cursor, then the rest.
    half = v2[len(v2) // 2]["cursor"]
    assert take(riptide.Jetstream(f"ws://{serve}{V2}", cursor=half), events - len(v2) // 2) == v1[len(v2) // 2:]

    with pytest.raises(ValueError, match="kinds"):
        riptide.Jetstream(f"ws://{serve}", kinds=["commit"])


def test_v2_compressed_with_the_servers_dictionary(serve_v2_dictionary, events, corpus):
    url = f"ws://{serve_v2_dictionary}{V2}"
    with riptide.Jetstream(url, cursor=0) as js:
        plain = take(js, events)
        plain_bytes = js.stats()["bytes"]
    with riptide.Jetstream(url, cursor=0, compress=True) as js:
        fetched = take(js, events)
        fetched_bytes = js.stats()["bytes"]
    dictionary = corpus / "jetstream-dictionaries" / "subscribe_events_20260811.zdict"
    with riptide.Jetstream(url, cursor=0, compress=True, zstd_dictionary=dictionary) as js:
        given = take(js, events)
        given_bytes = js.stats()["bytes"]
    assert len(plain) == events
    assert fetched == given == plain
    assert fetched_bytes == given_bytes < plain_bytes * 2 // 3, (fetched_bytes, plain_bytes)


def test_the_dictionary_download_fails_clearly(answer):
    # Nobody listening: transient, raised at construction as the base class.
    with pytest.raises(riptide.ConnectError) as raised:
        riptide.Jetstream(f"ws://127.0.0.1:{free_port()}{V2}", compress=True)
    assert type(raised.value) is riptide.ConnectError
    assert "getZstdDictionary" in raised.value.url
    # Refused: permanent, with the server's reason.
    srv = answer(403, '{"error":"Forbidden","message":"no dictionary for you"}', "application/json")
    with pytest.raises(riptide.RefusedError) as raised:
        riptide.Jetstream(srv.url + V2, compress=True)
    assert (raised.value.status, raised.value.error, raised.value.message) == (403, "Forbidden", "no dictionary for you")
