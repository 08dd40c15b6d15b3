//! # boxoffice-sweeper
//!
//! The sweeper actor: releases holds whose TTL ran out, so their places go back on sale.
//!
//! It owns no inventory: on every tick it asks the engine to expire what is due
//! ([`Engine::expire_due`]), and each section actor decides for its own holds (a section also
//! refuses a confirm past the deadline by itself, so a late sweep can never let a late confirm
//! through). Work per tick is bounded: at most [`SweeperConfig::rounds_per_tick_max`] rounds
//! of at most [`SweeperConfig::expire_per_section_max`] holds per section, so a backlog drains
//! over several ticks without starving the booking path. Ticks are timer messages
//! (`send_interval`); the handler never sleeps.

use std::time::Duration;

use boxoffice_engine::{Engine, EngineError};
use ractor::{Actor, ActorProcessingErr, ActorRef};

/// How often and how much the sweeper works.
#[derive(Clone, Debug)]
pub struct SweeperConfig {
    /// Time between ticks.
    pub tick: Duration,
    /// Most holds expired per section per round.
    pub expire_per_section_max: usize,
    /// Most rounds per tick.
    pub rounds_per_tick_max: usize,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            tick: Duration::from_millis(250),
            expire_per_section_max: 1_024,
            rounds_per_tick_max: 8,
        }
    }
}

/// Messages the sweeper takes.
#[derive(Debug)]
pub enum SweeperMsg {
    /// Expire what is due now (sent by the interval timer, or by anyone who wants a sweep now).
    Tick,
}

/// The sweeper actor.
pub struct Sweeper;

/// Arguments to start a sweeper.
pub struct SweeperArgs {
    /// The engine to sweep.
    pub engine: Engine,
    /// Tick and bounds.
    pub config: SweeperConfig,
}

/// What the sweeper keeps between ticks.
pub struct SweeperState {
    engine: Engine,
    config: SweeperConfig,
    expired_total: u64,
}

impl Actor for Sweeper {
    type Msg = SweeperMsg;
    type State = SweeperState;
    type Arguments = SweeperArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: SweeperArgs,
    ) -> Result<Self::State, ActorProcessingErr> {
        myself.send_interval(args.config.tick, || SweeperMsg::Tick);
        // Holds already past their deadline (say, after a restart) expire right away.
        let _ = myself.cast(SweeperMsg::Tick);
        Ok(SweeperState {
            engine: args.engine,
            config: args.config,
            expired_total: 0,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        msg: Self::Msg,
        st: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            SweeperMsg::Tick => {
                for _ in 0..st.config.rounds_per_tick_max {
                    match st.engine.expire_due(st.config.expire_per_section_max).await {
                        Ok(expired) => {
                            let n = expired.len();
                            st.expired_total += n as u64;
                            metrics::counter!("boxoffice_sweeper_expired_total")
                                .increment(n as u64);
                            for h in &expired {
                                tracing::debug!(hold = %h.hold_id, "hold expired");
                            }
                            // A round that did not hit the bound drained everything due.
                            if n < st.config.expire_per_section_max {
                                break;
                            }
                        }
                        // Not ready: recovering or shutting down; try again next tick.
                        Err(EngineError::NotReady) => break,
                        Err(e) => {
                            tracing::error!(error = %e, "sweep failed");
                            break;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Starts a sweeper for `engine`; stop it with `actor.stop(None)`.
pub async fn start(
    engine: Engine,
    config: SweeperConfig,
) -> Result<(ActorRef<SweeperMsg>, tokio::task::JoinHandle<()>), ractor::SpawnErr> {
    Actor::spawn(None, Sweeper, SweeperArgs { engine, config }).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use boxoffice_engine::{
        EngineConfig, EventId, EventSpec, HoldRequest, HoldStatus, Layout, ManualClock, SectionId,
        SectionSpec, Selection, UserId,
    };
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sweeper_expires_due_holds_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000_000));
        let mut cfg = EngineConfig::new(dir.path());
        cfg.clock = clock.clone();
        let engine = Engine::open(cfg).await.unwrap();
        engine
            .create_event(EventSpec {
                event_id: Some(EventId::from("e")),
                name: "e".into(),
                sections: vec![SectionSpec {
                    section_id: SectionId::from("ga"),
                    name: "GA".into(),
                    price_cents: 1,
                    layout: Layout::GeneralAdmission { capacity: 10_000 },
                }],
                hold_ttl_ms: 5_000,
                per_user_limit: 4,
                admit_rate_per_second: 0,
                admission_window_ms: 0,
                sale_opens_at_ms: 0,
            })
            .await
            .unwrap();
        let mut holds = Vec::new();
        for u in 0..3000 {
            if u == 1500 {
                clock.advance_ms(1_000);
            }
            let h = engine
                .hold(HoldRequest {
                    event_id: EventId::from("e"),
                    user_id: UserId::from(format!("u{u}")),
                    idempotency_key: String::new(),
                    selection: Selection::BestAvailable {
                        section: None,
                        quantity: 1,
                    },
                })
                .await
                .unwrap();
            holds.push(h);
        }
        let config = SweeperConfig {
            tick: Duration::from_millis(5),
            expire_per_section_max: 100,
            rounds_per_tick_max: 2,
        };
        let (sweeper, handle) = start(engine.clone(), config).await.unwrap();
        // The first 1500 are due at +5 s, the rest at +6 s. Move to +5 s: only the first half.
        clock.advance_ms(4_000);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let held = engine.event(&EventId::from("e")).unwrap().sections[0].held;
            if held == 1500 {
                break;
            }
            assert!(held > 1500, "never expires a hold before its deadline");
            assert!(
                std::time::Instant::now() < deadline,
                "sweeper stalled at {held}"
            );
            tokio::task::yield_now().await;
        }
        assert_eq!(
            engine.get_hold(&holds[1499].hold_id).await.unwrap().status,
            HoldStatus::Expired
        );
        assert_eq!(
            engine.get_hold(&holds[1500].hold_id).await.unwrap().status,
            HoldStatus::Held
        );
        sweeper.stop(None);
        handle.await.unwrap();
        engine.shutdown().await;
    }
}
