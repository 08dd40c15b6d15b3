//! The race of the dots, played twice: in chaos (the seeds' naive baseline, the same
//! [`Venue`] as `flash-sale --naive`: every fan reads a stale seat map, then books what looked
//! free with no atomic check) and clean (the real engine over gRPC: each fan joins the waiting
//! room, waits for admission, and holds one place atomically). Each step is sent as a
//! [`Step`] to the page as it happens.

use std::sync::Arc;
use std::time::{Duration, Instant};

use boxoffice_client::{Bearer, Clients};
use boxoffice_proto::v1 as pb;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tokio::sync::mpsc::Sender;

use crate::flash_sale::naive::{Tally, Venue};

/// What a race is asked to play.
#[derive(Debug, Clone, Copy)]
pub struct Race {
    /// Fans racing.
    pub fans: u32,
    /// Seats for them.
    pub seats: u32,
    /// 1: real time (fans arrive over about 2 s); 2: twice as fast.
    pub speed: f64,
}

/// One step of a race, as the page receives it (JSON, one per server-sent event).
#[derive(Debug, Clone, Serialize)]
#[serde(
    tag = "type",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub enum Step {
    /// The race begins.
    Start {
        /// `chaos` or `clean`.
        mode: &'static str,
        /// Fans.
        fans: u32,
        /// Seats.
        seats: u32,
    },
    /// A fan got a place in line.
    Queued {
        /// The fan (0-based).
        fan: u32,
        /// Its position.
        position: u64,
    },
    /// A fan was admitted to book.
    Admitted {
        /// The fan.
        fan: u32,
    },
    /// A fan booked a seat.
    Booked {
        /// The fan.
        fan: u32,
        /// The seat (0-based).
        seat: u32,
        /// The seat was booked by another fan already: sold twice.
        double: bool,
    },
    /// A fan got no seat.
    Refused {
        /// The fan.
        fan: u32,
        /// Why (the contract's reason in the clean race; `LOOKED_SOLD_OUT` in chaos).
        reason: String,
    },
    /// The race is over.
    Done {
        /// `chaos` or `clean`.
        mode: &'static str,
        /// Seats booked at least once.
        sold: u32,
        /// Bookings in all.
        bookings: u32,
        /// Bookings past one per seat.
        oversold: u32,
        /// Seats booked more than once.
        double_booked: u32,
        /// What was checked at the end (clean: the engine's own seat map).
        checked: String,
        /// How long it took, ms.
        ms: u64,
    },
    /// The race could not be played.
    Failed {
        /// Why.
        error: String,
    },
}

impl Step {
    /// The last step of a race whose bookings add up to `t`.
    fn done(mode: &'static str, t: Tally, checked: String, started: Instant) -> Step {
        Step::Done {
            mode,
            sold: t.sold,
            bookings: t.bookings as u32,
            oversold: t.oversold as u32,
            double_booked: t.double_booked as u32,
            checked,
            ms: started.elapsed().as_millis() as u64,
        }
    }
}

fn pause(speed: f64, ms: f64) -> Duration {
    Duration::from_secs_f64((ms / 1_000.0 / speed.max(0.01)).max(0.0))
}

/// The chaos race: the naive baseline, fan by fan.
pub async fn chaos(race: Race, tx: Sender<Step>) {
    let started = Instant::now();
    let _ = tx
        .send(Step::Start {
            mode: "chaos",
            fans: race.fans,
            seats: race.seats,
        })
        .await;
    let venue = Arc::new(Venue::new(race.seats as usize));
    let refresher = {
        let venue = venue.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(pause(race.speed, 300.0)).await;
                venue.refresh();
            }
        })
    };
    let mut fans = Vec::new();
    for fan in 0..race.fans {
        let (venue, tx) = (venue.clone(), tx.clone());
        fans.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(u64::from(fan));
            tokio::time::sleep(pause(
                race.speed,
                2_000.0 * f64::from(fan) / f64::from(race.fans),
            ))
            .await;
            let picks = venue.looking_free(rng.random_range(0..race.seats as usize), 1);
            // The network between the read and the write.
            tokio::time::sleep(pause(race.speed, rng.random_range(50.0..250.0))).await;
            let step = match picks.first() {
                Some(&s) => Step::Booked {
                    fan,
                    seat: s as u32,
                    double: venue.book_blindly(s) > 0,
                },
                None => Step::Refused {
                    fan,
                    reason: "LOOKED_SOLD_OUT".into(),
                },
            };
            let _ = tx.send(step).await;
        }));
    }
    for f in fans {
        let _ = f.await;
    }
    refresher.abort();
    let _ = tx
        .send(Step::done(
            "chaos",
            venue.tally(),
            "each seat's bookings counted".into(),
            started,
        ))
        .await;
}

/// Where the clean race plays: the embedded server's gRPC address and keys.
#[derive(Clone)]
pub struct Target {
    /// `http://HOST:PORT` of the gRPC server.
    pub url: String,
    /// An admin key.
    pub admin_key: String,
    /// A client key.
    pub client_key: String,
}

/// The clean race: the real engine, through its waiting room and atomic holds.
pub async fn clean(race: Race, target: Target, run: u64, tx: Sender<Step>) {
    if let Err(e) = clean_race(race, target, run, &tx).await {
        let _ = tx
            .send(Step::Failed {
                error: format!("{e:#}"),
            })
            .await;
    }
}

async fn clean_race(race: Race, target: Target, run: u64, tx: &Sender<Step>) -> anyhow::Result<()> {
    let started = Instant::now();
    let channel = boxoffice_client::connect(&target.url).await?;
    let mut admin = Clients::new(&channel, &Bearer::new(&target.admin_key)?);
    let fans_clients = Clients::new(&channel, &Bearer::new(&target.client_key)?);
    let event_id = format!("race-{run}");
    admin
        .events
        .create_event(race_event(&race, &event_id, run))
        .await?;
    let _ = tx
        .send(Step::Start {
            mode: "clean",
            fans: race.fans,
            seats: race.seats,
        })
        .await;
    // The engine's answers, counted seat by seat as the chaos race counts its bookings.
    let tally = Arc::new(Venue::new(race.seats as usize));
    let mut fans = Vec::new();
    for fan in 0..race.fans {
        let (mut c, tx, event_id) = (fans_clients.clone(), tx.clone(), event_id.clone());
        let tally = tally.clone();
        fans.push(tokio::spawn(async move {
            tokio::time::sleep(pause(
                race.speed,
                2_000.0 * f64::from(fan) / f64::from(race.fans),
            ))
            .await;
            let step = match one_fan(&mut c, &event_id, fan, race.speed, &tx).await {
                Ok(seat) => Step::Booked {
                    fan,
                    seat,
                    double: tally.book_blindly(seat as usize) > 0,
                },
                Err(status) => Step::Refused {
                    fan,
                    reason: boxoffice_client::reason(&status)
                        .unwrap_or_else(|| format!("{:?}", status.code())),
                },
            };
            let _ = tx.send(step).await;
        }));
    }
    for f in fans {
        let _ = f.await;
    }
    let checked = engine_says(&mut admin, &event_id, &tally).await?;
    let told = tally.tally();
    let _ = tx.send(Step::done("clean", told, checked, started)).await;
    Ok(())
}

/// The clean race's event: one row of `race.seats`, one seat per fan, a line that admits fans
/// at a pace the page can show.
fn race_event(race: &Race, event_id: &str, run: u64) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        event_id: event_id.to_owned(),
        name: format!("The race, run {run}"),
        sections: vec![pb::SectionSpec {
            section_id: "front".into(),
            name: "Front row".into(),
            price_cents: 5_000,
            layout: Some(pb::section_spec::Layout::Reserved(pb::ReservedLayout {
                rows: vec![pb::RowSpec {
                    label: "A".into(),
                    seat_count: race.seats,
                }],
            })),
            price_tiers: Vec::new(),
        }],
        hold_ttl_seconds: 600,
        per_user_limit: 1,
        // The line lets fans in at a pace the page can show.
        admit_rate_per_second: ((20.0 * race.speed) as u32).max(1),
        admission_window_seconds: 120,
        sale_opens_at_unix_ms: 0,
        idempotency_key: String::new(),
        join_pow_difficulty_bits: 0,
        cancellation_deadline_unix_ms: 0,
        transfers_disabled: false,
        presale_section_ids: Vec::new(),
        presale_ends_at_unix_ms: 0,
        access_codes: Vec::new(),
    }
}

/// What the engine itself says after the clean race: every seat held at most once, the seat
/// map's counts against what the fans were told (`tally`).
async fn engine_says(admin: &mut Clients, event_id: &str, tally: &Venue) -> anyhow::Result<String> {
    // What the engine itself says: every seat held at most once, the map's counts.
    let map = admin
        .events
        .get_seat_map(pb::GetSeatMapRequest {
            event_id: event_id.to_owned(),
            section_id: String::new(),
            first_row: 0,
        })
        .await?
        .into_inner();
    let section = map.sections.first().cloned().unwrap_or_default();
    let taken = section.held + section.sold;
    let told = tally.tally();
    let checked = format!(
        "the engine's seat map: {} held or sold, {} available of {}{}",
        taken,
        section.available,
        section.capacity,
        if u64::from(taken) == told.bookings {
            " (as many as the fans were told)"
        } else {
            " (NOT as many as the fans were told)"
        }
    );
    Ok(checked)
}

/// One fan of the clean race: join, wait to be admitted, hold one seat; the seat (0-based).
async fn one_fan(
    c: &mut Clients,
    event_id: &str,
    fan: u32,
    speed: f64,
    tx: &Sender<Step>,
) -> Result<u32, tonic::Status> {
    let user = format!("fan-{fan}");
    let ticket = c
        .room
        .join(pb::JoinRequest {
            event_id: event_id.to_owned(),
            user_id: user.clone(),
            session_id: "s".into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let _ = tx
        .send(Step::Queued {
            fan,
            position: ticket.position,
        })
        .await;
    let admission = loop {
        let s = c
            .room
            .get_status(pb::GetStatusRequest {
                queue_token: ticket.queue_token.clone(),
            })
            .await?
            .into_inner();
        if s.state() == pb::QueueState::Admitted {
            break s.admission_token;
        }
        if s.state() == pb::QueueState::Expired {
            return Err(tonic::Status::deadline_exceeded(
                "the place in line expired",
            ));
        }
        tokio::time::sleep(pause(speed, 100.0)).await;
    };
    let _ = tx.send(Step::Admitted { fan }).await;
    let hold = c
        .booking
        .hold(pb::HoldRequest {
            event_id: event_id.to_owned(),
            user_id: user,
            admission_token: admission,
            idempotency_key: format!("race-{fan}"),
            selection: Some(pb::hold_request::Selection::BestAvailable(
                pb::BestAvailable {
                    section_id: String::new(),
                    quantity: 1,
                },
            )),
            access_code: String::new(),
        })
        .await?
        .into_inner();
    // Seat ids are `front:A:{n}`, n from 1.
    hold.seat_ids
        .first()
        .and_then(|s| s.rsplit(':').next())
        .and_then(|n| n.parse::<u32>().ok())
        .map(|n| n.saturating_sub(1))
        .ok_or_else(|| tonic::Status::internal("a hold without a seat of the row"))
}
