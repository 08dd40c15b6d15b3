//! A real gRPC server in a child process, for tests that kill it with SIGKILL at a moment of
//! their choosing and start another on the same data dir.
//!
//! The child side, [`serve`], runs in the helper binary (`boxoffice-test-child serve`, its
//! data dir in [`DIR_VAR`]; see [`crate::child`]): it starts the server of `boxoffice serve`
//! (the keys and token secret of [`crate::server`]) on `127.0.0.1:0` over that data dir, waits
//! for recovery, prints where it listens, and then answers audits asked on its stdin: the
//! engine's reconciliation and invariant checks, which the gRPC contract does not expose.
//!
//! ```text
//! let mut server = ServerProcess::start(child_bin!(), dir.path()).await?;
//! let audit = server.audit();  // reconciliation findings, invariant violations
//! server.kill();               // SIGKILL: no drain, no flush, no goodbye
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use boxoffice_engine::{Engine, Finding};
use boxoffice_gateway::server::{self, ServerConfig};
use tonic::transport::Channel;

use crate::child::{self, ChildTest};
use crate::server::{ADMIN, CLIENT, SECRET};
use crate::{Bearer, Clients, connect};

/// The variable naming the data dir of the child's server.
pub const DIR_VAR: &str = "BOXOFFICE_SERVER_PROCESS_DIR";
/// Set (to anything) for a child whose server also serves `/metrics` on `127.0.0.1:0`: a
/// process of its own has a metrics recorder of its own, untouched by other tests.
pub const METRICS_VAR: &str = "BOXOFFICE_SERVER_PROCESS_METRICS";

/// The child's line once it serves: this, a space, the gRPC address.
const SERVING: &str = "SERVER-PROCESS-SERVING";
/// The child's line before [`SERVING`] when it serves metrics: this, a space, their address.
const METRICS: &str = "SERVER-PROCESS-METRICS";
/// The child's line when its server did not start: this, a space, why.
const FAILED: &str = "SERVER-PROCESS-FAILED";
/// The command on the child's stdin that asks for an audit.
const AUDIT: &str = "AUDIT";
/// The child's last line of an audit's answer.
const AUDIT_END: &str = "AUDIT-END";
/// An audit line: a captured charge without an order (`payment_id hold_id`).
const UNPAID: &str = "CAPTURED-WITHOUT-ORDER";
/// An audit line: anything else that does not add up.
const PROBLEM: &str = "PROBLEM";

/// The child side: serves on `dir` until killed (or until the parent closes the child's stdin).
/// Failures to start are printed for the parent (the child's stderr is dropped).
pub fn serve(dir: &str) {
    child::announce();
    crate::on_runtime(async move {
        let mut config = ServerConfig::new(ADMIN, CLIENT, SECRET);
        config.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.metrics_listen =
            std::env::var_os(METRICS_VAR).map(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        config.data_dir = dir.into();
        config.grace = Duration::from_secs(1);
        config.reconcile_every = None; // the parent asks for audits when it wants them
        let mut running = match server::start(config).await {
            Ok(running) => running,
            Err(e) => return println!("{FAILED} start: {e:#}"),
        };
        if let Err(e) = running.wait_ready().await {
            return println!("{FAILED} recovery: {e:#}");
        }
        let Some(engine) = running.engine() else {
            return println!("{FAILED} no engine after recovery");
        };
        if let Some(m) = running.metrics_addr {
            println!("{METRICS} {m}");
        }
        println!("{SERVING} {}", running.addr);
        // Commands come on stdin, read by a plain thread (blocking reads) and handed over.
        let (tx, mut commands) = tokio::sync::mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in std::io::stdin().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        while let Some(command) = commands.recv().await {
            if command == AUDIT {
                for line in audit(&engine).await {
                    println!("{line}");
                }
                println!("{AUDIT_END}");
            }
        }
        let _ = running.shutdown().await;
    });
}

/// The lines of one audit: the reconciliation's findings (a captured charge without an order
/// with the hold it was for, taken from the charge's provider key `{hold}:{token fingerprint}`)
/// and the sections' invariant violations.
async fn audit(engine: &Engine) -> Vec<String> {
    let mut out = Vec::new();
    match engine.reconcile().await {
        Ok(findings) => {
            let charges = engine.payments().charges().await.unwrap_or_default();
            for f in findings {
                match &f {
                    Finding::CapturedWithoutOrder { payment_id, .. } => {
                        let hold = charges
                            .iter()
                            .find(|c| &c.payment_id == payment_id)
                            .and_then(|c| c.key.split(':').next())
                            .unwrap_or("?");
                        out.push(format!("{UNPAID} {payment_id} {hold}"));
                    }
                    _ => out.push(format!("{PROBLEM} reconciliation: {f:?}")),
                }
            }
        }
        Err(e) => out.push(format!("{PROBLEM} the reconciliation failed: {e}")),
    }
    match engine.invariant_violations().await {
        Ok(violations) => out.extend(
            violations
                .into_iter()
                .map(|v| format!("{PROBLEM} invariant: {v}")),
        ),
        Err(e) => out.push(format!("{PROBLEM} the invariant check failed: {e}")),
    }
    out
}

/// What an audit of the child's engine found.
#[derive(Debug, Default)]
pub struct Audit {
    /// Captured charges without an order: (payment id, the hold it was for). A crash between
    /// the charge and the order leaves one, until the confirm is retried.
    pub captured_without_order: Vec<(String, String)>,
    /// Every other finding of the reconciliation, and every invariant violation.
    pub problems: Vec<String>,
}

/// The parent side: a server in a child process, and a channel to it.
pub struct ServerProcess {
    child: ChildTest,
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    channel: Channel,
}

impl ServerProcess {
    /// Starts [`serve`] on `dir` in the helper binary `exe` ([`crate::child_bin!`]), waits
    /// until it serves, and connects; or says why the server did not start (its recovery
    /// refused the data dir, or the process ended).
    pub async fn start(exe: &str, dir: &Path) -> anyhow::Result<ServerProcess> {
        Self::start_with(exe, dir, &[]).await
    }

    /// [`ServerProcess::start`] for a server that also serves `/metrics`
    /// ([`ServerProcess::metrics_addr`]).
    pub async fn start_with_metrics(exe: &str, dir: &Path) -> anyhow::Result<ServerProcess> {
        Self::start_with(exe, dir, &[(METRICS_VAR, "1".as_ref())]).await
    }

    async fn start_with(
        exe: &str,
        dir: &Path,
        envs: &[(&str, &std::ffi::OsStr)],
    ) -> anyhow::Result<ServerProcess> {
        let mut all = vec![(DIR_VAR, dir.as_os_str())];
        all.extend_from_slice(envs);
        let mut child = ChildTest::spawn(exe, "serve", &all);
        let mut metrics_addr = None;
        let addr = tokio::task::block_in_place(|| {
            loop {
                let Some(line) = child.next_line() else {
                    anyhow::bail!("the server process ended before serving");
                };
                if let Some(addr) = line.strip_prefix(METRICS) {
                    metrics_addr = Some(addr.trim().parse::<SocketAddr>()?);
                }
                if let Some(addr) = line.strip_prefix(SERVING) {
                    break Ok(addr.trim().parse::<SocketAddr>()?);
                }
                if line.starts_with(FAILED) {
                    anyhow::bail!("{line}");
                }
            }
        })?;
        let channel = connect(&format!("http://{addr}")).await?;
        Ok(ServerProcess {
            child,
            addr,
            metrics_addr,
            channel,
        })
    }

    /// The gRPC address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The metrics address (a server started with [`ServerProcess::start_with_metrics`]).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Clients with the admin key.
    pub fn admin(&self) -> Clients {
        Clients::new(&self.channel, &Bearer::new(ADMIN).expect("an ASCII key"))
    }

    /// Clients with the client key (clones share one connection).
    pub fn client(&self) -> Clients {
        Clients::new(&self.channel, &Bearer::new(CLIENT).expect("an ASCII key"))
    }

    /// Asks the child for an audit of its engine and waits for the answer. Run it when no call
    /// is in flight: a confirm between its charge and its order shows as a captured charge
    /// without an order.
    pub fn audit(&mut self) -> Audit {
        tokio::task::block_in_place(|| {
            self.child.send_line(AUDIT);
            let mut audit = Audit::default();
            loop {
                let line = self
                    .child
                    .next_line()
                    .expect("the server process answers the audit");
                if line == AUDIT_END {
                    return audit;
                }
                if let Some(rest) = line.strip_prefix(UNPAID) {
                    let mut parts = rest.split_whitespace();
                    let payment = parts.next().unwrap_or("?").to_owned();
                    let hold = parts.next().unwrap_or("?").to_owned();
                    audit.captured_without_order.push((payment, hold));
                } else if let Some(rest) = line.strip_prefix(PROBLEM) {
                    audit.problems.push(rest.trim().to_owned());
                }
            }
        })
    }

    /// Sends SIGKILL to the server process and reaps it.
    pub fn kill(mut self) {
        self.child.kill();
    }
}
