//! What the serve crate's integration tests share: a log of synthetic events, served on
//! loopback. Each test file is its own crate and uses only part of this, hence `dead_code`.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use riptide_serve::{
    router, App, ConnInfo, ConnLimits, Event, LimitedListener, Log, Metrics, ServerConfig, Store,
    TailLimits,
};

/// Opens the store at `dir` once the store this process had open there has let go of it (a data
/// directory is one store's at a time, `riptide_store::lock`): a test that "restarts" in-process
/// waits for the tasks of the first run (a server's last connections, a resync service) to end.
pub async fn reopen(
    dir: &Path,
    dict_id: u32,
    options: riptide_store::store::StoreOptions,
) -> (Store, riptide_serve::Resume) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match Store::open_with(dir, dict_id, options) {
            Err(riptide_serve::StoreError::Locked(e)) if std::time::Instant::now() < until => {
                let _ = e;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            r => return r.expect("reopening the store"),
        }
    }
}

/// A log over a fresh store in `dir`, with a tail large enough for any test's events.
pub fn open_log(dir: &Path) -> Arc<Log> {
    let (store, resume) = Store::open(dir, 0).unwrap();
    Arc::new(Log::new(
        store,
        resume.next_seq,
        TailLimits {
            max_events: 1 << 20,
            max_bytes: 1 << 30,
        },
    ))
}

/// Event `i` (seq and `time_us` both `i`): a commit by `did:plc:a` in `a.b.c` with this JSON.
pub fn commit(i: u64, json: &str) -> Event {
    riptide_store::testing::commit(i, json)
}

/// Event `i` as a bare `{"i":…,"pad":…}` object: enough for v1, which sends the stored JSON.
pub fn padded(i: u64, pad: &str) -> Event {
    commit(i, &format!("{{\"i\":{i},\"pad\":\"{pad}\"}}"))
}

/// Event `i` in the stored v1 shape, so that both `/subscribe` and `subscribeEvents` can send
/// it, its record padded with `pad`.
pub fn v1_commit(i: u64, pad: &str) -> Event {
    commit(
        i,
        &format!(
            r#"{{"did":"did:plc:a","time_us":{i},"cursor":{i},"kind":"commit","commit":{{"rev":"3l3qo2vutsw2b","operation":"create","collection":"a.b.c","rkey":"k{i}","record":{{"pad":"{pad}"}},"cid":"bafyreib"}}}}"#
        ),
    )
}

/// Serves `app` on a loopback port.
pub async fn listen(app: Arc<App>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = router(app);
    tokio::spawn(async move { axum::serve(listener, r).await });
    addr
}

/// Serves `app` on a loopback port behind the connection limits.
pub async fn listen_limited(app: Arc<App>, limits: ConnLimits) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let l = LimitedListener::new(listener, limits, app.metrics.clone());
    let r = router(app).into_make_service_with_connect_info::<ConnInfo>();
    tokio::spawn(async move { axum::serve(l, r).await });
    addr
}

/// Serves `app`'s probes on a loopback port of their own (`LimitedListener::probes`).
pub async fn listen_probes(app: Arc<App>, header_timeout: std::time::Duration) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let l = LimitedListener::probes(listener, header_timeout, app.metrics.clone());
    let r = router(app).into_make_service_with_connect_info::<ConnInfo>();
    tokio::spawn(async move { axum::serve(l, r).await });
    addr
}

/// A fresh log holding `events` (published straight into the in-memory tail), served on a
/// loopback port; the store's directory lives as long as the returned guard.
pub async fn serve_events(
    events: &[Event],
    config: ServerConfig,
) -> (SocketAddr, Arc<App>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let log = open_log(dir.path());
    log.publish(events);
    let app = App::new(log, Arc::new(Metrics::default()), config);
    (listen(app.clone()).await, app, dir)
}
