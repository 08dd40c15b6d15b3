//! The ticket signing key a server starts with, and its rotation while the server is stopped
//! (the key ring itself: [`crate::tickets`]).

use std::sync::Arc;

use anyhow::Context;
use boxoffice_engine::{Engine, EngineConfig};

/// The ticket signing key of the data dir's ring ([`crate::tickets`]). A missing key is made
/// anew only when no ticket was sold (a new data dir), or when the operator says so: silently
/// replacing it would sign new tickets with a key the scanners do not have, and make every ticket
/// already sold whose public key is not kept fail at the door. A damaged key file is refused by
/// name, never replaced.
pub(crate) async fn signer(
    dir: &std::path::Path,
    new_ticket_key: bool,
    engine: &Engine,
) -> anyhow::Result<crate::tickets::TicketSigner> {
    use crate::tickets::{KEY_FILE, KeyRing, PUBLIC_KEYS_DIR, open_for_signing};
    // A node's groups share its key ring: one of them makes the key, the others load it. One
    // lock per data dir: nodes of other dirs in the same process (the simulation's runs, side
    // by side) never wait on each other.
    static MAKING: std::sync::LazyLock<
        dashmap::DashMap<std::path::PathBuf, Arc<tokio::sync::Mutex<()>>>,
    > = std::sync::LazyLock::new(dashmap::DashMap::new);
    let lock = MAKING.entry(dir.to_owned()).or_default().value().clone();
    let _one_at_a_time = lock.lock().await;
    if let Some(signer) = open_for_signing(dir, false)? {
        return Ok(signer);
    }
    let sold = engine.orders().await.context("counting the orders")?.len();
    let kept = KeyRing::load(dir)?.keys().len();
    let old_tickets = if kept > 0 {
        format!(
            "the tickets already sold whose public keys are kept in {PUBLIC_KEYS_DIR}/ \
             ({kept} kept) keep verifying"
        )
    } else {
        "the tickets already sold will not verify: no public key of theirs is kept".to_owned()
    };
    if sold > 0 && !new_ticket_key {
        anyhow::bail!(
            "the ticket signing key {} is missing but {sold} orders were sold: restore the file, \
             or start with --new-ticket-key to sign new tickets with a new key ({old_tickets})",
            dir.join(KEY_FILE).display()
        );
    }
    let signer = open_for_signing(dir, true)?.context("a new ticket signing key was not made")?;
    if sold > 0 {
        tracing::warn!(sold, kid = %signer.kid(), "a new ticket signing key: {old_tickets}");
    }
    Ok(signer)
}

/// Rotates the ticket signing key of a stopped server's data dir
/// ([`crate::tickets::rotate`]): a new key signs from the next start on, and the public halves of
/// the old ones stay in the ring so that tickets already sold keep verifying. The data dir is
/// held (its engine opened, which replays the log) while the keys change, so a server cannot
/// start on it meanwhile, and a server running on it makes this fail instead.
pub async fn rotate_ticket_key(
    data_dir: &std::path::Path,
) -> anyhow::Result<crate::tickets::Rotation> {
    if crate::tickets::KeyRing::load(data_dir)?.keys().is_empty() {
        // Not a server's data dir (or one never started on): `rotate` refuses it, saying so,
        // before an engine opened on a wrong path makes a log there.
        return crate::tickets::rotate(data_dir);
    }
    let engine = Engine::open(EngineConfig::new(data_dir))
        .await
        .with_context(|| {
            format!(
                "opening {} (is the server running on it? Keys are rotated with the server \
                 stopped)",
                data_dir.display()
            )
        })?;
    let rotated = crate::tickets::rotate(data_dir);
    engine.shutdown().await;
    rotated
}
