//! Following a server's change stream (`ChangeService.WatchChanges`) as a client does: from a
//! cursor, across the nodes of a cluster. If its node goes away (a failover, a restart, a
//! drain) the reader resumes from the last cursor it handled on the next node, so nothing is
//! missed and nothing handled twice. `boxoffice changes` prints what it reads; `flash-sale`
//! counts it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use boxoffice_proto::v1 as pb;

use crate::secret::UsageError;

/// How long a following reader keeps trying to reach a node again before it gives up.
pub const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// Where and what to read.
#[derive(Clone, Debug)]
pub struct Follow {
    /// The server, or the nodes of a cluster (tried in turn).
    pub targets: Vec<String>,
    /// An admin or stream key.
    pub key: String,
    /// The CA certificate (PEM) to trust for `https://` targets.
    pub ca_cert: Option<PathBuf>,
    /// Start after this cursor (empty: the oldest kept; `0`: the first).
    pub after: String,
    /// Only this event's changes (empty: every event's).
    pub event: String,
    /// Keep reading as changes are made.
    pub follow: bool,
}

/// How a read ended (short of an error of the reader's own).
#[derive(Debug)]
pub enum Ended {
    /// Everything there was has been read (without `follow`).
    Done,
    /// The server refused (a cursor, a key): nothing to retry.
    Refused(tonic::Status),
}

/// One connection's end.
enum Read {
    Ended(Ended),
    /// The node went away (why): resume elsewhere.
    Lost(String),
}

/// Reads `f`'s stream, handing each change to `each` (which returns an error to stop), and
/// moving on to the next target from the last change handled when a node goes away. `moved` is
/// told each move (the target left, why, the cursor resumed after).
pub async fn follow(
    f: &Follow,
    mut each: impl FnMut(pb::Change) -> anyhow::Result<()>,
    mut moved: impl FnMut(&str, &str, &str),
) -> anyhow::Result<Ended> {
    anyhow::ensure!(!f.targets.is_empty(), "no target to read from");
    let mut after = f.after.clone();
    let mut lost_since: Option<Instant> = None;
    // Without `follow`, each target is tried once in turn (a dead node's neighbour answers).
    let mut tries_left = f.targets.len();
    for target in f.targets.iter().cycle() {
        let read = match connect(f, target).await {
            Ok(c) => read(c, f, &mut after, &mut each, &mut lost_since).await?,
            Err(e) => Read::Lost(format!("{e:#}")),
        };
        match read {
            Read::Ended(end) => return Ok(end),
            Read::Lost(why) if f.follow => {
                let since = *lost_since.get_or_insert_with(Instant::now);
                if since.elapsed() > RECONNECT_FOR {
                    anyhow::bail!("no node answered for {} s: {why}", RECONNECT_FOR.as_secs());
                }
                moved(target, &why, &after);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Read::Lost(why) => {
                tries_left -= 1;
                if tries_left == 0 {
                    anyhow::bail!("{target}: {why}");
                }
                moved(target, &why, &after);
            }
        }
    }
    unreachable!("targets cycle")
}

/// A channel to `target` (trusting the CA certificate at `ca` for `https://`; one that cannot
/// be read is a [`UsageError`]) that sends `key` with every call.
pub async fn authed(
    target: &str,
    key: &str,
    ca: Option<&std::path::Path>,
) -> anyhow::Result<boxoffice_client::Authed> {
    let channel = match ca {
        Some(ca) => {
            let pem = std::fs::read(ca)
                .map_err(|e| UsageError::new(format!("--ca-cert {}: {e}", ca.display())))?;
            boxoffice_client::connect_tls(target, &pem).await?
        }
        None => boxoffice_client::connect(target).await?,
    };
    Ok(tonic::service::interceptor::InterceptedService::new(
        channel,
        boxoffice_client::Bearer::new(key)?,
    ))
}

async fn connect(
    f: &Follow,
    target: &str,
) -> anyhow::Result<pb::change_service_client::ChangeServiceClient<boxoffice_client::Authed>> {
    let authed = authed(target, &f.key, f.ca_cert.as_deref()).await?;
    Ok(pb::change_service_client::ChangeServiceClient::new(authed)
        .max_decoding_message_size(boxoffice_gateway::limits::MESSAGE_BYTES_MAX))
}

/// Reads one connection's stream from `after`, handing each change on and moving `after`.
async fn read(
    mut client: pb::change_service_client::ChangeServiceClient<boxoffice_client::Authed>,
    f: &Follow,
    after: &mut String,
    each: &mut impl FnMut(pb::Change) -> anyhow::Result<()>,
    lost_since: &mut Option<Instant>,
) -> anyhow::Result<Read> {
    let req = pb::WatchChangesRequest {
        after_cursor: after.clone(),
        event_id: f.event.clone(),
        follow: f.follow,
    };
    let mut stream = match client.watch_changes(req).await {
        Ok(s) => s.into_inner(),
        Err(s) => return Ok(lost_or_refused(s)),
    };
    *lost_since = None;
    loop {
        match stream.message().await {
            Ok(Some(change)) => {
                let cursor = change.cursor.clone();
                each(change)?;
                *after = cursor;
            }
            Ok(None) if f.follow => return Ok(Read::Lost("the stream ended".into())),
            Ok(None) => return Ok(Read::Ended(Ended::Done)),
            Err(s) => return Ok(lost_or_refused(s)),
        }
    }
}

/// A node that is not there (or not ready) is lost; so is one whose copy has not reached the
/// cursor yet (`CURSOR_INVALID` from a node behind the one that handed it out: another node,
/// or the same a little later, knows it); anything else is the server's answer.
fn lost_or_refused(s: tonic::Status) -> Read {
    let behind = s.code() == tonic::Code::InvalidArgument
        && boxoffice_client::reason(&s).as_deref() == Some("CURSOR_INVALID")
        && s.message().contains("past the end");
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            Read::Lost(format!("{:?}: {}", s.code(), s.message()))
        }
        _ if behind => Read::Lost(format!("{:?}: {}", s.code(), s.message())),
        _ => Read::Ended(Ended::Refused(s)),
    }
}
