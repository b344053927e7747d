//! The server's rare-but-repeatable complaints, said by the warning rule ([`riptide_throttle`]).
//!
//! Why a module: a few error paths are "never expected" one at a time but come in floods when
//! something is wrong for everyone at once — a damaged store block read by every replaying
//! subscriber, a zstd failure for every event, every account of a catch-up breaking its chain,
//! a segment file that fails under each download. One line per occurrence drowns the journal
//! (issue 39), so each such kind goes through one process-wide [`Throttle`]: the first
//! [`Throttle::FIRST`] in full, then at most one summary a [`Throttle::EVERY`] with exact
//! counts. The metrics named in each summary count every occurrence. The hot, per-frame paths
//! with throttles of their own (`upstream`'s garbage classes, `ingest`'s verdicts) keep them.

use std::sync::OnceLock;

use riptide_throttle::{Say, Throttle};

/// The one rule of this module's kinds, shared by every task and thread of the process.
fn throttle() -> &'static Throttle {
    static T: OnceLock<Throttle> = OnceLock::new();
    T.get_or_init(Throttle::default)
}

/// Says one occurrence of `kind`: `full` logs it in full (with its own level and fields), a
/// summary line says how many went unsaid and where they are counted (`counted_in`: the metric).
pub(crate) fn say(kind: &'static str, counted_in: &'static str, full: impl FnOnce()) {
    say_with(throttle(), kind, counted_in, full);
}

fn say_with(
    t: &Throttle,
    kind: &'static str,
    counted_in: &'static str,
    full: impl FnOnce(),
) -> Say {
    let say = t.say(kind);
    match say {
        Say::Full => full(),
        Say::Quiet => {}
        Say::Summary { suppressed, total } => tracing::warn!(
            kind,
            suppressed,
            total,
            "{kind}: {suppressed} more not said since the last line, {total} in all ({counted_in}; \
             said in full only the first {} times, then at most once every {} s)",
            Throttle::FIRST,
            Throttle::EVERY.as_secs(),
        ),
    }
    say
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_flood_is_said_a_few_times_in_full_then_in_summaries_per_kind() {
        let t = Throttle::new(3, Duration::from_millis(50));
        let mut full = [0u32; 2];
        let mut summaries = 0;
        for i in 0..10_000 {
            let (kind, n) = if i % 2 == 0 { ("a", 0) } else { ("b", 1) };
            if let Say::Summary { .. } = say_with(&t, kind, "m", || full[n] += 1) {
                summaries += 1;
            }
        }
        // Each kind in full exactly the rule's first 3 times; the rest of a burst quicker than
        // the interval is unsaid.
        assert_eq!(full, [3, 3]);
        assert_eq!(summaries, 0);
        std::thread::sleep(Duration::from_millis(60));
        assert!(matches!(
            say_with(&t, "a", "m", || full[0] += 1),
            Say::Summary {
                suppressed: 4_997,
                total: 5_001
            }
        ));
        assert_eq!(full, [3, 3]);
    }
}
