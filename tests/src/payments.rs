//! A payment provider a test controls: every charge waits until the test lets it through, and
//! optionally waits again once the money is captured, before the answer goes back.

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
    /// With [`Gated::hold_after_capture`]: one permit lets one captured charge answer.
    pub after: Arc<Semaphore>,
    /// One permit per charge captured and waiting at `after`.
    pub captured: Arc<Semaphore>,
    hold_after: std::sync::atomic::AtomicBool,
    /// While set, every partial refund fails (the provider is down for refunds).
    pub fail_refunds: std::sync::atomic::AtomicBool,
}

impl Gated {
    /// A gated provider recording in `dir`, with its gate closed.
    pub fn open(dir: &Path) -> Arc<Gated> {
        let store = boxoffice_engine::store::SledKv::open(
            dir,
            64 << 20,
            std::time::Duration::from_secs(10),
        )
        .expect("the payments database opens");
        Arc::new(Gated {
            inner: SimulatedProvider::open(Arc::new(store), SimulatedConfig::default())
                .expect("the simulated provider opens"),
            gate: Arc::new(Semaphore::new(0)),
            arrived: Arc::new(Semaphore::new(0)),
            after: Arc::new(Semaphore::new(0)),
            captured: Arc::new(Semaphore::new(0)),
            hold_after: std::sync::atomic::AtomicBool::new(false),
            fail_refunds: std::sync::atomic::AtomicBool::new(false),
        })
    }
}

impl Gated {
    /// From now on a captured charge also waits at `after` before its answer goes back (the
    /// window between the money taken and the order made).
    pub fn hold_after_capture(&self) {
        self.hold_after
            .store(true, std::sync::atomic::Ordering::SeqCst);
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
            let charged = self.inner.charge(key, amount_cents, token).await;
            if self.hold_after.load(std::sync::atomic::Ordering::SeqCst) {
                self.captured.add_permits(1);
                self.after
                    .acquire()
                    .await
                    .map_err(|e| PaymentError::Unavailable(e.to_string()))?
                    .forget();
            }
            charged
        })
    }
    fn refund<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Charge, PaymentError>> {
        self.inner.refund(id)
    }
    fn refund_part<'a>(
        &'a self,
        payment_id: &'a str,
        key: &'a str,
        amount_cents: u64,
    ) -> BoxFuture<'a, Result<Charge, PaymentError>> {
        if self.fail_refunds.load(std::sync::atomic::Ordering::SeqCst) {
            return Box::pin(async { Err(PaymentError::Unavailable("refunds are down".into())) });
        }
        self.inner.refund_part(payment_id, key, amount_cents)
    }
    fn lookup<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Charge>, PaymentError>> {
        self.inner.lookup(key)
    }
    fn charges(&self) -> BoxFuture<'_, Result<Vec<Charge>, PaymentError>> {
        self.inner.charges()
    }
}
