//! `boxoffice cluster`: tools for a cluster's operator. `certs` makes the cluster's CA and its
//! nodes' certificates for the peer port's mutual TLS; `status`, `add-node`, `remove-node`,
//! `replace-node`, `rotate-ticket-key` and `rebalance` call a running node's `ClusterService`.

use std::path::PathBuf;

use boxoffice_drill::secret::UsageError;
use boxoffice_gateway::certs::{self, NodeHosts, Validity};
use boxoffice_proto::v1 as pb;
use clap::Subcommand;

use crate::exit::Exit;

/// Where a running server (or any node of a cluster) is, and the admin key to call it with.
#[derive(clap::Args, Debug)]
pub(crate) struct Target {
    /// Any node of the cluster (its public gRPC address; `https://` if it serves TLS).
    #[arg(
        long,
        env = "BOXOFFICE_TARGET",
        default_value = "http://127.0.0.1:50051"
    )]
    target: String,
    /// An admin key of the cluster.
    #[arg(long, env = "BOXOFFICE_ADMIN_KEY", hide_env_values = true)]
    admin_key: String,
    /// The CA certificate (PEM) to trust for an `https://` target.
    #[arg(long, env = "BOXOFFICE_CA_CERT")]
    ca_cert: Option<PathBuf>,
}

impl Target {
    /// The cluster service at the target, with the admin key.
    async fn client(
        &self,
    ) -> anyhow::Result<pb::cluster_service_client::ClusterServiceClient<boxoffice_client::Authed>>
    {
        Ok(pb::cluster_service_client::ClusterServiceClient::new(
            self.authed().await?,
        ))
    }

    /// A channel to the target that sends the admin key with every call.
    pub(crate) async fn authed(&self) -> anyhow::Result<boxoffice_client::Authed> {
        boxoffice_drill::changes::authed(&self.target, &self.admin_key, self.ca_cert.as_deref())
            .await
    }
}

/// The subcommands of `boxoffice cluster`.
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The cluster as a node sees it: each node (address, voter or learner, the groups it
    /// leads) and each group (leader, term, voters, learners, last log index).
    Status {
        #[command(flatten)]
        target: Target,
    },
    /// Add a node to every group, live: a learner that catches up, then a voter. Start the
    /// node first (`serve --node-id N`, its `--peers` listing every node, itself included).
    AddNode {
        #[command(flatten)]
        target: Target,
        /// The new node's id.
        #[arg(long)]
        node_id: u64,
        /// Where its peers reach it (HOST:PORT: its peer port if the nodes have one).
        #[arg(long)]
        address: String,
    },
    /// Remove a node from every group, live (stop its process afterwards).
    RemoveNode {
        #[command(flatten)]
        target: Target,
        /// The node to remove.
        #[arg(long)]
        node_id: u64,
    },
    /// Replace a node by another, live: the new one added to every group (start it first),
    /// then the old one removed (stop its process afterwards). Also how a node moves to a new
    /// address: start it there under a new id, and replace the old id by it.
    ReplaceNode {
        #[command(flatten)]
        target: Target,
        /// The node to replace.
        #[arg(long)]
        old_node_id: u64,
        /// The node that takes its place.
        #[arg(long)]
        new_node_id: u64,
        /// Where the new node's peers reach it (HOST:PORT).
        #[arg(long)]
        address: String,
    },
    /// Rotate the cluster's ticket signing key, live: a new key (made by group 0's leader,
    /// replicated sealed) signs the orders made from 30 s after the call on; every older key
    /// keeps signing the orders of its time, so no ticket's code changes, and keeps verifying.
    /// Prints the status with the ring.
    RotateTicketKey {
        #[command(flatten)]
        target: Target,
    },
    /// Spread the groups' leaders over the nodes again (after failovers left one node leading
    /// several groups): each move hands a group from the node that leads most to the one that
    /// leads fewest; its calls answer NOT_READY for that moment. Prints where the leaders are.
    Rebalance {
        #[command(flatten)]
        target: Target,
    },
    /// Make the cluster's CA (`ca.pem`, `ca.key`) and each node's certificate and key
    /// (`node-N.pem`, `node-N.key`) for the peer port (`serve --peer-listen` with `--peer-ca`,
    /// `--peer-cert`, `--peer-key`). A CA already in the folder is used, so a node added later
    /// joins the same cluster; no file is ever overwritten. Keep `ca.key` off the nodes.
    Certs {
        /// The folder to write into (made if missing).
        #[arg(long)]
        out: PathBuf,
        /// A node as ID=HOST[,HOST...]: its id and the IP addresses or DNS names its peers dial
        /// it at (repeat for each node).
        #[arg(long = "node", value_name = "ID=HOST[,HOST...]", required = true)]
        nodes: Vec<String>,
        /// How many days the certificates are valid.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=3650))]
        days: u32,
    },
}

/// `ID=HOST[,HOST...]`.
fn parse_node(text: &str) -> Result<NodeHosts, UsageError> {
    let bad = || UsageError::new(format!("--node {text:?} is not ID=HOST[,HOST...]"));
    let (id, hosts) = text.split_once('=').ok_or_else(bad)?;
    let id = id.trim().parse::<u64>().map_err(|_| bad())?;
    let hosts: Vec<String> = hosts
        .split(',')
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .collect();
    if id == 0 || hosts.is_empty() {
        return Err(bad());
    }
    Ok(NodeHosts { id, hosts })
}

/// Prints `status`, a line a node then a line a group.
fn print_status(status: &pb::ClusterStatus) {
    println!("answered by node {}", status.answered_by);
    for n in &status.nodes {
        let role = if n.voter { "voter" } else { "learner" };
        println!(
            "node {}  {}  {role}  leads {:?}",
            n.node_id, n.address, n.leads
        );
    }
    for g in &status.groups {
        println!(
            "group {}: leader {}, term {}, voters {:?}, learners {:?}, last log index {}",
            g.group, g.leader_id, g.term, g.voters, g.learners, g.last_log_index
        );
    }
    for k in &status.ticket_keys {
        let signs = if k.can_sign {
            format!("signs orders from {} ms", k.signs_from_unix_ms)
        } else {
            "verifies only".to_owned()
        };
        println!("ticket key {}  {}  {signs}", k.key_id, k.public_key);
    }
}

/// A call's answer printed, or its error said (exit 1).
fn answered(
    result: Result<tonic::Response<pb::ClusterStatus>, tonic::Status>,
) -> anyhow::Result<Exit> {
    match result {
        Ok(r) => {
            print_status(r.get_ref());
            Ok(Exit::Ok)
        }
        Err(s) => Ok(refused(&s)),
    }
}

/// Says why a call was refused (its code, reason and message) on stderr: exit 1.
pub(crate) fn refused(s: &tonic::Status) -> Exit {
    let reason = boxoffice_client::reason(s).unwrap_or_default();
    crate::exit::error(format_args!("{:?} {reason}: {}", s.code(), s.message()));
    Exit::Failed
}

/// Runs the subcommand; its exit code.
pub async fn run(command: ClusterCommand) -> anyhow::Result<Exit> {
    match command {
        ClusterCommand::Status { target } => {
            let mut c = target.client().await?;
            answered(c.get_cluster_status(pb::GetClusterStatusRequest {}).await)
        }
        ClusterCommand::AddNode {
            target,
            node_id,
            address,
        } => {
            let mut c = target.client().await?;
            answered(c.add_node(pb::AddNodeRequest { node_id, address }).await)
        }
        ClusterCommand::RemoveNode { target, node_id } => {
            let mut c = target.client().await?;
            answered(c.remove_node(pb::RemoveNodeRequest { node_id }).await)
        }
        ClusterCommand::ReplaceNode {
            target,
            old_node_id,
            new_node_id,
            address,
        } => {
            let mut c = target.client().await?;
            let req = pb::ReplaceNodeRequest {
                old_node_id,
                new_node_id,
                address,
            };
            answered(c.replace_node(req).await)
        }
        ClusterCommand::RotateTicketKey { target } => {
            let mut c = target.client().await?;
            answered(c.rotate_ticket_key(pb::RotateTicketKeyRequest {}).await)
        }
        ClusterCommand::Rebalance { target } => {
            let mut c = target.client().await?;
            answered(c.rebalance(pb::RebalanceRequest {}).await)
        }
        ClusterCommand::Certs { out, nodes, days } => {
            let nodes = nodes
                .iter()
                .map(|n| parse_node(n))
                .collect::<Result<Vec<_>, _>>()?;
            let made = certs::make(&out, &nodes, Validity::days(days))
                .map_err(|e| UsageError::new(format!("{e:#}")))?;
            if made.new_ca {
                println!("made a new cluster CA in {}", out.display());
            } else {
                println!("used the cluster CA in {}", out.display());
            }
            for f in &made.written {
                println!("wrote {}", f.display());
            }
            Ok(Exit::Ok)
        }
    }
}
