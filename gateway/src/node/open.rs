//! A cluster node's store and Raft of each group: the data dir's layout, the first start that
//! forms a group, and every start's opening of what is durable.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::config::ClusterConfig;

/// The file of a cluster node's data dir that records its `--groups`.
pub const GROUPS_FILE: &str = "cluster-groups";

/// Refuses a cluster node's start with another `--groups` than its data dir was made with (an
/// event's group is its id's hash modulo the count: another count would lose events); records
/// the count on the first start. A data dir from before the count was recorded, with a log at
/// its top, was made with one group.
pub(crate) fn check_groups(data_dir: &std::path::Path, groups: u32) -> anyhow::Result<()> {
    let path = data_dir.join(GROUPS_FILE);
    let had = match std::fs::read_to_string(&path) {
        Ok(text) => Some(
            text.trim()
                .parse::<u32>()
                .with_context(|| format!("{} does not hold a group count", path.display()))?,
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            data_dir.join("db").exists().then_some(1)
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if let Some(had) = had
        && had != groups
    {
        anyhow::bail!(
            "{} was made with --groups {had}: a cluster's group count cannot change (an event's \
             group is its id's hash modulo the count); start with --groups {had}",
            data_dir.display()
        );
    }
    if !path.exists() {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("creating {}", data_dir.display()))?;
        let tmp = data_dir.join(format!("{GROUPS_FILE}.tmp"));
        std::fs::write(&tmp, format!("{groups}\n"))?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(data_dir)?.sync_all()?;
    }
    Ok(())
}

/// Where group `g` of a cluster node keeps its log: the data dir itself for group 0 (a
/// one-group node's layout), `group-{g}/` inside it for the others.
pub fn group_dir(data_dir: &std::path::Path, g: u32) -> PathBuf {
    if g == 0 {
        data_dir.to_owned()
    } else {
        data_dir.join(format!("group-{g}"))
    }
}

/// Opens a cluster node's sled database for `group` ([`group_dir`]), its Raft log and state
/// machine, and its Raft; the group's first node (round robin by id: group 0 the lowest) forms
/// it on the very first start of every node ([`form_group`]).
pub(crate) async fn open_raft(
    cluster: &ClusterConfig,
    data_dir: &std::path::Path,
    group: u32,
    links: &crate::node::peers::Peers,
) -> anyhow::Result<(
    boxoffice_engine::raft::Raft,
    boxoffice_engine::raft::StateMachine,
    boxoffice_engine::raft::VoteGuard,
)> {
    use boxoffice_engine::raft;
    anyhow::ensure!(
        cluster.peers.contains_key(&cluster.node_id),
        "--node-id {} is not one of --peers ({:?})",
        cluster.node_id,
        cluster.peers.keys().collect::<Vec<_>>()
    );
    let peers = links.clone().in_group(group, cluster.groups.max(1));
    let (sm, log, guard) = match open_store(cluster, data_dir, group).await {
        Ok(opened) => opened,
        // A damaged store is never voted or led with: a node on sled's files sets it aside
        // and rejoins its group empty (a simulation's disks are not repaired here).
        Err(damage) if raft::is_damaged_store(damage.as_ref()) && cluster.stores.is_none() => {
            let store = crate::node::repair::Damaged {
                group,
                dir: group_dir(data_dir, group),
                data_dir,
                damage,
            };
            crate::node::repair::set_aside(cluster.node_id, &peers, store).await?;
            open_store(cluster, data_dir, group)
                .await
                .context("opening the empty store that replaces the damaged one")?
        }
        Err(e) => return Err(e),
    };
    let raft = raft::Raft::new(
        cluster.node_id,
        raft::config_keeping(cluster.snapshot_every, cluster.snapshot_keep)?,
        peers.clone(),
        log,
        sm.clone(),
    )
    .await
    .context("starting Raft")?;
    quiet_start(&raft);
    // Group g is formed by the g-th node (by id, round robin): its first leader.
    let ids: Vec<u64> = cluster.peers.keys().copied().collect();
    if ids.get(group as usize % ids.len().max(1)) == Some(&cluster.node_id) {
        tokio::spawn(form_group(raft.clone(), guard.clone(), peers.clone()));
    }
    Ok((raft, sm, guard))
}

/// How long a node that starts stays out of elections, unless a leader reaches it first:
/// longer than a leader waits before it calls a peer that was down again (openraft 0.9 backs
/// off for 500 ms). openraft 0.9 has no pre-vote, and a restarted node reads its vote back
/// uncommitted (so it does not resume a leadership it may have lost entries of), so without
/// this it would stand after one election timeout (150 to 300 ms), before its leader's next
/// try reaches it, and depose a working leader: an election for nothing at every restart.
const QUIET_START: Duration = Duration::from_millis(1_000);

/// Keeps `raft` out of elections for [`QUIET_START`], or until it knows a leader.
fn quiet_start(raft: &boxoffice_engine::raft::Raft) {
    raft.runtime_config().elect(false);
    let raft = raft.clone();
    tokio::spawn(async move {
        let mut metrics = raft.metrics();
        let known = metrics.wait_for(|m| m.current_leader.is_some());
        let _ = tokio::time::timeout(QUIET_START, known).await;
        raft.runtime_config().elect(true);
    });
}

/// Opens group `group`'s store and what a start reads of it: the state machine, the log, the
/// vote guard. What the last run wrote but never synced is made durable before anything is
/// read, so this start never acts on a vote or entries that a power cut could take back.
async fn open_store(
    cluster: &ClusterConfig,
    data_dir: &std::path::Path,
    group: u32,
) -> anyhow::Result<(
    boxoffice_engine::raft::StateMachine,
    boxoffice_engine::raft::LogStore,
    boxoffice_engine::raft::VoteGuard,
)> {
    let db = open_db(cluster, data_dir, group).await?;
    boxoffice_engine::raft::open_for_start(&db)
        .await
        .with_context(|| {
            format!(
                "opening the Raft storage in {}",
                group_dir(data_dir, group).display()
            )
        })
}

/// Opens group `group`'s store in `data_dir` ([`group_dir`]; the test's store if it gave one).
async fn open_db(
    cluster: &ClusterConfig,
    data_dir: &std::path::Path,
    group: u32,
) -> anyhow::Result<boxoffice_engine::raft::NodeDb> {
    use boxoffice_engine::raft;
    let dir = group_dir(data_dir, group);
    let shown = dir.clone();
    // The node's groups share one page cache budget (sled's 1 GiB), at least 64 MiB each.
    let cache = (boxoffice_engine::store::SLED_CACHE_BYTES / u64::from(cluster.groups.max(1)))
        .max(64 << 20);
    let store = cluster
        .stores
        .as_ref()
        .and_then(|s| s.get(group as usize).cloned());
    Ok(match store {
        Some(store) => raft::NodeDb::new(store),
        // sled panics on some damage in its file (a message that passes its checksum but
        // does not parse): that is damage too, said as such.
        None => boxoffice_engine::rt::blocking(move || raft::open_node_db_cached(&dir, cache))
            .await
            .map_err(|panicked| {
                anyhow::Error::new(raft::damaged_store(&format!(
                    "sled could not read {} ({panicked})",
                    shown.display()
                )))
            })?
            .with_context(|| format!("opening {}", shown.display()))?,
    })
}

/// Forms the group on the first start of the node with the lowest id, once every node of the
/// cluster answers that it is pristine too (a node whose data dir was wiped while a group
/// exists must rejoin that group, never form a new one): until then it asks again every
/// [`FORM_RETRY`], and stops asking once it has Raft state (a leader reached it) or a peer has.
async fn form_group(
    raft: boxoffice_engine::raft::Raft,
    guard: boxoffice_engine::raft::VoteGuard,
    network: crate::node::peers::Peers,
) {
    let me = raft.metrics().borrow().id;
    let group = network.group();
    loop {
        tokio::time::sleep(FORM_RETRY).await;
        if !matches!(raft.is_initialized().await, Ok(false))
            || raft.metrics().borrow().current_leader.is_some()
        {
            return;
        }
        match network.all_pristine(me).await {
            Some(true) => break,
            Some(false) => {
                tracing::info!("a group exists: waiting for its leader to reach this node");
                return;
            }
            None => tracing::info!("waiting for every node before forming the group"),
        }
    }
    let members: std::collections::BTreeMap<u64, openraft::BasicNode> = network
        .addrs()
        .into_iter()
        .map(|(id, a)| (id, openraft::BasicNode::new(a)))
        .collect();
    match raft.initialize(members).await {
        Ok(()) => {
            guard.set_ready();
            tracing::info!(group, "formed the group");
        }
        Err(e) => tracing::info!(error = %e, "the group was not formed here"),
    }
}

/// How often the lowest node asks its peers before forming the group.
const FORM_RETRY: Duration = Duration::from_millis(1_500);
