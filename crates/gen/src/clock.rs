//! The generator's clock: a fixed epoch plus seed-driven steps, never the wall clock, so the
//! same arguments always give the same bytes. Formats atproto datetimes and TIDs from it.

use riptide_syntax::{days_from_civil, format_utc, Precision, Tid};

/// The stream's start: 2026-07-04T14:00:00Z, in microseconds since the Unix epoch.
pub const EPOCH_MICROS: u64 = (days_from_civil(2026, 7, 4) as u64 * 86_400 + 14 * 3600) * 1_000_000;

/// `2026-07-04T14:38:07.517Z`: millisecond precision, as the relay and the apps write it.
pub fn datetime(micros: u64) -> String {
    format_utc(micros, Precision::Millis)
}

/// The TID for this instant and clock id.
pub fn tid(micros: u64, clock_id: u16) -> String {
    Tid::from_parts(micros, clock_id).into_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_the_epoch() {
        assert_eq!(datetime(EPOCH_MICROS), "2026-07-04T14:00:00.000Z");
        assert_eq!(datetime(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(datetime(951_782_400_123_000), "2000-02-29T00:00:00.123Z");
        assert!(riptide_syntax::is_valid_tid(&tid(EPOCH_MICROS, 7)));
        assert!(tid(EPOCH_MICROS, 7) < tid(EPOCH_MICROS + 1, 0));
    }
}
