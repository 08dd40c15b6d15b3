//! `boxoffice changes`: the change stream (`ChangeService.WatchChanges`) of a running server, one
//! JSON object a line (the HTTP API's `Change`). With `--follow` it keeps reading as changes are
//! made; if its node goes away (a failover, a restart, a drain) it resumes from the last cursor
//! it printed, on the next of its `--target`s, so nothing is missed and nothing printed twice.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use boxoffice_gateway::http::types::Change;
use boxoffice_proto::v1 as pb;

use crate::cluster::{authed, refused};
use crate::exit::Exit;

/// How long `--follow` keeps trying to reach a node again before it gives up.
const RECONNECT_FOR: Duration = Duration::from_secs(60);

/// `boxoffice changes`.
#[derive(clap::Args, Debug)]
pub struct ChangesArgs {
    /// Keep reading: print changes as they are made (until interrupted).
    #[arg(long)]
    follow: bool,
    /// Start after this cursor (a change's `cursor`). None: from the oldest change kept; `0`:
    /// from the very first.
    #[arg(long, default_value = "")]
    after: String,
    /// Only this event's changes.
    #[arg(long, default_value = "")]
    event: String,
    /// The server, or the nodes of a cluster (comma-separated: `--follow` moves to the next one
    /// when its node goes away).
    #[arg(
        long,
        env = "BOXOFFICE_TARGET",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:50051"
    )]
    target: Vec<String>,
    /// An admin key, or a stream key (`serve --stream-key`).
    #[arg(long, env = "BOXOFFICE_STREAM_KEY", hide_env_values = true)]
    key: String,
    /// The CA certificate (PEM) to trust for an `https://` target.
    #[arg(long, env = "BOXOFFICE_CA_CERT")]
    ca_cert: Option<PathBuf>,
}

/// How one connection's stream ended.
enum Ended {
    /// Everything there was has been printed (without `--follow`).
    Done,
    /// The server refused (a cursor, a key): nothing to retry.
    Refused(tonic::Status),
    /// The node went away: resume elsewhere.
    Lost(String),
}

/// Prints the stream; its exit code (1 if the server refused, with its reason on stderr).
pub async fn run(args: ChangesArgs) -> anyhow::Result<Exit> {
    let mut after = args.after.clone();
    let mut lost_since: Option<Instant> = None;
    let mut out = std::io::stdout().lock();
    for (i, target) in args.target.iter().cycle().enumerate() {
        let ended = match authed(target, &args.key, args.ca_cert.as_deref()).await {
            Ok(channel) => read(channel, &args, &mut after, &mut out, &mut lost_since).await?,
            Err(e) => Ended::Lost(format!("{e:#}")),
        };
        match ended {
            Ended::Done => return Ok(Exit::Ok),
            Ended::Refused(status) => return Ok(refused(&status)),
            Ended::Lost(why) if args.follow => {
                let since = *lost_since.get_or_insert_with(Instant::now);
                if since.elapsed() > RECONNECT_FOR {
                    anyhow::bail!("no node answered for {} s: {why}", RECONNECT_FOR.as_secs());
                }
                crate::exit::warn(format_args!(
                    "{target}: {why}; resuming after {} on {}",
                    if after.is_empty() {
                        "the start"
                    } else {
                        &after
                    },
                    args.target[(i + 1) % args.target.len()]
                ));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ended::Lost(why) => anyhow::bail!("{target}: {why}"),
        }
    }
    Ok(Exit::Ok)
}

/// Reads one connection's stream from `after`, printing each change and moving `after` on.
async fn read(
    channel: boxoffice_client::Authed,
    args: &ChangesArgs,
    after: &mut String,
    out: &mut impl Write,
    lost_since: &mut Option<Instant>,
) -> anyhow::Result<Ended> {
    let mut client = pb::change_service_client::ChangeServiceClient::new(channel)
        .max_decoding_message_size(boxoffice_gateway::limits::MESSAGE_BYTES_MAX);
    let req = pb::WatchChangesRequest {
        after_cursor: after.clone(),
        event_id: args.event.clone(),
        follow: args.follow,
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
                serde_json::to_writer(&mut *out, &Change::from(change))?;
                out.write_all(b"\n")?;
                out.flush()?;
                *after = cursor;
            }
            Ok(None) if args.follow => return Ok(Ended::Lost("the stream ended".into())),
            Ok(None) => return Ok(Ended::Done),
            Err(s) => return Ok(lost_or_refused(s)),
        }
    }
}

/// A node that is not there (or not ready) is lost; anything else is the server's answer.
fn lost_or_refused(s: tonic::Status) -> Ended {
    match s.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => {
            Ended::Lost(format!("{:?}: {}", s.code(), s.message()))
        }
        _ => Ended::Refused(s),
    }
}
