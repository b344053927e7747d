//! Runs the atproto interop syntax vectors (`interop/syntax/*.txt` in the
//! shared corpus) against every validator and type of this crate.
//!
//! The files are read in place, never copied. File format: one value per
//! line, exactly as written: leading and trailing spaces are part of the
//! value. Empty lines and lines starting with `#` are comments.
//!
//! The corpus is located by `riptide-testdata` (`RIPTIDE_CORPUS`, else
//! `../shared/corpus`): if it is missing the tests panic when `CI` is set and
//! otherwise print a note and pass.
//!
//! Where a vector contradicts the atproto spec, the spec wins; such vectors
//! are listed in [`SPEC_OVERRIDES`] with the reason, and the test asserts the
//! spec's outcome (and that the vector is still present, so the list cannot
//! go stale silently).

use std::path::PathBuf;

use riptide_syntax::*;

/// Vectors whose expected outcome is flipped because the spec says otherwise:
/// (file, vector, why).
const SPEC_OVERRIDES: &[(&str, &str, &str)] = &[(
    "nsid_syntax_valid.txt",
    "com.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.middle.foo",
    "atproto.com/specs/nsid: the domain authority is 'at most 253 characters (including \
     periods)'; here it is 283 (`com` + 40 x `.middle`). The vector only respects the \
     317-byte overall limit, which is all the TS and Go reference implementations check.",
)];

/// The syntax vectors directory, or `None` (after a note) when the corpus is absent outside CI
/// (the rule of `riptide-testdata`).
fn corpus_dir() -> Option<PathBuf> {
    riptide_testdata::corpus().map(|c| c.join("interop/syntax"))
}

/// The vectors of one file, in order.
fn vectors(dir: &std::path::Path, file: &str) -> Vec<String> {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.split('\n')
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Checks that `accept` returns `expect` for every vector in `file` (spec
/// overrides flip it), that at least `min` vectors were read, and reports
/// every failure at once.
fn check(file: &str, min: usize, expect: bool, accept: impl Fn(&str) -> bool) {
    let Some(dir) = corpus_dir() else { return };
    let vs = vectors(&dir, file);
    assert!(
        vs.len() >= min,
        "{file}: read {} vectors, expected at least {min}",
        vs.len()
    );
    let mut failures = Vec::new();
    for v in &vs {
        let overridden = SPEC_OVERRIDES.iter().any(|(f, o, _)| *f == file && o == v);
        let want = expect != overridden;
        if accept(v) != want {
            let verdict = if want {
                "should be accepted"
            } else {
                "should be rejected"
            };
            failures.push(format!("  {verdict}: {v:?}"));
        }
    }
    for (f, o, why) in SPEC_OVERRIDES.iter().filter(|(f, _, _)| *f == file) {
        assert!(
            vs.iter().any(|v| v == o),
            "{f}: overridden vector no longer present ({why})"
        );
    }
    assert!(failures.is_empty(), "{file}:\n{}", failures.join("\n"));
}

#[test]
fn did() {
    check("did_syntax_valid.txt", 24, true, |s| {
        is_valid_did(s) && Did::parse(s).is_ok()
    });
    check("did_syntax_invalid.txt", 18, false, |s| {
        is_valid_did(s) || Did::parse(s).is_ok()
    });
}

#[test]
fn handle() {
    check("handle_syntax_valid.txt", 71, true, |s| {
        is_valid_handle(s) && Handle::parse(s).is_ok_and(|h| h.as_str() == s.to_ascii_lowercase())
    });
    check("handle_syntax_invalid.txt", 48, false, |s| {
        is_valid_handle(s) || Handle::parse(s).is_ok()
    });
}

#[test]
fn nsid() {
    check("nsid_syntax_valid.txt", 25, true, |s| {
        is_valid_nsid(s) && Nsid::parse(s).is_ok()
    });
    check("nsid_syntax_invalid.txt", 27, false, |s| {
        is_valid_nsid(s) || Nsid::parse(s).is_ok()
    });
}

#[test]
fn record_key() {
    check("recordkey_syntax_valid.txt", 16, true, |s| {
        is_valid_record_key(s) && RecordKey::parse(s).is_ok()
    });
    check("recordkey_syntax_invalid.txt", 11, false, |s| {
        is_valid_record_key(s) || RecordKey::parse(s).is_ok()
    });
}

#[test]
fn tid() {
    check("tid_syntax_valid.txt", 4, true, |s| {
        // Valid TIDs also survive a decode/re-encode round trip.
        is_valid_tid(s)
            && Tid::parse(s).is_ok_and(|t| Tid::from_parts(t.timestamp_micros(), t.clock_id()) == t)
    });
    check("tid_syntax_invalid.txt", 9, false, |s| {
        is_valid_tid(s) || Tid::parse(s).is_ok()
    });
}

#[test]
fn at_uri() {
    check("aturi_syntax_valid.txt", 23, true, |s| {
        is_valid_at_uri(s) && AtUri::parse(s).is_ok()
    });
    check("aturi_syntax_invalid.txt", 72, false, |s| {
        is_valid_at_uri(s) || AtUri::parse(s).is_ok()
    });
}

#[test]
fn at_identifier() {
    check("atidentifier_syntax_valid.txt", 11, true, |s| {
        is_valid_at_identifier(s) && AtIdentifier::parse(s).is_ok()
    });
    check("atidentifier_syntax_invalid.txt", 22, false, |s| {
        is_valid_at_identifier(s) || AtIdentifier::parse(s).is_ok()
    });
}

#[test]
fn datetime() {
    check("datetime_syntax_valid.txt", 35, true, |s| {
        is_valid_datetime(s) && Datetime::parse(s).is_ok()
    });
    check("datetime_syntax_invalid.txt", 45, false, |s| {
        is_valid_datetime(s) || Datetime::parse(s).is_ok()
    });
    // "Parse invalid": must not become a `Datetime`. Most are also invalid
    // syntax (month 00, minute 99, ...); the exception is
    // `0000-01-01T00:00:00+01:00`, valid syntax that normalises to before
    // year 0 (the spec lists `0000-01-01T00:00:00+23:59` as valid syntax
    // that "does not normalize into a valid datetime").
    check("datetime_parse_invalid.txt", 7, false, |s| {
        Datetime::parse(s).is_ok()
    });
}

#[test]
fn language() {
    check("language_syntax_valid.txt", 18, true, |s| {
        is_valid_language(s) && Language::parse(s).is_ok()
    });
    check("language_syntax_invalid.txt", 7, false, |s| {
        is_valid_language(s) || Language::parse(s).is_ok()
    });
    // Well-formed (per the file's own header) but not valid: repeated
    // variant or singleton. The syntax check accepts them, `Language` does not.
    check("language_parse_invalid.txt", 4, false, |s| {
        !is_valid_language(s) || Language::parse(s).is_ok()
    });
}
