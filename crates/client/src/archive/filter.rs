//! The exact filter a planned segment's rows go through.
//!
//! Why a module: `planSnapshot` answers with a superset (DID blooms have false positives, a
//! block's collection bitmap covers all its rows, a whole segment is planned when 75% of its
//! blocks match), so the client keeps exactly the rows the request names, as the `atproto` SDK's
//! `RowMatcher` does and with the semantics of the live `subscribeEvents` filters: `kinds` by
//! event kind (a `create-resync` row is a commit), `dids` exactly, `collections` (exact or
//! `prefix.*`) on commits only — identity, account and sync rows pass a collection filter — and
//! the seq window `(afterSeq, beforeSeq]`. The request is validated once by the planner's own
//! rules ([`PlanRequest::new`]), so a request the server would refuse is refused here first.

use std::collections::HashSet;

use riptide_segment::plan::PlanRequest;
use riptide_segment::{Kind, Row};

use super::ArchiveError;
use crate::V2Filter;

/// A validated request: what to plan and which rows to keep.
#[derive(Clone, Debug, Default)]
pub(crate) struct RowFilter {
    /// Bits of [`kind_bit`]; 0 admits every kind.
    kinds: u8,
    dids: HashSet<String>,
    exact: HashSet<String>,
    /// Wildcard heads, each ending in `.`.
    prefixes: Vec<String>,
    pub(crate) after_seq: Option<u64>,
    pub(crate) before_seq: Option<u64>,
}

fn kind_bit(k: Kind) -> u8 {
    match k {
        Kind::Create | Kind::Update | Kind::Delete | Kind::CreateResync => 1,
        Kind::Identity => 2,
        Kind::Account => 4,
        Kind::Sync => 8,
    }
}

impl RowFilter {
    /// Validates the filter and window as `planSnapshot` does.
    pub(crate) fn new(
        f: &V2Filter,
        after_seq: Option<u64>,
        before_seq: Option<u64>,
    ) -> Result<RowFilter, ArchiveError> {
        PlanRequest::new(&f.kinds, &f.dids, &f.collections, after_seq, before_seq)
            .map_err(|e| ArchiveError::InvalidRequest(e.0))?;
        let mut kinds = 0;
        for k in &f.kinds {
            kinds |= match k.as_str() {
                "commit" => 1,
                "identity" => 2,
                "account" => 4,
                // `PlanRequest::new` admits nothing else.
                _ => 8,
            };
        }
        let (mut exact, mut prefixes) = (HashSet::new(), Vec::new());
        for c in &f.collections {
            match c.strip_suffix('*') {
                Some(head) => prefixes.push(head.to_owned()),
                None => {
                    exact.insert(c.clone());
                }
            }
        }
        Ok(RowFilter {
            kinds,
            dids: f.dids.iter().cloned().collect(),
            exact,
            prefixes,
            after_seq,
            before_seq,
        })
    }

    /// Whether some seq of `[min, max]` is in the window.
    pub(crate) fn overlaps(&self, min: u64, max: u64) -> bool {
        self.after_seq.is_none_or(|a| max > a) && self.before_seq.is_none_or(|b| min <= b)
    }

    /// Whether the row is one the request names.
    pub(crate) fn matches(&self, r: &Row<'_>) -> bool {
        if self.after_seq.is_some_and(|a| r.seq <= a) || self.before_seq.is_some_and(|b| r.seq > b)
        {
            return false;
        }
        if self.kinds != 0 && self.kinds & kind_bit(r.kind) == 0 {
            return false;
        }
        if !self.dids.is_empty() && !self.dids.contains(r.did) {
            return false;
        }
        if r.kind.is_commit() && !(self.exact.is_empty() && self.prefixes.is_empty()) {
            return self.exact.contains(r.collection)
                || self.prefixes.iter().any(|p| r.collection.starts_with(p));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: u64, kind: Kind, did: &'static str, collection: &'static str) -> Row<'static> {
        Row {
            seq,
            witnessed_at: 0,
            indexed_at: 0,
            kind,
            did,
            collection,
            rkey: "",
            rev: "",
            payload: &[],
        }
    }

    fn filter(
        kinds: &[&str],
        dids: &[&str],
        cols: &[&str],
        a: Option<u64>,
        b: Option<u64>,
    ) -> RowFilter {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect();
        let f = V2Filter {
            kinds: s(kinds),
            dids: s(dids),
            collections: s(cols),
            max_message_size_bytes: 0,
        };
        RowFilter::new(&f, a, b).unwrap()
    }

    #[test]
    fn rows_are_kept_exactly_as_the_live_filters_would() {
        let (a, b) = ("did:plc:aaaa", "did:plc:bbbb");
        let like = row(5, Kind::Create, a, "app.bsky.feed.like");
        let follow = row(6, Kind::CreateResync, a, "app.bsky.graph.follow");
        let ident = row(7, Kind::Identity, b, "");
        let sync = row(8, Kind::Sync, a, "");
        let all = [like, follow, ident, sync];
        let keep = |f: &RowFilter| {
            all.iter()
                .filter(|r| f.matches(r))
                .map(|r| r.seq)
                .collect::<Vec<_>>()
        };
        assert_eq!(keep(&filter(&[], &[], &[], None, None)), [5, 6, 7, 8]);
        assert_eq!(keep(&filter(&["commit"], &[], &[], None, None)), [5, 6]);
        assert_eq!(
            keep(&filter(&["identity", "sync"], &[], &[], None, None)),
            [7, 8]
        );
        assert_eq!(keep(&filter(&[], &[a], &[], None, None)), [5, 6, 8]);
        // Collections filter commits only; markers ride along.
        assert_eq!(
            keep(&filter(&[], &[], &["app.bsky.graph.*"], None, None)),
            [6, 7, 8]
        );
        assert_eq!(
            keep(&filter(
                &["commit"],
                &[],
                &["app.bsky.feed.like"],
                None,
                None
            )),
            [5]
        );
        // The window is (after, before].
        assert_eq!(keep(&filter(&[], &[], &[], Some(5), Some(7))), [6, 7]);
        assert!(filter(&[], &[], &[], Some(5), Some(7)).overlaps(7, 9));
        assert!(!filter(&[], &[], &[], Some(5), Some(7)).overlaps(1, 5));
        assert!(!filter(&[], &[], &[], Some(5), Some(7)).overlaps(8, 9));
    }

    #[test]
    fn requests_the_planner_refuses_are_refused_here() {
        let f = |kinds: Vec<&str>, cols: Vec<&str>| V2Filter {
            kinds: kinds.into_iter().map(String::from).collect(),
            collections: cols.into_iter().map(String::from).collect(),
            ..V2Filter::default()
        };
        for (v, a, b) in [
            (f(vec!["nope"], vec![]), None, None),
            (f(vec!["identity"], vec!["app.bsky.feed.like"]), None, None),
            (f(vec![], vec!["not an nsid"]), None, None),
            (f(vec![], vec![]), Some(9), Some(9)),
        ] {
            assert!(matches!(
                RowFilter::new(&v, a, b),
                Err(ArchiveError::InvalidRequest(_))
            ));
        }
    }
}
