//! Measuring a firehose stream: the statistics the generator is tuned to and tested against.
//!
//! Why: "realistic" has to be a number. [`measure`] reads any corpus (the real relay capture or a
//! generated one) with the same code, so a test can hold the generator to the real network
//! within a stated tolerance ([`Stats::compare`]), and the figures that tuned the generator's
//! constants can be reproduced (`cargo test -p riptide-gen --test stats -- --nocapture`).
//!
//! What is measured: frame kinds; per commit, ops, blocks and bytes; per op, the action and the
//! collection; per created or updated record, its size and, for posts, its shape (reply, facets,
//! langs, embed type). Frames that do not decode are counted (`undecodable`), never dropped.
//!
//! What it does not do: verify anything (see `riptide_firehose::verify`).

use std::collections::BTreeMap;

use riptide_cbor::{Kind, Value};
use riptide_firehose::{Action, Body, FrameDecoder};
use serde::Serialize;

/// Statistics of a stream of frames. Counts are exact; means are over the counted population.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Frames measured.
    pub frames: u64,
    /// Frames that do not decode (their content is not measured).
    pub undecodable: u64,
    /// Frames per kind (`commit`, `identity`, `account`, `sync`, ...).
    pub kinds: BTreeMap<String, u64>,
    /// `#commit` frames.
    pub commits: u64,
    /// Ops over all commits.
    pub ops: u64,
    /// Ops per action (`create`, `update`, `delete`).
    pub actions: BTreeMap<String, u64>,
    /// Ops per collection NSID.
    pub collections: BTreeMap<String, u64>,
    /// Commits with more than one op.
    pub multi_op_commits: u64,
    /// CAR blocks over all commits.
    pub commit_blocks: u64,
    /// Frame bytes over all commits.
    pub commit_bytes: u64,
    /// Frame bytes over all frames.
    pub bytes: u64,
    /// Created or updated records found in their CAR.
    pub records: u64,
    /// Their encoded bytes.
    pub record_bytes: u64,
    /// Posts (created or updated `app.bsky.feed.post` records found in the CAR).
    pub posts: u64,
    /// Posts with a `reply`.
    pub posts_reply: u64,
    /// Posts with `facets`.
    pub posts_facets: u64,
    /// Posts with `langs`.
    pub posts_langs: u64,
    /// Posts by `embed.$type`.
    pub post_embeds: BTreeMap<String, u64>,
    /// `#account` frames with `active: false`.
    pub inactive_accounts: u64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

impl Stats {
    /// Mean ops per commit.
    pub fn ops_per_commit(&self) -> f64 {
        ratio(self.ops, self.commits)
    }

    /// Mean CAR blocks per commit.
    pub fn blocks_per_commit(&self) -> f64 {
        ratio(self.commit_blocks, self.commits)
    }

    /// Mean frame bytes per commit.
    pub fn bytes_per_commit(&self) -> f64 {
        ratio(self.commit_bytes, self.commits)
    }

    /// Mean frame bytes per frame.
    pub fn bytes_per_frame(&self) -> f64 {
        ratio(self.bytes, self.frames)
    }

    /// Mean encoded record size.
    pub fn bytes_per_record(&self) -> f64 {
        ratio(self.record_bytes, self.records)
    }

    /// Share of ops with this action.
    pub fn action_share(&self, action: &str) -> f64 {
        ratio(self.actions.get(action).copied().unwrap_or(0), self.ops)
    }

    /// Share of ops in this collection.
    pub fn collection_share(&self, nsid: &str) -> f64 {
        ratio(self.collections.get(nsid).copied().unwrap_or(0), self.ops)
    }

    /// Share of ops in collections outside `app.bsky.*` and `chat.bsky.*`.
    pub fn non_bluesky_share(&self) -> f64 {
        let n = self
            .collections
            .iter()
            .filter(|(c, _)| !c.starts_with("app.bsky.") && !c.starts_with("chat.bsky."))
            .map(|(_, n)| n)
            .sum();
        ratio(n, self.ops)
    }

    /// Share of frames of this kind.
    pub fn kind_share(&self, kind: &str) -> f64 {
        ratio(self.kinds.get(kind).copied().unwrap_or(0), self.frames)
    }

    /// The tested comparison: each metric of `self` against `reference`, with its tolerance.
    ///
    /// Tolerances (stated here and in the crate docs): shares (collection mix, action mix,
    /// commit share of frames) within ±0.08 absolute; means (ops, blocks and bytes per commit,
    /// bytes per record) within a factor of 1.5 either way. The real capture is 150 frames,
    /// so its own sampling error on a share of 0.3 is about ±0.04; the bounds are about twice
    /// that. Blocks and bytes per commit depend on repository sizes (deeper trees carry longer
    /// proof paths), which is why they get a ratio rather than a tight bound.
    pub fn compare(&self, reference: &Stats) -> Vec<Comparison> {
        let mut out = Vec::new();
        let mut share = |name: String, got: f64, want: f64| {
            out.push(Comparison::new(name, got, want, Tolerance::Absolute(0.08)));
        };
        for c in [
            "app.bsky.feed.like",
            "app.bsky.feed.post",
            "app.bsky.feed.repost",
            "app.bsky.graph.follow",
        ] {
            share(
                format!("collection {c}"),
                self.collection_share(c),
                reference.collection_share(c),
            );
        }
        share(
            "collection non-Bluesky".into(),
            self.non_bluesky_share(),
            reference.non_bluesky_share(),
        );
        for a in ["create", "update", "delete"] {
            share(
                format!("action {a}"),
                self.action_share(a),
                reference.action_share(a),
            );
        }
        share(
            "kind commit".into(),
            self.kind_share("commit"),
            reference.kind_share("commit"),
        );
        let mut mean = |name: &str, got: f64, want: f64| {
            out.push(Comparison::new(
                name.into(),
                got,
                want,
                Tolerance::Factor(1.5),
            ));
        };
        mean(
            "ops per commit",
            self.ops_per_commit(),
            reference.ops_per_commit(),
        );
        mean(
            "blocks per commit",
            self.blocks_per_commit(),
            reference.blocks_per_commit(),
        );
        mean(
            "bytes per commit",
            self.bytes_per_commit(),
            reference.bytes_per_commit(),
        );
        mean(
            "bytes per record",
            self.bytes_per_record(),
            reference.bytes_per_record(),
        );
        out
    }
}

/// How far a measured value may be from the reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// `|got - want| <= d`.
    Absolute(f64),
    /// `want / f <= got <= want * f`.
    Factor(f64),
}

/// One metric of [`Stats::compare`].
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// What is compared.
    pub metric: String,
    /// The measured value.
    pub got: f64,
    /// The reference value.
    pub want: f64,
    /// The allowed distance.
    pub tolerance: Tolerance,
    /// Whether `got` is within `tolerance` of `want`.
    pub ok: bool,
}

impl Comparison {
    fn new(metric: String, got: f64, want: f64, tolerance: Tolerance) -> Comparison {
        let ok = match tolerance {
            Tolerance::Absolute(d) => (got - want).abs() <= d,
            Tolerance::Factor(f) => got >= want / f && got <= want * f,
        };
        Comparison {
            metric,
            got,
            want,
            tolerance,
            ok,
        }
    }
}

impl std::fmt::Display for Comparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tol = match self.tolerance {
            Tolerance::Absolute(d) => format!("±{d}"),
            Tolerance::Factor(x) => format!("×/÷{x}"),
        };
        write!(
            f,
            "{:<32} got {:>10.3} want {:>10.3} ({tol}) {}",
            self.metric,
            self.got,
            self.want,
            if self.ok { "ok" } else { "OUT OF TOLERANCE" }
        )
    }
}

/// Measures a stream of frames (each one a whole subscribeRepos message).
pub fn measure<'f>(frames: impl IntoIterator<Item = &'f [u8]>) -> Stats {
    let mut s = Stats::default();
    let mut dec = FrameDecoder::new();
    for bytes in frames {
        s.frames += 1;
        s.bytes += bytes.len() as u64;
        let Ok(frame) = dec.decode(bytes) else {
            s.undecodable += 1;
            continue;
        };
        *s.kinds.entry(frame.body().kind().to_owned()).or_default() += 1;
        match frame.body() {
            Body::Commit(c) => {
                s.commits += 1;
                s.commit_bytes += bytes.len() as u64;
                s.commit_blocks += frame.car().map_or(0, |car| car.len() as u64);
                let n = c.op_count() as u64;
                s.ops += n;
                if n > 1 {
                    s.multi_op_commits += 1;
                }
                for op in c.ops() {
                    *s.actions.entry(op.action.as_str().to_owned()).or_default() += 1;
                    *s.collections.entry(op.collection().to_owned()).or_default() += 1;
                    if op.action == Action::Delete {
                        continue;
                    }
                    let Some(cid) = op.cid else { continue };
                    let Some(block) = frame.block_bytes(cid) else {
                        continue;
                    };
                    s.records += 1;
                    s.record_bytes += block.len() as u64;
                    if op.collection() == "app.bsky.feed.post" {
                        if let Some(v) = frame.block_by_cid(cid) {
                            post_shape(&mut s, v);
                        }
                    }
                }
            }
            Body::Account(a) if !a.active => s.inactive_accounts += 1,
            _ => {}
        }
    }
    s
}

fn post_shape(s: &mut Stats, v: Value<'_>) {
    if v.kind() != Kind::Map {
        return;
    }
    s.posts += 1;
    s.posts_reply += u64::from(v.get("reply").is_some());
    s.posts_facets += u64::from(v.get("facets").is_some());
    s.posts_langs += u64::from(v.get("langs").is_some());
    let embed = v
        .get("embed")
        .map(|e| {
            e.get("$type")
                .and_then(|t| t.as_str())
                .unwrap_or("?")
                .to_owned()
        })
        .unwrap_or_else(|| "none".to_owned());
    *s.post_embeds.entry(embed).or_default() += 1;
}
