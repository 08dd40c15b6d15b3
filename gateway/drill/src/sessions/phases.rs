//! The phases of a sessions run, each measured with [`drive`]: join and be admitted, hold,
//! refresh the hold while all are held, then pay or release. What a phase got for each session
//! (an admission token, a hold id, an order id) goes into that session's slot for the next.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use anyhow::Context;
use boxoffice_client::{Authed, Clients};
use boxoffice_proto::v1 as pb;
use pb::waiting_room_service_client::WaitingRoomServiceClient;

use crate::measure::{RpcFigures, drive};

/// One slot per session, filled once.
pub(super) type Slots = Arc<Vec<OnceLock<String>>>;

/// `n` empty slots.
pub(super) fn slots(n: usize) -> Slots {
    Arc::new((0..n).map(|_| OnceLock::new()).collect())
}

fn taken(s: &Slots, i: usize) -> Result<String, tonic::Status> {
    s[i].get()
        .cloned()
        .ok_or_else(|| tonic::Status::failed_precondition("an earlier phase failed for it"))
}

/// The sessions of a run: session `i` is fan `session-{tag}-{i}` of event `i % events`, over
/// client bundle `i % clients`.
#[derive(Clone)]
pub(super) struct Sessions {
    pub clients: Arc<Vec<Clients>>,
    pub events: Arc<Vec<String>>,
    /// New for each run: `--target` may have served earlier runs, and the same user with the
    /// same idempotency key would be IDEMPOTENCY_KEY_REUSED.
    pub tag: Arc<str>,
    pub n: usize,
    pub concurrency: usize,
    pub quantity: u32,
}

impl Sessions {
    fn client(&self, i: usize) -> Clients {
        self.clients[i % self.clients.len()].clone()
    }

    fn event(&self, i: usize) -> String {
        self.events[i % self.events.len()].clone()
    }

    fn user(&self, i: usize) -> String {
        format!("session-{}-{i}", self.tag)
    }

    /// 1. Every session joins its event's line and polls until admitted.
    pub async fn join(&self, admission: &Slots) -> RpcFigures {
        let (s, admission) = (self.clone(), admission.clone());
        drive("join + admission", self.n, self.concurrency, move |i| {
            let mut room = s.client(i).room;
            let (event_id, user_id, admission) = (s.event(i), s.user(i), admission.clone());
            async move {
                let token = admitted(&mut room, event_id, user_id).await?;
                let _ = admission[i].set(token);
                Ok(())
            }
        })
        .await
    }

    /// 2. Every session holds its places, best available anywhere; none lapses (ten-minute TTL).
    pub async fn hold(&self, admission: &Slots, holds: &Slots) -> RpcFigures {
        let (s, admission, holds) = (self.clone(), admission.clone(), holds.clone());
        drive("Hold", self.n, self.concurrency, move |i| {
            let mut booking = s.client(i).booking;
            let request = taken(&admission, i).map(|admission_token| pb::HoldRequest {
                event_id: s.event(i),
                user_id: s.user(i),
                admission_token,
                idempotency_key: "checkout-hold".into(),
                selection: Some(pb::hold_request::Selection::BestAvailable(
                    pb::BestAvailable {
                        section_id: String::new(),
                        quantity: s.quantity,
                    },
                )),
                access_code: String::new(),
            });
            let holds = holds.clone();
            async move {
                let h = booking.hold(request?).await?.into_inner();
                let _ = holds[i].set(h.hold_id);
                Ok(())
            }
        })
        .await
    }

    /// 3. With all of them held, every session refreshes its hold (the checkout page's poll).
    pub async fn refresh(&self, holds: &Slots) -> RpcFigures {
        let (s, holds) = (self.clone(), holds.clone());
        drive("GetHold (all held)", self.n, self.concurrency, move |i| {
            let mut booking = s.client(i).booking;
            let request = taken(&holds, i).map(|hold_id| pb::GetHoldRequest {
                hold_id,
                user_id: s.user(i),
            });
            async move {
                let h = booking.get_hold(request?).await?.into_inner();
                if h.status == pb::HoldStatus::Held as i32 {
                    Ok(())
                } else {
                    Err(tonic::Status::internal(format!(
                        "hold {} is {:?}, not HELD",
                        h.hold_id, h.status
                    )))
                }
            }
        })
        .await
    }

    /// 4a. The sessions `payers` (indexes) pay; their order ids go into `paid`.
    pub async fn confirm(&self, payers: Vec<usize>, holds: &Slots, paid: &Slots) -> RpcFigures {
        let (s, holds, paid) = (self.clone(), holds.clone(), paid.clone());
        drive("Confirm", payers.len(), self.concurrency, move |k| {
            let i = payers[k];
            let mut booking = s.client(i).booking;
            let request = taken(&holds, i).map(|hold_id| pb::ConfirmRequest {
                hold_id,
                user_id: s.user(i),
                payment_token: format!("tok_session_{i}"),
                idempotency_key: "checkout-pay".into(),
            });
            let paid = paid.clone();
            async move {
                let o = booking.confirm(request?).await?.into_inner();
                let _ = paid[i].set(o.order_id);
                Ok(())
            }
        })
        .await
    }

    /// 4b. The sessions `leavers` (indexes) give their places back.
    pub async fn release(&self, leavers: Vec<usize>, holds: &Slots) -> RpcFigures {
        let (s, holds) = (self.clone(), holds.clone());
        drive("Release", leavers.len(), self.concurrency, move |k| {
            let i = leavers[k];
            let mut booking = s.client(i).booking;
            let request = taken(&holds, i).map(|hold_id| pb::ReleaseRequest {
                hold_id,
                user_id: s.user(i),
            });
            async move { booking.release(request?).await.map(|_| ()) }
        })
        .await
    }

    /// (held, sold, available) summed over the events' sections, as the server counts them.
    pub async fn counts(&self) -> anyhow::Result<(u64, u64, u64)> {
        let mut admin = self.client(0).events;
        let (mut held, mut sold, mut available) = (0u64, 0u64, 0u64);
        for e in self.events.iter() {
            let ev = admin
                .get_event(pb::GetEventRequest {
                    event_id: e.clone(),
                })
                .await
                .context("GetEvent")?
                .into_inner();
            for s in ev.sections {
                held += u64::from(s.held);
                sold += u64::from(s.sold);
                available += u64::from(s.available);
            }
        }
        Ok((held, sold, available))
    }
}

/// Joins `event_id`'s line as `user_id` and polls every 20 ms until admitted: the admission
/// token.
async fn admitted(
    room: &mut WaitingRoomServiceClient<Authed>,
    event_id: String,
    user_id: String,
) -> Result<String, tonic::Status> {
    let q = room
        .join(pb::JoinRequest {
            event_id,
            user_id,
            session_id: "checkout".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .queue_token;
    loop {
        let st = room
            .get_status(pb::GetStatusRequest {
                queue_token: q.clone(),
            })
            .await?
            .into_inner();
        if st.state == pb::QueueState::Admitted as i32 {
            return Ok(st.admission_token);
        }
        if st.state == pb::QueueState::Expired as i32 {
            return Err(tonic::Status::deadline_exceeded("queue token expired"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
