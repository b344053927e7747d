//! The relay serving the real capture on loopback: seqs, verification after seq rewriting, cursor
//! semantics, looping and shutdown.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use riptide_crypto::PublicKey;
use riptide_firehose::corpus::split_frames;
use riptide_firehose::verify::{peek, KeyLookup, KeyUnavailable, Verdict, Verifier};
use riptide_firehose::{Body, FrameDecoder};
use riptide_identity::DidDocs;
use riptide_relay::{Relay, RelayConfig, RelayHandle};
use tokio_tungstenite::tungstenite::Message;

const T: Duration = Duration::from_secs(30);

fn capture() -> Option<(Vec<Bytes>, DidDocs)> {
    let file = riptide_testdata::read("jetstream-2026-07/firehose-frames.bin")?;
    let docs =
        DidDocs::from_slice(&riptide_testdata::read("jetstream-2026-07/did_docs.json")?).unwrap();
    let frames = split_frames(&file)
        .unwrap()
        .iter()
        .map(|f| Bytes::copy_from_slice(f.bytes))
        .collect();
    Some((frames, docs))
}

struct Keys<'a>(&'a DidDocs);
impl KeyLookup for Keys<'_> {
    fn key(&self, did: &str) -> Result<PublicKey, KeyUnavailable> {
        self.0.signing_key(did).map_err(|_| KeyUnavailable::Unknown)
    }
}

async fn start(frames: Vec<Bytes>, cfg: RelayConfig) -> RelayHandle {
    let (_, relay) = Relay::bind("127.0.0.1:0".parse().unwrap(), frames, cfg)
        .await
        .unwrap();
    relay
}

/// Reads `n` binary messages from `url`.
async fn read(url: &str, n: usize) -> Vec<Bytes> {
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(T, ws.next())
            .await
            .expect("timed out")
            .expect("stream ended")
            .unwrap()
        {
            Message::Binary(b) => out.push(b),
            Message::Close(_) => break,
            _ => {}
        }
    }
    out
}

fn seqs(frames: &[Bytes]) -> Vec<Option<i64>> {
    let mut arena = riptide_cbor::Arena::new();
    frames.iter().map(|f| peek(&mut arena, f).seq).collect()
}

fn notice(frame: &[u8]) -> (String, String) {
    let mut d = FrameDecoder::new();
    match *d.decode(frame).unwrap().body() {
        Body::Info(i) => ("info".into(), i.name.into()),
        Body::Error(e) => ("error".into(), e.error.into()),
        other => panic!("not a notice: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_the_capture_with_new_seqs_and_every_frame_still_verifies() {
    let Some((frames, docs)) = capture() else {
        return;
    };
    let relay = start(frames.clone(), RelayConfig::default()).await;
    relay.wait_for_head(150).await;
    let got = read(&format!("{}?cursor=0", relay.url()), 150).await;
    assert_eq!(seqs(&got), (1..=150).map(Some).collect::<Vec<_>>());
    let mut v = Verifier::new(Keys(&docs));
    for (i, f) in got.iter().enumerate() {
        assert_eq!(v.verify(f), Verdict::Ok, "frame {i}");
        // Only the seq changed: the original seqs are 11 digits (9-byte ints), the new ones short.
        assert!(f.len() < frames[i].len() && frames[i].len() - f.len() <= 8);
    }
    assert_eq!(v.counts().get(Verdict::Ok), 150);
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_from_the_middle_replays_exactly_the_rest() {
    let Some((frames, _)) = capture() else { return };
    let relay = start(frames, RelayConfig::default()).await;
    relay.wait_for_head(150).await;
    let got = read(&format!("{}?cursor=100", relay.url()), 50).await;
    assert_eq!(seqs(&got), (101..=150).map(Some).collect::<Vec<_>>());
    // Nothing more arrives: the next message would be a ping or nothing.
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_cursor_gets_an_error_frame_and_old_cursor_an_outdated_info() {
    let Some((frames, _)) = capture() else { return };
    let relay = start(
        frames,
        RelayConfig {
            window: 50,
            ..RelayConfig::default()
        },
    )
    .await;
    relay.wait_for_head(150).await;
    let got = read(&format!("{}?cursor=151", relay.url()), 2).await;
    assert_eq!(got.len(), 1, "error frame, then close");
    assert_eq!(notice(&got[0]), ("error".into(), "FutureCursor".into()));

    let got = read(&format!("{}?cursor=10", relay.url()), 51).await;
    assert_eq!(notice(&got[0]), ("info".into(), "OutdatedCursor".into()));
    assert_eq!(seqs(&got[1..]), (101..=150).map(Some).collect::<Vec<_>>());
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_subscribers_get_new_events_and_looping_keeps_seqs_increasing() {
    let Some((frames, _)) = capture() else { return };
    let cfg = RelayConfig {
        rate: Some(2000.0),
        looped: true,
        window: 1000,
        ..RelayConfig::default()
    };
    let relay = start(frames.clone(), cfg).await;
    let url = relay.url();
    // Three live subscribers, each sees 200 consecutive seqs.
    let subs: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn({
                let url = url.clone();
                async move { read(&url, 200).await }
            })
        })
        .collect();
    for s in subs {
        let got = seqs(&s.await.unwrap());
        let first = got[0].unwrap();
        assert_eq!(got, (first..first + 200).map(Some).collect::<Vec<_>>());
    }
    relay.wait_for_head(301).await;
    let got = read(&format!("{}?cursor=0", relay.url()), 301).await;
    // Seq 151 is frame 0 again, with its new seq.
    let mut d = FrameDecoder::new();
    let again = d.decode(&got[150]).unwrap().body().seq();
    assert_eq!(again, Some(151));
    let mut d0 = FrameDecoder::new();
    assert_eq!(
        d0.decode(&got[0]).unwrap().body().did(),
        d.decode(&got[150]).unwrap().body().did()
    );
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_subscribers_with_1001() {
    let Some((frames, _)) = capture() else { return };
    let relay = start(frames, RelayConfig::default()).await;
    let (mut ws, _) = tokio_tungstenite::connect_async(relay.url()).await.unwrap();
    let stop = tokio::spawn(relay.shutdown());
    let code = loop {
        match tokio::time::timeout(T, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(Some(f)))) => break u16::from(f.code),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(code, 1001);
    drop(ws);
    tokio::time::timeout(T, stop).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_upgrades_get_the_status_and_other_paths_404() {
    let Some((frames, _)) = capture() else { return };
    let mut cfg = RelayConfig::default();
    cfg.faults.reject_upgrades = 2;
    cfg.faults.reject_status = 502;
    let relay = start(frames, cfg).await;
    for _ in 0..2 {
        match tokio_tungstenite::connect_async(relay.url()).await {
            Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
                assert_eq!(r.status().as_u16(), 502)
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(tokio_tungstenite::connect_async(relay.url()).await.is_ok());
    match tokio_tungstenite::connect_async(format!("ws://{}/nope", relay.addr())).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 404),
        other => panic!("{other:?}"),
    }
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_without_a_seq_to_renumber_are_left_out_and_counted() {
    let Some((mut frames, _)) = capture() else {
        return;
    };
    // A truncated frame (its payload never reaches `seq`) and one that is not CBOR at all.
    let cut = frames[3].slice(..frames[3].len() / 3);
    frames.insert(3, cut);
    frames.insert(10, Bytes::from_static(b"\xff\xff"));
    let relay = start(frames, RelayConfig::default()).await;
    assert_eq!(
        relay
            .stats()
            .unservable
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
    assert_eq!(relay.left_out(), [3, 10]);
    relay.wait_for_head(150).await;
    assert_eq!(relay.head(), 150);
    let got = read(&format!("{}?cursor=0", relay.url()), 150).await;
    assert_eq!(seqs(&got), (1..=150).map(Some).collect::<Vec<_>>());
    relay.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verbatim_serves_every_frame_as_it_is() {
    let Some((mut frames, _)) = capture() else {
        return;
    };
    // What the default mode leaves out or renumbers is sent byte for byte.
    let cut = frames[3].slice(..frames[3].len() / 3);
    frames.insert(3, cut);
    frames.insert(10, Bytes::from_static(b"\xff\xff"));
    frames.insert(11, Bytes::new());
    let n = frames.len();
    let cfg = RelayConfig {
        faults: riptide_relay::Faults {
            verbatim: true,
            ..Default::default()
        },
        ..RelayConfig::default()
    };
    let relay = start(frames.clone(), cfg).await;
    assert_eq!(
        relay
            .stats()
            .unservable
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    relay.wait_for_head(n as u64).await;
    let got = read(&format!("{}?cursor=0", relay.url()), n).await;
    assert_eq!(got, frames);
    relay.shutdown().await;
}
