//! A cluster node (issue 13): its Raft group of each `--groups`, their life cycle, the
//! leadership loops that serve a group's engine while the node leads it, the leader's lease,
//! the Raft network between nodes, and the forwarding of public calls to the leader.
//!
//! - [`open`](self::open): the data dir's layout, forming a group, opening what is durable.
//! - [`lead`](self::lead): the leadership loop and a new leader's opening of its engine.
//! - [`lease`](self::lease): a leader cut off from its majority stops its engine.
//! - [`peers`]: the Raft network between nodes (internal gRPC behind the cluster secret).
//! - [`forward`]: a node that does not lead forwards public calls to the one that does.
//! - [`reads`]: a leader's reads and refusals wait until it is known to have led after them.

pub mod forward;
pub(crate) mod handover;
pub(crate) mod heard;
mod lead;
mod lease;
pub mod links;
pub mod members;
mod membership;
mod open;
pub mod peers;
pub mod reads;
mod repair;
pub mod ring;

use std::sync::Arc;

use boxoffice_engine::raft::{Raft, StateMachine, VoteGuard};
use tokio::sync::{oneshot, watch};
use tonic_health::server::HealthReporter;

pub use lease::{LEASE_CHECK_EVERY, LEASE_LOST_AFTER};
pub use open::{GROUPS_FILE, group_dir};

use crate::config::ServerConfig;
use crate::health::GroupHealth;
use crate::services::{Groups, Ready};
use crate::stack::SweeperSlot;

/// A cluster node's Raft of each group, opened, with what it serves its peers and what
/// forwards public calls; it leads nothing yet ([`Opened::lead`]).
pub(crate) struct Opened {
    /// Each group's Raft, state machine and vote guard (index: the group).
    groups: Vec<(Raft, StateMachine, VoteGuard)>,
    /// The cluster's ticket key ring, as this node holds it.
    ring: Arc<ring::ClusterRing>,
    /// Each group's handover on this node.
    handovers: handover::Handovers,
}

/// What the server gives a node's leadership loops.
pub(crate) struct Serving<'a> {
    pub(crate) config: &'a ServerConfig,
    /// Each group's services' state (index: the group).
    pub(crate) readies: &'a [Ready],
    pub(crate) health: &'a HealthReporter,
    /// Where group 0's sweeper is shown while this node leads it.
    pub(crate) sweeper: &'a SweeperSlot,
    /// Told once every group is served here or known to be served elsewhere.
    pub(crate) recovered: oneshot::Sender<anyhow::Result<()>>,
    /// Where the node's background tasks go.
    pub(crate) background: &'a mut Vec<tokio::task::JoinHandle<()>>,
}

impl Opened {
    /// Each group's copy of its log, where this node reads its change stream (index: the
    /// group).
    pub(crate) fn copies(&self) -> Vec<Arc<dyn boxoffice_engine::LogSink>> {
        self.groups
            .iter()
            .map(|(_, sm, _)| sm.sink() as Arc<dyn boxoffice_engine::LogSink>)
            .collect()
    }

    /// Opens every group of `config`'s cluster (checking `--groups` against the data dir),
    /// with the Raft service for the peers and the forwarder of public calls (routed by
    /// `groups`).
    pub(crate) async fn open(
        config: &ServerConfig,
        groups: &Groups,
    ) -> anyhow::Result<(Opened, peers::PeerService, Arc<forward::Forwarder>)> {
        let c = config
            .cluster
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("not a cluster node"))?;
        let n_groups = c.groups.max(1);
        open::check_groups(&config.data_dir, n_groups)?;
        let mut opened = Vec::new();
        // One watch over the peers' links for every group and the forwarder: a peer down is
        // one warning, not one a group and a call.
        let watch = Arc::new(links::PeerWatch::new(c.peers.clone()));
        let links = peers::Peers::new(c.peers.clone(), c.secret.clone())
            .over(config.network.clone())
            .with_tls(c.peer_tls.clone())
            .watched_by(watch);
        for g in 0..n_groups {
            opened.push(open::open_raft(c, &config.data_dir, g, &links).await?);
        }
        let heard = heard::Heard::new(n_groups);
        let handovers = handover::handovers(n_groups);
        let ring = Arc::new(ring::ClusterRing::new(
            opened[0].1.store(),
            ring::Sealer::new(c.secret.material()),
            config.data_dir.clone(),
            Some(ring::Current {
                raft: opened[0].0.clone(),
                heard: heard.clone(),
            }),
            config.clock.clone(),
        ));
        let service = peers::raft_service(
            opened
                .iter()
                .map(|(raft, _, guard)| (raft.clone(), guard.clone()))
                .collect(),
            c.secret.clone(),
            heard,
            Some(ring.clone()),
            handovers.to_vec(),
        );
        let forwarder = Arc::new(forward::Forwarder::new(
            c.node_id,
            opened.iter().map(|(raft, _, _)| raft.clone()).collect(),
            links,
            groups.clone(),
            ring.clone(),
            handovers.clone(),
            crate::tokens::TokenSigner::new(&config.token_secret),
        ));
        Ok((
            Opened {
                groups: opened,
                ring,
                handovers,
            },
            service,
            forwarder,
        ))
    }

    /// Starts each group's leadership loop (and its Raft figures' sampler).
    pub(crate) fn lead(self, s: Serving<'_>) -> Node {
        let (stop, stopped) = watch::channel(false);
        let (failed_tx, failed) = watch::channel(None);
        let failed_tx = Arc::new(failed_tx);
        let group_health = Arc::new(GroupHealth::new(s.health.clone(), self.groups.len()));
        let ring = self.ring.clone();
        s.background.push(ring.clone().keep_current());
        let mut leads = Vec::new();
        let mut serving = Vec::new();
        for (g, (raft, sm, _)) in self.groups.iter().enumerate() {
            let group = u32::try_from(g).unwrap_or(u32::MAX);
            s.background.push(crate::metrics::spawn_raft_sampler(
                raft.clone(),
                sm.warm(),
                group,
            ));
            let leading = lead::Leading {
                raft: raft.clone(),
                sm: sm.clone(),
                group,
                config: s.config.clone(),
                ready: s.readies[g].clone(),
                health: group_health.clone(),
                // The sweeper of group 0 (the one `Running::sweeper` shows).
                sweeper: if g == 0 {
                    s.sweeper.clone()
                } else {
                    SweeperSlot::default()
                },
                ring: ring.clone(),
                handover: self.handovers[g].clone(),
            };
            let (ready_tx, ready_rx) = oneshot::channel();
            serving.push(ready_rx);
            leads.push(tokio::spawn(lead::lead(
                leading,
                stopped.clone(),
                ready_tx,
                failed_tx.clone(),
            )));
        }
        s.background
            .push(tokio::spawn(all_served(serving, s.recovered)));
        Node {
            guards: self.groups.iter().map(|(_, _, g)| g.clone()).collect(),
            rafts: self.groups.into_iter().map(|(raft, _, _)| raft).collect(),
            stop,
            leads,
            failed,
        }
    }
}

/// Tells `recovered` once every group serves here or is known to be served elsewhere (or the
/// first that cannot).
async fn all_served(
    serving: Vec<oneshot::Receiver<anyhow::Result<()>>>,
    recovered: oneshot::Sender<anyhow::Result<()>>,
) {
    let mut result = Ok(());
    for rx in serving {
        match rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                result = Err(e);
                break;
            }
            Err(_) => {
                result = Err(anyhow::anyhow!("the node stopped before it served"));
                break;
            }
        }
    }
    let _ = recovered.send(result);
}

/// A cluster node's running parts.
pub(crate) struct Node {
    /// Each group's Raft (index: the group).
    rafts: Vec<Raft>,
    /// Each group's vote guard (index: the group).
    guards: Vec<VoteGuard>,
    stop: watch::Sender<bool>,
    /// Each group's leadership loop.
    leads: Vec<tokio::task::JoinHandle<()>>,
    /// Why the node left its group on its own (its Raft stopped on an error, or it could not
    /// serve as leader): set once, by the leadership loop.
    failed: watch::Receiver<Option<String>>,
}

impl Node {
    /// Each group's Raft (index: the group).
    pub(crate) fn rafts(&self) -> &[Raft] {
        &self.rafts
    }

    /// Whether this node, started without its data, still waits to catch up from a leader
    /// before it votes, in some group.
    pub(crate) fn catching_up(&self) -> bool {
        self.guards.iter().any(|g| g.catching_up())
    }

    /// Resolves when the node has left its group on its own, with the reason.
    pub(crate) async fn failed(&self) -> String {
        let mut failed = self.failed.clone();
        match failed.wait_for(|f| f.is_some()).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops the leadership loops (each stops the engine it serves, if any), then Raft.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        for lead in self.leads {
            let _ = lead.await;
        }
        for raft in self.rafts {
            if let Err(e) = raft.shutdown().await {
                tracing::warn!(error = %e, "stopping Raft");
            }
        }
    }
}
