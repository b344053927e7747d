//! `Resyncer::fetch_repo` against a hand-written host on loopback: each way a `getRepo` can go
//! wrong is its own typed `FetchError` (what a backfill counts by kind), and a good answer is the
//! CAR's exact bytes, in memory or spooled.

#![allow(clippy::unwrap_used, clippy::expect_used)]
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use riptide_resolver::{FetchError, Resolver, ResolverConfig, ResyncConfig, Resyncer};
use riptide_sim::fixture;

const LOOPBACK: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 0);

/// A host with one route per behaviour; its base URL.
async fn host(car: bytes::Bytes) -> String {
    let ok = car.clone();
    let last = car.clone();
    let cut = car.clone();
    let trickle = car.clone();
    let app = axum::Router::new()
        .route("/ok", get(move || async move { ok.clone().into_response() }))
        .route(
            "/last",
            get(move || {
                let car = last.clone();
                async move {
                    // Served, but the window is spent until it resets in 2 s.
                    Response::builder()
                        .header("ratelimit-limit", "20")
                        .header("ratelimit-remaining", "0")
                        .header("ratelimit-reset", "2")
                        .body(Body::from(car))
                        .unwrap()
                }
            }),
        )
        .route(
            "/deactivated",
            get(|| async {
                (
                    StatusCode::BAD_REQUEST,
                    r#"{"error":"RepoDeactivated","message":"Repo has been deactivated: did:plc:x"}"#,
                )
            }),
        )
        .route(
            "/limited",
            get(|| async {
                // No Retry-After: the PDS's own headers say when the window resets.
                Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .header("ratelimit-limit", "3000")
                    .header("ratelimit-remaining", "0")
                    .header("ratelimit-reset", "2")
                    .header("ratelimit-policy", "3000;w=300")
                    .body(Body::from(r#"{"error":"RateLimitExceeded"}"#))
                    .unwrap()
            }),
        )
        .route(
            "/cut",
            get(move || {
                let half = cut.slice(..cut.len() / 2);
                let len = cut.len();
                async move {
                    // Half the body, a pause (so that it reaches the client), then the
                    // connection fails.
                    let stream = futures_util::stream::unfold(0u8, move |step| {
                        let half = half.clone();
                        async move {
                            match step {
                                0 => Some((Ok(half), 1)),
                                1 => {
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                    Some((Err(std::io::Error::other("cut")), 2))
                                }
                                _ => None,
                            }
                        }
                    });
                    Response::builder()
                        .header(header::CONTENT_LENGTH, len)
                        .body(Body::from_stream(stream))
                        .unwrap()
                }
            }),
        )
        .route(
            "/trickle",
            get(move || {
                let car = trickle.clone();
                async move {
                    // 16 bytes every 50 ms: 320 bytes/s.
                    let stream = futures_util::stream::unfold(0usize, move |at| {
                        let car = car.clone();
                        async move {
                            if at >= car.len() {
                                return None;
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            let end = (at + 16).min(car.len());
                            Some((Ok::<_, std::io::Error>(car.slice(at..end)), end))
                        }
                    });
                    Response::new(Body::from_stream(stream))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(LOOPBACK).await.unwrap();
    let me = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{me}")
}

fn resyncer(cfg: ResyncConfig) -> Resyncer {
    Resyncer::new(Resolver::new(ResolverConfig::default()).unwrap(), cfg)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_of_a_fetch_is_its_own_kind() {
    let alice = fixture::account(1, "alice.test", 200);
    let base = host(alice.car.clone()).await;
    let rs = resyncer(ResyncConfig {
        timeout: Duration::from_secs(5),
        min_bytes_per_sec: 2000,
        min_rate_grace: Duration::from_millis(300),
        ..ResyncConfig::default()
    });

    let got = rs.fetch_repo(&format!("{base}/ok")).await.unwrap();
    assert_eq!(&got[..], &alice.car[..]);
    assert!(!got.is_spooled());

    match rs.fetch_repo(&format!("{base}/deactivated")).await {
        Err(FetchError::Status { status, error, .. }) => {
            assert_eq!((status, error.as_deref()), (400, Some("RepoDeactivated")))
        }
        other => panic!("{other:?}"),
    }

    match rs.fetch_repo(&format!("{base}/cut")).await {
        Err(FetchError::Truncated { got, announced, .. }) => {
            assert_eq!(announced, Some(alice.car.len() as u64));
            assert_eq!(got, alice.car.len() as u64 / 2);
        }
        other => panic!("{other:?}"),
    }

    let t = std::time::Instant::now();
    match rs.fetch_repo(&format!("{base}/trickle")).await {
        Err(FetchError::TooSlow {
            bytes,
            min_bytes_per_sec,
            ..
        }) => {
            assert_eq!(min_bytes_per_sec, 2000);
            assert!(bytes < alice.car.len() as u64, "{bytes}");
        }
        other => panic!("{other:?}"),
    }
    // Given up soon after the grace period, not at the 5 s timeout.
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());

    // 429 with RateLimit-Reset only: the wait is the reset; the host is then not asked again
    // until it passes (the second answer comes without a request).
    match rs.fetch_repo(&format!("{base}/limited")).await {
        Err(FetchError::RateLimited {
            retry_in, asked, ..
        }) => {
            assert_eq!(retry_in, Duration::from_secs(2));
            assert!(asked);
        }
        other => panic!("{other:?}"),
    }
    match rs.fetch_repo(&format!("{base}/ok")).await {
        Err(FetchError::RateLimited {
            retry_in, asked, ..
        }) => {
            assert!(retry_in <= Duration::from_secs(2) && retry_in > Duration::ZERO);
            assert!(!asked);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_and_a_spooled_body() {
    let alice = fixture::account(1, "alice.test", 200);
    let base = host(alice.car.clone()).await;
    // No minimum rate: the trickle runs into the timeout instead.
    let rs = resyncer(ResyncConfig {
        timeout: Duration::from_millis(300),
        ..ResyncConfig::default()
    });
    match rs.fetch_repo(&format!("{base}/trickle")).await {
        Err(FetchError::Timeout { after, .. }) => assert_eq!(after, Duration::from_millis(300)),
        other => panic!("{other:?}"),
    }
    let rs = resyncer(ResyncConfig {
        spool_above: 1024,
        ..ResyncConfig::default()
    });
    let got = rs.fetch_repo(&format!("{base}/ok")).await.unwrap();
    assert!(alice.car.len() > 1024);
    assert!(got.is_spooled());
    assert_eq!(&got[..], &alice.car[..]);
    let rs = resyncer(ResyncConfig {
        max_repo_bytes: 1024,
        ..ResyncConfig::default()
    });
    assert!(matches!(
        rs.fetch_repo(&format!("{base}/ok")).await,
        Err(FetchError::TooLarge { limit: 1024, .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_window_is_waited_out_before_asking_again() {
    let alice = fixture::account(1, "alice.test", 20);
    let base = host(alice.car.clone()).await;
    let rs = resyncer(ResyncConfig::default());
    let got = rs.fetch_repo(&format!("{base}/last")).await.unwrap();
    assert_eq!(&got[..], &alice.car[..]);
    match rs.fetch_repo(&format!("{base}/ok")).await {
        Err(FetchError::RateLimited {
            retry_in, asked, ..
        }) => {
            assert!(!asked, "not asked: the window was spent");
            assert!(retry_in > Duration::from_secs(1) && retry_in <= Duration::from_secs(2));
        }
        other => panic!("{other:?}"),
    }
}
