//! The relay's event log: the last `window` events with the seqs the relay assigned.
//!
//! Concurrency: one `std::sync::Mutex` held only to append or to clone a few `Bytes` handles
//! (reference-count bumps, no frame copies); a `watch` channel tells subscribers the newest seq.

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::watch;

use crate::frames::SeqSlot;

#[derive(Debug)]
struct Inner {
    events: VecDeque<Bytes>,
    /// Seq of `events[0]` (meaningless while empty).
    first: u64,
    /// The next seq to assign.
    next: u64,
}

/// Where a subscriber stands relative to the log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Read {
    /// Events after the position, with the seq of the last one.
    Events(Vec<Bytes>, u64),
    /// Nothing newer yet.
    UpToDate,
    /// The position fell out of the window: oldest seq kept.
    Behind(u64),
}

#[derive(Debug)]
pub(crate) struct Log {
    inner: Mutex<Inner>,
    window: usize,
    head: watch::Sender<u64>,
}

impl Log {
    pub(crate) fn new(first_seq: u64, window: usize) -> Log {
        let first_seq = first_seq.max(1);
        let (head, _) = watch::channel(first_seq - 1);
        Log {
            inner: Mutex::new(Inner {
                events: VecDeque::new(),
                first: first_seq,
                next: first_seq,
            }),
            window: window.max(1),
            head,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock is our own bug; the data (a queue of handles) stays
        // consistent at every step, so keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends a frame, assigning it the next seq (frames without a seq slot are served as they
    /// are but still take a position). Returns the seq.
    pub(crate) fn append(&self, slot: &SeqSlot, frame: &Bytes) -> u64 {
        let mut g = self.lock();
        let seq = g.next;
        let bytes = slot.splice(frame, seq);
        g.events.push_back(bytes);
        g.next += 1;
        if g.events.len() > self.window {
            g.events.pop_front();
            g.first += 1;
        }
        drop(g);
        self.head.send_replace(seq);
        seq
    }

    /// The newest seq assigned (first_seq - 1 when none).
    pub(crate) fn head(&self) -> u64 {
        self.lock().next - 1
    }

    /// The oldest seq kept, or the next to be assigned when the log is empty.
    pub(crate) fn oldest(&self) -> u64 {
        self.lock().first
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.head.subscribe()
    }

    /// Up to `max` events with seq > `pos`.
    pub(crate) fn read_after(&self, pos: u64, max: usize) -> Read {
        let g = self.lock();
        if pos + 1 >= g.next {
            return Read::UpToDate;
        }
        if pos + 1 < g.first {
            return Read::Behind(g.first);
        }
        let start = (pos + 1 - g.first) as usize;
        let end = (start + max).min(g.events.len());
        let out: Vec<Bytes> = g.events.range(start..end).cloned().collect();
        let last = pos + out.len() as u64;
        Read::Events(out, last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_bounds_the_log_and_reads_are_after_the_position() {
        let log = Log::new(1, 3);
        let slot = SeqSlot::find(
            &mut crate::frames::scan_decoder(),
            0,
            &crate::info_frame("x", "y"),
        )
        .unwrap();
        for _ in 0..5 {
            log.append(&slot, &Bytes::from_static(b"f"));
        }
        assert_eq!((log.oldest(), log.head()), (3, 5));
        assert_eq!(log.read_after(1, 10), Read::Behind(3));
        assert!(matches!(log.read_after(2, 10), Read::Events(ref v, 5) if v.len() == 3));
        assert!(matches!(log.read_after(3, 1), Read::Events(ref v, 4) if v.len() == 1));
        assert_eq!(log.read_after(5, 10), Read::UpToDate);
    }
}
