//! The generator's clock: a fixed epoch plus seed-driven steps, never the wall clock, so the
//! same arguments always give the same bytes. Formats atproto datetimes and TIDs from it.

use riptide_syntax::Tid;

/// The stream's start: 2026-07-04T14:00:00Z, in microseconds since the Unix epoch.
pub const EPOCH_MICROS: u64 = (days_from_civil(2026, 7, 4) * 86_400 + 14 * 3600) * 1_000_000;

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub const fn days_from_civil(y: i64, m: i64, d: i64) -> u64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) as u64
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `2026-07-04T14:38:07.517Z`: millisecond precision, as the relay and the apps write it.
pub fn datetime(micros: u64) -> String {
    let secs = micros / 1_000_000;
    let ms = (micros / 1000) % 1000;
    let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    format!(
        "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        s / 3600,
        (s / 60) % 60,
        s % 60
    )
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
