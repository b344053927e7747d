//! Segment file names: `seg_` + the index in 10 lowercase base-36 digits + `.jss`.
//!
//! Why a module: the name is on the wire (`planSnapshot`, `listSegments`, `getSegment`'s `name`,
//! `getBlock`'s `segment`) and on disk (`DIR/segments/`), and it must be exactly Jetstream's
//! (`internal/ingest/filename.go`): a client passes back the name it was given, and a server must
//! refuse every other spelling of the same index (upper case, fewer digits) rather than serve it.

const PREFIX: &str = "seg_";
const SUFFIX: &str = ".jss";
const DIGITS: usize = 10;

/// The file name of segment `index` (`seg_000000002a.jss` for 82). An index of 36^10 or more
/// has more digits, as Jetstream's `SegmentFilename` gives it.
pub fn segment_name(index: u64) -> String {
    let mut digits = Vec::new();
    let mut n = index;
    loop {
        digits.push(b"0123456789abcdefghijklmnopqrstuvwxyz"[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    while digits.len() < DIGITS {
        digits.push(b'0');
    }
    digits.reverse();
    let mut s = String::with_capacity(PREFIX.len() + digits.len() + SUFFIX.len());
    s.push_str(PREFIX);
    s.extend(digits.iter().map(|&d| d as char));
    s.push_str(SUFFIX);
    s
}

/// The index a segment name stands for, if it is exactly [`segment_name`] of it.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let mid = name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX)?;
    if mid.len() != DIGITS {
        return None;
    }
    let index = u64::from_str_radix(mid, 36).ok()?;
    (segment_name(index) == name).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_jetstreams() {
        // The lexicon's example name, `seg_000000002a.jss`, is segment 2×36 + 10.
        assert_eq!(segment_name(82), "seg_000000002a.jss");
        assert_eq!(segment_name(0), "seg_0000000000.jss");
        assert_eq!(parse_segment_name("seg_000000002a.jss"), Some(82));
        assert_eq!(segment_name(36u64.pow(10) - 1), "seg_zzzzzzzzzz.jss");
        for bad in [
            "seg_000000002A.jss",
            "seg_00000002a.jss",
            "seg_000000002a.jsx",
            "seg_+00000002a.jss",
            "../seg_000000002a.jss",
            "",
        ] {
            assert_eq!(parse_segment_name(bad), None, "{bad}");
        }
    }
}
