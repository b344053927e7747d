//! Output helpers shared by subcommands: a locked, buffered stdout and broken-pipe detection.

use std::io::{self, BufWriter, Write};

/// Buffered, locked stdout.
pub fn stdout() -> BufWriter<io::StdoutLock<'static>> {
    BufWriter::with_capacity(1 << 16, io::stdout().lock())
}

/// Whether an error is a closed pipe on stdout (e.g. `riptide … | head`), which is not a failure.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

/// Writes one line.
pub fn line(w: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
    w.write_all(bytes)?;
    w.write_all(b"\n")
}

/// A duration in milliseconds with microsecond resolution, as the `timings_ms` JSON fields
/// (`repo verify`, `verify-handle`) report it.
pub fn ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}
