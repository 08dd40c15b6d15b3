//! `boxoffice changes`: the change stream (`ChangeService.WatchChanges`) of a running server, one
//! JSON object a line (the HTTP API's `Change`). With `--follow` it keeps reading as changes are
//! made; if its node goes away (a failover, a restart, a drain) it resumes from the last cursor
//! it printed, on the next of its `--target`s, so nothing is missed and nothing printed twice
//! ([`boxoffice_drill::changes`]).

use std::io::Write;
use std::path::PathBuf;

use boxoffice_drill::changes::{Ended, Follow, follow};
use boxoffice_gateway::http::changes::Change;

use crate::cluster::refused;
use crate::exit::Exit;

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

/// Prints the stream; its exit code (1 if the server refused, with its reason on stderr).
pub async fn run(args: ChangesArgs) -> anyhow::Result<Exit> {
    let f = Follow {
        targets: args.target,
        key: args.key,
        ca_cert: args.ca_cert,
        after: args.after,
        event: args.event,
        follow: args.follow,
    };
    let mut out = std::io::stdout().lock();
    let ended = follow(
        &f,
        |change| {
            serde_json::to_writer(&mut out, &Change::from(change))?;
            out.write_all(b"\n")?;
            out.flush()?;
            Ok(())
        },
        |target, why, after| {
            let after = if after.is_empty() { "the start" } else { after };
            crate::exit::warn(format_args!("{target}: {why}; resuming after {after}"));
        },
    )
    .await?;
    Ok(match ended {
        Ended::Done => Exit::Ok,
        Ended::Refused(status) => refused(&status),
    })
}
