//! Records: what each generated op writes, in the shapes and proportions of the real network.
//!
//! Why: a benchmark of decoding or projection is only as good as its data. The collection mix,
//! the share of each post feature and the sizes here were tuned against the real relay capture
//! with [`crate::stats::measure`] (figures in the crate README): mostly likes, then posts,
//! reposts and follows; posts with text, `langs`, facets (links, mentions, tags), replies and
//! embeds (images with blobs, external links, quoted records, record-with-media, video); a
//! sprinkling of blocks, lists, list items, threadgates, postgates, profiles, statuses and
//! records of non-Bluesky lexicons (teal.fm plays and statuses, Tangled stars).
//!
//! What it does not do: choose accounts or actions, or encode frames (see [`crate::network`]).

use std::borrow::Cow;
use std::collections::BTreeMap;

use rand::Rng;
use riptide_cbor::{write_map_header, write_text, CidBuf, OwnedValue, DAG_CBOR, RAW};

use crate::account::random_did;
use crate::clock::{datetime, tid};
use crate::words::{pick, LANGS, LINK_HOSTS, TAGS, TEXT_WORDS};

/// What kind of record to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `app.bsky.feed.like`
    Like,
    /// `app.bsky.feed.post`
    Post,
    /// `app.bsky.feed.repost`
    Repost,
    /// `app.bsky.graph.follow`
    Follow,
    /// `app.bsky.graph.block`
    Block,
    /// `app.bsky.graph.list`
    List,
    /// `app.bsky.graph.listitem`
    ListItem,
    /// `app.bsky.feed.threadgate` (rkey: the post's)
    Threadgate,
    /// `app.bsky.feed.postgate` (rkey: the post's)
    Postgate,
    /// `app.bsky.actor.profile` (rkey `self`)
    Profile,
    /// `app.bsky.actor.status` (rkey `self`)
    ActorStatus,
    /// `fm.teal.alpha.feed.play`
    TealPlay,
    /// `fm.teal.alpha.actor.status` (rkey `self`)
    TealStatus,
    /// `sh.tangled.feed.star`
    Star,
}

impl Kind {
    /// The collection NSID.
    pub fn nsid(self) -> &'static str {
        match self {
            Kind::Like => "app.bsky.feed.like",
            Kind::Post => "app.bsky.feed.post",
            Kind::Repost => "app.bsky.feed.repost",
            Kind::Follow => "app.bsky.graph.follow",
            Kind::Block => "app.bsky.graph.block",
            Kind::List => "app.bsky.graph.list",
            Kind::ListItem => "app.bsky.graph.listitem",
            Kind::Threadgate => "app.bsky.feed.threadgate",
            Kind::Postgate => "app.bsky.feed.postgate",
            Kind::Profile => "app.bsky.actor.profile",
            Kind::ActorStatus => "app.bsky.actor.status",
            Kind::TealPlay => "fm.teal.alpha.feed.play",
            Kind::TealStatus => "fm.teal.alpha.actor.status",
            Kind::Star => "sh.tangled.feed.star",
        }
    }

    /// Whether the record key is the literal `self` (otherwise a TID).
    pub fn is_singleton(self) -> bool {
        matches!(self, Kind::Profile | Kind::ActorStatus | Kind::TealStatus)
    }
}

/// Single-op creates, weights per 10,000 (tuned against the real capture's collection mix).
pub const CREATE_MIX: &[(Kind, u32)] = &[
    (Kind::Like, 6700),
    (Kind::Post, 1150),
    (Kind::Repost, 1000),
    (Kind::Follow, 650),
    (Kind::Block, 80),
    (Kind::ListItem, 90),
    (Kind::List, 5),
    (Kind::TealPlay, 120),
    (Kind::Star, 25),
    (Kind::ActorStatus, 15),
];

/// Updates: singletons and lists, weights per 1,000.
pub const UPDATE_MIX: &[(Kind, u32)] = &[
    (Kind::Profile, 450),
    (Kind::ActorStatus, 200),
    (Kind::TealStatus, 250),
    (Kind::List, 100),
];

/// Draws from a weighted table.
pub fn weighted<R: Rng, T: Copy>(rng: &mut R, table: &[(T, u32)]) -> T {
    let total: u32 = table.iter().map(|(_, w)| w).sum();
    let mut x = rng.gen_range(0..total);
    for &(t, w) in table {
        if x < w {
            return t;
        }
        x -= w;
    }
    table[table.len() - 1].0
}

/// The DAG-CBOR bytes of a record, encoded into a reused scratch buffer and copied out at their
/// exact size (growing a fresh `Vec` byte by byte dominated generation in profiles).
pub fn encode(value: &OwnedValue) -> Vec<u8> {
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(Vec::with_capacity(4096));
    }
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        s.clear();
        value.encode(&mut s);
        s.to_vec()
    })
}

/// Shared context records refer to: recent posts (for likes, reposts, replies, quotes) and
/// known accounts (for follows, blocks, mentions).
#[derive(Debug, Default)]
pub struct Context {
    recent: Vec<(String, String)>,
    next: usize,
    /// DIDs of the generated accounts.
    pub dids: Vec<String>,
    /// Their handles, index for index (empty when unknown): a mention of a generated account
    /// shows its real handle.
    pub handles: Vec<String>,
}

const RECENT: usize = 4096;

fn text(s: impl Into<String>) -> OwnedValue {
    OwnedValue::Text(s.into())
}

fn int(i: i64) -> OwnedValue {
    OwnedValue::Int(i)
}

fn map<const N: usize>(pairs: [(&str, OwnedValue); N]) -> OwnedValue {
    OwnedValue::Map(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

fn fake_cid<R: Rng>(rng: &mut R, codec: u64) -> CidBuf {
    let d: [u8; 32] = rng.gen();
    CidBuf::from_sha256_digest(codec, &d)
}

impl Context {
    /// A context knowing these accounts and no posts yet.
    pub fn new(dids: Vec<String>) -> Context {
        Context {
            recent: Vec::new(),
            next: 0,
            dids,
            handles: Vec::new(),
        }
    }

    /// Remembers a post as a target for later likes, reposts, replies and quotes.
    pub fn add_post(&mut self, uri: String, cid: String) {
        if self.recent.len() < RECENT {
            self.recent.push((uri, cid));
        } else {
            self.recent[self.next] = (uri, cid);
            self.next = (self.next + 1) % RECENT;
        }
    }

    fn some_did<R: Rng>(&self, rng: &mut R) -> String {
        self.some_account(rng).0
    }

    /// A DID to refer to (a generated account's or one from elsewhere) and, for a generated
    /// account whose handle is known, that handle.
    fn some_account<R: Rng>(&self, rng: &mut R) -> (String, Option<&str>) {
        if !self.dids.is_empty() && rng.gen_bool(0.5) {
            let i = rng.gen_range(0..self.dids.len());
            (
                self.dids[i].clone(),
                self.handles.get(i).map(String::as_str),
            )
        } else {
            (random_did(rng), None)
        }
    }

    /// A `com.atproto.repo.strongRef` to a post: a recent one, or one from elsewhere.
    fn post_ref<R: Rng>(&self, rng: &mut R, now: u64) -> OwnedValue {
        let (uri, cid) = self.post_ref_parts(rng, now);
        map([("cid", text(cid)), ("uri", text(uri))])
    }

    /// The URI and CID of [`Context::post_ref`], borrowed when it is a recent post.
    fn post_ref_parts<R: Rng>(&self, rng: &mut R, now: u64) -> (Cow<'_, str>, Cow<'_, str>) {
        if !self.recent.is_empty() && rng.gen_bool(0.6) {
            let (uri, cid) = &self.recent[rng.gen_range(0..self.recent.len())];
            (Cow::Borrowed(uri), Cow::Borrowed(cid))
        } else {
            let age = rng.gen_range(0..30 * 86_400_000_000u64);
            let uri = format!(
                "at://{}/app.bsky.feed.post/{}",
                random_did(rng),
                tid(now.saturating_sub(age), rng.gen_range(0..1024))
            );
            (
                Cow::Owned(uri),
                Cow::Owned(fake_cid(rng, DAG_CBOR).to_string()),
            )
        }
    }
}

fn blob<R: Rng>(rng: &mut R, mime: &str, max: i64) -> OwnedValue {
    map([
        ("$type", text("blob")),
        ("ref", OwnedValue::Link(fake_cid(rng, RAW))),
        ("mimeType", text(mime)),
        ("size", int(rng.gen_range(20_000..max))),
    ])
}

fn sentence<R: Rng>(rng: &mut R, words: std::ops::Range<usize>) -> String {
    let words = if words.is_empty() {
        0
    } else {
        rng.gen_range(words)
    };
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(pick(rng, TEXT_WORDS));
    }
    s
}

fn link<R: Rng>(rng: &mut R) -> String {
    format!(
        "https://{}/{}/{}",
        pick(rng, LINK_HOSTS),
        pick(rng, TEXT_WORDS),
        rng.gen_range(1000..999_999)
    )
}

fn facet(start: usize, end: usize, feature: OwnedValue) -> OwnedValue {
    map([
        ("$type", text("app.bsky.richtext.facet")),
        (
            "index",
            map([
                ("byteEnd", int(end as i64)),
                ("byteStart", int(start as i64)),
            ]),
        ),
        ("features", OwnedValue::Array(vec![feature])),
    ])
}

/// The post record (and whether it is worth remembering as a target).
fn post<R: Rng>(rng: &mut R, ctx: &Context, created: u64) -> OwnedValue {
    let mut m: BTreeMap<String, OwnedValue> = BTreeMap::new();
    let hi = rng.gen_range(4..48);
    let words = rng.gen_range(1..=hi);
    let mut body = sentence(rng, words..words + 1);
    let mut facets = Vec::new();
    if rng.gen_bool(0.28) {
        for _ in 0..rng.gen_range(1..=2) {
            body.push(' ');
            let start = body.len();
            let feature = match rng.gen_range(0..3) {
                0 => {
                    let uri = link(rng);
                    body.push_str(&uri);
                    map([
                        ("$type", text("app.bsky.richtext.facet#link")),
                        ("uri", text(uri)),
                    ])
                }
                1 => {
                    // A generated account is mentioned by its own handle (as clients write
                    // it); an account from elsewhere by a made-up one.
                    let (did, handle) = ctx.some_account(rng);
                    body.push('@');
                    match handle {
                        Some(h) => body.push_str(h),
                        None => {
                            body.push_str(pick(rng, TEXT_WORDS));
                            body.push_str(".bsky.social");
                        }
                    }
                    map([
                        ("$type", text("app.bsky.richtext.facet#mention")),
                        ("did", text(did)),
                    ])
                }
                _ => {
                    let tag = pick(rng, TAGS);
                    body.push('#');
                    body.push_str(tag);
                    map([
                        ("$type", text("app.bsky.richtext.facet#tag")),
                        ("tag", text(tag)),
                    ])
                }
            };
            facets.push(facet(start, body.len(), feature));
        }
    }
    m.insert("$type".into(), text("app.bsky.feed.post"));
    m.insert("text".into(), text(body));
    m.insert("createdAt".into(), text(datetime(created)));
    if !facets.is_empty() {
        m.insert("facets".into(), OwnedValue::Array(facets));
    }
    if rng.gen_bool(0.93) {
        let lang = weighted(rng, LANGS);
        m.insert("langs".into(), OwnedValue::Array(vec![text(lang)]));
    }
    if rng.gen_bool(0.42) {
        let parent = ctx.post_ref(rng, created);
        let root = if rng.gen_bool(0.5) {
            parent.clone()
        } else {
            ctx.post_ref(rng, created)
        };
        m.insert("reply".into(), map([("parent", parent), ("root", root)]));
    }
    let embed = match rng.gen_range(0..100) {
        0..=13 => Some(images(rng)),
        14..=26 => Some(external(rng)),
        27..=32 => Some(map([
            ("$type", text("app.bsky.embed.record")),
            ("record", ctx.post_ref(rng, created)),
        ])),
        33..=34 => Some(map([
            ("$type", text("app.bsky.embed.recordWithMedia")),
            ("media", images(rng)),
            (
                "record",
                map([
                    ("$type", text("app.bsky.embed.record")),
                    ("record", ctx.post_ref(rng, created)),
                ]),
            ),
        ])),
        35..=36 => Some(map([
            ("$type", text("app.bsky.embed.video")),
            ("video", blob(rng, "video/mp4", 20_000_000)),
            (
                "aspectRatio",
                map([("height", int(1080)), ("width", int(1920))]),
            ),
        ])),
        _ => None,
    };
    if let Some(e) = embed {
        m.insert("embed".into(), e);
    }
    OwnedValue::Map(m)
}

fn images<R: Rng>(rng: &mut R) -> OwnedValue {
    let n = *[1, 1, 1, 1, 2, 2, 3, 4]
        .get(rng.gen_range(0..8))
        .unwrap_or(&1);
    let imgs = (0..n)
        .map(|_| {
            let alt = if rng.gen_bool(0.4) {
                sentence(rng, 2..12)
            } else {
                String::new()
            };
            map([
                ("alt", text(alt)),
                ("image", blob(rng, "image/jpeg", 1_000_000)),
                (
                    "aspectRatio",
                    map([
                        ("height", int(rng.gen_range(400..2000))),
                        ("width", int(rng.gen_range(400..2000))),
                    ]),
                ),
            ])
        })
        .collect();
    map([
        ("$type", text("app.bsky.embed.images")),
        ("images", OwnedValue::Array(imgs)),
    ])
}

fn external<R: Rng>(rng: &mut R) -> OwnedValue {
    let mut ext = BTreeMap::new();
    ext.insert("uri".into(), text(link(rng)));
    ext.insert("title".into(), text(sentence(rng, 2..10)));
    ext.insert("description".into(), text(sentence(rng, 0..30)));
    if rng.gen_bool(0.7) {
        ext.insert("thumb".into(), blob(rng, "image/jpeg", 900_000));
    }
    map([
        ("$type", text("app.bsky.embed.external")),
        ("external", OwnedValue::Map(ext)),
    ])
}

/// Extra inputs some kinds need: the post a threadgate or postgate is for, the list of a
/// list item.
#[derive(Clone, Debug, Default)]
pub struct Links {
    /// `at://` URI of the author's post (threadgate, postgate).
    pub post: Option<String>,
    /// `at://` URI of the author's list (list item).
    pub list: Option<String>,
}

/// The DAG-CBOR bytes of [`record`]`(rng, ctx, kind, author, created, links)`: the same
/// bytes and the same draws from `rng`. The commonest kinds (likes, reposts, follows,
/// blocks: about 85% of records) are written directly, without building a value first.
pub fn encode_record<R: Rng>(
    rng: &mut R,
    ctx: &Context,
    kind: Kind,
    author: &str,
    created: u64,
    links: &Links,
) -> Vec<u8> {
    // Canonical key order (length first): `$type`, `subject`, `createdAt`.
    let start = |out: &mut Vec<u8>| {
        write_map_header(out, 3);
        write_text(out, "$type");
        write_text(out, kind.nsid());
        write_text(out, "subject");
    };
    let end = |out: &mut Vec<u8>| {
        write_text(out, "createdAt");
        write_text(out, &datetime(created));
    };
    match kind {
        Kind::Like | Kind::Repost => {
            let (uri, cid) = ctx.post_ref_parts(rng, created);
            let mut out = Vec::with_capacity(64 + uri.len() + cid.len() + kind.nsid().len());
            start(&mut out);
            write_map_header(&mut out, 2);
            write_text(&mut out, "cid");
            write_text(&mut out, &cid);
            write_text(&mut out, "uri");
            write_text(&mut out, &uri);
            end(&mut out);
            out
        }
        Kind::Follow | Kind::Block => {
            let did = ctx.some_did(rng);
            let mut out = Vec::with_capacity(64 + did.len() + kind.nsid().len());
            start(&mut out);
            write_text(&mut out, &did);
            end(&mut out);
            out
        }
        _ => encode(&record(rng, ctx, kind, author, created, links)),
    }
}

/// One record of `kind`, created at `created` (microseconds) by `author`.
pub fn record<R: Rng>(
    rng: &mut R,
    ctx: &Context,
    kind: Kind,
    author: &str,
    created: u64,
    links: &Links,
) -> OwnedValue {
    let at = || text(datetime(created));
    let ty = text(kind.nsid());
    match kind {
        Kind::Like => map([
            ("$type", ty),
            ("subject", ctx.post_ref(rng, created)),
            ("createdAt", at()),
        ]),
        Kind::Repost => map([
            ("$type", ty),
            ("subject", ctx.post_ref(rng, created)),
            ("createdAt", at()),
        ]),
        Kind::Post => post(rng, ctx, created),
        Kind::Follow | Kind::Block => map([
            ("$type", ty),
            ("subject", text(ctx.some_did(rng))),
            ("createdAt", at()),
        ]),
        Kind::List => {
            let purpose = if rng.gen_bool(0.7) {
                "app.bsky.graph.defs#curatelist"
            } else {
                "app.bsky.graph.defs#modlist"
            };
            map([
                ("$type", ty),
                ("name", text(sentence(rng, 1..4))),
                ("purpose", text(purpose)),
                ("description", text(sentence(rng, 0..20))),
                ("createdAt", at()),
            ])
        }
        Kind::ListItem => {
            let list = links.list.clone().unwrap_or_else(|| {
                format!(
                    "at://{author}/app.bsky.graph.list/{}",
                    tid(created, rng.gen_range(0..1024))
                )
            });
            map([
                ("$type", ty),
                ("list", text(list)),
                ("subject", text(ctx.some_did(rng))),
                ("createdAt", at()),
            ])
        }
        Kind::Threadgate => {
            let post = links.post.clone().unwrap_or_default();
            let allow = match rng.gen_range(0..3) {
                0 => vec![],
                1 => vec![map([(
                    "$type",
                    text("app.bsky.feed.threadgate#followingRule"),
                )])],
                _ => vec![map([(
                    "$type",
                    text("app.bsky.feed.threadgate#mentionRule"),
                )])],
            };
            map([
                ("$type", ty),
                ("post", text(post)),
                ("allow", OwnedValue::Array(allow)),
                ("createdAt", at()),
                ("hiddenReplies", OwnedValue::Array(vec![])),
            ])
        }
        Kind::Postgate => {
            let post = links.post.clone().unwrap_or_default();
            map([
                ("$type", ty),
                ("post", text(post)),
                (
                    "embeddingRules",
                    OwnedValue::Array(vec![map([(
                        "$type",
                        text("app.bsky.feed.postgate#disableRule"),
                    )])]),
                ),
                ("createdAt", at()),
                ("detachedEmbeddingUris", OwnedValue::Array(vec![])),
            ])
        }
        Kind::Profile => {
            let mut m = BTreeMap::new();
            m.insert("$type".into(), ty);
            m.insert("displayName".into(), text(sentence(rng, 1..3)));
            m.insert("description".into(), text(sentence(rng, 0..40)));
            m.insert("avatar".into(), blob(rng, "image/jpeg", 1_000_000));
            if rng.gen_bool(0.6) {
                m.insert("banner".into(), blob(rng, "image/jpeg", 1_000_000));
            }
            m.insert("createdAt".into(), at());
            OwnedValue::Map(m)
        }
        Kind::ActorStatus => map([
            ("$type", ty),
            ("status", text("app.bsky.actor.status#live")),
            ("durationMinutes", int(rng.gen_range(10..240))),
            (
                "embed",
                map([
                    ("$type", text("app.bsky.embed.external")),
                    (
                        "external",
                        map([
                            ("uri", text(link(rng))),
                            ("title", text(sentence(rng, 4..5))),
                            ("description", text(String::new())),
                        ]),
                    ),
                ]),
            ),
            ("createdAt", at()),
        ]),
        Kind::TealPlay => map([
            ("$type", ty),
            ("trackName", text(sentence(rng, 1..5))),
            (
                "artists",
                OwnedValue::Array(vec![map([("artistName", text(sentence(rng, 2..3)))])]),
            ),
            ("releaseName", text(sentence(rng, 3..4))),
            ("duration", int(rng.gen_range(90..420))),
            ("musicServiceBaseDomain", text("music.example.fm")),
            ("submissionClientAgent", text("piper/v0.0.3")),
            ("playedTime", at()),
        ]),
        Kind::TealStatus => map([
            ("$type", ty),
            ("time", text(created.to_string())),
            ("expiry", text((created + 600_000_000).to_string())),
            (
                "item",
                map([
                    ("trackName", text(sentence(rng, 1..5))),
                    ("duration", int(rng.gen_range(90..420))),
                ]),
            ),
        ]),
        Kind::Star => map([
            ("$type", ty),
            (
                "subject",
                text(format!(
                    "at://{}/sh.tangled.repo/{}",
                    ctx.some_did(rng),
                    tid(
                        created.saturating_sub(86_400_000_000),
                        rng.gen_range(0..1024)
                    )
                )),
            ),
            ("createdAt", at()),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    /// The direct encoder gives the bytes (and leaves the RNG where) building the value does.
    #[test]
    fn encode_record_equals_encoding_the_value() {
        let mut ctx = Context::new(vec!["did:plc:aaaaaaaaaaaaaaaaaaaaaaaa".into()]);
        ctx.handles = vec!["alice.bsky.social".into()];
        let mut a = ChaCha8Rng::seed_from_u64(3);
        let mut b = ChaCha8Rng::seed_from_u64(3);
        let author = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb";
        for n in 0..2000u64 {
            let kind = weighted(&mut a, CREATE_MIX);
            assert_eq!(weighted(&mut b, CREATE_MIX), kind);
            let created = 1_780_000_000_000_000 + n * 1_000_000;
            let links = Links::default();
            let direct = encode_record(&mut a, &ctx, kind, author, created, &links);
            let built = encode(&record(&mut b, &ctx, kind, author, created, &links));
            assert_eq!(direct, built, "{kind:?} #{n}");
            if n % 7 == 0 {
                ctx.add_post(
                    format!("at://{author}/app.bsky.feed.post/{n}"),
                    format!("c{n}"),
                );
            }
        }
        assert_eq!(a.gen::<u64>(), b.gen::<u64>());
    }
}
