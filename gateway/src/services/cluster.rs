//! `ClusterService`: a cluster node's membership calls, over its [`Members`].

use std::sync::Arc;

use boxoffice_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::node::members::Members;
use crate::status::ApiError;

/// `ClusterService` (admin scope): a cluster node's members (`None`: a single node: `NOT_A_CLUSTER`).
#[derive(Clone, Default)]
pub struct ClusterSvc(pub Option<Arc<Members>>);

impl ClusterSvc {
    fn members(&self) -> Result<&Members, Status> {
        self.0.as_deref().ok_or_else(|| {
            Status::from(ApiError::Cluster(
                crate::status::ClusterRefusal::NotACluster,
            ))
        })
    }
}

#[tonic::async_trait]
impl pb::cluster_service_server::ClusterService for ClusterSvc {
    async fn get_cluster_status(
        &self,
        _req: Request<pb::GetClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        Ok(Response::new(self.members()?.status()))
    }

    async fn add_node(
        &self,
        req: Request<pb::AddNodeRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let r = req.into_inner();
        let status = self.members()?.add(r.node_id, r.address.trim()).await?;
        Ok(Response::new(status))
    }

    async fn remove_node(
        &self,
        req: Request<pb::RemoveNodeRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let status = self.members()?.remove(req.into_inner().node_id).await?;
        Ok(Response::new(status))
    }

    async fn replace_node(
        &self,
        req: Request<pb::ReplaceNodeRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let r = req.into_inner();
        let status = self
            .members()?
            .replace(r.old_node_id, r.new_node_id, r.address.trim())
            .await?;
        Ok(Response::new(status))
    }

    async fn rotate_ticket_key(
        &self,
        _req: Request<pb::RotateTicketKeyRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        Ok(Response::new(self.members()?.rotate_ticket_key().await?))
    }

    async fn rebalance(
        &self,
        _req: Request<pb::RebalanceRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        Ok(Response::new(self.members()?.rebalance().await?))
    }
}
