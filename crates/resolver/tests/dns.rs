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
