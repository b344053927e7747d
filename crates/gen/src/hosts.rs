//! Which PDS host each account lives on: a skewed, deterministic split of a network's accounts
//! over `n` hosts, for `riptide sim --hosts N`.
//!
//! Why: the real network is one very large host (Bluesky's own PDSes, about 1.1M accounts of
//! the ≈40M behind one rate limit) and thousands of small ones; a backfill's wall time is set by
//! the largest host's accounts divided by its per-client rate limit, so a test network must have
//! that shape. Host 0 takes `share` of the accounts; the others split the rest with weights
//! 1/k (host k, k ≥ 1: a few medium hosts, a long tail of small ones).
//!
//! Determinism: the host of an account depends only on its DID, `n`, `share` and the seed (a
//! SplitMix64 hash of the DID's bytes), not on which other accounts exist or their order, so a
//! network grown by more accounts keeps every existing account where it was.

/// The default share of the accounts on host 0.
pub const DEFAULT_SHARE: f64 = 0.5;

/// SplitMix64's finaliser: a well-mixed 64-bit hash step.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A 64-bit hash of `bytes` under `seed` (deterministic across runs and machines).
pub fn hash(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = mix(seed ^ bytes.len() as u64);
    for chunk in bytes.chunks(8) {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        h = mix(h ^ u64::from_le_bytes(w));
    }
    h
}

/// A number in [0, 1) from a hash.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// How accounts are spread over hosts.
#[derive(Clone, Debug, PartialEq)]
pub struct HostSplit {
    hosts: usize,
    share: f64,
    seed: u64,
    /// Cumulative weights of hosts 1..n (1/k), normalised to end at 1.
    tail: Vec<f64>,
}

impl HostSplit {
    /// `hosts` hosts (at least 1), host 0 taking `share` (clamped to [0, 1]) of the accounts.
    pub fn new(hosts: usize, share: f64, seed: u64) -> HostSplit {
        let hosts = hosts.max(1);
        let share = if share.is_finite() {
            share.clamp(0.0, 1.0)
        } else {
            DEFAULT_SHARE
        };
        let mut tail = Vec::with_capacity(hosts.saturating_sub(1));
        let mut total = 0.0;
        for k in 1..hosts {
            total += 1.0 / k as f64;
            tail.push(total);
        }
        for w in &mut tail {
            *w /= total;
        }
        HostSplit {
            hosts,
            share,
            seed,
            tail,
        }
    }

    /// The number of hosts.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// The host (0-based) of the account `did`.
    pub fn host_of(&self, did: &str) -> usize {
        if self.hosts == 1 {
            return 0;
        }
        let h = hash(self.seed, did.as_bytes());
        if unit(h) < self.share {
            return 0;
        }
        let u = unit(mix(h));
        1 + self.tail.partition_point(|&c| c <= u).min(self.hosts - 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dids(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("did:plc:{i:024}")).collect()
    }

    #[test]
    fn skewed_and_deterministic() {
        let split = HostSplit::new(20, 0.5, 7);
        let mut counts = vec![0usize; 20];
        let all = dids(20_000);
        for d in &all {
            counts[split.host_of(d)] += 1;
        }
        // Host 0: half, within sampling error (σ ≈ 71 at n = 20,000).
        assert!((9_700..10_300).contains(&counts[0]), "{counts:?}");
        // The rest fall off as 1/k: host 1 has about 19/… the weight of host 19.
        assert!(counts[1] > 4 * counts[19], "{counts:?}");
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        // Same inputs, same host; another seed moves accounts.
        let again = HostSplit::new(20, 0.5, 7);
        assert!(all.iter().all(|d| split.host_of(d) == again.host_of(d)));
        let other = HostSplit::new(20, 0.5, 8);
        assert!(all.iter().any(|d| split.host_of(d) != other.host_of(d)));
    }

    #[test]
    fn one_host_and_edges() {
        let one = HostSplit::new(1, 0.5, 1);
        assert!(dids(100).iter().all(|d| one.host_of(d) == 0));
        let none_on_0 = HostSplit::new(3, 0.0, 1);
        assert!(dids(1000).iter().all(|d| none_on_0.host_of(d) != 0));
        let all_on_0 = HostSplit::new(3, 1.0, 1);
        assert!(dids(1000).iter().all(|d| all_on_0.host_of(d) == 0));
        assert_eq!(HostSplit::new(0, 0.5, 1).hosts(), 1);
    }
}
