//! Counters a consumer can read while the stream runs (from any thread: plain atomics).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use riptide_firehose::verify::Verdict;

/// Live counters of one client.
#[derive(Debug, Default)]
pub struct ClientStats {
    messages: AtomicU64,
    bytes: AtomicU64,
    connects: AtomicU64,
    reconnects: AtomicU64,
    connect_failures: AtomicU64,
    decode_errors: AtomicU64,
    oversized: AtomicU64,
    text_messages: AtomicU64,
    connected: AtomicU64,
    last_error: std::sync::Mutex<Option<String>>,
    verdicts: [AtomicU64; Verdict::COUNT],
}

/// A copy of the counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Data messages received (binary or text).
    pub messages: u64,
    /// Bytes of those messages, as received (compressed, for compressed Jetstream).
    pub bytes: u64,
    /// Successful connections.
    pub connects: u64,
    /// Connections after the first (each follows a disconnect).
    pub reconnects: u64,
    /// Connection attempts that failed (refused, timed out, non-101 answer).
    pub connect_failures: u64,
    /// Messages that did not decode (delivered as such or skipped, always counted here).
    pub decode_errors: u64,
    /// Messages over [`ClientConfig::max_message_bytes`](crate::ClientConfig::max_message_bytes),
    /// refused unread and skipped (also in `decode_errors`).
    pub oversized: u64,
    /// Text messages on a binary stream (the relay firehose), skipped (also in `decode_errors`).
    pub text_messages: u64,
    /// Whether a connection is up now.
    pub connected: bool,
    /// Verdicts recorded by the caller with [`ClientStats::record_verdict`], in
    /// [`Verdict::ALL`] order.
    pub verdicts: [u64; Verdict::COUNT],
}

impl ClientStats {
    /// Records the verdict of a frame the caller verified.
    pub fn record_verdict(&self, v: Verdict) {
        if let Some(i) = Verdict::ALL.iter().position(|x| *x == v) {
            self.verdicts[i].fetch_add(1, Relaxed);
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        let mut verdicts = [0; Verdict::COUNT];
        for (o, a) in verdicts.iter_mut().zip(&self.verdicts) {
            *o = a.load(Relaxed);
        }
        StatsSnapshot {
            messages: self.messages.load(Relaxed),
            bytes: self.bytes.load(Relaxed),
            connects: self.connects.load(Relaxed),
            reconnects: self.reconnects.load(Relaxed),
            connect_failures: self.connect_failures.load(Relaxed),
            decode_errors: self.decode_errors.load(Relaxed),
            oversized: self.oversized.load(Relaxed),
            text_messages: self.text_messages.load(Relaxed),
            connected: self.connected.load(Relaxed) > 0,
            verdicts,
        }
    }

    /// What went wrong last (a failed connect or a connection that ended), with its host; `None`
    /// while the current connection has had no trouble.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().map(|e| e.clone()).unwrap_or(None)
    }

    pub(crate) fn set_error(&self, e: Option<String>) {
        if let Ok(mut g) = self.last_error.lock() {
            *g = e;
        }
    }

    /// Connections made so far.
    pub fn connects(&self) -> u64 {
        self.connects.load(Relaxed)
    }

    pub(crate) fn set_connected(&self, up: bool) {
        self.connected.store(up as u64, Relaxed);
    }

    pub(crate) fn oversized(&self) {
        self.oversized.fetch_add(1, Relaxed);
        self.decode_error();
    }

    pub(crate) fn text_message(&self) {
        self.text_messages.fetch_add(1, Relaxed);
        self.decode_error();
    }

    pub(crate) fn message(&self, len: usize) {
        self.messages.fetch_add(1, Relaxed);
        self.bytes.fetch_add(len as u64, Relaxed);
    }

    /// A connection is up; every one after the first is a reconnect (one `ClientStats` per
    /// session, so its own count says whether this is the first).
    pub(crate) fn connected(&self) {
        if self.connects.fetch_add(1, Relaxed) > 0 {
            self.reconnects.fetch_add(1, Relaxed);
        }
    }

    pub(crate) fn connect_failure(&self) {
        self.connect_failures.fetch_add(1, Relaxed);
    }

    pub(crate) fn decode_error(&self) {
        self.decode_errors.fetch_add(1, Relaxed);
    }
}
