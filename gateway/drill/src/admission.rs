//! Getting fans through the waiting room before a measurement: join the line, then poll
//! `GetStatus` until admitted. Used by `loadgen` and by the benches' comparison.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use boxoffice_client::Authed;
use boxoffice_proto::v1 as pb;
use pb::waiting_room_service_client::WaitingRoomServiceClient;

/// How often [`admitted`] polls.
const POLL_EVERY: Duration = Duration::from_millis(20);

/// Joins `user` to the line of `event` (as session `session`); returns the queue token.
pub async fn join(
    room: &mut WaitingRoomServiceClient<Authed>,
    event: &str,
    user: &str,
    session: &str,
) -> anyhow::Result<String> {
    Ok(room
        .join(pb::JoinRequest {
            event_id: event.into(),
            user_id: user.into(),
            session_id: session.into(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("Join of {user}"))?
        .into_inner()
        .queue_token)
}

/// Polls `GetStatus` for `queue_token` until it is admitted (its admission token), for at most
/// `patience`.
pub async fn admitted(
    room: &mut WaitingRoomServiceClient<Authed>,
    queue_token: &str,
    patience: Duration,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + patience;
    loop {
        let s = room
            .get_status(pb::GetStatusRequest {
                queue_token: queue_token.to_owned(),
            })
            .await
            .context("GetStatus")?
            .into_inner();
        if s.state == pb::QueueState::Admitted as i32 {
            return Ok(s.admission_token);
        }
        if Instant::now() > deadline {
            bail!("not admitted within {patience:?}");
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}
