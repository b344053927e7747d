//! Handle resolution through DNS TXT, against a DNS server on loopback (the resolver's
//! `dns_servers` option pointed at it): a `did=` record resolves (and the document, from the
//! simulator, claims the handle back); records naming two DIDs fail as the handle spec says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::proto::op::{Message, MessageType, ResponseCode};
use hickory_resolver::proto::rr::rdata::TXT;
use hickory_resolver::proto::rr::{RData, Record};
use riptide_resolver::{ResolveError, Resolver, ResolverConfig};
use riptide_sim::{fixture, Faults, Network, Sim};
use tokio::net::UdpSocket;

/// Answers TXT queries from `records` (name → TXT strings), NXDOMAIN otherwise.
async fn dns_server(records: Vec<(String, Vec<String>)>) -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, from)) = sock.recv_from(&mut buf).await else {
                return;
            };
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut resp = Message::new();
            resp.set_id(q.id())
                .set_message_type(MessageType::Response)
                .set_op_code(q.op_code());
            resp.set_recursion_desired(q.recursion_desired())
                .set_recursion_available(true);
            resp.add_queries(q.queries().to_vec());
            let name = q
                .queries()
                .first()
                .map(|q| q.name().to_ascii().to_lowercase())
                .unwrap_or_default();
            let mut found = false;
            for (n, txts) in &records {
                if *n == name {
                    found = true;
                    for t in txts {
                        let rd = RData::TXT(TXT::new(vec![t.clone()]));
                        resp.add_answer(Record::from_rdata(q.queries()[0].name().clone(), 60, rd));
                    }
                }
            }
            if !found {
                resp.set_response_code(ResponseCode::NXDomain);
            }
            let _ = sock.send_to(&resp.to_vec().unwrap(), from).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txt_records_resolve_handles() {
    let alice = fixture::account(1, "alice.test", 1);
    let sim = Sim::spawn(
        Network::new([alice.doc.clone()], []).unwrap(),
        SocketAddr::from(([127, 0, 0, 1], 0)),
        Faults::default(),
    )
    .await
    .unwrap();
    let dns = dns_server(vec![
        (
            "_atproto.alice.test.".into(),
            vec!["v=spf1 -all".into(), format!("did={}", alice.did)],
        ),
        (
            "_atproto.two.test.".into(),
            vec![
                format!("did={}", alice.did),
                format!("did={}", fixture::did_for(2)),
            ],
        ),
    ])
    .await;
    let r = Resolver::new(ResolverConfig {
        plc_url: sim.base_url(),
        dns_servers: vec![dns],
        timeout: Duration::from_secs(10),
        ..ResolverConfig::default()
    })
    .unwrap();

    let id = r.identity("Alice.Test").await.unwrap();
    assert_eq!(id.did.as_str(), alice.did);
    assert_eq!(id.handle.as_str(), "alice.test");
    assert_eq!(
        riptide_sim::Counters::get(&sim.sim.counters().well_known),
        0,
        "DNS answered: no HTTPS"
    );

    match r.resolve_handle("two.test").await {
        Err(ResolveError::AmbiguousHandle { dids, .. }) => {
            assert!(dids.contains(&alice.did), "{dids}")
        }
        other => panic!("expected AmbiguousHandle, got {other:?}"),
    }
}

/// Issue 39: offline, `verify-handle` said `handle-not-found`. A handle is "not found" only when
/// something that could name its DID was asked and did not: a DNS server that answers NXDOMAIN
/// and a host that does not answer is a missing handle; no DNS answer at all and no connection
/// either is a network failure (`resolve-failed`), with both causes in the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offline_is_a_network_failure_not_a_missing_handle() {
    let resolver = |dns: SocketAddr| {
        Resolver::new(ResolverConfig {
            // Nothing listens here: PLC is never reached for a handle that does not resolve.
            plc_url: "http://127.0.0.1:1".into(),
            dns_servers: vec![dns],
            timeout: Duration::from_secs(3),
            ..ResolverConfig::default()
        })
        .unwrap()
    };
    // `.test` is reserved (RFC 2606): `https://nobody.test` never connects, on any machine.
    let answering = dns_server(Vec::new()).await;
    let err = resolver(answering)
        .resolve_handle("nobody.test")
        .await
        .unwrap_err();
    assert!(
        matches!(err, ResolveError::HandleNotFound { .. }),
        "{err:?}"
    );
    assert_eq!(
        riptide_resolver::TrustVerdict::of_resolve_error(&err).as_str(),
        "handle-not-found"
    );

    // A DNS "server" that never answers: a bound socket nobody reads.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let err = resolver(silent.local_addr().unwrap())
        .resolve_handle("nobody.test")
        .await
        .unwrap_err();
    let ResolveError::Network { url, why } = &err else {
        panic!("expected a network failure, got {err:?}");
    };
    assert!(
        url.contains("_atproto.nobody.test") && url.contains("https://nobody.test"),
        "{url}"
    );
    assert!(
        why.starts_with("DNS: ") && why.contains("; HTTPS: "),
        "{why}"
    );
    assert_eq!(
        riptide_resolver::TrustVerdict::of_resolve_error(&err).as_str(),
        "resolve-failed"
    );
}
