//! The flags of how a server meets the network: TLS on its public ports, and a cluster node's
//! peers, secret, groups and peer port (issue 27, point 3).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use boxoffice_drill::secret::{self, UsageError};
use boxoffice_gateway::server;
use boxoffice_gateway::tls::{PeerTls, PublicTls};

/// TLS on the public ports (gRPC and the HTTP API).
#[derive(clap::Args, Debug)]
pub struct TlsArgs {
    /// Serve TLS on the public gRPC and HTTP ports with this certificate chain (PEM, the
    /// server's certificate first). Without it both ports are plaintext.
    #[arg(long, env = "BOXOFFICE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "BOXOFFICE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require a client certificate signed by this CA (PEM) on the public ports.
    #[arg(long, env = "BOXOFFICE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
}

/// A cluster node's flags.
#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Run as node N of a cluster (with --peers and a cluster secret): the node replicates its
    /// log with Raft, serves the engine while it leads and forwards calls to the leader
    /// otherwise. Every node needs the same keys and token secret. Without it: one node.
    #[arg(
        long,
        env = "BOXOFFICE_NODE_ID",
        value_name = "N",
        requires = "peers",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) node_id: Option<u64>,
    /// Every node of the cluster as ID=HOST:PORT, comma-separated, this node's among them, at
    /// the address the others reach it on: its --peer-listen port if the nodes have one (they
    /// all must, or none), its --listen address otherwise; e.g.
    /// 1=10.0.0.1:50061,2=10.0.0.2:50061,3=...
    #[arg(
        long,
        env = "BOXOFFICE_PEERS",
        value_delimiter = ',',
        value_name = "ID=HOST:PORT",
        requires = "node_id"
    )]
    peers: Vec<String>,
    /// The secret a cluster's nodes share (their Raft messages and forwarded calls carry it).
    #[arg(
        long,
        env = "BOXOFFICE_CLUSTER_SECRET",
        hide_env_values = true,
        conflicts_with = "cluster_secret_file"
    )]
    cluster_secret: Option<String>,
    /// A file holding the cluster secret (trailing newline trimmed).
    #[arg(long, env = "BOXOFFICE_CLUSTER_SECRET_FILE", hide_env_values = true)]
    cluster_secret_file: Option<PathBuf>,
    /// Raft entries (group commits) between snapshots of a node's log; the Raft log before a
    /// snapshot is purged, and a node that lost its data catches up from one.
    #[arg(
        long,
        env = "BOXOFFICE_SNAPSHOT_EVERY",
        default_value_t = 10_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    snapshot_every: u64,
    /// Raft groups of a cluster (1 to 64): each event belongs to one (by a hash of its id), each
    /// group has its own log and leader, and the groups' first leaders are spread over the
    /// nodes, so events scale out across machines. The same on every node.
    #[arg(
        long,
        env = "BOXOFFICE_GROUPS",
        default_value_t = 1,
        value_parser = clap::value_parser!(u32).range(1..=64)
    )]
    groups: u32,
    /// The peer port: Raft and calls forwarded between nodes are served here and only here (the
    /// public port then refuses them), over mutual TLS with --peer-ca, --peer-cert and
    /// --peer-key. Keep it on a private network. Without it, a cluster node takes them on its
    /// public gRPC port, and the cluster secret they carry crosses that port.
    #[arg(long, env = "BOXOFFICE_PEER_LISTEN", requires_all = ["node_id", "peer_ca", "peer_cert", "peer_key"])]
    peer_listen: Option<SocketAddr>,
    /// The cluster's CA certificate (PEM): peers are accepted and reached only with a
    /// certificate it signed (`boxoffice cluster certs` makes one).
    #[arg(long, env = "BOXOFFICE_PEER_CA", requires = "peer_listen")]
    peer_ca: Option<PathBuf>,
    /// This node's certificate on the peer port (PEM; signed by --peer-ca, naming the host the
    /// other nodes dial in --peers).
    #[arg(long, env = "BOXOFFICE_PEER_CERT", requires = "peer_listen")]
    peer_cert: Option<PathBuf>,
    /// The private key of --peer-cert (PEM).
    #[arg(long, env = "BOXOFFICE_PEER_KEY", requires = "peer_listen")]
    peer_key: Option<PathBuf>,
}

/// The public ports' TLS of the flags, read and checked (a bad file is a usage error naming it).
pub fn public_tls(args: TlsArgs) -> Result<Option<Arc<PublicTls>>, UsageError> {
    let (Some(cert), Some(key)) = (args.tls_cert, args.tls_key) else {
        return Ok(None);
    };
    PublicTls::load(&cert, &key, args.tls_client_ca.as_deref())
        .map(|t| Some(Arc::new(t)))
        .map_err(|e| UsageError::new(format!("{e:#}")))
}

/// The peer port's mutual TLS of the flags, read and checked.
fn peer_tls(args: &ClusterArgs) -> Result<Option<Arc<PeerTls>>, UsageError> {
    let (Some(ca), Some(cert), Some(key)) = (&args.peer_ca, &args.peer_cert, &args.peer_key) else {
        return Ok(None);
    };
    PeerTls::load(ca, cert, key)
        .map(|t| Some(Arc::new(t)))
        .map_err(|e| UsageError::new(format!("{e:#}")))
}

/// `--peers ID=HOST:PORT,...`: each node's address, by id (each id once).
fn parse_peers(peers: &[String]) -> Result<std::collections::BTreeMap<u64, String>, UsageError> {
    let mut map = std::collections::BTreeMap::new();
    for p in peers {
        let (id, addr) = p
            .split_once('=')
            .ok_or_else(|| UsageError::new(format!("--peers: {p:?} is not ID=HOST:PORT")))?;
        let id: u64 = id
            .trim()
            .parse()
            .map_err(|_| UsageError::new(format!("--peers: {id:?} in {p:?} is not a node id")))?;
        let addr = addr.trim();
        let port_ok = addr
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !port_ok {
            return Err(UsageError::new(format!(
                "--peers: {addr:?} in {p:?} is not HOST:PORT"
            )));
        }
        if map.insert(id, addr.to_owned()).is_some() {
            return Err(UsageError::new(format!(
                "--peers: node {id} is named twice"
            )));
        }
    }
    Ok(map)
}

/// The cluster part of the flags, if `--node-id` was given. A cluster's nodes must share
/// their keys and token secret: generated ones are refused.
pub fn cluster_config(
    args: ClusterArgs,
    keys_given: bool,
    public_tls: bool,
) -> Result<Option<server::ClusterConfig>, UsageError> {
    if args.node_id.is_some() && public_tls && args.peer_listen.is_none() {
        return Err(UsageError::new(
            "a cluster node with --tls-cert needs --peer-listen (and --peer-ca, --peer-cert, \
             --peer-key): its peers reach it on its peer port, never on the public TLS port"
                .to_owned(),
        ));
    }
    let (secret, secret_file, groups) = (
        args.cluster_secret.clone(),
        args.cluster_secret_file.as_deref(),
        args.groups,
    );
    let Some(node_id) = args.node_id else {
        if secret.is_some() || secret_file.is_some() {
            return Err(UsageError::new(
                "--cluster-secret needs --node-id and --peers".to_owned(),
            ));
        }
        if groups != 1 {
            return Err(UsageError::new(
                "--groups needs --node-id and --peers (a single node has one log)".to_owned(),
            ));
        }
        return Ok(None);
    };
    let map = parse_peers(&args.peers)?;
    if !map.contains_key(&node_id) {
        return Err(UsageError::new(format!(
            "--node-id {node_id} is not one of --peers ({})",
            map.keys()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let secret = secret::one("--cluster-secret-file", secret, secret_file)?
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            UsageError::new(
                "--node-id needs the cluster's secret: --cluster-secret-file F (or \
                 --cluster-secret)"
                    .to_owned(),
            )
        })?;
    if !keys_given {
        return Err(UsageError::new(
            "a cluster's nodes share their API keys and token secret: give --admin-key, \
             --client-key and --token-secret (or their files) to every node"
                .to_owned(),
        ));
    }
    Ok(Some(server::ClusterConfig {
        node_id,
        peers: map,
        secret: boxoffice_gateway::node::peers::ClusterSecret::new(&secret)
            .map_err(|e| UsageError::new(format!("--cluster-secret-file: {e}")))?,
        snapshot_every: args.snapshot_every,
        groups,
        stores: None,
        snapshot_keep: boxoffice_engine::raft::SNAPSHOT_KEEP_DEFAULT,
        peer_listen: args.peer_listen,
        peer_tls: peer_tls(&args)?,
    }))
}
