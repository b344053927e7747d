//! `--collections`: which records a backfill keeps, and how their accounts are found.
//!
//! Why: a consumer of one app's records (a feed generator, a labeller) wants those, not the
//! network. Patterns are exact NSIDs (`app.bsky.feed.post`) or prefixes (`app.bsky.graph.*`,
//! matching `app.bsky.graph.follow` and `app.bsky.graph.block`, as Jetstream's
//! `wantedCollections` does). Exact NSIDs can be discovered with the relay's
//! `com.atproto.sync.listReposByCollection`, which takes one NSID, never a prefix: with a prefix
//! among the patterns every account is crawled and its records filtered.

use riptide_syntax::is_valid_nsid;

/// Collection patterns; empty means every collection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collections {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

/// A pattern that is neither an NSID nor `prefix.*`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a collection NSID or a prefix ending in `.*`")]
pub struct BadPattern(pub String);

impl Collections {
    /// Every collection.
    pub fn all() -> Collections {
        Collections::default()
    }

    /// Patterns, each an NSID or `prefix.*` (the prefix being one or more NSID segments).
    pub fn parse<S: AsRef<str>>(
        patterns: impl IntoIterator<Item = S>,
    ) -> Result<Collections, BadPattern> {
        let mut c = Collections::default();
        for p in patterns {
            let p = p.as_ref().trim();
            if let Some(prefix) = p.strip_suffix(".*") {
                // Segments as an NSID's: letters, digits and hyphens, none empty.
                let segment = |s: &str| {
                    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                };
                if prefix.is_empty() || !prefix.split('.').all(segment) {
                    return Err(BadPattern(p.to_owned()));
                }
                c.prefixes.push(format!("{prefix}."));
            } else if is_valid_nsid(p) {
                c.exact.push(p.to_owned());
            } else {
                return Err(BadPattern(p.to_owned()));
            }
        }
        c.exact.sort();
        c.exact.dedup();
        Ok(c)
    }

    /// Whether every collection is kept.
    pub fn is_all(&self) -> bool {
        self.exact.is_empty() && self.prefixes.is_empty()
    }

    /// Whether records of `collection` are kept.
    pub fn matches(&self, collection: &str) -> bool {
        self.is_all()
            || self.exact.iter().any(|e| e == collection)
            || self.prefixes.iter().any(|p| collection.starts_with(p))
    }

    /// The patterns as one string, the same for the same set however it was given (sorted,
    /// comma-separated, prefixes as `prefix.*`; empty for every collection): what a landing in
    /// pieces records of the filter it lands with (`crate::store_sink`).
    pub fn key(&self) -> String {
        let mut all: Vec<String> = self.exact.clone();
        all.extend(self.prefixes.iter().map(|p| format!("{p}*")));
        all.sort();
        all.dedup();
        all.join(",")
    }

    /// The NSIDs to discover accounts by (`listReposByCollection`), when every pattern is an
    /// exact NSID; `None` when all accounts must be crawled (no pattern, or a prefix).
    pub fn discoverable(&self) -> Option<&[String]> {
        (!self.exact.is_empty() && self.prefixes.is_empty()).then_some(&self.exact[..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_names_and_prefixes() {
        let c = Collections::parse(["app.bsky.feed.post", "app.bsky.graph.*"]).unwrap();
        assert!(c.matches("app.bsky.feed.post"));
        assert!(c.matches("app.bsky.graph.follow"));
        assert!(!c.matches("app.bsky.feed.like"));
        assert!(!c.matches("app.bsky.graphx.follow"));
        assert_eq!(c.discoverable(), None, "a prefix means crawling everyone");
        let c = Collections::parse(["app.bsky.feed.post", "app.bsky.feed.like"]).unwrap();
        assert_eq!(
            c.discoverable(),
            Some(
                &[
                    "app.bsky.feed.like".to_owned(),
                    "app.bsky.feed.post".to_owned()
                ][..]
            )
        );
        assert_eq!(
            Collections::parse(["app.bsky.graph.*", "app.bsky.feed.post", "app.bsky.graph.*"])
                .unwrap()
                .key(),
            "app.bsky.feed.post,app.bsky.graph.*"
        );
        assert_eq!(c.key(), "app.bsky.feed.like,app.bsky.feed.post");
        assert_eq!(Collections::all().key(), "");
        assert!(Collections::all().matches("anything.at.all"));
        assert_eq!(Collections::all().discoverable(), None);
        for bad in [
            "",
            "*",
            ".*",
            "app..*",
            "not an nsid",
            "app.bsky.feed.post*",
            "a b.*",
        ] {
            assert_eq!(
                Collections::parse([bad]),
                Err(BadPattern(bad.to_owned())),
                "{bad:?}"
            );
        }
    }
}
