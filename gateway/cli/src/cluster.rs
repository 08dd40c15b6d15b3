//! `boxoffice cluster`: tools for a cluster's operator. `certs` makes the cluster's CA and its
//! nodes' certificates for the peer port's mutual TLS.

use std::path::PathBuf;

use boxoffice_drill::secret::UsageError;
use boxoffice_gateway::certs::{self, NodeHosts, Validity};
use clap::Subcommand;

use crate::exit::Exit;

/// The subcommands of `boxoffice cluster`.
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
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

/// Runs the subcommand; its exit code.
pub fn run(command: ClusterCommand) -> anyhow::Result<Exit> {
    match command {
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
