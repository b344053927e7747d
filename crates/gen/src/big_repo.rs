//! One large repository export (`big-repo.car`): a single account with many records, built
//! bottom-up from sorted leaves (`riptide_repo::mst::Builder`), for whole-repository
//! benchmarks. 200,000 records come to about 70 MB, like the largest repositories public
//! benchmarks use.
//!
//! The CAR: root = the signed commit; blocks = the commit, every MST node (root first), every
//! record (in key order).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use riptide_car::CarWriter;
use riptide_cbor::{CidBuf, DAG_CBOR};
use riptide_repo::mst;

use crate::account::Account;
use crate::clock::{tid, EPOCH_MICROS};
use crate::error::GenError;
use crate::records::{record, weighted, Context, Kind, Links, CREATE_MIX};

/// A generated repository export.
#[derive(Debug)]
pub struct BigRepo {
    /// The account (its DID document goes to `big-repo.did.json` and `did_docs.json`).
    pub account: Account,
    /// The CAR bytes.
    pub car: Vec<u8>,
    /// Number of records.
    pub records: usize,
}

/// Stream-independent seed derivation, so `--big-repo` does not change the stream.
const SALT: u64 = 0x6269_672d_7265_706f; // "big-repo"

/// Generates a repository of `n` records for seed `seed`.
pub fn big_repo(seed: u64, n: usize, dids: &[String]) -> Result<BigRepo, GenError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ SALT);
    let account = Account::generate(&mut rng);
    let ctx = Context::new(dids.to_vec());
    let clock = rng.gen_range(0..1024);
    // Records one every ~2 minutes on average, ending an hour before the epoch.
    let mut t = EPOCH_MICROS - (n as u64 + 1) * 120_000_000 - 3_600_000_000;
    let mut leaves: Vec<(String, CidBuf)> = Vec::with_capacity(n);
    let mut bodies: Vec<Vec<u8>> = Vec::with_capacity(n);
    let profile = record(
        &mut rng,
        &ctx,
        Kind::Profile,
        &account.did,
        t,
        &Links::default(),
    )
    .to_cbor();
    leaves.push((
        "app.bsky.actor.profile/self".into(),
        CidBuf::sha256(DAG_CBOR, &profile),
    ));
    bodies.push(profile);
    while leaves.len() < n {
        t += rng.gen_range(1_000_000..240_000_000);
        let kind = weighted(&mut rng, CREATE_MIX);
        if kind.is_singleton() {
            continue;
        }
        let bytes = crate::records::encode(&record(
            &mut rng,
            &ctx,
            kind,
            &account.did,
            t,
            &Links::default(),
        ));
        leaves.push((
            format!("{}/{}", kind.nsid(), tid(t, clock)),
            CidBuf::sha256(DAG_CBOR, &bytes),
        ));
        bodies.push(bytes);
    }
    let mut order: Vec<usize> = (0..leaves.len()).collect();
    order.sort_by(|&a, &b| leaves[a].0.cmp(&leaves[b].0));
    let sorted: Vec<(&str, CidBuf)> = order
        .iter()
        .map(|&i| (leaves[i].0.as_str(), leaves[i].1))
        .collect();
    let (root, mut nodes) = mst::build(&sorted).map_err(|e| GenError::Internal(e.to_string()))?;
    nodes.reverse();
    let rev = tid(EPOCH_MICROS - 60_000_000, clock);
    let mut unsigned = Vec::new();
    crate::network::commit_fields(&mut unsigned, &account.did, &rev, root, None);
    let sig = account.key.sign(&unsigned);
    let mut commit = Vec::new();
    crate::network::commit_fields(&mut commit, &account.did, &rev, root, Some(&sig));
    let cid = CidBuf::sha256(DAG_CBOR, &commit);
    let mut w = CarWriter::new(&[cid]);
    w.block(cid.as_cid(), &commit);
    for (c, b) in &nodes {
        w.block(c.as_cid(), b);
    }
    let mut seen = std::collections::HashSet::new();
    for &i in &order {
        if seen.insert(leaves[i].1) {
            w.block(leaves[i].1.as_cid(), &bodies[i]);
        }
    }
    Ok(BigRepo {
        account,
        car: w.finish(),
        records: leaves.len(),
    })
}
