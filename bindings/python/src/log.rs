//! The clients' log lines, carried to Python's `logging`.
//!
//! Why: `riptide-client` says what goes wrong with a connection through `tracing` (a failed
//! connect with its reason and the next retry, a reconnect, an undecodable message), and a Python
//! program has no `tracing` subscriber, so all of it was lost: an offline `Firehose` printed
//! nothing, ever (issue 39). Each client's threads get a [`Capture`] as their thread-local
//! subscriber, which keeps the INFO, WARN and ERROR events of that client only, as lines, until
//! Python takes them (`take_log`, after every batch) and logs them through the logger `riptide`,
//! where the rule "said once per kind, then counted" is applied (`_clients.py`), so that a
//! Python test can shorten its interval.
//!
//! Bounded: at most [`MAX_LINES`] lines wait for Python; beyond that they are counted, and the
//! count is handed over as a line of its own. The client's own warnings are few (a failed connect
//! is followed by a backoff; floods are throttled where they arise), so the bound is a guard.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Most lines kept for Python.
pub const MAX_LINES: usize = 256;

/// One line: its kind (the call site: the same statement is the same kind), Python's level
/// number (`logging.INFO` 20, `WARNING` 30, `ERROR` 40) and the text.
pub type Line = (&'static str, u8, String);

#[derive(Debug, Default)]
struct Lines {
    lines: VecDeque<Line>,
    dropped: u64,
}

/// A client's log lines (shared by its threads and its Python object).
#[derive(Clone, Debug, Default)]
pub struct LogLines(Arc<Mutex<Lines>>);

impl LogLines {
    /// Keeps a line (or counts it, past [`MAX_LINES`]).
    pub fn push(&self, kind: &'static str, level: u8, text: String) {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if g.lines.len() >= MAX_LINES {
            g.dropped += 1;
        } else {
            g.lines.push_back((kind, level, text));
        }
    }

    /// The lines kept since the last call, oldest first; lines that were not kept are counted in
    /// a last line.
    pub fn take(&self) -> Vec<Line> {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<Line> = g.lines.drain(..).collect();
        let dropped = std::mem::take(&mut g.dropped);
        if dropped > 0 {
            out.push((
                "riptide-python: dropped",
                30,
                format!("{dropped} more log lines were not kept (Python took none for a while)"),
            ));
        }
        out
    }

    /// A subscriber that keeps this client's events here, for
    /// [`tracing::subscriber::set_default`] on each of its threads.
    pub fn capture(&self) -> Capture {
        Capture(self.clone())
    }
}

/// The thread-local subscriber of a client's threads (module docs). Spans are ignored: the
/// client's events carry their context in their fields.
#[derive(Debug)]
pub struct Capture(LogLines);

impl Subscriber for Capture {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        *m.level() <= Level::INFO && m.is_event()
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let m = event.metadata();
        let level = match *m.level() {
            Level::ERROR => 40,
            Level::WARN => 30,
            _ => 20,
        };
        let mut text = Text::default();
        event.record(&mut text);
        self.0.push(m.name(), level, text.finish());
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// An event as one line: its message, then its other fields as `name=value`.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Text {
    fn finish(self) -> String {
        if self.fields.is_empty() {
            self.message
        } else {
            format!("{} ({})", self.message, self.fields.trim_start())
        }
    }
}

impl Visit for Text {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}
