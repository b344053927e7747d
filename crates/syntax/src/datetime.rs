//! Lexicon `datetime` strings: timestamps such as a record's `createdAt` and
//! every firehose event's `time`.
//!
//! The format is the intersection of RFC 3339 and ISO 8601 described in
//! <https://atproto.com/specs/lexicon#datetime>:
//! `YYYY-MM-DDTHH:MM:SS[.fraction](Z|+HH:MM|-HH:MM)`, with an upper-case `T`
//! and `Z`, a mandatory timezone, no `-00:00`, whole seconds required and any
//! number of fraction digits. The spec also calls a string invalid if its
//! fields are out of range: month or day `00`, a day past the end of its month
//! (leap years included), hour over 23, minute or second over 59 (no leap
//! seconds). Like both reference implementations, input over 64 bytes is
//! rejected.
//!
//! [`is_valid_datetime`] is exactly that syntax check. The [`Datetime`] type
//! additionally requires that the instant, once the offset is applied, lies in
//! years 0000..=9999 UTC ("datetimes before year zero are specifically
//! disallowed"), so [`Datetime::timestamp_micros`] is always meaningful. The
//! spec itself lists `0000-01-01T00:00:00+23:59` as valid syntax with the
//! warning that it does not normalise to a valid datetime: it passes
//! `is_valid_datetime` and fails `Datetime::parse`.

use crate::{Format, SyntaxError, SyntaxErrorKind};

const MAX_DATETIME_LEN: usize = 64;

/// Returns whether `s` is a valid Lexicon `datetime` string.
pub fn is_valid_datetime(s: &str) -> bool {
    parse_parts(s).is_ok()
}

/// The fields of a datetime string. `micros` keeps the first six fraction
/// digits; `offset_secs` is signed (local time = UTC + offset).
#[derive(Debug, Clone, Copy)]
struct Parts {
    year: i64,
    month: i64,
    day: i64,
    hour: i64,
    minute: i64,
    second: i64,
    micros: i64,
    offset_secs: i64,
}

/// Reads `n` ASCII digits at `at`.
fn digits(b: &[u8], at: usize, n: usize) -> Result<i64, SyntaxErrorKind> {
    let mut v = 0;
    for i in at..at + n {
        match b.get(i) {
            Some(c) if c.is_ascii_digit() => v = v * 10 + i64::from(c - b'0'),
            _ => return Err(SyntaxErrorKind::BadCharacter { index: i }),
        }
    }
    Ok(v)
}

/// Requires byte `c` at `at`.
fn byte(b: &[u8], at: usize, c: u8) -> Result<(), SyntaxErrorKind> {
    if b.get(at) == Some(&c) {
        Ok(())
    } else {
        Err(SyntaxErrorKind::BadCharacter { index: at })
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

fn parse_parts(s: &str) -> Result<Parts, SyntaxErrorKind> {
    let b = s.as_bytes();
    if b.is_empty() {
        return Err(SyntaxErrorKind::Empty);
    }
    if b.len() > MAX_DATETIME_LEN {
        return Err(SyntaxErrorKind::TooLong {
            max: MAX_DATETIME_LEN,
        });
    }
    let year = digits(b, 0, 4)?;
    byte(b, 4, b'-')?;
    let month = digits(b, 5, 2)?;
    byte(b, 7, b'-')?;
    let day = digits(b, 8, 2)?;
    byte(b, 10, b'T')?;
    let hour = digits(b, 11, 2)?;
    byte(b, 13, b':')?;
    let minute = digits(b, 14, 2)?;
    byte(b, 16, b':')?;
    let second = digits(b, 17, 2)?;

    let mut i = 19;
    let mut micros = 0;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        while let Some(c) = b.get(i).filter(|c| c.is_ascii_digit()) {
            if i - start < 6 {
                micros = micros * 10 + i64::from(c - b'0');
            }
            i += 1;
        }
        if i == start {
            return Err(SyntaxErrorKind::BadCharacter { index: i });
        }
        for _ in (i - start)..6 {
            micros *= 10;
        }
    }

    let offset_secs = match b.get(i) {
        Some(b'Z') => {
            i += 1;
            0
        }
        Some(&sign @ (b'+' | b'-')) => {
            let oh = digits(b, i + 1, 2)?;
            byte(b, i + 3, b':')?;
            let om = digits(b, i + 4, 2)?;
            if oh > 23 || om > 59 {
                return Err(SyntaxErrorKind::OutOfRange);
            }
            if sign == b'-' && oh == 0 && om == 0 {
                // "-00:00" is RFC 3339's "unknown offset", not ISO 8601.
                return Err(SyntaxErrorKind::BadCharacter { index: i });
            }
            let secs = oh * 3600 + om * 60;
            i += 6;
            if sign == b'-' {
                -secs
            } else {
                secs
            }
        }
        _ => return Err(SyntaxErrorKind::BadCharacter { index: i }),
    };
    if i != b.len() {
        return Err(SyntaxErrorKind::BadCharacter { index: i });
    }

    let in_range = (1..=12).contains(&month)
        && (1..=days_in_month(year, month)).contains(&day)
        && hour <= 23
        && minute <= 59
        && second <= 59;
    if !in_range {
        return Err(SyntaxErrorKind::OutOfRange);
    }
    Ok(Parts {
        year,
        month,
        day,
        hour,
        minute,
        second,
        micros,
        offset_secs,
    })
}

/// Days from 1970-01-01 to the given proleptic Gregorian date
/// (H. Hinnant's `days_from_civil`).
pub const fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The proleptic Gregorian date (year, month, day) of a day count since 1970-01-01: the inverse
/// of [`days_from_civil`] (H. Hinnant's `civil_from_days`).
pub const fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
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

/// How many fractional-second digits [`format_utc`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// `2026-07-04T14:38:07Z`
    Seconds,
    /// `2026-07-04T14:38:07.517Z`, as the relay and the apps write `createdAt` and `time`.
    Millis,
}

/// An instant (microseconds since the Unix epoch) as an atproto datetime in UTC (`Z`).
pub fn format_utc(micros: u64, precision: Precision) -> String {
    let secs = micros / 1_000_000;
    let (y, mo, d) = civil_from_days((secs / 86_400) as i64);
    let s = secs % 86_400;
    let (h, mi, se) = (s / 3600, (s / 60) % 60, s % 60);
    match precision {
        Precision::Seconds => format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{se:02}Z"),
        Precision::Millis => {
            let ms = (micros / 1000) % 1000;
            format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{se:02}.{ms:03}Z")
        }
    }
}

impl Parts {
    /// Whole seconds since the Unix epoch, in UTC.
    fn utc_seconds(&self) -> i64 {
        days_from_civil(self.year, self.month, self.day) * 86_400
            + self.hour * 3600
            + self.minute * 60
            + self.second
            - self.offset_secs
    }
}

/// A valid Lexicon datetime whose UTC instant lies in years 0000..=9999,
/// e.g. `1985-04-12T23:20:50.123Z`. The original string is kept verbatim
/// (no normalisation), so records round-trip byte for byte. Deliberately not
/// `Ord`: string order is not time order across offsets; compare
/// [`Datetime::timestamp_micros`] instead.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Datetime(String);

crate::string_type!(Datetime);

impl Datetime {
    fn check(s: &str) -> Result<(), SyntaxError> {
        let err = |k| SyntaxError::new(Format::Datetime, k);
        let secs = parse_parts(s).map_err(err)?.utc_seconds();
        let min = days_from_civil(0, 1, 1) * 86_400;
        let end = days_from_civil(10_000, 1, 1) * 86_400;
        if (min..end).contains(&secs) {
            Ok(())
        } else {
            Err(err(SyntaxErrorKind::OutOfRange))
        }
    }

    fn from_checked(s: String) -> Self {
        Datetime(s)
    }

    /// Microseconds since the Unix epoch (negative before 1970). Fraction
    /// digits past the sixth are truncated.
    pub fn timestamp_micros(&self) -> i64 {
        // Validated at construction, so this cannot fail.
        parse_parts(&self.0).map_or(0, |p| p.utc_seconds() * 1_000_000 + p.micros)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn micros(s: &str) -> i64 {
        Datetime::parse(s).expect("valid").timestamp_micros()
    }

    #[test]
    fn timestamps() {
        assert_eq!(micros("1970-01-01T00:00:00Z"), 0);
        assert_eq!(micros("1970-01-01T00:00:00.000001Z"), 1);
        assert_eq!(micros("1970-01-01T01:00:00+01:00"), 0);
        assert_eq!(micros("1969-12-31T19:00:00-05:00"), 0);
        assert_eq!(micros("1985-04-12T23:20:50.1234567Z"), 482_196_050_123_456);
        assert_eq!(micros("2000-03-01T00:00:00Z"), 951_868_800_000_000);
        assert_eq!(micros("0000-01-01T00:00:00Z"), -62_167_219_200_000_000);
    }

    #[test]
    fn formatting_is_the_parsers_inverse() {
        assert_eq!(format_utc(0, Precision::Seconds), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_utc(951_782_400_123_999, Precision::Millis),
            "2000-02-29T00:00:00.123Z"
        );
        // Every day of four centuries (leap rules included), at an odd time of day: the
        // formatted string parses back (an independent path through the parser's own checks) to
        // the same instant, truncated to the millisecond.
        for day in (0..146_097 * 2).step_by(7) {
            let t = (day * 86_400 + 45_296) * 1_000_000 + 789_123;
            let t = t as u64;
            for p in [Precision::Seconds, Precision::Millis] {
                let s = format_utc(t, p);
                let unit = if p == Precision::Seconds {
                    1_000_000
                } else {
                    1000
                };
                assert_eq!(micros(&s) as u64, t / unit * unit, "{s}");
            }
            assert_eq!(days_from_civil_of(civil_from_days(day)), day);
        }
    }

    fn days_from_civil_of((y, m, d): (i64, u32, u32)) -> i64 {
        days_from_civil(y, i64::from(m), i64::from(d))
    }

    #[test]
    fn calendar() {
        assert!(is_valid_datetime("2000-02-29T00:00:00Z"));
        assert!(is_valid_datetime("2024-02-29T00:00:00Z"));
        assert!(!is_valid_datetime("1900-02-29T00:00:00Z"));
        assert!(!is_valid_datetime("2023-02-29T00:00:00Z"));
        assert!(!is_valid_datetime("2023-04-31T00:00:00Z"));
        assert!(!is_valid_datetime("2023-04-30T00:00:60Z"));
        assert!(!is_valid_datetime("2023-04-30T00:00:00+24:00"));
        assert!(!is_valid_datetime("2023-04-30T00:00:00-00:00"));
        assert!(is_valid_datetime("2023-04-30T00:00:00+00:00"));
    }

    #[test]
    fn instant_range() {
        // Valid syntax per the spec's own examples, but they normalise
        // outside years 0000..=9999.
        for s in ["0000-01-01T00:00:00+23:59", "9999-12-31T23:59:59.999-23:59"] {
            assert!(is_valid_datetime(s), "{s}");
            let e = Datetime::parse(s).expect_err(s);
            assert_eq!(e.kind(), SyntaxErrorKind::OutOfRange);
        }
        assert!(Datetime::parse("0000-01-01T00:00:00-01:00").is_ok());
        assert!(Datetime::parse("9999-12-31T23:59:59.999999Z").is_ok());
    }

    #[test]
    fn reasons() {
        let kind = |s| parse_parts(s).err();
        assert_eq!(kind(""), Some(SyntaxErrorKind::Empty));
        assert_eq!(
            kind("1985-04-12T23:20:50.Z"),
            Some(SyntaxErrorKind::BadCharacter { index: 20 })
        );
        assert_eq!(
            kind("1985-04-12T23:20:50"),
            Some(SyntaxErrorKind::BadCharacter { index: 19 })
        );
        assert_eq!(
            kind("1985-04-12T23:20:50Zx"),
            Some(SyntaxErrorKind::BadCharacter { index: 20 })
        );
        assert_eq!(
            kind("1985-13-12T23:20:50Z"),
            Some(SyntaxErrorKind::OutOfRange)
        );
        let long = format!("1985-04-12T23:20:50.{}Z", "1".repeat(44));
        assert_eq!(kind(&long), Some(SyntaxErrorKind::TooLong { max: 64 }));
        let max = format!("1985-04-12T23:20:50.{}Z", "1".repeat(43));
        assert!(max.len() == 64 && is_valid_datetime(&max));
    }
}
