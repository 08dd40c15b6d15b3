//! `flash-sale --pause-at S --pause-for D`: an operator's emergency stop in the middle of the
//! sale. `S` seconds after the opening the sale is paused (`UpdateSale`), `D` seconds later it
//! opens again. Between the pause's answer and the resume, the event's places taken (held or
//! sold) may only fall (a release); a rise would be a hold placed after the pause was answered.

use std::time::{Duration, Instant};

use boxoffice_proto::v1 as pb;

use super::Events;

/// What the pause did, for the report (times since the sale's start, as the plot's axis).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Paused {
    /// When the pause was answered.
    pub paused_at_seconds: f64,
    /// When the resume was answered.
    pub resumed_at_seconds: f64,
    /// Places taken (held or sold) when the resume was sent, less those taken when the pause
    /// was answered: 0 or less (a release), never more.
    pub taken_during_pause: i64,
    /// How long the pause call took to answer (every section paused), ms.
    pub pause_call_ms: u64,
}

/// The operator's task: pauses at `at`, resumes `pause_for` later.
pub(crate) struct Pauser(tokio::task::JoinHandle<anyhow::Result<Paused>>);

impl Pauser {
    /// Starts the task against `admins` (any node; the next on a failure), for `event_id`;
    /// `started` is the sale's start (the report's time axis).
    pub(crate) fn spawn(
        admins: Vec<Events>,
        event_id: String,
        started: Instant,
        at: Instant,
        pause_for: Duration,
    ) -> Pauser {
        Pauser(tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            let asked = Instant::now();
            let paused = set(&admins, &event_id, pb::SaleState::Paused).await?;
            let pause_call_ms = u64::try_from(asked.elapsed().as_millis()).unwrap_or(u64::MAX);
            let paused_at_seconds = started.elapsed().as_secs_f64();
            let at_pause = taken(&paused);
            tokio::time::sleep(pause_for).await;
            let before_resume = taken(&get(&admins, &event_id).await?);
            set(&admins, &event_id, pb::SaleState::Open).await?;
            Ok(Paused {
                paused_at_seconds,
                resumed_at_seconds: started.elapsed().as_secs_f64(),
                taken_during_pause: before_resume - at_pause,
                pause_call_ms,
            })
        }))
    }

    /// What the pause did (it waits for its resume).
    pub(crate) async fn finish(self) -> anyhow::Result<Paused> {
        self.0.await?
    }
}

/// Places held or sold in `e`.
fn taken(e: &pb::Event) -> i64 {
    e.sections
        .iter()
        .map(|s| i64::from(s.held) + i64::from(s.sold))
        .sum()
}

/// Sets the sale's state, on the first node that answers.
async fn set(admins: &[Events], event_id: &str, state: pb::SaleState) -> anyhow::Result<pb::Event> {
    let req = pb::UpdateSaleRequest {
        event_id: event_id.to_owned(),
        state: state as i32,
        // One key per change: a retry on another node answers the change once.
        idempotency_key: format!("flash-sale-{}", state.as_str_name()),
        ..Default::default()
    };
    first_answer(admins, |mut c| {
        let req = req.clone();
        async move { c.update_sale(req).await }
    })
    .await
}

async fn get(admins: &[Events], event_id: &str) -> anyhow::Result<pb::Event> {
    first_answer(admins, |mut c| {
        let req = pb::GetEventRequest {
            event_id: event_id.to_owned(),
        };
        async move { c.get_event(req).await }
    })
    .await
}

/// The first answer of `call` over the nodes in turn (a node that is down or has no leader is
/// passed by), within 30 s.
async fn first_answer<T, F, Fut>(admins: &[Events], mut call: F) -> anyhow::Result<T>
where
    F: FnMut(Events) -> Fut,
    Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    let until = Instant::now() + Duration::from_secs(30);
    let mut last = None;
    for i in 0.. {
        if Instant::now() > until {
            break;
        }
        match call(admins[i % admins.len()].clone()).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if s.code() == tonic::Code::Unavailable => {
                last = Some(s);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(s) => return Err(anyhow::anyhow!("the sale's pause: {s}")),
        }
    }
    Err(anyhow::anyhow!(
        "the sale's pause: no node answered: {last:?}"
    ))
}
