//! TIDs: timestamp identifiers, used as commit revisions and record keys.
//!
//! Every commit's `rev` is a TID, and relays compare revs to order commits, so
//! riptide needs both the syntax check and the numeric value. A TID
//! (<https://atproto.com/specs/tid>) is a 64-bit integer with the top bit 0,
//! then 53 bits of microseconds since the Unix epoch, then a 10-bit clock id,
//! written as 13 characters of the sortable base32 alphabet
//! `234567abcdefghijklmnopqrstuvwxyz`. Thirteen characters hold 65 bits, so
//! the syntax rule "the first character is one of `234567abcdefghij`" only
//! keeps the value within 64 bits; it does not enforce the zero top bit (that
//! would need `234567ab`). We follow the syntax rule as written, and
//! [`Tid::timestamp_micros`] reads only the 53 timestamp bits. Because the
//! encoding is fixed-width and the alphabet is in ASCII order, string order
//! equals numeric order equals time order.

use crate::{Format, SyntaxError, SyntaxErrorKind};

const TID_LEN: usize = 13;
const ALPHABET: &[u8; 32] = b"234567abcdefghijklmnopqrstuvwxyz";
const MICROS_MASK: u64 = (1 << 53) - 1;
const CLOCK_ID_MASK: u16 = (1 << 10) - 1;

/// Returns whether `s` is a syntactically valid TID.
pub fn is_valid_tid(s: &str) -> bool {
    validate(s).is_ok()
}

/// The 64-bit integer a TID string encodes, or `None` if `s` is not a TID. No allocation: for
/// comparing revisions and reading their clocks on the hot path (chain state keeps revs as this
/// integer).
pub fn tid_value(s: &str) -> Option<u64> {
    decode(s).ok()
}

/// The base32-sortable value of `c`, if it is in the alphabet.
fn digit(c: u8) -> Option<u64> {
    match c {
        b'2'..=b'7' => Some(u64::from(c - b'2')),
        b'a'..=b'z' => Some(u64::from(c - b'a') + 6),
        _ => None,
    }
}

/// Decodes a TID to its integer, or says why it is not one.
fn decode(s: &str) -> Result<u64, SyntaxErrorKind> {
    let b = s.as_bytes();
    if b.len() != TID_LEN {
        return Err(SyntaxErrorKind::WrongLength { expected: TID_LEN });
    }
    let mut v: u64 = 0;
    for (i, &c) in b.iter().enumerate() {
        let Some(d) = digit(c) else {
            return Err(SyntaxErrorKind::BadCharacter { index: i });
        };
        // 13 * 5 = 65 bits: the first digit's 16s place would be a 65th bit.
        if i == 0 && d >= 16 {
            return Err(SyntaxErrorKind::OutOfRange);
        }
        v = (v << 5) | d;
    }
    Ok(v)
}

pub(crate) fn validate(s: &str) -> Result<(), SyntaxErrorKind> {
    decode(s).map(|_| ())
}

/// A syntactically valid TID, e.g. `3jzfcijpj2z2a`. Ordered by time (then
/// clock id), which is also its string order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tid(String);

crate::string_type!(Tid);

impl Tid {
    fn check(s: &str) -> Result<(), SyntaxError> {
        validate(s).map_err(|k| SyntaxError::new(Format::Tid, k))
    }

    fn from_checked(s: String) -> Self {
        Tid(s)
    }

    /// Builds the TID for `micros` since the Unix epoch and `clock_id`. As in
    /// the reference implementation, `micros` is truncated to its low 53 bits
    /// and `clock_id` to its low 10 bits.
    pub fn from_parts(micros: u64, clock_id: u16) -> Self {
        Self::from_u64(((micros & MICROS_MASK) << 10) | u64::from(clock_id & CLOCK_ID_MASK))
    }

    /// Encodes any 64-bit integer (TIDs proper keep the top bit clear).
    pub fn from_u64(v: u64) -> Self {
        let mut v = v;
        let mut out = [0u8; TID_LEN];
        for slot in out.iter_mut().rev() {
            *slot = ALPHABET[(v & 31) as usize];
            v >>= 5;
        }
        Tid(out.iter().map(|&c| char::from(c)).collect())
    }

    /// The 64-bit integer this TID encodes.
    pub fn to_u64(&self) -> u64 {
        // Validated at construction, so decoding cannot fail.
        decode(&self.0).unwrap_or_default()
    }

    /// Microseconds since the Unix epoch: the 53 bits below the top bit.
    pub fn timestamp_micros(&self) -> u64 {
        (self.to_u64() >> 10) & MICROS_MASK
    }

    /// The 10-bit clock identifier.
    pub fn clock_id(&self) -> u16 {
        (self.to_u64() & u64::from(CLOCK_ID_MASK)) as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let micros = 1_700_000_000_123_456;
        let t = Tid::from_parts(micros, 513);
        let parsed = Tid::parse(t.as_str()).expect("from_parts output parses");
        assert_eq!(parsed, t);
        assert_eq!(parsed.timestamp_micros(), micros);
        assert_eq!(parsed.clock_id(), 513);
        assert_eq!(tid_value(t.as_str()), Some(t.to_u64()));
        assert_eq!(tid_value("3jzfcijpj2z2"), None);
        assert_eq!(tid_value("3jzfcijpj2z21"), None);
    }

    #[test]
    fn known_values() {
        assert_eq!(Tid::from_u64(0).as_str(), "2222222222222");
        assert_eq!(Tid::from_parts(0, 0).to_u64(), 0);
        let max = Tid::from_parts(u64::MAX, u16::MAX);
        assert_eq!(max.as_str(), "bzzzzzzzzzzzz");
        assert_eq!(max.timestamp_micros(), MICROS_MASK);
        assert_eq!(max.clock_id(), CLOCK_ID_MASK);
        assert!(is_valid_tid(max.as_str()));
        let t = Tid::parse("3jzfcijpj2z2a").expect("valid");
        assert_eq!(Tid::from_u64(t.to_u64()), t);
        // Valid syntax with the reserved top bit set: the bit is ignored.
        let t = Tid::parse("jzzzzzzzzzzzz").expect("valid syntax");
        assert_eq!(t.to_u64(), u64::MAX);
        assert_eq!(t.timestamp_micros(), MICROS_MASK);
        assert_eq!(Tid::from_u64(u64::MAX), t);
    }

    #[test]
    fn orders_by_time_then_clock() {
        let a = Tid::from_parts(1_000, 1023);
        let b = Tid::from_parts(1_001, 0);
        let c = Tid::from_parts(1_001, 1);
        assert!(a < b && b < c);
        assert!(
            Tid::parse("2222222222222").expect("valid")
                < Tid::parse("3zzzzzzzzzzzz").expect("valid")
        );
    }

    #[test]
    fn reasons() {
        let kind = |s| validate(s).err();
        assert_eq!(
            kind("222"),
            Some(SyntaxErrorKind::WrongLength { expected: 13 })
        );
        assert_eq!(
            kind("3jzfcijpj2z21"),
            Some(SyntaxErrorKind::BadCharacter { index: 12 })
        );
        assert_eq!(kind("kjzfcijpj2z2a"), Some(SyntaxErrorKind::OutOfRange));
        assert_eq!(
            kind("3JZFCIJPJ2Z2A"),
            Some(SyntaxErrorKind::BadCharacter { index: 1 })
        );
    }
}
