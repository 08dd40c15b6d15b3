//! `boxoffice ticket`: the public keys door scanners verify e-ticket codes with, the offline
//! verification of a code (exit code 1 if it is not genuine), and the rotation of the signing
//! key (offline: the server stopped).

use std::path::{Path, PathBuf};

use boxoffice_drill::secret::UsageError;
use boxoffice_gateway::tickets::{self, KeyRing, PublicKey};
use clap::Subcommand;

use crate::exit::Exit;

/// The subcommands of `boxoffice ticket`.
#[derive(Subcommand, Debug)]
pub enum TicketCommand {
    /// List the public keys door scanners verify ticket codes with: one line each, `KID HEX
    /// signing|verifying` (the signing key signs new tickets; every key listed verifies).
    PublicKey {
        /// The server's data dir (where `ticket-signing.key` and `ticket-public-keys/` are).
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
    },
    /// Verify a ticket code offline; prints what it says, exits 1 if it is not genuine.
    Verify {
        /// The code, as `Ticket.code` shows it.
        code: String,
        /// A public key (hex) to verify with (repeatable: the code names the one it needs);
        /// without it, the keys of `--data-dir`.
        #[arg(long)]
        public_key: Vec<String>,
        /// The server's data dir (used when no `--public-key` is given).
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
        /// The event's revocation list, as `GET /v1/events/{id}/revocations` (or
        /// `GetRevocationList`) answers it (JSON; or its `signed` text alone): a code it revokes
        /// is not valid. Its signature is checked with the same keys as the code's.
        #[arg(long)]
        revocations: Option<PathBuf>,
    },
    /// Make a new signing key; the old public keys stay, so tickets already sold keep verifying.
    /// Offline: refused while a server runs on the data dir. Give scanners the new public key
    /// before the next start.
    RotateKey {
        /// The server's data dir.
        #[arg(long, env = "BOXOFFICE_DATA_DIR", default_value = "boxoffice-data")]
        data_dir: PathBuf,
    },
}

/// Runs the subcommand; its exit code.
pub async fn run(command: TicketCommand) -> anyhow::Result<Exit> {
    match command {
        TicketCommand::PublicKey { data_dir } => {
            list(&load(&data_dir)?);
            Ok(Exit::Ok)
        }
        TicketCommand::Verify {
            code,
            public_key,
            data_dir,
            revocations,
        } => verify(&code, &public_key, &data_dir, revocations.as_deref()),
        TicketCommand::RotateKey { data_dir } => {
            boxoffice_drill::held::refuse_if_held(&data_dir)?;
            // A dir without keys is nothing to work on (exit 2), as for every reader of it.
            load(&data_dir)?;
            if data_dir.join(boxoffice_gateway::node::GROUPS_FILE).exists() {
                // Not this command's to do (exit 2): the node's files are not the ring.
                return Err(boxoffice_drill::secret::UsageError::new(format!(
                    "{} is a cluster node's data dir: its tickets are signed with the cluster's \
                     key ring (replicated by group 0), which a node's files do not change: \
                     rotate it live with `boxoffice cluster rotate-ticket-key`",
                    data_dir.display()
                ))
                .into());
            }
            let r = boxoffice_gateway::server::rotate_ticket_key(&data_dir).await?;
            match r.retired {
                Some(old) => eprintln!("key {old} retired: its tickets keep verifying"),
                None => eprintln!("there was no signing key; the kept public keys still verify"),
            }
            eprintln!(
                "key {} signs from the next start; {} keys verify tickets:",
                r.signing, r.keys
            );
            list(&load(&data_dir)?);
            Ok(Exit::Ok)
        }
    }
}

/// The ring of `data_dir`, refused when it holds no key at all (most likely the wrong dir): a
/// usage error (exit code 2), nothing to work on.
fn load(data_dir: &Path) -> anyhow::Result<KeyRing> {
    let ring = KeyRing::load(data_dir)?;
    if ring.keys().is_empty() {
        return Err(UsageError::new(format!(
            "no ticket keys in {} (neither {} nor {}/): is it the server's data dir?",
            data_dir.display(),
            tickets::KEY_FILE,
            tickets::PUBLIC_KEYS_DIR
        ))
        .into());
    }
    Ok(ring)
}

fn list(ring: &KeyRing) {
    let signing = ring.signer().map(|s| s.kid());
    for k in ring.keys() {
        let role = if Some(k.kid()) == signing {
            "signing"
        } else {
            "verifying"
        };
        println!("{} {} {role}", k.kid(), k.to_hex());
    }
    if signing.is_none() {
        eprintln!(
            "no signing key ({} is missing): the server will not start without --new-ticket-key",
            tickets::KEY_FILE
        );
    }
}

/// The revocation list in `path` (JSON with a `signed` field, or the signed text), verified
/// with `keys`: a list that is not genuine is refused (exit code 2: nothing to check against).
fn revocation_list(path: &Path, keys: &[PublicKey]) -> anyhow::Result<tickets::Revocations> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| UsageError::new(format!("--revocations {}: {e}", path.display())))?;
    let signed = match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) => v["signed"].as_str().map(str::to_owned).ok_or_else(|| {
            UsageError::new(format!(
                "--revocations {}: JSON without a `signed` field",
                path.display()
            ))
        })?,
        Err(_) => text.trim().to_owned(),
    };
    let (list, _) = tickets::verify_revocations(&signed, keys).map_err(|e| {
        UsageError::new(format!(
            "--revocations {}: not a genuine revocation list for these keys: {e}",
            path.display()
        ))
    })?;
    Ok(list)
}

fn verify(
    code: &str,
    hex_keys: &[String],
    data_dir: &Path,
    revocations: Option<&Path>,
) -> anyhow::Result<Exit> {
    let keys = if hex_keys.is_empty() {
        load(data_dir)?.keys().to_vec()
    } else {
        hex_keys
            .iter()
            .map(|k| {
                PublicKey::from_hex(k)
                    .map_err(|e| UsageError::new(format!("--public-key {k:?}: {e}")).into())
            })
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    let revoked = revocations.map(|p| revocation_list(p, &keys)).transpose()?;
    match tickets::verify(code, &keys) {
        Ok(v) => {
            let t = v.claims;
            if let Some(list) = &revoked {
                if list.event_id != t.event_id {
                    return Err(UsageError::new(format!(
                        "the revocation list is event {}'s, the ticket is event {}'s",
                        list.event_id, t.event_id
                    ))
                    .into());
                }
                if list.ticket_ids.contains(&t.ticket_id) {
                    println!(
                        "NOT VALID: ticket {} was revoked (given back by its buyer): it is on                          event {}'s revocation list as of {} ms",
                        t.ticket_id, list.event_id, list.as_of_ms
                    );
                    return Ok(Exit::Failed);
                }
            }
            println!("valid ticket");
            println!("event   {}", t.event_id);
            println!("section {}", t.section_id);
            println!(
                "seat    {}",
                if t.seat_id.is_empty() {
                    "(general admission)"
                } else {
                    &t.seat_id
                }
            );
            println!("order   {}", t.order_id);
            println!("ticket  {}", t.ticket_id);
            if v.kid_in_code {
                println!("key     {}", v.kid);
            } else {
                println!("key     {} (a code from before key ids)", v.kid);
            }
            if let Some(list) = &revoked {
                println!(
                    "not revoked (event {}'s revocation list as of {} ms, {} revoked)",
                    list.event_id,
                    list.as_of_ms,
                    list.ticket_ids.len()
                );
            }
            Ok(Exit::Ok)
        }
        Err(e) => {
            println!("NOT VALID: {e}");
            Ok(Exit::Failed)
        }
    }
}
