//! A cluster node whose store is damaged repairs itself (issue 27, point 4).
//!
//! At its start a node checks its store as strictly as a single node checks its log: the Raft
//! marks (the last index and the vote it made durable), the entries' checksums and order, and
//! whether sled can read its file at all ([`boxoffice_engine::raft::open_for_start`]). A store
//! that fails is never voted or led with. If another node of the cluster holds the group, the
//! damaged store is moved aside (never deleted: `damaged-group-G-SECONDS/` in the data dir, with
//! `DAMAGE.txt` saying what was found), and the node starts the group empty: like a node whose
//! disk was wiped, it catches up from the leader (from a snapshot if the log was purged) and
//! votes again only once it has ([`boxoffice_engine::raft::VoteGuard`]). The repair is logged
//! and counted in `boxoffice_raft_repairs_total{group}`.
//!
//! If no other node answers that it holds the group within [`PEERS_WAIT`], the store is left
//! as it is and the start fails, naming the damage: a node never throws away the only copy
//! there may be (every node damaged at once is the operator's to look at).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::node::peers::Peers;

/// How long a damaged node waits for another node to answer that it holds the group.
pub const PEERS_WAIT: Duration = Duration::from_secs(30);

/// sled's files in a store's dir (0.34: its config, its one data file, its blobs, its
/// snapshots), and the Raft marks beside them: what a repair moves aside.
fn store_file(name: &str) -> bool {
    matches!(name, "conf" | "db" | "blobs")
        || name.starts_with("snap.")
        || boxoffice_engine::store::superblock::RAFT_FILES.contains(&name)
}

/// The store a node found damaged: its group, its dir, in which data dir, what was found.
pub(crate) struct Damaged<'a> {
    pub(crate) group: u32,
    pub(crate) dir: PathBuf,
    pub(crate) data_dir: &'a Path,
    pub(crate) damage: anyhow::Error,
}

/// Moves node `me`'s damaged store out of the way, once a peer (of `peers`) answers that it
/// holds the group: where it went.
pub(crate) async fn set_aside(
    me: u64,
    peers: &Peers,
    store: Damaged<'_>,
) -> anyhow::Result<PathBuf> {
    let Damaged {
        group,
        dir,
        data_dir,
        damage,
    } = store;
    let deadline = tokio::time::Instant::now() + PEERS_WAIT;
    while !peers.any_formed(me).await {
        if tokio::time::Instant::now() >= deadline {
            return Err(damage.context(format!(
                "no other node answered within {PEERS_WAIT:?} that it holds group {group}, to \
                 repair this node's store from: the store is left as it is"
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = data_dir.join(format!("damaged-group-{group}-{seconds}"));
    std::fs::create_dir_all(&aside).with_context(|| format!("creating {}", aside.display()))?;
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        if store_file(&name.to_string_lossy()) {
            std::fs::rename(entry.path(), aside.join(&name)).with_context(|| {
                format!("moving {} to {}", entry.path().display(), aside.display())
            })?;
        }
    }
    std::fs::write(aside.join("DAMAGE.txt"), format!("{damage:#}\n"))
        .with_context(|| format!("writing {}", aside.join("DAMAGE.txt").display()))?;
    // The moves made durable before the empty store is made beside them.
    for d in [&aside, &dir, &data_dir.to_path_buf()] {
        std::fs::File::open(d)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", d.display()))?;
    }
    tracing::warn!(
        group,
        moved_to = %aside.display(),
        "{damage:#}; the damaged store was moved aside: this node rejoins the group empty, \
         catches up from its leader and votes again once it has"
    );
    metrics::counter!("boxoffice_raft_repairs_total", "group" => group.to_string()).increment(1);
    Ok(aside)
}

#[cfg(test)]
mod tests {
    use super::store_file;

    #[test]
    fn only_the_stores_files_are_moved() {
        for name in [
            "conf",
            "db",
            "blobs",
            "snap.000000000001",
            "raft-marks.0",
            "raft-marks.1",
        ] {
            assert!(store_file(name), "{name}");
        }
        for name in [
            "group-1",
            "cluster-groups",
            "ticket-public-keys",
            "ticket-signing.key",
            "damaged-group-0-1",
        ] {
            assert!(!store_file(name), "{name}");
        }
    }
}
