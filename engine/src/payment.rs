//! Payments: the [`PaymentProvider`] trait and the built-in [`SimulatedProvider`].
//!
//! A real provider (Stripe, Adyen, ...) plugs in behind the same trait: `charge` must be
//! idempotent by key (the provider's own idempotency key: the same key never charges twice and
//! returns the first result), `lookup` finds a charge by that key, `refund` refunds a captured
//! charge, and `charges` lists them for reconciliation (a real provider would page through its
//! settlement report).
//!
//! The simulated provider keeps its own durable record of charges (the `payments` tree of the
//! data dir, flushed before it answers), and follows the contract's token conventions: any
//! `tok_...` token succeeds except `tok_decline` (declined), `tok_timeout` (the charge is made but
//! the answer is lost: a retry with the same key finds it captured) and `tok_error` (the provider
//! fails; nothing is charged). A configurable latency range and decline rate serve load runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::codec;
use crate::store::{Kv, KvTree};

/// A boxed future, for the object-safe trait.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where a charge stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChargeStatus {
    /// Money taken.
    Captured,
    /// Refused by the card's issuer.
    Declined,
    /// Taken, then given back.
    Refunded,
}

/// A charge as the provider records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The provider's id of the charge.
    pub payment_id: String,
    /// The idempotency key it was made with.
    pub key: String,
    /// Amount, cents.
    pub amount_cents: u64,
    /// Status.
    pub status: ChargeStatus,
}

/// Why a payment call did not give an answer to act on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PaymentError {
    /// Declined: a definite no.
    #[error("declined")]
    Declined,
    /// No answer in time; the charge may or may not have happened (look it up).
    #[error("the payment provider did not answer in time")]
    Timeout,
    /// The provider failed.
    #[error("the payment provider failed: {0}")]
    Unavailable(String),
    /// Not a token this provider takes.
    #[error("invalid payment token")]
    InvalidToken,
    /// No such charge (refund of an unknown id).
    #[error("no such charge")]
    NotFound,
}

/// A payment provider. See the module docs for what each call must guarantee.
pub trait PaymentProvider: Send + Sync + 'static {
    /// Charges `amount_cents` to `token`, idempotently by `key`.
    fn charge<'a>(
        &'a self,
        key: &'a str,
        amount_cents: u64,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Charge, PaymentError>>;
    /// Refunds a captured charge (idempotent: refunding a refunded charge answers it again).
    fn refund<'a>(&'a self, payment_id: &'a str) -> BoxFuture<'a, Result<Charge, PaymentError>>;
    /// Refunds part of a captured charge (tickets given back), idempotently by `key` (the same
    /// key never refunds twice and answers the first refund). The refund is a record of its
    /// own: its `payment_id` is the refund's id, its `key` the one given, its status
    /// `Refunded`; the charge stays `Captured` with its amount. `lookup(key)` finds it.
    fn refund_part<'a>(
        &'a self,
        payment_id: &'a str,
        key: &'a str,
        amount_cents: u64,
    ) -> BoxFuture<'a, Result<Charge, PaymentError>>;
    /// The charge made with `key`, if any.
    fn lookup<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Charge>, PaymentError>>;
    /// Every charge (for reconciliation).
    fn charges(&self) -> BoxFuture<'_, Result<Vec<Charge>, PaymentError>>;
}

/// How the simulated provider behaves.
#[derive(Clone, Debug)]
pub struct SimulatedConfig {
    /// Latency of a charge, drawn uniformly from this range.
    pub latency: (Duration, Duration),
    /// Share of otherwise good tokens declined (for load runs).
    pub decline_rate: f64,
}

impl Default for SimulatedConfig {
    fn default() -> Self {
        SimulatedConfig {
            latency: (Duration::ZERO, Duration::ZERO),
            decline_rate: 0.0,
        }
    }
}

/// The built-in simulated provider (see the module docs).
pub struct SimulatedProvider {
    store: Arc<dyn Kv>,
    by_key: Arc<dyn KvTree>,
    by_id: Arc<dyn KvTree>,
    config: SimulatedConfig,
    /// Serializes the charges and refunds of one key (the idempotency check and the record are
    /// one step), by stripes: calls for other keys go on meanwhile (on a cluster leader, where
    /// a record waits for its Raft commit, one lock for all would allow one commit at a time).
    locks: Vec<tokio::sync::Mutex<()>>,
    /// Group commit of the record: see [`SimulatedProvider::flush`].
    flushes: GroupFlush,
    /// A cluster leader's: the record is replicated through its group (and applied to these
    /// trees by the state machine) instead of written here.
    replicate: Option<Arc<dyn crate::store::Replicate>>,
}

/// One fsync for every caller waiting at once. Callers take a ticket after their write; the
/// one flusher at a time reads the last ticket before it flushes, so its flush covers every
/// write with a ticket up to there, and those callers return without flushing again.
#[derive(Default)]
struct GroupFlush {
    requested: std::sync::atomic::AtomicU64,
    done: std::sync::atomic::AtomicU64,
    flusher: tokio::sync::Mutex<()>,
}

impl GroupFlush {
    /// Returns once a `flush` that started after this call has succeeded.
    async fn run<F, Fut, E>(&self, flush: F) -> Result<(), E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<(), E>>,
    {
        use std::sync::atomic::Ordering;
        let ticket = self.requested.fetch_add(1, Ordering::AcqRel) + 1;
        let _turn = self.flusher.lock().await;
        if self.done.load(Ordering::Acquire) >= ticket {
            return Ok(());
        }
        let upto = self.requested.load(Ordering::Acquire);
        flush().await?;
        self.done.fetch_max(upto, Ordering::AcqRel);
        Ok(())
    }
}

/// Stripes of [`SimulatedProvider`]'s per-key lock.
const LOCK_STRIPES: usize = 256;

fn io(e: crate::error::StorageError) -> PaymentError {
    PaymentError::Unavailable(e.to_string())
}

impl SimulatedProvider {
    /// A provider keeping its record in the `payments` trees of `store`.
    pub fn open(
        store: Arc<dyn Kv>,
        config: SimulatedConfig,
    ) -> Result<Arc<SimulatedProvider>, PaymentError> {
        SimulatedProvider::open_replicated(store, config, None)
    }

    /// [`SimulatedProvider::open`] on a cluster node leading its group: every change of the
    /// record is committed through `replicate` (so the next leader knows every charge), and
    /// read from `store`, where the group's state machine applies it.
    pub fn open_replicated(
        store: Arc<dyn Kv>,
        config: SimulatedConfig,
        replicate: Option<Arc<dyn crate::store::Replicate>>,
    ) -> Result<Arc<SimulatedProvider>, PaymentError> {
        Ok(Arc::new(SimulatedProvider {
            by_key: store.tree(crate::store::names::PAYMENTS).map_err(io)?,
            by_id: store
                .tree(crate::store::names::PAYMENTS_BY_ID)
                .map_err(io)?,
            store,
            config,
            locks: (0..LOCK_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            flushes: GroupFlush::default(),
            replicate,
        }))
    }

    /// Reads every record of the provider's tables: `Err` names the first that does not decode
    /// (damage) or that the other table does not agree with.
    pub fn check_record(&self) -> Result<(), String> {
        use std::ops::Bound::Unbounded;
        // Each pair borrowed from the store as it is walked; only the keys are kept.
        let mut damage: Option<String> = None;
        let mut recorded: std::collections::HashSet<Vec<u8>> = std::collections::HashSet::new();
        self.by_key
            .visit_range(Unbounded, Unbounded, &mut |key, value| {
                let key = String::from_utf8_lossy(key);
                let found = match codec::decode::<Charge>(value) {
                    Err(e) => format!("table `payments`: the charge of key {key} is damaged: {e}"),
                    Ok(charge) if charge.key != key => format!(
                        "table `payments`: the charge at key {key} says it is {}'s",
                        charge.key
                    ),
                    Ok(_) => {
                        recorded.insert(key.as_bytes().to_vec());
                        return Ok(());
                    }
                };
                damage = Some(found);
                Err(crate::error::StorageError::Io("damage found".into()))
            })
            .map_err(|e| {
                damage
                    .take()
                    .unwrap_or_else(|| format!("table `payments`: {e}"))
            })?;
        // A set, not a scan of `by_key` per payment: that made a start with a million records
        // quadratic (82 s at 166,667 charges).
        self.by_id
            .visit_range(Unbounded, Unbounded, &mut |id, key| {
                if recorded.contains(key) {
                    return Ok(());
                }
                let id = String::from_utf8_lossy(id);
                damage = Some(format!(
                    "table `payments_by_id`: payment {id} names a charge that is not recorded"
                ));
                Err(crate::error::StorageError::Io("damage found".into()))
            })
            .map_err(|e| {
                damage
                    .take()
                    .unwrap_or_else(|| format!("table `payments_by_id`: {e}"))
            })
    }

    /// The lock of `key`'s stripe.
    async fn lock(&self, key: &str) -> tokio::sync::MutexGuard<'_, ()> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hash = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(key);
        let stripe = usize::try_from(hash % LOCK_STRIPES as u64).unwrap_or(0);
        self.locks[stripe].lock().await
    }

    fn get(&self, key: &str) -> Result<Option<Charge>, PaymentError> {
        match self.by_key.get(key.as_bytes()).map_err(io)? {
            None => Ok(None),
            Some(b) => codec::decode(&b)
                .map(Some)
                .map_err(|e| PaymentError::Unavailable(format!("payment record: {e}"))),
        }
    }

    /// Records `c`: written here (durable at the next [`SimulatedProvider::flush`]), or, on a
    /// cluster leader, committed through its group before this returns.
    async fn put(&self, c: &Charge) -> Result<(), PaymentError> {
        let Some(replicate) = self.replicate.clone() else {
            return self.put_here(c);
        };
        let put = |table: &str, key: &str, value: Vec<u8>| crate::store::Op::Put {
            table: table.to_owned(),
            key: key.as_bytes().to_vec(),
            value,
        };
        let batch = crate::store::Batch {
            term: 0, // the replicator stamps it
            ops: vec![
                put(crate::store::names::PAYMENTS, &c.key, codec::encode(c)),
                put(
                    crate::store::names::PAYMENTS_BY_ID,
                    &c.payment_id,
                    c.key.as_bytes().to_vec(),
                ),
            ],
        };
        replicate
            .commit(batch)
            .await
            .map(|_| ())
            .map_err(|e| PaymentError::Unavailable(format!("payment record: {e}")))
    }

    fn put_here(&self, c: &Charge) -> Result<(), PaymentError> {
        self.by_key
            .insert(c.key.as_bytes(), &codec::encode(c))
            .map_err(io)?;
        self.by_id
            .insert(c.payment_id.as_bytes(), c.key.as_bytes())
            .map_err(io)?;
        Ok(())
    }

    /// Makes every record so far durable. The fsync runs off the runtime's workers, outside the
    /// record lock, and is shared: charges that wait while one flush runs are covered by the
    /// next one (without this, concurrent confirms queued one fsync each inside sled).
    async fn flush(&self) -> Result<(), PaymentError> {
        if self.replicate.is_some() {
            // Committed by the group before `put` returned.
            return Ok(());
        }
        self.flushes
            .run(|| async {
                let store = self.store.clone();
                crate::rt::blocking(move || store.sync())
                    .await
                    .map_err(PaymentError::Unavailable)?
                    .map_err(io)?;
                Ok(())
            })
            .await
    }

    fn latency(&self) -> Duration {
        let (lo, hi) = self.config.latency;
        if hi <= lo {
            return lo;
        }
        let span = (hi - lo).as_micros();
        let pick = u128::from(rand_u64()) % span.max(1);
        lo + Duration::from_micros(u64::try_from(pick).unwrap_or(0))
    }
}

fn rand_u64() -> u64 {
    crate::rt::random_u64()
}

impl PaymentProvider for SimulatedProvider {
    fn charge<'a>(
        &'a self,
        key: &'a str,
        amount_cents: u64,
        token: &'a str,
    ) -> BoxFuture<'a, Result<Charge, PaymentError>> {
        Box::pin(async move {
            if !token.starts_with("tok_") {
                return Err(PaymentError::InvalidToken);
            }
            let delay = self.latency();
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let _guard = self.lock(key).await;
            if let Some(c) = self.get(key)? {
                // Idempotent by key: the first result, whatever the token now (made durable
                // first: its first caller may still be flushing it).
                drop(_guard);
                self.flush().await?;
                return match c.status {
                    ChargeStatus::Declined => Err(PaymentError::Declined),
                    _ => Ok(c),
                };
            }
            if token == "tok_error" {
                return Err(PaymentError::Unavailable(
                    "simulated provider failure".into(),
                ));
            }
            let declined = token == "tok_decline"
                || (self.config.decline_rate > 0.0
                    && (rand_u64() as f64 / u64::MAX as f64) < self.config.decline_rate);
            let charge = Charge {
                payment_id: format!("pay_{}", crate::rt::ulid()),
                key: key.to_owned(),
                amount_cents,
                status: if declined {
                    ChargeStatus::Declined
                } else {
                    ChargeStatus::Captured
                },
            };
            self.put(&charge).await?;
            drop(_guard);
            self.flush().await?;
            metrics::counter!("boxoffice_payment_charges_total", "outcome" => if declined { "declined" } else { "captured" })
                .increment(1);
            if declined {
                return Err(PaymentError::Declined);
            }
            if token == "tok_timeout" {
                // Charged, but the answer is lost on the way back.
                return Err(PaymentError::Timeout);
            }
            Ok(charge)
        })
    }

    fn refund<'a>(&'a self, payment_id: &'a str) -> BoxFuture<'a, Result<Charge, PaymentError>> {
        Box::pin(async move {
            // A payment's key never changes: read without the lock, then lock the key.
            let key = self
                .by_id
                .get(payment_id.as_bytes())
                .map_err(io)?
                .ok_or(PaymentError::NotFound)?;
            let key = String::from_utf8_lossy(&key).into_owned();
            let _guard = self.lock(&key).await;
            let mut c = self.get(&key)?.ok_or(PaymentError::NotFound)?;
            match c.status {
                ChargeStatus::Refunded => Ok(c),
                ChargeStatus::Declined => Err(PaymentError::NotFound),
                ChargeStatus::Captured => {
                    c.status = ChargeStatus::Refunded;
                    self.put(&c).await?;
                    drop(_guard);
                    self.flush().await?;
                    metrics::counter!("boxoffice_payment_refunds_total").increment(1);
                    Ok(c)
                }
            }
        })
    }

    fn refund_part<'a>(
        &'a self,
        payment_id: &'a str,
        key: &'a str,
        amount_cents: u64,
    ) -> BoxFuture<'a, Result<Charge, PaymentError>> {
        Box::pin(async move {
            let _guard = self.lock(key).await;
            if let Some(done) = self.get(key)? {
                return Ok(done);
            }
            let charge_key = self
                .by_id
                .get(payment_id.as_bytes())
                .map_err(io)?
                .ok_or(PaymentError::NotFound)?;
            let charge = self
                .get(&String::from_utf8_lossy(&charge_key))?
                .ok_or(PaymentError::NotFound)?;
            if charge.status != ChargeStatus::Captured || amount_cents > charge.amount_cents {
                return Err(PaymentError::Unavailable(format!(
                    "cannot refund {amount_cents} of payment {payment_id} ({:?}, {})",
                    charge.status, charge.amount_cents
                )));
            }
            let refund = Charge {
                payment_id: format!("rf_{}", crate::rt::ulid()),
                key: key.to_owned(),
                amount_cents,
                status: ChargeStatus::Refunded,
            };
            self.put(&refund).await?;
            drop(_guard);
            self.flush().await?;
            metrics::counter!("boxoffice_payment_refunds_total").increment(1);
            Ok(refund)
        })
    }

    fn lookup<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Charge>, PaymentError>> {
        Box::pin(async move { self.get(key) })
    }

    fn charges(&self) -> BoxFuture<'_, Result<Vec<Charge>, PaymentError>> {
        Box::pin(async move {
            let mut out = Vec::new();
            for (_, v) in self.by_key.pairs().map_err(io)? {
                out.push(
                    codec::decode(&v)
                        .map_err(|e| PaymentError::Unavailable(format!("payment record: {e}")))?,
                );
            }
            Ok(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn token_conventions_and_idempotency_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SledKv::open(dir.path(), 16 << 20, Duration::ZERO).unwrap();
        let p = SimulatedProvider::open(Arc::new(store), SimulatedConfig::default()).unwrap();
        let a = p.charge("k1", 100, "tok_visa").await.unwrap();
        assert_eq!(a.status, ChargeStatus::Captured);
        assert_eq!(
            p.charge("k1", 100, "tok_visa").await.unwrap(),
            a,
            "same key, same charge"
        );
        assert_eq!(
            p.charge("k2", 100, "tok_decline").await,
            Err(PaymentError::Declined)
        );
        assert_eq!(
            p.charge("k2", 100, "tok_decline").await,
            Err(PaymentError::Declined)
        );
        assert_eq!(
            p.charge("k3", 100, "tok_timeout").await,
            Err(PaymentError::Timeout)
        );
        let t = p.charge("k3", 100, "tok_timeout").await.unwrap();
        assert_eq!(
            t.status,
            ChargeStatus::Captured,
            "the lost answer is found on retry"
        );
        assert!(matches!(
            p.charge("k4", 100, "tok_error").await,
            Err(PaymentError::Unavailable(_))
        ));
        assert_eq!(
            p.lookup("k4").await.unwrap(),
            None,
            "an error charges nothing"
        );
        assert_eq!(
            p.charge("k5", 100, "visa").await,
            Err(PaymentError::InvalidToken)
        );
        let r = p.refund(&a.payment_id).await.unwrap();
        assert_eq!(r.status, ChargeStatus::Refunded);
        assert_eq!(p.refund(&a.payment_id).await.unwrap(), r);
        let all = p.charges().await.unwrap();
        assert_eq!(all.len(), 3, "k1, k2 (declined), k3");
    }

    /// The start's check of the record: clean when both tables agree, and each kind of damage
    /// named (a charge that does not decode, one kept under another key, a payment id naming
    /// a charge that is not there).
    #[tokio::test]
    async fn the_record_check_names_each_kind_of_damage() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SledKv::open(dir.path(), 16 << 20, Duration::ZERO).unwrap();
        let store: Arc<dyn Kv> = Arc::new(store);
        let p = SimulatedProvider::open(store.clone(), SimulatedConfig::default()).unwrap();
        for k in 0..50 {
            p.charge(&format!("k{k}"), 100, "tok_visa").await.unwrap();
        }
        assert_eq!(p.check_record(), Ok(()));
        let by_key = store.tree(crate::store::names::PAYMENTS).unwrap();
        let by_id = store.tree(crate::store::names::PAYMENTS_BY_ID).unwrap();

        by_id.insert(b"pay_orphan", b"k-missing").unwrap();
        let err = p.check_record().unwrap_err();
        assert!(
            err.contains("pay_orphan names a charge that is not recorded"),
            "{err}"
        );
        by_id.remove(b"pay_orphan").unwrap();
        assert_eq!(p.check_record(), Ok(()));

        let k7 = by_key.get(b"k7").unwrap().unwrap();
        by_key.insert(b"k7", b"not a charge").unwrap();
        let err = p.check_record().unwrap_err();
        assert!(err.contains("the charge of key k7 is damaged"), "{err}");
        by_key.insert(b"k7", &k7).unwrap();
        assert_eq!(p.check_record(), Ok(()));

        by_key.insert(b"k7-copy", &k7).unwrap();
        let err = p.check_record().unwrap_err();
        assert!(
            err.contains("the charge at key k7-copy says it is k7's"),
            "{err}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_flush_covers_every_write_made_before_it_started() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let group = Arc::new(GroupFlush::default());
        let written = Arc::new(AtomicU64::new(0));
        let durable = Arc::new(AtomicU64::new(0));
        let flushes = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..100 {
            let (group, written, durable, flushes) = (
                group.clone(),
                written.clone(),
                durable.clone(),
                flushes.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mine = written.fetch_add(1, Ordering::AcqRel) + 1;
                group
                    .run(|| async {
                        // What this flush makes durable: every write made before it started.
                        let covered = written.load(Ordering::Acquire);
                        flushes.fetch_add(1, Ordering::AcqRel);
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                        durable.fetch_max(covered, Ordering::AcqRel);
                        Ok::<(), ()>(())
                    })
                    .await
                    .unwrap();
                assert!(
                    durable.load(Ordering::Acquire) >= mine,
                    "returned before durable"
                );
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let n = flushes.load(Ordering::Acquire);
        assert!(
            (1..50).contains(&n),
            "100 concurrent writers shared flushes: {n}"
        );
        // A failed flush is reported to its caller and counts for nobody.
        let failed = group.run(|| async { Err::<(), &str>("disk gone") }).await;
        assert_eq!(failed, Err("disk gone"));
        assert!(group.run(|| async { Ok::<(), &str>(()) }).await.is_ok());
    }
}
