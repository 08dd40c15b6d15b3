//! Opening the engine's log: the sink, the payment provider beside it, and the replay that
//! rebuilds the state (keeping the log's files as evidence when it finds damage). What
//! [`Engine::open`](crate::Engine::open) calls before it starts the actors.

use std::sync::Arc;
use std::time::Duration;

use crate::config::EngineConfig;
use crate::error::{EngineError, StorageError};
use crate::payment::{PaymentProvider, SimulatedProvider};
use crate::recovery::{RecoverWith, Recovered, RecoveryReport, recover};
use crate::store::{LogSink, SledSink};

/// How long opening waits for a sled lock a previous instance still holds.
const SLED_LOCK_WAIT: Duration = Duration::from_secs(10);

/// The sink `config` asks for: its own, or sled in the data dir (opened off the runtime).
pub(crate) async fn open_sink(config: &EngineConfig) -> Result<Arc<dyn LogSink>, EngineError> {
    if let Some(sink) = &config.sink {
        return Ok(sink.clone());
    }
    let dir = config.data_dir.clone();
    let sink = crate::rt::blocking(move || SledSink::open(&dir, SLED_LOCK_WAIT))
        .await
        .map_err(|e| StorageError::Io(format!("opening the log: {e}")))??;
    Ok(Arc::new(sink))
}

/// The payment provider: the configured one, or the simulated one recording beside the log in
/// its store, with what the check of its record found ([`checked_payments`] acts on it). A log
/// outside a [`Kv`](crate::store::Kv) store has no durable place for the simulated provider's
/// record, so it needs a provider configured (charges must outlive a restart). The check reads
/// the whole record (a table of every charge) off the runtime: [`Engine::open`](crate::Engine::open)
/// runs it beside the log's replay.
pub(crate) async fn open_payments(
    config: &EngineConfig,
    sink: &dyn LogSink,
) -> Result<(Arc<dyn PaymentProvider>, Result<(), String>), EngineError> {
    if let Some(p) = &config.payments {
        return Ok((p.clone(), Ok(())));
    }
    let kv = sink.kv().ok_or_else(|| StorageError::Open {
        path: String::new(),
        reason: "a log outside a key-value store needs EngineConfig::payments \
                 (EngineConfig::with_sink sets the simulated provider)"
            .into(),
    })?;
    let provider = SimulatedProvider::open_replicated(
        kv,
        config.simulated_payments.clone(),
        config.replicate.clone(),
    )
    .map_err(|e| StorageError::Io(format!("payments: {e}")))?;
    let checking = provider.clone();
    let checked = crate::rt::blocking(move || checking.check_record())
        .await
        .map_err(|e| StorageError::Io(format!("checking the payment record: {e}")))?;
    Ok((provider, checked))
}

/// The provider [`open_payments`] opened, once its record's check is taken into account: its
/// record is part of the data dir, so a charge that does not decode is damage, named now rather
/// than when reconciliation first reads it (accepted with `--accept-damage`). Called after the
/// replay, so the damage it names comes after the log's in what a start reports.
pub(crate) fn checked_payments(
    (provider, checked): (Arc<dyn PaymentProvider>, Result<(), String>),
    config: &EngineConfig,
    sink: &dyn LogSink,
) -> Result<Arc<dyn PaymentProvider>, EngineError> {
    if let Err(damage) = checked {
        if config.recovery_mode == crate::integrity::RecoveryMode::AcceptDamage {
            tracing::error!(%damage, "the payment record is damaged; accepted");
        } else {
            return Err(StorageError::Damaged {
                count: 1,
                summary: damage,
                evidence: sink.keep_evidence(),
            }
            .into());
        }
    }
    Ok(provider)
}

/// Replays the log off the runtime: from a cluster node's warm state if it kept one with this
/// `window_ms` (the log read in full if that fails), else the whole log. The log's files as
/// they were before this start are kept as evidence when damage was found or recovery failed,
/// and dropped otherwise.
pub(crate) async fn recover_log(
    config: &EngineConfig,
    sink: &Arc<dyn LogSink>,
    window_ms: u64,
) -> Result<(Recovered, RecoveryReport), EngineError> {
    let with = RecoverWith {
        ledger_shards: config.ledger_shards,
        window_ms,
        now_ms: config.clock.now_ms(),
        mode: config.recovery_mode,
        replicated: config.replicate.is_some(),
    };
    let warm = config
        .warm
        .as_ref()
        .and_then(|w| w.take())
        .filter(|(_, kept_ms)| *kept_ms == window_ms)
        .map(|(replayed, _)| replayed);
    let sink_ref = sink.clone();
    let (recovered, mut report) = crate::rt::blocking(move || {
        let mut report = RecoveryReport::default();
        let r = match warm {
            Some(replayed) => {
                match crate::recovery::recover_warm(sink_ref.as_ref(), replayed, &with, &mut report)
                {
                    Ok(r) => Ok(r),
                    Err(e) => {
                        tracing::warn!(error = %e, "a warm start failed: reading the log");
                        report = RecoveryReport::default();
                        recover(sink_ref.as_ref(), &with, &mut report)
                    }
                }
            }
            None => recover(sink_ref.as_ref(), &with, &mut report),
        };
        (r, report)
    })
    .await
    .map_err(|e| StorageError::Io(format!("recovery failed: {e}")))?;
    let recovered = keep_evidence(sink.as_ref(), recovered, &mut report)?;
    Ok((recovered, report))
}

/// What recovery gave, with the log's files as they were kept as evidence when it found damage
/// (accepted, or refusing the start) or failed, and dropped when all was well.
fn keep_evidence(
    sink: &dyn LogSink,
    recovered: Result<Recovered, StorageError>,
    report: &mut RecoveryReport,
) -> Result<Recovered, EngineError> {
    match recovered {
        Ok(r) if report.integrity.damage.is_empty() => {
            sink.drop_evidence();
            Ok(r)
        }
        Ok(r) => {
            if let Some(kept) = sink.keep_evidence() {
                report.integrity.actions.push(format!(
                    "kept the log's files as they were before this start in {kept}"
                ));
            }
            Ok(r)
        }
        Err(StorageError::Damaged { count, summary, .. }) => {
            let evidence = sink.keep_evidence();
            Err(StorageError::Damaged {
                count,
                summary,
                evidence,
            }
            .into())
        }
        Err(e) => {
            if let Some(kept) = sink.keep_evidence() {
                tracing::error!(error = %e, kept, "recovery failed; the log's files as they were are kept");
            }
            Err(e.into())
        }
    }
}
