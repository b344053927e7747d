//! Per-DID ordered parallel processing: events of one DID are handled in order, events of
//! different DIDs in parallel, with bounded memory.
//!
//! Each DID is hashed to one of N workers; a worker handles its queue in order, so two events of
//! one DID are never handled concurrently or out of order. Queues are bounded: [`PerDid::submit`]
//! waits while the chosen worker's queue is full (backpressure reaches the stream reader, which
//! stops reading the socket). The cost of this simplicity: DIDs sharing a worker also wait behind
//! each other (head-of-line blocking within a worker, never across workers).

use std::future::Future;
use std::hash::{DefaultHasher, Hash, Hasher};

use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::ClientError;

/// A pool of ordered workers. `T` is the work item (e.g. a `FirehoseEvent`).
#[derive(Debug)]
pub struct PerDid<T> {
    senders: Vec<mpsc::Sender<T>>,
    tasks: JoinSet<()>,
}

impl<T: Send + 'static> PerDid<T> {
    /// `workers` tasks, each with a queue of `queue` items, running `handler` on each item.
    pub fn new<F, Fut>(workers: usize, queue: usize, handler: F) -> PerDid<T>
    where
        F: Fn(T) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut senders = Vec::new();
        let mut tasks = JoinSet::new();
        for _ in 0..workers.max(1) {
            let (tx, mut rx) = mpsc::channel::<T>(queue.max(1));
            let h = handler.clone();
            tasks.spawn(async move {
                while let Some(item) = rx.recv().await {
                    h(item).await;
                }
            });
            senders.push(tx);
        }
        PerDid { senders, tasks }
    }

    /// The worker a DID goes to.
    pub fn worker_of(&self, did: &str) -> usize {
        let mut h = DefaultHasher::new();
        did.hash(&mut h);
        (h.finish() % self.senders.len() as u64) as usize
    }

    /// Queues an item for the DID's worker, waiting while that queue is full.
    pub async fn submit(&self, did: &str, item: T) -> Result<(), ClientError> {
        let w = self.worker_of(did);
        self.senders[w]
            .send(item)
            .await
            .map_err(|_| ClientError::Closed)
    }

    /// Closes the queues and waits until every queued item has been handled.
    pub async fn finish(mut self) {
        self.senders.clear();
        while self.tasks.join_next().await.is_some() {}
    }
}
