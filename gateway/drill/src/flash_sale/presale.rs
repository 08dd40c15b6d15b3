//! The flash sale's presale and its after-sale.
//!
//! - **Presale** (`--presale-codes N --presale-seconds S`): every section sells only to holders
//!   of an access code for the first S seconds after the opening. N random codes are made, each
//!   capped at `seats / (2 N)` places (at least 1). The fans who come before the public sale
//!   are the fan club, with codes; of those who come later every fourth has one too (fan `i`
//!   has code `i % N`). A fan whose code is used up (or who has none while one is needed) waits
//!   for the public sale and tries again. At the end each code's uses (`GetEvent`, admin key)
//!   must be within its cap: a code over its cap is a broken promise.
//! - **After the sale** (`--after-sale N`): N fans give one ticket back (`CancelTickets`, the
//!   event takes cancellations for an hour) and N others pass one to a friend
//!   (`TransferTickets`). The tickets given back leave the fans' count, the moved ones stay
//!   (ownership moves, not the seat), so the seat-by-seat audit that follows checks them.

use std::sync::Mutex;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use boxoffice_client::Authed;
use boxoffice_proto::v1 as pb;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use super::args::FlashSaleArgs;
use super::failover::on_any_node;
use super::tally::{Acked, Ticket};

type Booking = pb::booking_service_client::BookingServiceClient<Authed>;
type BookingClient = pb::booking_service_client::BookingServiceClient<Channel>;

/// The presale of a sale: its codes, their cap, and when it ends.
#[derive(Clone, Debug)]
pub(crate) struct Presale {
    /// The codes, in the order the event was given them.
    pub codes: Vec<String>,
    /// Each code's cap of places.
    pub cap: u32,
    /// When the sections go on sale to everyone, Unix ms.
    pub ends_at_unix_ms: i64,
    /// The same, on this process's clock.
    pub ends_at: Instant,
    /// Fans with a lower index come before the public sale: the fan club.
    pub fan_club: usize,
}

impl Presale {
    /// The presale of `args` for a sale opening at `opening` (`opening_unix_ms`), if any.
    pub fn plan(args: &FlashSaleArgs, opening: Instant, opening_unix_ms: i64) -> Option<Presale> {
        let n = args.presale_codes;
        if n == 0 {
            return None;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed ^ 0x00c0_debe_efed);
        let codes = (0..n)
            .map(|i| {
                let tail: String = (0..16)
                    .map(|_| {
                        char::from(b"ABCDEFGHJKLMNPQRSTUVWXYZ23456789"[rng.random_range(0..32)])
                    })
                    .collect();
                format!("FC{i}-{tail}")
            })
            .collect();
        let presale = Duration::from_secs_f64(args.presale_seconds);
        Some(Presale {
            codes,
            cap: (args.seats / (2 * n)).max(1),
            ends_at_unix_ms: opening_unix_ms
                + i64::try_from(presale.as_millis()).unwrap_or(i64::MAX),
            ends_at: opening + presale,
            fan_club: 0,
        })
    }

    /// Makes `req` an event whose every section (`sections`) is a presale section.
    pub fn apply(&self, req: &mut pb::CreateEventRequest) {
        req.presale_section_ids = req.sections.iter().map(|s| s.section_id.clone()).collect();
        req.presale_ends_at_unix_ms = self.ends_at_unix_ms;
        req.access_codes = self
            .codes
            .iter()
            .map(|code| pb::AccessCode {
                code: code.clone(),
                max_uses: self.cap,
                ..Default::default()
            })
            .collect();
    }

    /// Fan `i`'s code: the fan club's, and every fourth fan's after it.
    pub fn code_of(&self, i: usize) -> String {
        if i < self.fan_club || i.is_multiple_of(4) {
            self.codes[i % self.codes.len()].clone()
        } else {
            String::new()
        }
    }

    /// Waits until the presale is over (and `extra` more).
    pub async fn wait_for_end(&self, extra: Duration) {
        tokio::time::sleep_until((self.ends_at + extra).into()).await;
    }
}

/// What the presale came to, as the report shows it.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct PresaleFigures {
    /// Codes made.
    pub codes: u64,
    /// Each code's cap of places.
    pub cap_per_code: u32,
    /// How long the presale lasted after the opening, seconds.
    pub seconds: f64,
    /// Places held or sold under a code at the end, all codes (`GetEvent`).
    pub places_under_codes: u64,
    /// Codes used up to their cap exactly.
    pub codes_used_up: u64,
    /// Codes whose uses went over their cap (a broken promise: must be 0), or whose uses the
    /// server did not show.
    pub codes_over_cap: u64,
    /// Holds the presale turned away (no code, or the code used up) that waited for the public
    /// sale.
    pub waited_for_public_sale: u64,
    /// Codes whose uses, as the engine counts them live, differ from the places held or sold
    /// under them by the sections' holds (embedded server only; must be 0).
    pub codes_miscounted: u64,
}

impl PresaleFigures {
    /// Each code's uses in `event` (read with an admin key) against its cap.
    pub(crate) fn audit(presale: &Presale, event: &pb::Event, waited: u64) -> PresaleFigures {
        let mut f = PresaleFigures {
            codes: presale.codes.len() as u64,
            cap_per_code: presale.cap,
            seconds: presale
                .ends_at_unix_ms
                .saturating_sub(event.sale_opens_at_unix_ms) as f64
                / 1000.0,
            waited_for_public_sale: waited,
            ..PresaleFigures::default()
        };
        if event.access_codes.len() != presale.codes.len() {
            f.codes_over_cap = presale.codes.len() as u64;
        }
        for c in &event.access_codes {
            f.places_under_codes += u64::from(c.uses);
            if c.uses > c.max_uses || c.max_uses != presale.cap {
                f.codes_over_cap += 1;
            } else if c.uses == c.max_uses {
                f.codes_used_up += 1;
            }
        }
        f
    }
}

/// The after-sale's changes, as the report shows them.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct AfterSale {
    /// Tickets given back (`CancelTickets`).
    pub cancelled: u64,
    /// Tickets moved to another fan (`TransferTickets`).
    pub transferred: u64,
    /// Calls that failed.
    pub failed: u64,
}

/// The orders the after-sale works on: the first ones the fans were told about.
#[derive(Default)]
pub(crate) struct Orders {
    kept: Mutex<Vec<pb::Order>>,
}

impl Orders {
    /// Keeps `order` if fewer than `max` are kept.
    pub fn keep(&self, order: &pb::Order, max: usize) {
        if let Ok(mut k) = self.kept.lock()
            && k.len() < max
        {
            k.push(order.clone());
        }
    }

    fn take(&self) -> Vec<pb::Order> {
        self.kept
            .lock()
            .map(|mut k| std::mem::take(&mut *k))
            .unwrap_or_default()
    }
}

/// Gives back one ticket of each of the first `n` kept orders and moves one ticket of each of
/// the next `n` to a friend, over `channels` (one per node, tried in turn); takes the tickets
/// given back out of `tickets`, and the ones given back or moved out of the orders' acknowledged
/// tickets (`acked`: what a cluster run reads back).
pub(crate) async fn after_sale(
    channels: &[Channel],
    bearer: &boxoffice_client::Bearer,
    (orders, acked): (&Orders, &Mutex<Acked>),
    n: usize,
    tickets: &mut Vec<Ticket>,
) -> AfterSale {
    let clients: Vec<Booking> = channels
        .iter()
        .map(|c| BookingClient::with_interceptor(c.clone(), bearer.clone()))
        .collect();
    let at = AtomicUsize::new(0);
    let mut done = AfterSale::default();
    for (k, order) in orders.take().into_iter().enumerate() {
        let Some(ticket) = order.tickets.first() else {
            continue;
        };
        let ids = vec![ticket.ticket_id.clone()];
        if k < n {
            let r = on_any_node(&clients, &at, |mut c: Booking| {
                let req = pb::CancelTicketsRequest {
                    order_id: order.order_id.clone(),
                    user_id: order.user_id.clone(),
                    ticket_ids: ids.clone(),
                    idempotency_key: format!("after-sale-cancel-{k}"),
                };
                async move { c.cancel_tickets(req).await }
            })
            .await;
            match r {
                Ok(_) => {
                    done.cancelled += 1;
                    one_ticket_less(acked, &order.order_id);
                    let place = (ticket.section_id.clone(), ticket.seat_id.clone());
                    if let Some(i) = tickets.iter().position(|t| *t == place) {
                        tickets.swap_remove(i);
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, order = %order.order_id, "cannot give a ticket back");
                    done.failed += 1;
                }
            }
        } else {
            let r = on_any_node(&clients, &at, |mut c: Booking| {
                let req = pb::TransferTicketsRequest {
                    order_id: order.order_id.clone(),
                    user_id: order.user_id.clone(),
                    ticket_ids: ids.clone(),
                    to_user_id: format!("{}-friend", order.user_id),
                    idempotency_key: format!("after-sale-transfer-{k}"),
                };
                async move { c.transfer_tickets(req).await }
            })
            .await;
            match r {
                Ok(_) => {
                    done.transferred += 1;
                    one_ticket_less(acked, &order.order_id);
                }
                Err(e) => {
                    tracing::error!(error = %e, order = %order.order_id, "cannot move a ticket");
                    done.failed += 1;
                }
            }
        }
    }
    done
}

/// The acknowledged order `order_id` (if recorded) has one ticket less.
fn one_ticket_less(acked: &Mutex<Acked>, order_id: &str) {
    if let Ok(mut a) = acked.lock()
        && let Some(o) = a.orders.iter_mut().find(|o| o.order_id == order_id)
    {
        o.tickets = o.tickets.saturating_sub(1);
    }
}
