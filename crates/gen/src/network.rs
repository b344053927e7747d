//! The simulated network: accounts with repositories, and the relay stream of their events.
//!
//! Why: one deterministic state machine produces every frame, so each is consistent with the
//! account's history: a `#commit`'s `since` is the account's previous revision (of a commit or a
//! `#sync`), its `prevData` the previous MST root, its ops carry `prev` CIDs for updates and
//! deletes, and its CAR holds the commit, the proof nodes ([`crate::repo`]) and the new records.
//! `#identity`, `#account` (deactivation, later reactivation; a deactivated account commits
//! nothing) and `#sync` frames are interleaved at about the network's rates.
//!
//! Determinism: one ChaCha8 RNG seeded from the seed drives every choice in a fixed order; time
//! is a fixed epoch plus drawn steps (≥ 1 ms, so `time` strictly increases at its millisecond
//! precision, and revisions, which are TIDs of that time, too); no hash-map iteration order
//! reaches the output. Signing is deterministic (RFC 6979), so signing a batch of commits on
//! several threads ([`Config::threads`]) gives the same bytes as on one.
//!
//! Adversarial frames ([`crate::adversarial`]) are extra frames built like a commit of some
//! account, then *aborted* (the account's state does not advance) and broken in one way: the
//! frames around them are unaffected, and a consumer that drops them sees an unbroken chain.
//!
//! What it does not do: file I/O (see [`crate::output`]).

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use riptide_car::CarWriter;
use riptide_cbor::{
    write_array_header, write_bool, write_bytes, write_head, write_int, write_link,
    write_map_header, write_null, write_text, write_varint, CidBuf, DAG_CBOR, RAW,
};
use riptide_crypto::{PrivateKey, Signer};
use riptide_firehose::encode::write_message_header;
use riptide_repo::Action;

use crate::account::Account;
use crate::adversarial::{AdversarialEntry, Defect};
use crate::clock::{datetime, tid, EPOCH_MICROS};
use crate::error::GenError;
use crate::records::{
    encode_record, record, weighted, Context, Kind, Links, CREATE_MIX, UPDATE_MIX,
};
use crate::repo::{Change, Op, RepoState};

/// What to generate.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// The seed: the same configuration always gives the same bytes.
    pub seed: u64,
    /// Number of accounts in the stream.
    pub accounts: usize,
    /// Number of frames.
    pub events: u64,
    /// Share of frames broken on purpose (0 to 1).
    pub adversarial: f64,
    /// Keep record bytes so every account's repository can be exported at the end
    /// (`--repos`: `DIR/repos/<did>.car`).
    pub keep_records: bool,
    /// Also write one large repository of this many records (`--big-repo`).
    pub big_repo: Option<usize>,
    /// Threads in all (output is identical for any count). One: everything on the calling
    /// thread. N ≥ 2: the calling thread draws the frames of the next batch while N − 1
    /// threads sign and encode the previous one.
    pub threads: usize,
    /// Records in each account's repository before the stream starts, within this range: the
    /// most active accounts get the largest (real repositories make real proof paths).
    pub initial_records: (usize, usize),
    /// How starting repository sizes are drawn (default: [`Sizes::Ranked`], today's shape).
    pub sizes: Sizes,
    /// With [`Config::keep_records`]: export the repositories after this many frames instead of
    /// at the end, then go on with the stream (`--repos-at K`): the repositories are as of
    /// frame K, and frames K + 1 … are the live tail after them.
    pub repos_at: Option<u64>,
}

/// How the starting repository sizes are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sizes {
    /// Within [`Config::initial_records`], falling off as rank^-1/2 (the default; a stream's
    /// proof paths are as long as the network's, and setup stays cheap).
    Ranked,
    /// Heavy-tailed, as the network's repositories are (`--sizes heavy`): Pareto with minimum
    /// `min` and tail index `alpha`, capped at `max`; with the defaults ([`Sizes::HEAVY`]) the
    /// median is ≈ 50 records, one account in ≈ 500 has 100k or more.
    Heavy {
        /// The smallest size.
        min: usize,
        /// The tail index (smaller: heavier tail).
        alpha: f64,
        /// The cap.
        max: usize,
    },
}

impl Sizes {
    /// The heavy-tailed defaults: min 20, alpha 0.75, cap 250,000.
    pub const HEAVY: Sizes = Sizes::Heavy {
        min: 20,
        alpha: 0.75,
        max: 250_000,
    };

    /// The size for a draw `u` in (0, 1] (heavy) or rank `r` with factor `u` in [0.5, 1.5)
    /// (ranked), within `(lo, hi)` for the ranked shape.
    fn size(&self, r: usize, u: f64, (lo, hi): (usize, usize)) -> usize {
        match *self {
            Sizes::Ranked => {
                let n = hi as f64 / ((r + 1) as f64).sqrt() * u;
                (n as usize).clamp(lo, hi)
            }
            Sizes::Heavy { min, alpha, max } => {
                // Inverse CDF of Pareto(min, alpha) at 1 - u.
                let n = min as f64 / u.max(f64::MIN_POSITIVE).powf(1.0 / alpha.max(0.01));
                (n.min(max as f64) as usize).clamp(min.max(1), max.max(1))
            }
        }
    }
}

impl Config {
    /// A configuration with the defaults for everything but the contract's arguments.
    pub fn new(seed: u64, accounts: usize, events: u64) -> Config {
        Config {
            seed,
            accounts,
            events,
            adversarial: 0.0,
            keep_records: false,
            big_repo: None,
            threads: 1,
            initial_records: (50, 6000),
            sizes: Sizes::Ranked,
            repos_at: None,
        }
    }
}

/// Per-mille rates of the non-commit frames.
const IDENTITY_PER_MILLE: u32 = 4;
const ACCOUNT_PER_MILLE: u32 = 3;
const SYNC_PER_MILLE: u32 = 2;
/// Frames encoded per batch (signing is spread over threads per batch).
const BATCH: usize = 4096;

struct AccountState {
    account: Account,
    repo: RepoState,
    active: bool,
    clock_id: u16,
    /// A list of the account's (for list items).
    list: Option<String>,
    /// Whether a commit or `#sync` of the account's has been sent (a verifier has its state).
    seen: bool,
}

/// A frame waiting to be signed and encoded.
enum Pending {
    Ready(Vec<u8>),
    Commit(Box<CommitJob>),
}

#[derive(Clone)]
struct CommitJob {
    account: usize,
    seq: i64,
    time: String,
    rev: String,
    since: Option<String>,
    data: CidBuf,
    prev_data: CidBuf,
    ops: Vec<Op>,
    proof: Vec<(CidBuf, Vec<u8>)>,
    records: Vec<(CidBuf, Vec<u8>)>,
    /// A `#sync` frame: the commit block only.
    sync: bool,
    defect: Option<Defect>,
}

/// The simulated network.
pub struct Network {
    cfg: Config,
    rng: ChaCha8Rng,
    accounts: Vec<AccountState>,
    /// Cumulative activity weights (heavy-tailed: a few accounts are very active).
    cumulative: Vec<f64>,
    inactive: Vec<usize>,
    ctx: Context,
    seq: i64,
    now: u64,
    produced: u64,
    adversarial: Vec<AdversarialEntry>,
    defects_made: usize,
    oversized_made: usize,
    /// The copy of a commit a `replayed-commit` sends as the next frame.
    replay_next: Option<Box<CommitJob>>,
    /// Signs every commit: one libsecp256k1 context, blinded once (see [`signer_seed`]).
    signer: Arc<Signer>,
    /// The accounts' identities (as in `accounts`, which never change them), shared with the
    /// threads that sign.
    identities: Arc<[Account]>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("cfg", &self.cfg)
            .field("accounts", &self.accounts.len())
            .field("produced", &self.produced)
            .finish_non_exhaustive()
    }
}

fn sha(data: &[u8]) -> CidBuf {
    CidBuf::sha256(DAG_CBOR, data)
}

/// First relay sequence number (the real capture's neighbourhood).
pub const FIRST_SEQ: i64 = 31_527_015_322;

impl Network {
    /// Creates the accounts and their starting repositories.
    pub fn new(cfg: Config) -> Result<Network, GenError> {
        if cfg.accounts == 0 {
            return Err(GenError::Config("at least one account is needed".into()));
        }
        if !(0.0..=1.0).contains(&cfg.adversarial) {
            return Err(GenError::Config(
                "the adversarial rate is a share from 0 to 1".into(),
            ));
        }
        let (lo, hi) = cfg.initial_records;
        if lo == 0 || hi < lo {
            return Err(GenError::Config(
                "initial records: need 1 <= min <= max".into(),
            ));
        }
        let signer = Arc::new(Signer::new(&signer_seed(cfg.seed)));
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
        let identities: Vec<Account> = (0..cfg.accounts)
            .map(|_| Account::generate(&mut rng))
            .collect();
        let mut ctx = Context::new(identities.iter().map(|a| a.did.clone()).collect());
        ctx.handles = identities.iter().map(|a| a.handle.clone()).collect();
        // Heavy users have big repositories: the most active accounts (lowest index, see
        // `cumulative`) get the largest, which makes proof paths as long as the network's.
        // Sizes fall off as rank^-1/2 (times a random factor), so the total grows as
        // max * sqrt(accounts), not linearly: setup stays cheap for thousands of accounts.
        let mut sizes: Vec<usize> = (0..cfg.accounts)
            .map(|r| match cfg.sizes {
                Sizes::Ranked => cfg.sizes.size(r, rng.gen_range(0.5..1.5), (lo, hi)),
                Sizes::Heavy { .. } => cfg.sizes.size(r, 1.0 - rng.gen::<f64>(), (lo, hi)),
            })
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let mut accounts = Vec::with_capacity(cfg.accounts);
        for (account, n) in identities.into_iter().zip(sizes) {
            let clock_id = rng.gen_range(0..1024);
            let records = initial_records(&mut rng, &mut ctx, &account.did, n.max(1));
            let rev = tid(
                EPOCH_MICROS - rng.gen_range(60_000_000..86_400_000_000),
                clock_id,
            );
            let repo = RepoState::new(records, rev, cfg.keep_records)?;
            accounts.push(AccountState {
                account,
                repo,
                active: true,
                clock_id,
                list: None,
                seen: false,
            });
        }
        let identities: Arc<[Account]> = accounts.iter().map(|a| a.account.clone()).collect();
        let mut cumulative = Vec::with_capacity(accounts.len());
        let mut total = 0.0;
        for i in 0..accounts.len() {
            total += 1.0 / ((i + 1) as f64).powf(0.6);
            cumulative.push(total);
        }
        Ok(Network {
            cfg,
            rng,
            accounts,
            cumulative,
            inactive: Vec::new(),
            ctx,
            seq: FIRST_SEQ - 1,
            now: EPOCH_MICROS,
            produced: 0,
            adversarial: Vec::new(),
            defects_made: 0,
            oversized_made: 0,
            replay_next: None,
            signer,
            identities,
        })
    }

    /// The accounts' identities, in generation order.
    pub fn accounts(&self) -> impl Iterator<Item = &Account> + '_ {
        self.accounts.iter().map(|a| &a.account)
    }

    /// The DIDs of the accounts deactivated now (by an `#account` frame, not yet reactivated).
    pub fn inactive(&self) -> impl Iterator<Item = &str> + '_ {
        self.accounts
            .iter()
            .filter(|a| !a.active)
            .map(|a| a.account.did.as_str())
    }

    /// Frames generated so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// Lets the next [`Network::run`] generate `frames` more, continuing the same stream (seqs,
    /// times and every account's chain go on from where they are).
    pub fn extend(&mut self, frames: u64) {
        self.cfg.events = self.produced + frames;
    }

    /// The frames broken on purpose so far.
    pub fn adversarial(&self) -> &[AdversarialEntry] {
        &self.adversarial
    }

    /// Generates the configured number of frames, handing each to `emit` in order.
    pub fn run<E: From<GenError>>(
        &mut self,
        mut emit: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let threads = self.cfg.threads.max(1);
        if threads == 1 {
            while self.produced < self.cfg.events {
                let pending = self.next_batch()?;
                for f in finish(&self.signer, &self.identities, pending, 1) {
                    emit(&f)?;
                }
            }
            return Ok(());
        }
        // A pipeline: this thread draws batch k + 1 while the others sign and encode batch k.
        let signer = Arc::clone(&self.signer);
        let identities = Arc::clone(&self.identities);
        std::thread::scope(|s| {
            let (job_tx, job_rx) = mpsc::sync_channel::<Vec<Pending>>(1);
            let (out_tx, out_rx) = mpsc::sync_channel::<Vec<Vec<u8>>>(1);
            s.spawn(move || {
                for batch in job_rx {
                    let frames = finish(&signer, &identities, batch, threads - 1);
                    if out_tx.send(frames).is_err() {
                        break;
                    }
                }
            });
            let mut in_flight = 0;
            let emit_next = |emit: &mut dyn FnMut(&[u8]) -> Result<(), E>| {
                let frames = out_rx
                    .recv()
                    .map_err(|_| GenError::Internal("the signing thread stopped".into()))?;
                frames.iter().try_for_each(|f| emit(f))
            };
            while self.produced < self.cfg.events {
                let pending = self.next_batch()?;
                job_tx
                    .send(pending)
                    .map_err(|_| GenError::Internal("the signing thread stopped".into()))?;
                in_flight += 1;
                if in_flight == 2 {
                    emit_next(&mut emit)?;
                    in_flight -= 1;
                }
            }
            drop(job_tx);
            for _ in 0..in_flight {
                emit_next(&mut emit)?;
            }
            Ok(())
        })
    }

    /// The next batch of frames, drawn but not yet signed.
    fn next_batch(&mut self) -> Result<Vec<Pending>, GenError> {
        let n = (self.cfg.events - self.produced).min(BATCH as u64) as usize;
        let mut pending = Vec::with_capacity(n);
        for _ in 0..n {
            pending.push(self.next_frame()?);
        }
        Ok(pending)
    }

    /// Each account's full repository as a CAR (root: a commit signed at its current
    /// revision, identical to its last `#commit`'s when that was its last event), in account
    /// order. Needs [`Config::keep_records`].
    pub fn export_repos(&self) -> impl Iterator<Item = Result<(&str, Vec<u8>), GenError>> + '_ {
        self.accounts.iter().map(|a| {
            let blocks = a.repo.export_blocks()?;
            let (cid, commit) =
                signed_commit(&self.signer, &a.account, &a.repo.rev, a.repo.root, None);
            let mut w = CarWriter::new(&[cid]);
            w.block(cid.as_cid(), &commit);
            for (c, b) in &blocks {
                w.block(c.as_cid(), b);
            }
            Ok((a.account.did.as_str(), w.finish()))
        })
    }

    fn tick(&mut self) -> (i64, String) {
        self.seq += 1;
        self.now += 1000 + self.rng.gen_range(0..1500);
        (self.seq, datetime(self.now))
    }

    fn next_frame(&mut self) -> Result<Pending, GenError> {
        let index = self.produced;
        self.produced += 1;
        let (seq, time) = self.tick();
        if let Some(mut copy) = self.replay_next.take() {
            copy.seq = seq;
            copy.time = time;
            self.label(index, Defect::ReplayedCommit);
            return Ok(Pending::Commit(copy));
        }
        if self.cfg.adversarial > 0.0 && self.rng.gen_bool(self.cfg.adversarial) {
            return self.adversarial_frame(index, seq, time);
        }
        let r = self.rng.gen_range(0..1000);
        if r < IDENTITY_PER_MILLE {
            let i = self.rng.gen_range(0..self.accounts.len());
            let a = &self.accounts[i].account;
            return Ok(Pending::Ready(identity_frame(
                &a.did, &a.handle, seq, &time,
            )));
        }
        if r < IDENTITY_PER_MILLE + ACCOUNT_PER_MILLE {
            return Ok(Pending::Ready(self.account_frame(seq, &time)));
        }
        let i = self.pick_active();
        if r < IDENTITY_PER_MILLE + ACCOUNT_PER_MILLE + SYNC_PER_MILLE {
            return Ok(self.sync(i, seq, time));
        }
        let changes = self.draw_changes(i, None);
        self.commit(i, seq, time, changes, None, true)
    }

    /// A `#sync` of account `i`'s current repository, at a new rev.
    fn sync(&mut self, i: usize, seq: i64, time: String) -> Pending {
        let a = &mut self.accounts[i];
        let rev = tid(self.now, a.clock_id);
        a.repo.rev = rev.clone();
        a.seen = true;
        Pending::Commit(Box::new(CommitJob {
            account: i,
            seq,
            time,
            rev,
            since: None,
            data: a.repo.root,
            prev_data: a.repo.root,
            ops: Vec::new(),
            proof: Vec::new(),
            records: Vec::new(),
            sync: true,
            defect: None,
        }))
    }

    /// A weighted random active account (there is always one: the last is never deactivated).
    fn pick_active(&mut self) -> usize {
        for _ in 0..16 {
            let total = self.cumulative[self.cumulative.len() - 1];
            let x = self.rng.gen_range(0.0..total);
            let i = self
                .cumulative
                .partition_point(|&c| c <= x)
                .min(self.accounts.len() - 1);
            if self.accounts[i].active {
                return i;
            }
        }
        self.accounts.iter().position(|a| a.active).unwrap_or(0)
    }

    fn account_frame(&mut self, seq: i64, time: &str) -> Vec<u8> {
        let cap = (self.accounts.len() / 50).max(1);
        let reactivate = !self.inactive.is_empty()
            && (self.inactive.len() >= cap
                || self.accounts.len() - self.inactive.len() <= 1
                || self.rng.gen_bool(0.5));
        if reactivate {
            let i = self.inactive.remove(0);
            self.accounts[i].active = true;
            account_frame(&self.accounts[i].account.did, true, seq, time)
        } else {
            let i = self.pick_active();
            self.accounts[i].active = false;
            self.inactive.push(i);
            account_frame(&self.accounts[i].account.did, false, seq, time)
        }
    }

    fn rkey(&mut self, i: usize, n: u64) -> String {
        tid(self.now + n, self.accounts[i].clock_id)
    }

    fn new_record(&mut self, i: usize, kind: Kind, n: u64, links: &Links) -> Change {
        let created = self.now.saturating_sub(self.rng.gen_range(0..3_000_000));
        let did = self.accounts[i].account.did.clone();
        let bytes = encode_record(&mut self.rng, &self.ctx, kind, &did, created, links);
        let cid = sha(&bytes);
        let path = if kind.is_singleton() {
            format!("{}/self", kind.nsid())
        } else {
            format!("{}/{}", kind.nsid(), self.rkey(i, n))
        };
        let action = if self.accounts[i].repo.get(&path).is_some() {
            Action::Update
        } else {
            Action::Create
        };
        Change {
            action,
            path,
            record: Some((cid, bytes)),
        }
    }

    /// The ops of one commit of account `i`. `defect` shapes adversarial commits.
    fn draw_changes(&mut self, i: usize, defect: Option<Defect>) -> Vec<Change> {
        if defect == Some(Defect::TooManyOps) {
            return (0..201)
                .map(|n| self.new_record(i, Kind::Like, n, &Links::default()))
                .collect();
        }
        if defect.is_some() {
            return vec![self.new_record(i, Kind::Like, 0, &Links::default())];
        }
        let r = self.rng.gen_range(0..1000);
        if r < 12 {
            return match self.rng.gen_range(0..3) {
                0 => {
                    let post = self.new_record(i, Kind::Post, 0, &Links::default());
                    let uri = format!("at://{}/{}", self.accounts[i].account.did, post.path);
                    let rkey = post
                        .path
                        .rsplit_once('/')
                        .map(|(_, k)| k.to_owned())
                        .unwrap_or_default();
                    let gate_kind = if self.rng.gen_bool(0.8) {
                        Kind::Threadgate
                    } else {
                        Kind::Postgate
                    };
                    let mut gate = self.new_record(
                        i,
                        gate_kind,
                        0,
                        &Links {
                            post: Some(uri),
                            list: None,
                        },
                    );
                    gate.path = format!("{}/{rkey}", gate_kind.nsid());
                    vec![post, gate]
                }
                1 => {
                    let list = self.new_record(i, Kind::List, 0, &Links::default());
                    let uri = format!("at://{}/{}", self.accounts[i].account.did, list.path);
                    self.accounts[i].list = Some(uri.clone());
                    let n = self.rng.gen_range(2..7);
                    let links = Links {
                        post: None,
                        list: Some(uri),
                    };
                    let mut out = vec![list];
                    for k in 1..=n {
                        out.push(self.new_record(i, Kind::ListItem, k, &links));
                    }
                    out
                }
                _ => {
                    let n = self.rng.gen_range(2..5);
                    (0..n)
                        .map(|k| self.new_record(i, Kind::Like, k, &Links::default()))
                        .collect()
                }
            };
        }
        if r < 12 + 27 && self.accounts[i].repo.deletable_len() > 0 {
            let repo = &self.accounts[i].repo;
            let path = repo
                .deletable(self.rng.gen_range(0..repo.deletable_len()))
                .to_owned();
            return vec![Change {
                action: Action::Delete,
                path,
                record: None,
            }];
        }
        if r < 12 + 27 + 13 {
            let mut kind = weighted(&mut self.rng, UPDATE_MIX);
            // An update needs a record to update: a status the account never set, or a list
            // it does not have, is an update of its profile instead (which always exists and
            // is never deleted), not a create (which made updates 0.5% of ops, not 1.3%).
            let missing = match kind {
                Kind::List => self.accounts[i].list.as_deref().is_none_or(|uri| {
                    let path = uri.splitn(4, '/').nth(3).unwrap_or_default();
                    self.accounts[i].repo.get(path).is_none()
                }),
                k if k.is_singleton() => {
                    let path = format!("{}/self", k.nsid());
                    self.accounts[i].repo.get(&path).is_none()
                }
                _ => false,
            };
            if missing {
                kind = Kind::Profile;
            }
            if kind == Kind::List {
                if let Some(uri) = self.accounts[i].list.clone() {
                    let path = uri.splitn(4, '/').nth(3).unwrap_or_default().to_owned();
                    let mut ch = self.new_record(i, Kind::List, 0, &Links::default());
                    if self.accounts[i].repo.get(&path).is_some() {
                        ch.path = path;
                        ch.action = Action::Update;
                    }
                    return vec![ch];
                }
            }
            return vec![self.new_record(i, kind, 0, &Links::default())];
        }
        let kind = weighted(&mut self.rng, CREATE_MIX);
        let links = Links {
            post: None,
            list: self.accounts[i].list.clone(),
        };
        vec![self.new_record(i, kind, 0, &links)]
    }

    fn commit(
        &mut self,
        i: usize,
        seq: i64,
        time: String,
        changes: Vec<Change>,
        defect: Option<Defect>,
        keep: bool,
    ) -> Result<Pending, GenError> {
        let rev = tid(self.now, self.accounts[i].clock_id);
        let since = Some(self.accounts[i].repo.rev.clone());
        let mut p = self.accounts[i].repo.prepare(changes)?;
        let (data, prev_data) = (p.data, p.prev_data);
        let proof = std::mem::take(&mut p.proof);
        // Move the ops and records into the job rather than copying them, except what the
        // repository still needs: record bytes it keeps, ops an abort undoes.
        let (ops, records);
        if keep {
            for op in &p.ops {
                if op.path.starts_with("app.bsky.feed.post/") {
                    if let Some(cid) = op.cid {
                        let uri = format!("at://{}/{}", self.accounts[i].account.did, op.path);
                        self.ctx.add_post(uri, cid.to_string());
                    }
                }
            }
            records = if self.accounts[i].repo.keep_records() {
                p.records.clone()
            } else {
                std::mem::take(&mut p.records)
            };
            self.accounts[i].repo.keep(&mut p, rev.clone())?;
            self.accounts[i].seen = true;
            ops = std::mem::take(&mut p.ops);
        } else {
            ops = p.ops.clone();
            records = std::mem::take(&mut p.records);
            self.accounts[i].repo.abort(p)?;
        }
        Ok(Pending::Commit(Box::new(CommitJob {
            account: i,
            seq,
            time,
            rev,
            since,
            data,
            prev_data,
            ops,
            proof,
            records,
            sync: false,
            defect,
        })))
    }

    /// Records frame `index` as broken by `defect`.
    fn label(&mut self, index: u64, defect: Defect) {
        self.adversarial.push(AdversarialEntry {
            index,
            defect,
            expected_verdict: defect.expected_verdict(),
        });
    }

    /// The next defect of the round-robin that can be made now (see [`crate::adversarial`]),
    /// with the account to make it on.
    fn next_defect(&mut self) -> (Defect, usize) {
        loop {
            let defect = Defect::ALL[self.defects_made % Defect::ALL.len()];
            self.defects_made += 1;
            let i = self.pick_active();
            match defect {
                Defect::OversizedBlocks => {
                    if self.oversized_made < crate::adversarial::MAX_OVERSIZED {
                        self.oversized_made += 1;
                        return (defect, i);
                    }
                }
                Defect::CommitAfterDeactivation => {
                    if let Some(&j) = self.inactive.first() {
                        return (defect, j);
                    }
                }
                // Its chain must be known to a verifier for a gap to show.
                Defect::DroppedCommit => {
                    if self.accounts[i].seen {
                        return (defect, i);
                    }
                }
                _ => return (defect, i),
            }
        }
    }

    fn adversarial_frame(
        &mut self,
        index: u64,
        seq: i64,
        time: String,
    ) -> Result<Pending, GenError> {
        let (defect, i) = self.next_defect();
        match defect {
            Defect::ReplayedCommit => {
                // This commit now, its copy as the next frame (labelled when it is sent).
                let changes = self.draw_changes(i, None);
                let p = self.commit(i, seq, time, changes, None, true)?;
                if let Pending::Commit(job) = &p {
                    self.replay_next = Some(job.clone());
                }
                return Ok(p);
            }
            Defect::DroppedCommit | Defect::SyncAfterGap => {
                // A commit the stream leaves out; then, a millisecond later (a later rev), the
                // account's next commit or a #sync of its new state in its place.
                let changes = self.draw_changes(i, None);
                let _left_out = self.commit(i, seq, time.clone(), changes, None, true)?;
                self.now += 1000;
                self.label(index, defect);
                if defect == Defect::SyncAfterGap {
                    return Ok(self.sync(i, seq, time));
                }
                let changes = self.draw_changes(i, None);
                return self.commit(i, seq, time, changes, None, true);
            }
            Defect::FutureRev | Defect::CommitAfterDeactivation => {
                self.label(index, defect);
                let changes = self.draw_changes(i, Some(defect));
                let mut p = self.commit(i, seq, time, changes, None, false)?;
                if let (Defect::FutureRev, Pending::Commit(job)) = (defect, &mut p) {
                    job.rev = tid(
                        crate::adversarial::FUTURE_REV_MICROS,
                        self.accounts[i].clock_id,
                    );
                }
                return Ok(p);
            }
            _ => self.label(index, defect),
        }
        let mut changes = self.draw_changes(i, Some(defect));
        if defect == Defect::DeepNesting {
            let bytes = crate::adversarial::deep_record();
            changes[0].record = Some((sha(&bytes), bytes));
        }
        self.commit(i, seq, time, changes, Some(defect), false)
    }
}

/// Signs and encodes a batch, on `threads` threads; order kept.
fn finish(
    signer: &Signer,
    identities: &[Account],
    pending: Vec<Pending>,
    threads: usize,
) -> Vec<Vec<u8>> {
    let one = |p: Pending| match p {
        Pending::Ready(b) => b,
        Pending::Commit(job) => encode_commit_job(signer, &identities[job.account], &job),
    };
    let threads = threads.max(1);
    if threads == 1 || pending.len() < 64 {
        return pending.into_iter().map(one).collect();
    }
    let chunk = pending.len().div_ceil(threads);
    let mut parts: Vec<Vec<Pending>> = Vec::new();
    let mut it = pending.into_iter();
    loop {
        let part: Vec<Pending> = it.by_ref().take(chunk).collect();
        if part.is_empty() {
            break;
        }
        parts.push(part);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| s.spawn(move || part.into_iter().map(one).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    })
}

/// The blinding seed of the signing context: derived from the seed (and nothing else, so runs
/// stay reproducible to the byte even if a backend let blinding reach the output, which RFC 6979
/// signing does not), without drawing from the stream's RNG.
fn signer_seed(seed: u64) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"riptide-gen signing context");
    h.update(seed.to_be_bytes());
    h.finalize().into()
}

/// Records of a repository before the stream starts, with creation times in the past.
fn initial_records(
    rng: &mut ChaCha8Rng,
    ctx: &mut Context,
    did: &str,
    n: usize,
) -> Vec<(String, CidBuf, Vec<u8>)> {
    let mut out = Vec::with_capacity(n + 1);
    let span = rng.gen_range(30..900) as u64 * 86_400_000_000;
    let start = EPOCH_MICROS - span - 3_600_000_000;
    let step = (span / n as u64).max(1000);
    let clock = rng.gen_range(0..1024);
    let profile = crate::records::encode(&record(
        rng,
        ctx,
        Kind::Profile,
        did,
        start,
        &Links::default(),
    ));
    out.push((
        "app.bsky.actor.profile/self".to_owned(),
        sha(&profile),
        profile,
    ));
    let mut t = start;
    for _ in 0..n {
        t += rng.gen_range(1..=2 * step);
        let kind = weighted(rng, CREATE_MIX);
        if kind.is_singleton() {
            continue;
        }
        let bytes = encode_record(rng, ctx, kind, did, t, &Links::default());
        out.push((
            format!("{}/{}", kind.nsid(), tid(t, clock)),
            sha(&bytes),
            bytes,
        ));
    }
    out
}

/// The commit block `{did, version: 3, data, rev, prev: null, sig}` and its CID, signed by the
/// account's key (or by `wrong_key`).
fn signed_commit(
    signer: &Signer,
    a: &Account,
    rev: &str,
    data: CidBuf,
    wrong_key: Option<&PrivateKey>,
) -> (CidBuf, Vec<u8>) {
    let mut out = Vec::with_capacity(160);
    commit_fields(&mut out, &a.did, rev, data, None);
    let sig = signer.sign(wrong_key.unwrap_or(&a.key), &out);
    out.clear();
    commit_fields(&mut out, &a.did, rev, data, Some(&sig));
    (sha(&out), out)
}

/// Canonical key order: did, rev, sig, data, prev, version.
pub(crate) fn commit_fields(
    out: &mut Vec<u8>,
    did: &str,
    rev: &str,
    data: CidBuf,
    sig: Option<&[u8; 64]>,
) {
    write_map_header(out, if sig.is_some() { 6 } else { 5 });
    write_text(out, "did");
    write_text(out, did);
    write_text(out, "rev");
    write_text(out, rev);
    if let Some(sig) = sig {
        write_text(out, "sig");
        write_bytes(out, sig);
    }
    write_text(out, "data");
    write_link(out, data.as_cid());
    write_text(out, "prev");
    write_null(out);
    write_text(out, "version");
    write_int(out, 3);
}

/// The frame header, then a payload map of `len` entries starting with `did`, `seq`, `time`
/// (canonical order; the caller writes the rest).
fn event_start(t: &str, len: usize, did: &str, seq: i64, time: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    write_message_header(&mut out, t);
    write_map_header(&mut out, len);
    write_text(&mut out, "did");
    write_text(&mut out, did);
    write_text(&mut out, "seq");
    write_int(&mut out, seq);
    write_text(&mut out, "time");
    write_text(&mut out, time);
    out
}

fn identity_frame(did: &str, handle: &str, seq: i64, time: &str) -> Vec<u8> {
    let mut out = event_start("#identity", 4, did, seq, time);
    write_text(&mut out, "handle");
    write_text(&mut out, handle);
    out
}

fn account_frame(did: &str, active: bool, seq: i64, time: &str) -> Vec<u8> {
    let len = if active { 4 } else { 5 };
    let mut out = event_start("#account", len, did, seq, time);
    write_text(&mut out, "active");
    write_bool(&mut out, active);
    if !active {
        write_text(&mut out, "status");
        write_text(&mut out, "deactivated");
    }
    out
}

fn write_op(out: &mut Vec<u8>, op: &Op) {
    // Canonical order: cid, path, prev, action. Creates have no `prev` (as the relay sends them).
    write_map_header(out, if op.prev.is_some() { 4 } else { 3 });
    write_text(out, "cid");
    match op.cid {
        Some(c) => write_link(out, c.as_cid()),
        None => write_null(out),
    }
    write_text(out, "path");
    write_text(out, &op.path);
    if let Some(p) = op.prev {
        write_text(out, "prev");
        write_link(out, p.as_cid());
    }
    write_text(out, "action");
    write_text(out, op.action.as_str());
}

/// One payload field: its key and how to write its value.
type Field<'a> = (&'static str, Box<dyn Fn(&mut Vec<u8>) + 'a>);

/// Bytes of `value` as an unsigned LEB128 varint.
fn varint_len(mut value: u64) -> usize {
    let mut n = 1;
    while value >= 0x80 {
        value >>= 7;
        n += 1;
    }
    n
}

/// A well-formed `#commit` or `#sync` frame, written in one pass into one buffer of the right
/// size (the CAR straight into the payload's `blocks` field). Same bytes as the general path
/// ([`encode_commit_job`]) without a defect: that is the hot path of every run.
fn encode_plain_job(signer: &Signer, a: &Account, job: &CommitJob) -> Vec<u8> {
    let (cid, commit) = signed_commit(signer, a, &job.rev, job.data, None);
    let header = CarWriter::new(&[cid]).finish();
    let block_len = |c: &CidBuf, d: &[u8]| {
        let n = c.as_cid().as_bytes().len() + d.len();
        varint_len(n as u64) + n
    };
    let mut blocks: Vec<(&CidBuf, &[u8])> = Vec::new();
    if !job.sync {
        blocks.reserve(job.proof.len() + job.records.len() + 1);
        blocks.extend(job.proof.iter().map(|(c, b)| (c, b.as_slice())));
        blocks.extend(job.records.iter().map(|(c, b)| (c, b.as_slice())));
    }
    blocks.push((&cid, &commit));
    let car_len = header.len() + blocks.iter().map(|(c, b)| block_len(c, b)).sum::<usize>();
    let mut out = Vec::with_capacity(car_len + 256 + job.ops.len() * 128);
    let write_blocks = |o: &mut Vec<u8>| {
        write_head(o, 2, car_len as u64);
        o.extend_from_slice(&header);
        for (c, b) in &blocks {
            let c = c.as_cid();
            write_varint(o, (c.as_bytes().len() + b.len()) as u64);
            o.extend_from_slice(c.as_bytes());
            o.extend_from_slice(b);
        }
    };
    let did = a.did.as_str();
    if job.sync {
        write_message_header(&mut out, "#sync");
        write_map_header(&mut out, 5);
        write_text(&mut out, "did");
        write_text(&mut out, did);
        write_text(&mut out, "rev");
        write_text(&mut out, &job.rev);
        write_text(&mut out, "seq");
        write_int(&mut out, job.seq);
        write_text(&mut out, "time");
        write_text(&mut out, &job.time);
        write_text(&mut out, "blocks");
        write_blocks(&mut out);
        return out;
    }
    write_message_header(&mut out, "#commit");
    write_map_header(&mut out, if job.since.is_some() { 12 } else { 11 });
    write_text(&mut out, "ops");
    write_array_header(&mut out, job.ops.len());
    for op in &job.ops {
        write_op(&mut out, op);
    }
    write_text(&mut out, "rev");
    write_text(&mut out, &job.rev);
    write_text(&mut out, "seq");
    write_int(&mut out, job.seq);
    write_text(&mut out, "repo");
    write_text(&mut out, did);
    write_text(&mut out, "time");
    write_text(&mut out, &job.time);
    write_text(&mut out, "blobs");
    write_array_header(&mut out, 0);
    if let Some(since) = &job.since {
        write_text(&mut out, "since");
        write_text(&mut out, since);
    }
    write_text(&mut out, "blocks");
    write_blocks(&mut out);
    write_text(&mut out, "commit");
    write_link(&mut out, cid.as_cid());
    write_text(&mut out, "rebase");
    write_bool(&mut out, false);
    write_text(&mut out, "tooBig");
    write_bool(&mut out, false);
    write_text(&mut out, "prevData");
    write_link(&mut out, job.prev_data.as_cid());
    out
}

fn encode_commit_job(signer: &Signer, a: &Account, job: &CommitJob) -> Vec<u8> {
    if job.defect.is_none() {
        return encode_plain_job(signer, a, job);
    }
    let wrong;
    let wrong_key = if job.defect == Some(Defect::BadSignature) {
        wrong = crate::adversarial::wrong_key(a.key.curve());
        Some(&wrong)
    } else {
        None
    };
    let (cid, commit) = signed_commit(signer, a, &job.rev, job.data, wrong_key);
    let mut car = CarWriter::new(&[cid]);
    if !job.sync {
        let skip_first_node = job.defect == Some(Defect::MissingProofBlock);
        for (c, b) in job.proof.iter().skip(usize::from(skip_first_node)) {
            car.block(c.as_cid(), b);
        }
        for (n, (c, b)) in job.records.iter().enumerate() {
            if n == 0 && job.defect == Some(Defect::ChangedBlockByte) {
                let mut changed = b.clone();
                if let Some(last) = changed.last_mut() {
                    *last ^= 0x01;
                }
                car.block(c.as_cid(), &changed);
            } else {
                car.block(c.as_cid(), b);
            }
        }
        if job.defect == Some(Defect::OversizedBlocks) {
            let filler = vec![0u8; crate::adversarial::OVERSIZED_FILLER];
            let fc = CidBuf::sha256(RAW, &filler);
            car.block(fc.as_cid(), &filler);
        }
    }
    car.block(cid.as_cid(), &commit);
    let blocks = car.finish();
    let mut out = Vec::with_capacity(blocks.len() + 512);
    let t = if job.defect == Some(Defect::UnknownType) {
        "#futureType"
    } else if job.sync {
        "#sync"
    } else {
        "#commit"
    };
    write_message_header(&mut out, t);
    if job.defect == Some(Defect::NonMinimalInt) {
        // The header ends with `op: 1` (one byte, 0x01): re-encode it in a two-byte head
        // (0x18 0x01), valid CBOR but not DAG-CBOR.
        out.pop();
        out.extend_from_slice(&[0x18, 0x01]);
    }
    let did = a.did.as_str();
    let seq = job.seq;
    let write_seq = move |o: &mut Vec<u8>| write_int(o, seq);
    let mut fields: Vec<Field<'_>> = Vec::with_capacity(12);
    if job.sync {
        fields.push(("did", Box::new(move |o| write_text(o, did))));
        fields.push(("rev", Box::new(|o| write_text(o, &job.rev))));
        fields.push(("seq", Box::new(write_seq)));
        fields.push(("time", Box::new(|o| write_text(o, &job.time))));
        fields.push(("blocks", Box::new(|o| write_bytes(o, &blocks))));
    } else {
        let prev_data = if job.defect == Some(Defect::WrongPrevData) {
            sha(format!("not the previous root {seq}").as_bytes())
        } else {
            job.prev_data
        };
        fields.push((
            "ops",
            Box::new(|o| {
                write_array_header(o, job.ops.len());
                for op in &job.ops {
                    write_op(o, op);
                }
            }),
        ));
        fields.push(("rev", Box::new(|o| write_text(o, &job.rev))));
        fields.push(("seq", Box::new(write_seq)));
        fields.push(("repo", Box::new(move |o| write_text(o, did))));
        fields.push(("time", Box::new(|o| write_text(o, &job.time))));
        fields.push(("blobs", Box::new(|o| write_array_header(o, 0))));
        if let Some(since) = &job.since {
            fields.push(("since", Box::new(move |o| write_text(o, since))));
        }
        fields.push(("blocks", Box::new(|o| write_bytes(o, &blocks))));
        fields.push(("commit", Box::new(move |o| write_link(o, cid.as_cid()))));
        fields.push(("rebase", Box::new(|o| write_bool(o, false))));
        fields.push(("tooBig", Box::new(|o| write_bool(o, false))));
        fields.push((
            "prevData",
            Box::new(move |o| write_link(o, prev_data.as_cid())),
        ));
    }
    if job.defect == Some(Defect::UnsortedKeys) {
        fields.reverse();
    }
    write_map_header(&mut out, fields.len());
    for (k, f) in &fields {
        write_text(&mut out, k);
        f(&mut out);
    }
    if job.defect == Some(Defect::Truncated) {
        out.truncate(out.len() * 2 / 3);
    }
    out
}

/// DID documents of `accounts`, keyed by DID (sorted), as `did_docs.json` holds them.
pub fn did_docs<'a>(
    accounts: impl IntoIterator<Item = &'a Account>,
) -> BTreeMap<String, serde_json::Value> {
    accounts
        .into_iter()
        .map(|a| (a.did.clone(), a.did_doc()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::Sizes;

    #[test]
    fn heavy_sizes_are_heavy_tailed() {
        let n = 100_000;
        let mut sizes: Vec<usize> = (0..n)
            .map(|i| Sizes::HEAVY.size(0, (i as f64 + 0.5) / n as f64, (1, 1)))
            .collect();
        sizes.sort_unstable();
        // Pareto(20, 0.75): median 20 * 2^(4/3) ≈ 50; P(≥ 100k) = (20/100k)^0.75 ≈ 0.17%.
        assert!((45..56).contains(&sizes[n / 2]), "{}", sizes[n / 2]);
        let big = sizes.iter().filter(|&&s| s >= 100_000).count();
        assert!((150..185).contains(&big), "{big}");
        assert_eq!(sizes[0], 20);
        assert_eq!(sizes[n - 1], 250_000);
        // The ranked shape is today's: hi / sqrt(rank + 1) times the factor, within bounds.
        assert_eq!(Sizes::Ranked.size(3, 1.0, (50, 6000)), 3000);
        assert_eq!(Sizes::Ranked.size(10_000, 0.5, (50, 6000)), 50);
    }
}
