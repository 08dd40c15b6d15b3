//! An in-process network between the Raft nodes of one process: each call goes straight to the
//! target node's [`Raft`](super::Raft) handle. A node taken off the router (crashed, or cut off
//! by a partition) is unreachable. Tests and simulations use it; processes talk over gRPC.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode};

use super::types::{Raft, TypeConfig};

type NodeId = u64;

#[derive(Default)]
struct Nodes {
    up: HashMap<NodeId, Raft>,
    /// Pairs that cannot reach each other (either direction).
    cut: HashSet<(NodeId, NodeId)>,
}

/// The nodes of a process, by id. Cheap to clone; every clone sees the same nodes.
#[derive(Clone, Default)]
pub struct Router {
    nodes: Arc<Mutex<Nodes>>,
}

impl Router {
    /// Puts `raft` on the network as `id` (again, after a restart).
    pub fn add(&self, id: NodeId, raft: Raft) {
        self.lock().up.insert(id, raft);
    }

    /// Takes `id` off the network (a crash): calls to it fail as unreachable.
    pub fn remove(&self, id: NodeId) -> Option<Raft> {
        self.lock().up.remove(&id)
    }

    /// Cuts (or, with `cut == false`, heals) the link between `a` and `b`.
    pub fn cut(&self, a: NodeId, b: NodeId, cut: bool) {
        let mut n = self.lock();
        let pair = (a.min(b), a.max(b));
        if cut {
            n.cut.insert(pair);
        } else {
            n.cut.remove(&pair);
        }
    }

    /// The network as seen from `from`.
    pub fn client_of(&self, from: NodeId) -> RouterFactory {
        RouterFactory {
            router: self.clone(),
            from,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Nodes> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn target<E: std::error::Error>(
        &self,
        from: NodeId,
        to: NodeId,
    ) -> Result<Raft, RPCError<NodeId, BasicNode, E>> {
        let n = self.lock();
        if n.cut.contains(&(from.min(to), from.max(to))) {
            return Err(unreachable(format!("the link {from}-{to} is cut")));
        }
        n.up.get(&to)
            .cloned()
            .ok_or_else(|| unreachable(format!("node {to} is down")))
    }
}

fn unreachable<E: std::error::Error>(why: String) -> RPCError<NodeId, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(why)))
}

/// [`RaftNetworkFactory`] of one node over a [`Router`].
pub struct RouterFactory {
    router: Router,
    from: NodeId,
}

/// A connection from one node to another over a [`Router`].
pub struct RouterClient {
    router: Router,
    from: NodeId,
    to: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for RouterFactory {
    type Network = RouterClient;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> RouterClient {
        RouterClient {
            router: self.router.clone(),
            from: self.from,
            to: target,
        }
    }
}

impl RaftNetwork<TypeConfig> for RouterClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.router.target(self.from, self.to)?;
        raft.append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.to, e)))
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let raft = self.router.target(self.from, self.to)?;
        raft.install_snapshot(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.to, e)))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let raft = self.router.target(self.from, self.to)?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(openraft::error::RemoteError::new(self.to, e)))
    }
}
