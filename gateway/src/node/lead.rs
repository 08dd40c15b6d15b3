//! A cluster node's leadership loop: while the node leads a group it serves the group's
//! engine, opened from its copy of the log; when it stops leading, the engine stops and calls
//! are forwarded to the leader.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use boxoffice_engine::raft::ReadFence;
use tokio::sync::{oneshot, watch};

use super::lease::lease_watchdog;
use crate::config::ServerConfig;
use crate::health::GroupHealth;
use crate::services::Ready;
use crate::stack::{Stack, SweeperSlot, engine_config, open_stack};

/// What the leadership loop needs.
pub(crate) struct Leading {
    pub(crate) raft: boxoffice_engine::raft::Raft,
    pub(crate) sm: boxoffice_engine::raft::StateMachine,
    /// Which group.
    pub(crate) group: u32,
    pub(crate) config: ServerConfig,
    pub(crate) ready: Ready,
    pub(crate) health: Arc<GroupHealth>,
    pub(crate) sweeper: SweeperSlot,
    /// The cluster's ticket key ring (this node's copy of group 0's).
    pub(crate) ring: Arc<super::ring::ClusterRing>,
    /// Whether this node hands the group over to another ([`super::handover`]).
    pub(crate) handover: Arc<super::handover::Handover>,
}

/// How long a new leader waits to have applied everything its group committed before it
/// gives up this try (and tries again while it still leads).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(10);

impl Leading {
    /// The engine of a node that leads: its log is the state machine's, every group commit
    /// goes through Raft. Opened once the node has applied everything its group committed.
    pub(crate) async fn open(&self) -> anyhow::Result<Stack> {
        let term = self.raft.metrics().borrow().current_term;
        self.catch_up(term).await?;
        let mut ec = engine_config(&self.config);
        ec.sink = Some(self.sm.sink());
        // The state this node kept while it followed, if it did: no replay of its copy.
        ec.warm = Some(self.sm.warm());
        // Its batches carry this term: should the node lose the leadership and win it again
        // while this engine runs, they are skipped, and the engine stops (see `lead`).
        // Its reads and refusals are answered once this node is known to have led in `term`
        // after they were made; its commits say so while writes flow.
        let fence = ReadFence::new(self.raft.clone(), term);
        let replicate = Arc::new(
            boxoffice_engine::raft::RaftReplicator::new(self.raft.clone(), term)
                .fenced(fence.clone())
                .of_group(self.group),
        );
        // Tickets are signed with the cluster's key ring (group 0's leader makes it if its group
        // has none), never a key of this node's own.
        let tickets = if boxoffice_engine::bugs::on(boxoffice_engine::bugs::Bug::NodeTicketKeys) {
            None
        } else {
            Some(self.ring.signer(self.group, replicate.as_ref()).await?)
        };
        ec.replicate = Some(replicate);
        let config = ServerConfig {
            // Only with the bug above: each node's own key, made on its first lead.
            new_ticket_key: true,
            ..self.config.clone()
        };
        let mut stack = open_stack(&config, ec, Some(fence), tickets).await?;
        stack.term = term;
        stack
            .tasks
            .push(lease_watchdog(self.raft.clone(), stack.api.engine.clone()));
        let (id, now) = {
            let m = self.raft.metrics().borrow().clone();
            (m.id, (m.current_leader, m.current_term))
        };
        if now != (Some(id), term) {
            stack.stop().await;
            anyhow::bail!("the leadership changed while the engine opened");
        }
        Ok(stack)
    }

    /// Waits until this node, leading in `term`, has caught up: a quorum confirmed it leads,
    /// and everything in its log is applied.
    async fn catch_up(&self, term: u64) -> anyhow::Result<()> {
        tokio::time::timeout(CATCH_UP_TIMEOUT, async {
            // A quorum must answer within one heartbeat interval: on a busy machine that can
            // take a few tries; losing the leadership ends them.
            loop {
                match self.raft.ensure_linearizable().await {
                    Ok(_) => return Ok(()),
                    Err(openraft::error::RaftError::APIError(
                        openraft::error::CheckIsLeaderError::QuorumNotEnough(_),
                    )) => tokio::time::sleep(Duration::from_millis(50)).await,
                    Err(e) => return Err(e),
                }
            }
        })
        .await
        .context("catching up with the group took too long")?
        .context("not the leader")?;
        // And everything in this node's log applied: this leadership has written nothing yet,
        // so every entry there is a former leader's, which the engine must see before it
        // numbers its own records (else it would number them over those entries' records).
        let mut metrics = self.raft.metrics();
        if !boxoffice_engine::bugs::on(boxoffice_engine::bugs::Bug::LeaderResumesTerm) {
            tokio::time::timeout(
                CATCH_UP_TIMEOUT,
                metrics.wait_for(|m| {
                    m.last_applied.map(|l| l.index) >= m.last_log_index || m.current_term != term
                }),
            )
            .await
            .context("applying this node's log took too long")?
            .context("this node's Raft stopped")?;
        }
        Ok(())
    }
}

/// Opens that fail in a row before a leader gives up its leadership (stops its Raft, so another
/// node leads): a node that cannot serve must not hold the group.
const OPEN_FAILURES_MAX: u32 = 5;

/// A cluster node's leadership loop: while the node leads its group it serves the engine
/// (opened from its copy of the log); when it stops leading, or its engine stops (a commit
/// without a majority, a lost leadership), the engine is stopped and calls are forwarded to
/// the leader. Health is `SERVING` while the node leads with its engine open or knows the
/// leader to forward to, `NOT_SERVING` otherwise (an election, or recovery).
///
/// The loop ends on a stop request, or on its own when the node cannot go on in its group: its
/// Raft stopped (a storage error: the log could not be written) or it could not open its engine
/// as leader [`OPEN_FAILURES_MAX`] times. Then health says `NOT_SERVING` and `failed` says why
/// (`Running::failed`: `serve` exits non-zero so that its supervisor restarts it).
pub(crate) async fn lead(
    node: Leading,
    mut stop: watch::Receiver<bool>,
    ready_tx: oneshot::Sender<anyhow::Result<()>>,
    failed: Arc<watch::Sender<Option<String>>>,
) {
    let mut l = LeadLoop {
        id: node.raft.metrics().borrow().id,
        metrics: node.raft.metrics(),
        handover: node.handover.watch(),
        node,
        stack: None,
        serving: None,
        ready_tx: Some(ready_tx),
        failures: 0,
    };
    let why_failed = loop {
        if *stop.borrow() {
            break None;
        }
        if let Err(fatal) = &l.metrics.borrow().running_state {
            break Some(format!("its Raft stopped: {fatal}"));
        }
        let now = l.now();
        l.stop_serving_if_over(&now).await;
        if now.handing && l.stack.is_none() {
            l.node.handover.now_quiet();
        }
        if !now.leads && l.stack.is_none() {
            l.keep_warm();
        }
        let retry = match l.open_if_leading(&now).await {
            Ok(retry) => retry,
            Err(why) => break Some(why),
        };
        l.report(&now).await;
        if let Some(why) = l.wait(&mut stop, retry).await {
            break Some(why);
        }
    };
    l.finish(why_failed, &stop, &failed).await;
}

/// The leadership loop's state between its turns.
struct LeadLoop {
    node: Leading,
    id: u64,
    metrics: watch::Receiver<openraft::RaftMetrics<u64, openraft::BasicNode>>,
    /// The engine this node serves while it leads.
    stack: Option<Stack>,
    /// What health says of this group now.
    serving: Option<bool>,
    /// Told once the group is served here or known to be served elsewhere.
    ready_tx: Option<oneshot::Sender<anyhow::Result<()>>>,
    /// Opens that failed in a row while leading.
    failures: u32,
    /// Told when a handover of the group begins.
    handover: watch::Receiver<Option<(u64, tokio::time::Instant)>>,
}

/// What Raft says at one turn of the loop.
struct Now {
    leads: bool,
    /// This node leads but hands the group over: it serves no engine meanwhile.
    handing: bool,
    /// A leader is known (this node or another).
    known: bool,
    term: u64,
}

impl LeadLoop {
    fn now(&mut self) -> Now {
        let m = self.metrics.borrow_and_update();
        Now {
            leads: m.current_leader == Some(self.id) && m.state == openraft::ServerState::Leader,
            handing: {
                self.handover.mark_unchanged();
                self.node.handover.active()
            },
            known: m.current_leader.is_some(),
            term: m.current_term,
        }
    }

    /// Stops the engine served if this node no longer leads, the engine stopped, or a new
    /// term began: an engine serves one leadership (even one this node leads again: another
    /// leader may have written meanwhile, so the engine is opened again).
    async fn stop_serving_if_over(&mut self, now: &Now) {
        if !now.leads {
            self.failures = 0;
        }
        let Some(s) = &self.stack else {
            return;
        };
        let stopped = s.api.engine.stopped();
        let moved = s.term != now.term;
        if now.leads && stopped.is_none() && !moved && !now.handing {
            return;
        }
        self.node.ready.take();
        if let Ok(mut slot) = self.node.sweeper.lock() {
            *slot = None;
        }
        if let Some(s) = self.stack.take() {
            let why = stopped.unwrap_or_else(|| {
                if now.handing {
                    "it hands the group over to another node".into()
                } else if now.leads {
                    "a new term began".into()
                } else {
                    "another node leads".into()
                }
            });
            tracing::warn!(group = self.node.group, reason = %why, "this node stops serving its group");
            s.stop().await;
        }
    }

    /// A follower keeps the state its engine would start from (once warmed up, each batch it
    /// applies keeps it so): a failover then replays nothing.
    fn keep_warm(&self) {
        if self.node.sm.warm().is_warm() {
            return;
        }
        let sm = self.node.sm.clone();
        let window_ms = engine_config(&self.node.config)
            .idempotency_window_ms()
            .unwrap_or(boxoffice_engine::IDEMPOTENCY_WINDOW_MS_DEFAULT);
        tokio::spawn(async move { sm.warm_up(window_ms).await });
    }

    /// Opens the engine if this node leads and serves none: `Ok(true)` to try again soon,
    /// `Err(why)` once it failed [`OPEN_FAILURES_MAX`] times in a row (its Raft stopped, so
    /// that another node leads).
    async fn open_if_leading(&mut self, now: &Now) -> Result<bool, String> {
        if now.handing {
            // Tried again once the handover is over (the target won, or it ends by itself).
            return Ok(true);
        }
        if !now.leads || self.stack.is_some() {
            return Ok(false);
        }
        let group = self.node.group;
        match self.node.open().await {
            Ok(s) => {
                self.failures = 0;
                tracing::info!(
                    node = self.id,
                    group,
                    term = now.term,
                    warm = s.api.engine.recovery_report().warm,
                    "this node leads its group and serves it"
                );
                if let Ok(mut slot) = self.node.sweeper.lock() {
                    *slot = Some(s.sweeper.clone());
                }
                self.node.ready.set(s.api.clone());
                self.stack = Some(s);
                Ok(false)
            }
            Err(e) if e.downcast_ref::<super::ring::NotYet>().is_some() => {
                // Not this node's failure: group 0 has no leader that made the ring yet.
                tracing::warn!(group, error = %e, "waiting for the ticket key ring");
                Ok(true)
            }
            Err(e) => {
                self.failures += 1;
                let failures = self.failures;
                tracing::error!(group, error = %format!("{e:#}"), failures, "cannot serve as the leader");
                if failures < OPEN_FAILURES_MAX {
                    return Ok(true);
                }
                tracing::error!(
                    "this node cannot serve: it leaves the group (its Raft stops) so that \
                     another node leads; restart it once the cause is fixed"
                );
                if let Err(e) = self.node.raft.shutdown().await {
                    tracing::warn!(error = %e, "stopping Raft");
                }
                Err(format!(
                    "it could not serve as leader ({failures} tries; the last: {e:#})"
                ))
            }
        }
    }

    /// Health follows whether the group is served here (leading) or has a leader to forward
    /// to; the start is told once it is.
    async fn report(&mut self, now: &Now) {
        let fine = if now.leads {
            self.stack.is_some()
        } else {
            now.known
        };
        if self.serving != Some(fine) {
            self.node.health.set(self.node.group, fine).await;
            self.serving = Some(fine);
        }
        if fine && let Some(tx) = self.ready_tx.take() {
            let _ = tx.send(Ok(()));
        }
    }

    /// Waits for Raft to change, the engine to stop, a stop request, or (`retry`) a moment
    /// before the next try; `Some(why)` if Raft stopped.
    async fn wait(&mut self, stop: &mut watch::Receiver<bool>, retry: bool) -> Option<String> {
        let engine_stopped = async {
            match &self.stack {
                Some(s) => {
                    let mut w = s.api.engine.watch_stopped();
                    let _ = w.wait_for(|s| s.is_some()).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.handover.changed() => {}
            changed = self.metrics.changed() => if changed.is_err() {
                return Some(match &self.node.raft.metrics().borrow().running_state {
                    Err(fatal) => format!("its Raft stopped: {fatal}"),
                    Ok(()) => "its Raft stopped".into(),
                });
            },
            () = engine_stopped => {}
            _ = stop.changed() => {}
            () = tokio::time::sleep(Duration::from_millis(500)), if retry => {}
        }
        None
    }

    /// Stops the engine served, if any; if the node left its group on its own (`why`, unless a
    /// stop was asked for), health says `NOT_SERVING` and `failed` says why.
    async fn finish(
        mut self,
        why: Option<String>,
        stop: &watch::Receiver<bool>,
        failed: &watch::Sender<Option<String>>,
    ) {
        let group = self.node.group;
        self.node.ready.take();
        if let Some(s) = self.stack.take() {
            s.stop().await;
        }
        // A stop asked for meanwhile (while the engine stopped) is a clean stop.
        let Some(why) = why.filter(|_| !*stop.borrow()) else {
            return;
        };
        tracing::error!(group, reason = %why, "this node left its group: health is NOT_SERVING until a restart");
        self.node.health.set(group, false).await;
        if let Some(tx) = self.ready_tx.take() {
            let _ = tx.send(Err(anyhow::anyhow!("this node left its group: {why}")));
        }
        failed.send_if_modified(|f| {
            if f.is_none() {
                *f = Some(format!("group {group}: {why}"));
                true
            } else {
                false
            }
        });
    }
}
