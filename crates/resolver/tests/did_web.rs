//! `did:web` end to end over loopback HTTP (did:web allows plain HTTP for `localhost` and
//! `127.0.0.1` development hosts): the document at `/.well-known/did.json` of the host named by
//! the DID, its signing key and PDS endpoint; a document whose `id` names another DID is refused;
//! a host without one is "not found".

#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::time::Duration;

use axum::routing::get;
use riptide_resolver::{ResolveError, Resolver, ResolverConfig};
use riptide_sim::fixture;

async fn serve_doc(doc: impl Fn(u16) -> Option<serde_json::Value> + Send + Sync + 'static) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let body = doc(port);
    let app = axum::Router::new().route(
        "/.well-known/did.json",
        get(move || {
            let body = body.clone();
            async move {
                match body {
                    Some(b) => (axum::http::StatusCode::OK, b.to_string()),
                    None => (axum::http::StatusCode::NOT_FOUND, String::new()),
                }
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    port
}

fn resolver() -> Resolver {
    Resolver::new(ResolverConfig {
        // No PLC directory is involved: a did:web lookup must not touch it.
        plc_url: "http://127.0.0.1:9".into(),
        timeout: Duration::from_secs(30),
        ..ResolverConfig::default()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn did_web_documents_resolve_and_are_checked() {
    let key = fixture::key_for(7).public_key();
    let good_key = key.clone();
    let port = serve_doc(move |port| {
        let did = format!("did:web:127.0.0.1%3A{port}");
        Some(fixture::doc(
            &did,
            "web.test",
            &good_key,
            "https://pds.web.test",
        ))
    })
    .await;
    let did = format!("did:web:127.0.0.1%3A{port}");
    let doc = resolver().resolve_did(&did).await.unwrap();
    assert_eq!(doc.did().as_str(), did);
    assert_eq!(doc.signing_key().unwrap(), key);
    assert_eq!(doc.pds(), Some("https://pds.web.test"));

    // A document for another DID is refused, not trusted.
    let port = serve_doc(|_| {
        Some(fixture::doc(
            &fixture::did_for(1),
            "x.test",
            &fixture::key_for(1).public_key(),
            "https://x.test",
        ))
    })
    .await;
    let did = format!("did:web:localhost%3A{port}");
    match resolver().resolve_did(&did).await {
        Err(ResolveError::IdMismatch { .. }) => {}
        other => panic!("expected an id mismatch, got {other:?}"),
    }

    // No document: not found.
    let port = serve_doc(|_| None).await;
    let did = format!("did:web:127.0.0.1%3A{port}");
    match resolver().resolve_did(&did).await {
        Err(ResolveError::DidNotFound(_)) => {}
        other => panic!("expected not found, got {other:?}"),
    }
}
