//! What a server runs while it serves an engine ([`Stack`]): the services' shared state over
//! the engine, the sweeper, the periodic reconciliation. A single node opens one at start
//! ([`recover`]); a cluster node opens one each time it begins to lead a group (see
//! [`crate::node`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use boxoffice_engine::raft::ReadFence;
use boxoffice_engine::{Engine, EngineConfig};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::config::ServerConfig;
use crate::health::set_health;
use crate::seat_maps::SeatMaps;
use crate::services::{Api, Ready};
use crate::tokens::TokenSigner;

/// The sweeper of the engine being served, if any.
pub(crate) type SweeperSlot =
    Arc<std::sync::Mutex<Option<ractor::ActorRef<boxoffice_sweeper::SweeperMsg>>>>;

/// The engine config of `config` (its own, or sled in the data dir), with the server's
/// settings.
pub(crate) fn engine_config(config: &ServerConfig) -> EngineConfig {
    let mut ec = config
        .engine
        .clone()
        .unwrap_or_else(|| EngineConfig::new(&config.data_dir));
    ec.durability = config.durability;
    ec.clock = config.clock.clone();
    ec.section_inflight_max = config.section_inflight_max;
    ec.recovery_mode = config.recovery_mode;
    ec.idempotency_window = config.idempotency_window;
    ec.change_retention = config.change_retention;
    ec
}

/// What a server runs while it serves an engine: the services' state, the sweeper, the
/// periodic tasks.
pub(crate) struct Stack {
    pub(crate) api: Arc<Api>,
    pub(crate) sweeper: ractor::ActorRef<boxoffice_sweeper::SweeperMsg>,
    pub(crate) tasks: Vec<tokio::task::JoinHandle<()>>,
    /// A cluster node's: the term of the leadership it serves (0 on a single node).
    pub(crate) term: u64,
}

impl Stack {
    /// Stops the tasks, the sweeper and the engine (its log flushed). Returns why the engine
    /// had stopped, if it had.
    pub(crate) async fn stop(self) -> Option<String> {
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        let _ = self
            .sweeper
            .stop_and_wait(None, Some(Duration::from_secs(5)))
            .await;
        self.api.stop();
        let stopped = self.api.engine.stopped();
        self.api.engine.shutdown().await;
        stopped
    }
}

/// Opens the engine of `ec` (replaying its log) and starts what serves it; a cluster leader's
/// answers wait at `fence` (see [`boxoffice_engine::raft::ReadFence`]), and it signs tickets
/// with `tickets` (its cluster's ring). Without them, the data dir's key signs
/// ([`crate::ticket_keys::signer`]).
pub(crate) async fn open_stack(
    config: &ServerConfig,
    ec: EngineConfig,
    fence: Option<Arc<ReadFence>>,
    tickets: Option<Arc<crate::signing::Signing>>,
) -> anyhow::Result<Stack> {
    let engine = Engine::open(ec)
        .await
        .with_context(|| format!("recovering from {}", config.data_dir.display()))?;
    let tickets = match tickets {
        Some(t) => t,
        None => match crate::ticket_keys::signer(&config.data_dir, config.new_ticket_key, &engine)
            .await
        {
            Ok(t) => Arc::new(crate::signing::Signing::fixed(t)),
            Err(e) => {
                // Refused to start: stop the engine, so the data dir is free for the next try.
                engine.shutdown().await;
                return Err(e);
            }
        },
    };
    // The series of every recovered event, at 0 before its first call.
    for e in engine.events().unwrap_or_default() {
        crate::metrics::register_event(e.event_id.as_str());
    }
    let mut api = Api::new(
        engine.clone(),
        TokenSigner::new(&config.token_secret),
        tickets,
        config.clock.clone(),
        config.queue_max,
        SeatMaps::new(
            config.seat_map_max_bytes,
            u64::try_from(config.seat_map_staleness.as_millis()).unwrap_or(u64::MAX),
        ),
        u64::try_from(config.join_challenge_ttl.as_millis()).unwrap_or(u64::MAX),
    );
    api.fence = fence;
    let api = Arc::new(api);
    let mut tasks = Vec::new();
    if let Some(every) = config.reconcile_every {
        tasks.push(reconcile_every(engine.clone(), every, config.refund_grace));
    }
    let (sweeper, sweeper_done) =
        match boxoffice_sweeper::start(engine.clone(), boxoffice_sweeper::SweeperConfig::default())
            .await
        {
            Ok(s) => s,
            Err(e) => {
                for t in tasks {
                    t.abort();
                }
                api.stop();
                engine.shutdown().await;
                return Err(e).context("starting the sweeper");
            }
        };
    // Without the sweeper no hold would expire and no waitlist offer be made. A stop aborts
    // this watch before it stops the sweeper.
    tasks.push(engine.stop_when_ended("the sweeper (holds would no longer expire)", sweeper_done));
    Ok(Stack {
        api,
        sweeper,
        tasks,
        term: 0,
    })
}
/// A single node's recovery: opens its engine (replaying the log), then serves it.
pub(crate) async fn recover(
    config: ServerConfig,
    ready: Ready,
    health: HealthReporter,
    sweeper: SweeperSlot,
    tasks: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) -> anyhow::Result<()> {
    if let Some(gate) = &config.recovery_gate {
        gate.notified().await;
    }
    let stack = open_stack(&config, engine_config(&config), None, None).await?;
    let engine = stack.api.engine.clone();
    if let Ok(mut s) = sweeper.lock() {
        *s = Some(stack.sweeper);
    }
    if let Ok(mut t) = tasks.lock() {
        t.extend(stack.tasks);
    }
    ready.set(stack.api);
    set_health(&health, ServingStatus::Serving).await;
    follow_engine_stop(&engine, health, &tasks);
    Ok(())
}

/// Health follows the engine: once it stops for good (the log failed, an actor could not be
/// rebuilt), health says `NOT_SERVING` so load balancers and orchestrators take this server out.
fn follow_engine_stop(
    engine: &Engine,
    health: HealthReporter,
    tasks: &Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) {
    let mut stopped = engine.watch_stopped();
    let task = tokio::spawn(async move {
        let reason = match stopped.wait_for(|s| s.is_some()).await {
            Ok(r) => r.clone().unwrap_or_default(),
            Err(_) => return, // the engine is gone (shutdown)
        };
        tracing::error!(%reason, "the engine stopped: health is NOT_SERVING until a restart");
        set_health(&health, ServingStatus::NotServing).await;
    });
    if let Ok(mut t) = tasks.lock() {
        t.push(task);
    }
}

/// The periodic reconciliation, every `every`: findings become a metric and a log line each;
/// charges left without a sale are refunded once `grace` has passed.
fn reconcile_every(
    engine: Engine,
    every: Duration,
    grace: Duration,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.tick().await;
        loop {
            tick.tick().await;
            match engine.settle_and_reconcile(grace).await {
                Ok((f, _)) if f.is_empty() => tracing::debug!("reconciliation clean"),
                Ok((f, _)) => {
                    tracing::error!(findings = f.len(), "reconciliation found problems")
                }
                Err(boxoffice_engine::EngineError::NotReady) => break,
                Err(e) => tracing::warn!(error = %e, "reconciliation could not run"),
            }
        }
    })
}
