//! The publish hook: where a batch goes before the local store, when the server is the ingest
//! node of a scale-out deployment (`riptide serve --publish kafka://…`, crate riptide-kafka).
//!
//! Why a trait here: ingest must not know Kafka (dependencies point one way: riptide-kafka
//! depends on this crate), yet the batch's events, the account states its frames changed and the
//! upstream cursor must reach the external log together, exactly once. The writer calls
//! [`Publish::publish`] with the whole batch *before* the store append: once it returns, the
//! batch is committed in the external log, and the local store follows. A crash between the two
//! leaves the external log ahead of the store, never behind, so a restart (or a standby taking
//! over) has one way to recover — catch the store up from the log — and nothing is published
//! twice or lost.
//!
//! The batch's changes to the resync partition (accounts queued for resync after a chain break,
//! the frames held for them, their release: `crate::resync`) go with it: they are written in the
//! same store batch as the upstream cursor that passes the held frames, so a node that takes
//! over from the external log must get them too, or the held frames would be behind its cursor
//! and never served. So do its backfill progress entries (the `backfill` partition: a landed
//! repository's DID and outcome, `riptide_backfill::landed_in`), written in the same store batch
//! as the repository's rows: a node that took over from the external log knows which
//! repositories landed, as the node that landed them does.

use riptide_firehose::chain::AccountState;
use riptide_segment::Row;

use crate::Event;
use riptide_store::store::{PendingChange, Resume};

/// Where verified batches are published before they are stored.
pub trait Publish: Send + std::fmt::Debug {
    /// Publishes one batch atomically: `events` (in seq order), each event's `.jss` row when
    /// ingest made one for every event of the batch (`rows`, one per event, as the store gets
    /// them: what a store of layout 5 seals into row blocks, so that a node reading the external
    /// log stores rows too, not only JSON), the chain states of the accounts its frames changed,
    /// its changes to the resync partition (`pending`, in the order the store applies them), its
    /// backfill progress entries (`progress`, (key, value) of the store's `backfill` partition),
    /// and `resume`, the position after it. Retries transient failures itself; an error is final
    /// (e.g. another ingest node took over) and stops ingest before the batch is stored.
    fn publish(
        &mut self,
        events: &[Event],
        rows: Option<&[Row<'_>]>,
        accounts: &[(Box<str>, AccountState)],
        pending: &[PendingChange],
        progress: &[(Box<str>, Vec<u8>)],
        resume: &Resume,
    ) -> Result<(), PublishError>;
}

/// A batch could not be published and never will be by this process.
#[derive(Debug, thiserror::Error)]
#[error("publishing to {target}: {reason}")]
pub struct PublishError {
    /// Where to (e.g. the Kafka topic).
    pub target: String,
    /// Why, for the operator.
    pub reason: String,
}
