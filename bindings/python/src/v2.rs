//! The native half of `riptide.Jetstream` on Jetstream v2's `subscribeEvents`: the
//! `riptide_client::JetstreamV2Client` run as the other clients are (`crate::clients`), with its
//! events handed to Python in the shape the v1 client yields.
//!
//! Why a module: v2's frames differ from v1's events (a flat `payload` with `seq` and an RFC 3339
//! `time`), and a Python program should not need two code paths for one event stream. The
//! mapping ([`v1_event`]): `did`; `time_us` from `time`; `cursor` from `seq` (riptide's v1
//! events carry the same number as `cursor`: one number per event on both wires); `kind`; and
//! the kind's object — `commit` (`rev`, `operation`, `collection`, `rkey`, and `record`, `cid`
//! unless a delete), `identity`, `account` — as v1 has them. Two kinds v1 never sends come
//! through rather than being dropped: `sync` (`"sync": {…}`, the upstream event) and `info`
//! (`"info": {"name", "message"}`, e.g. `OutdatedCursor`, with no `cursor` or `time_us`).
//!
//! The dictionary: with `compress=True` and no dictionary given, the server's own is fetched
//! from `getZstdDictionary` (`riptide_client::fetch_dictionary`) before the client starts,
//! once; a server without one (404 `DictionaryNotFound`) is read uncompressed, and that is
//! logged.

use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use riptide_client::{
    fetch_dictionary, JetstreamV2Client, JetstreamV2Config, V2Filter, V2Message, V2Payload,
};
use serde_json::{Map, Value};

use crate::clients::{
    client_error, config, live, AsyncNext, ClientCore, Item, NextFuture, Pipeline,
};
use crate::errors::connect_error;
use crate::log::LogLines;

/// Time allowed for the `getZstdDictionary` download.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

struct V2Next;
impl<'c> AsyncNext<'c, JetstreamV2Client, V2Message> for V2Next {
    type Fut = NextFuture<'c, V2Message>;
    fn next(&self, client: &'c mut JetstreamV2Client) -> Self::Fut {
        live(client.next())
    }
}

/// The native half of `riptide.Jetstream` on `subscribeEvents`.
#[pyfunction]
#[pyo3(name = "_jetstream_v2")]
#[pyo3(signature = (url, collections = None, dids = None, kinds = None, cursor = None, compress = false, zstd_dictionary = None))]
#[allow(clippy::too_many_arguments)]
fn jetstream_v2(
    py: Python<'_>,
    url: String,
    collections: Option<Vec<String>>,
    dids: Option<Vec<String>>,
    kinds: Option<Vec<String>>,
    cursor: Option<i64>,
    compress: bool,
    zstd_dictionary: Option<Vec<u8>>,
) -> PyResult<ClientCore> {
    let log = LogLines::default();
    let dictionary = match zstd_dictionary {
        Some(d) => Some(d),
        None if compress => server_dictionary(py, &url, &log)?,
        None => None,
    };
    let client = JetstreamV2Client::new(JetstreamV2Config {
        client: config(url.clone(), cursor),
        filter: V2Filter {
            kinds: kinds.unwrap_or_default(),
            dids: dids.unwrap_or_default(),
            collections: collections.unwrap_or_default(),
            max_message_size_bytes: 0,
        },
        dictionary,
    })
    .map_err(|e| client_error(py, &url, e))?;
    let stats = client.stats();
    let process = |messages: Vec<V2Message>| {
        messages
            .into_iter()
            .map(|m| Item::Event(v1_event(m.payload)))
            .collect()
    };
    Ok(ClientCore::new(Pipeline::start(
        url, client, stats, log, V2Next, process,
    )?))
}

/// The server's dictionary (module docs), fetched with the GIL released; `None` when it has none
/// (said in the client's log).
pub(crate) fn server_dictionary(
    py: Python<'_>,
    url: &str,
    log: &LogLines,
) -> PyResult<Option<Vec<u8>>> {
    let fetched = py.detach(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|rt| rt.block_on(fetch_dictionary(url, FETCH_TIMEOUT)))
    });
    match fetched.map_err(|e| PyRuntimeError::new_err(format!("runtime: {e}")))? {
        Ok(Some(d)) => Ok(Some(d)),
        Ok(None) => {
            log.push(
                "riptide-python: no dictionary",
                30,
                format!(
                    "{url}: the server has no zstd dictionary (getZstdDictionary: 404 DictionaryNotFound): reading it uncompressed"
                ),
            );
            Ok(None)
        }
        Err(e) => Err(connect_error(py, &e, url)),
    }
}

/// A v2 payload as the v1 event it corresponds to (module docs).
pub(crate) fn v1_event(p: V2Payload) -> Value {
    let kind = p.kind().to_owned();
    let mut o = Map::new();
    if let Some(did) = p.did {
        o.insert("did".into(), did.into());
    }
    if let Some(time) = p.time {
        match riptide_syntax::Datetime::parse(&time) {
            Ok(t) => o.insert("time_us".into(), t.timestamp_micros().into()),
            // Not expected from a v2 server; kept as sent rather than lost.
            Err(_) => o.insert("time".into(), time.into()),
        };
    }
    if let Some(seq) = p.seq {
        o.insert("cursor".into(), seq.into());
    }
    o.insert("kind".into(), kind.clone().into());
    let object = match kind.as_str() {
        "commit" => {
            let mut c = Map::new();
            for (k, v) in [
                ("rev", p.rev),
                ("operation", p.operation),
                ("collection", p.collection),
                ("rkey", p.rkey),
            ] {
                c.insert(k.into(), v.map_or(Value::Null, Value::String));
            }
            if let Some(r) = p.record {
                c.insert("record".into(), r);
            }
            if let Some(cid) = p.cid {
                c.insert("cid".into(), cid.into());
            }
            Some(Value::Object(c))
        }
        "identity" => p.identity,
        "account" => p.account,
        "sync" => p.sync,
        "info" => {
            let mut i = Map::new();
            i.insert("name".into(), p.name.map_or(Value::Null, Value::String));
            i.insert(
                "message".into(),
                p.message.map_or(Value::Null, Value::String),
            );
            Some(Value::Object(i))
        }
        _ => None,
    };
    if let Some(v) = object {
        o.insert(kind, v);
    }
    Value::Object(o)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(jetstream_v2, m)?)?;
    Ok(())
}
