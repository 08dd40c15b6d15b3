//! A payment provider a test controls: every charge waits until the test lets it through.

use std::path::Path;
use std::sync::Arc;

use boxoffice_engine::payment::{
    BoxFuture, Charge, PaymentError, PaymentProvider, SimulatedConfig, SimulatedProvider,
};
use tokio::sync::Semaphore;

/// The simulated provider (recording in its own sled database), behind a gate: a charge adds
/// a permit to `arrived`, then waits for a permit of `gate`.
pub struct Gated {
    inner: Arc<SimulatedProvider>,
    /// One permit lets one charge through.
    pub gate: Arc<Semaphore>,
    /// One permit per charge that arrived at the gate.
    pub arrived: Arc<Semaphore>,
    _db: boxoffice_engine::raw::sled::Db,
}

impl Gated {
    /// A gated provider recording in `dir`, with its gate closed.
    pub fn open(dir: &Path) -> Arc<Gated> {
        let db = boxoffice_engine::raw::sled::Config::new()
            .path(dir)
            .open()
            .expect("the payments database opens");
        Arc::new(Gated {
            inner: SimulatedProvider::open(&db, SimulatedConfig::default())
                .expect("the simulated provider opens"),
            gate: Arc::new(Semaphore::new(0)),
            arrived: Arc::new(Semaphore::new(0)),
            _db: db,
        })
    }
}

impl PaymentProvider for Gated {
    fn charge<'a>(
        &'a self,
        key: &'a str,
        amount_cents: u64,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Charge, PaymentError>> {
        Box::pin(async move {
            self.arrived.add_permits(1);
            self.gate
                .acquire()
                .await
                .map_err(|e| PaymentError::Unavailable(e.to_string()))?
                .forget();
            self.inner.charge(key, amount_cents, token).await
        })
    }
    fn refund<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Charge, PaymentError>> {
        self.inner.refund(id)
    }
    fn lookup<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Charge>, PaymentError>> {
        self.inner.lookup(key)
    }
    fn charges(&self) -> BoxFuture<'_, Result<Vec<Charge>, PaymentError>> {
        self.inner.charges()
    }
}
