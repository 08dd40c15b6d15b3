//! A group's majority that the test holds back: an engine opened with [`Majority`] as its
//! `replicate` commits each group commit at once, or, while held back, only once the test lets
//! it through (a leader whose followers have not answered yet).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use boxoffice_engine::StorageError;
use boxoffice_engine::store::{Batch, Replicate, Waiter};

/// See the module.
pub struct Majority {
    open: tokio::sync::watch::Sender<bool>,
    submitted: AtomicU64,
}

impl Majority {
    /// A majority that answers at once.
    pub fn new() -> Arc<Majority> {
        Arc::new(Majority {
            open: tokio::sync::watch::channel(true).0,
            submitted: AtomicU64::new(0),
        })
    }

    /// From now on, group commits wait (until [`Majority::let_through`]).
    pub fn hold_back(&self) {
        self.open.send_replace(false);
    }

    /// Every group commit waiting commits, and the next ones at once.
    pub fn let_through(&self) {
        self.open.send_replace(true);
    }

    /// Group commits submitted so far.
    pub fn submitted(&self) -> u64 {
        self.submitted.load(Ordering::SeqCst)
    }

    /// Returns once `n` group commits have been submitted (polled every 5 ms; the caller's test
    /// has its own bound).
    pub async fn until_submitted(&self, n: u64) {
        while self.submitted() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Replicate for Majority {
    fn submit(
        &self,
        _batch: Batch,
    ) -> Pin<Box<dyn Future<Output = Result<Waiter, StorageError>> + Send + '_>> {
        self.submitted.fetch_add(1, Ordering::SeqCst);
        let mut open = self.open.subscribe();
        Box::pin(async move {
            let waiter: Waiter = Box::pin(async move {
                let _ = open.wait_for(|o| *o).await;
                Ok(None)
            });
            Ok(waiter)
        })
    }
}
