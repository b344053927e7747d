//! AT URIs: `at://` references to repositories, collections and records.
//!
//! Records point at each other with AT URIs (replies, likes, reposts), and
//! riptide builds them for every op it emits. Lexicon's `at-uri` format is the
//! restricted syntax of <https://atproto.com/specs/at-uri-scheme>:
//! `at://AUTHORITY[/COLLECTION[/RKEY]]`, where the authority is a DID or a
//! handle, the collection an NSID and the rkey a record key, with no query,
//! fragment or trailing slash, and at most 8 KiB in all.

use crate::{did, handle, nsid, record_key};
use crate::{Format, SyntaxError, SyntaxErrorKind};

const MAX_AT_URI_LEN: usize = 8 * 1024;
const PREFIX: &str = "at://";

/// Returns whether `s` is a valid AT URI in the restricted Lexicon syntax.
pub fn is_valid_at_uri(s: &str) -> bool {
    validate(s).is_ok()
}

/// Splits the part after `at://` into authority, collection and rkey.
fn split(rest: &str) -> (&str, Option<&str>, Option<&str>) {
    let mut parts = rest.splitn(3, '/');
    let authority = parts.next().unwrap_or_default();
    (authority, parts.next(), parts.next())
}

pub(crate) fn validate(s: &str) -> Result<(), SyntaxErrorKind> {
    if s.is_empty() {
        return Err(SyntaxErrorKind::Empty);
    }
    if s.len() > MAX_AT_URI_LEN {
        return Err(SyntaxErrorKind::TooLong {
            max: MAX_AT_URI_LEN,
        });
    }
    let Some(rest) = s.strip_prefix(PREFIX) else {
        return Err(SyntaxErrorKind::BadPrefix);
    };
    let (authority, collection, rkey) = split(rest);
    let authority_ok = if authority.starts_with("did:") {
        did::validate(authority).map_err(|_| Format::Did)
    } else {
        handle::validate(authority).map_err(|_| Format::Handle)
    };
    authority_ok.map_err(SyntaxErrorKind::InvalidComponent)?;
    if let Some(c) = collection {
        nsid::validate(c).map_err(|_| SyntaxErrorKind::InvalidComponent(Format::Nsid))?;
    }
    if let Some(k) = rkey {
        record_key::validate(k)
            .map_err(|_| SyntaxErrorKind::InvalidComponent(Format::RecordKey))?;
    }
    Ok(())
}

/// A valid AT URI, e.g. `at://did:plc:abc/app.bsky.feed.post/3jzfcijpj2z2a`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AtUri(String);

crate::string_type!(AtUri);

impl AtUri {
    fn check(s: &str) -> Result<(), SyntaxError> {
        validate(s).map_err(|k| SyntaxError::new(Format::AtUri, k))
    }

    fn from_checked(s: String) -> Self {
        AtUri(s)
    }

    fn parts(&self) -> (&str, Option<&str>, Option<&str>) {
        split(&self.0[PREFIX.len()..])
    }

    /// The DID or handle after `at://`.
    pub fn authority(&self) -> &str {
        self.parts().0
    }

    /// The collection NSID, if the URI has a path.
    pub fn collection(&self) -> Option<&str> {
        self.parts().1
    }

    /// The record key, if the URI names a record.
    pub fn rkey(&self) -> Option<&str> {
        self.parts().2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts() {
        let u =
            AtUri::parse("at://did:plc:asdf123/app.bsky.feed.post/3jzfcijpj2z2a").expect("valid");
        assert_eq!(u.authority(), "did:plc:asdf123");
        assert_eq!(u.collection(), Some("app.bsky.feed.post"));
        assert_eq!(u.rkey(), Some("3jzfcijpj2z2a"));
        let u = AtUri::parse("at://alice.test").expect("valid");
        assert_eq!(
            (u.authority(), u.collection(), u.rkey()),
            ("alice.test", None, None)
        );
    }

    #[test]
    fn reasons() {
        use SyntaxErrorKind::*;
        let kind = |s| validate(s).err();
        assert_eq!(kind("http://alice.test"), Some(BadPrefix));
        assert_eq!(kind("at://did:plc:"), Some(InvalidComponent(Format::Did)));
        assert_eq!(kind("at://alice"), Some(InvalidComponent(Format::Handle)));
        assert_eq!(
            kind("at://alice.test/"),
            Some(InvalidComponent(Format::Nsid))
        );
        assert_eq!(
            kind("at://alice.test/a.b.c/"),
            Some(InvalidComponent(Format::RecordKey))
        );
        assert_eq!(
            kind("at://alice.test/a.b.c/d/e"),
            Some(InvalidComponent(Format::RecordKey))
        );
        assert_eq!(
            kind("at://alice.test#frag"),
            Some(InvalidComponent(Format::Handle))
        );
    }
}
