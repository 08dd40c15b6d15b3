//! One table of good and bad requests, sent over both faces of a server (gRPC, and HTTP/JSON)
//! and compared answer by answer: keys, validation, idempotency and reasons must be the same.
//! Each HTTP answer must be exactly the gRPC answer as the contract maps it to JSON: a success
//! is its message's JSON type (`boxoffice_gateway::http::types`), an error is the problem its
//! status makes (`Problem::from_status`, read from the wire), sent with that problem's HTTP
//! status. Writes are compared through idempotency: the gRPC call goes first with a key, the
//! HTTP call sends the same request with the same key and must get the same answer (the same
//! hold, the same order), or the same refusal.

use std::future::Future;
use std::net::SocketAddr;

use boxoffice_gateway::http::event_types;
use boxoffice_gateway::http::problem::Problem;
use boxoffice_gateway::http::types as json_types;
use boxoffice_proto::v1 as pb;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::http::{Answer, Http};
use crate::{Bearer, Clients, best_available as best};

/// One caller on both faces.
pub struct Face {
    /// Over gRPC.
    pub grpc: Clients,
    /// Over HTTP.
    pub http: Http,
}

/// The callers of a table: with the admin key, with the client key, with an unknown key.
pub struct Faces {
    /// Admin key.
    pub admin: Face,
    /// Client key.
    pub client: Face,
    /// A key the server does not know.
    pub stranger: Face,
}

impl Faces {
    /// The callers of a server at `grpc` (a channel to it) and `http`, with these keys.
    pub fn new(grpc: &Channel, http: SocketAddr, admin: &str, client: &str) -> Faces {
        let face = |key: &str| Face {
            grpc: Clients::new(grpc, &Bearer::new(key).expect("an ASCII key")),
            http: Http::new(http, Some(key)),
        };
        Faces {
            admin: face(admin),
            client: face(client),
            stranger: face("not-a-key-of-this-server"),
        }
    }
}

/// What the HTTP face must answer for a gRPC answer: (its HTTP status, if an error; its JSON).
fn expected<T, J>(grpc: Result<tonic::Response<T>, tonic::Status>) -> (Option<u16>, Value)
where
    J: From<T> + serde::Serialize,
{
    match grpc {
        Ok(answer) => (None, to_json(&J::from(answer.into_inner()))),
        Err(status) => {
            let problem = Problem::from_status(&status);
            (Some(problem.status), to_json(&problem))
        }
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("JSON")
}

/// The rows compared so far, and what each answered.
#[derive(Default)]
pub struct Table {
    rows: Vec<(String, Value)>,
}

impl Table {
    /// Compares one row: `grpc`'s answer (mapped to JSON by `J`) and `http`'s.
    async fn row<T, J>(
        &mut self,
        name: &str,
        grpc: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
        http: impl Future<Output = Answer>,
    ) -> Value
    where
        J: From<T> + serde::Serialize,
    {
        let (status, want) = expected::<T, J>(grpc.await);
        let got = http.await;
        match status {
            Some(status) => assert_eq!(got.status.as_u16(), status, "{name}: {got:?}"),
            None => assert!(got.status.is_success(), "{name}: {got:?}"),
        }
        let body = if got.body.is_empty() {
            Value::Null
        } else {
            got.json()
        };
        assert_eq!(body, want, "{name}: the HTTP answer is not the gRPC answer");
        self.rows.push((name.to_owned(), want.clone()));
        want
    }

    /// The rows compared, with whether each was an error's problem.
    pub fn summary(&self) -> (usize, usize) {
        let errors = self
            .rows
            .iter()
            .filter(|(_, v)| v.get("reason").is_some() || v.get("grpcCode").is_some())
            .count();
        (self.rows.len(), errors)
    }

    /// Every row's name and the reason it answered ("" for a success).
    pub fn reasons(&self) -> Vec<(String, String)> {
        self.rows
            .iter()
            .map(|(name, v)| {
                let reason = v
                    .get("reason")
                    .and_then(Value::as_str)
                    .or_else(|| v.get("grpcCode").and_then(Value::as_str))
                    .unwrap_or_default();
                (name.clone(), reason.to_owned())
            })
            .collect()
    }
}

/// `ReleaseResponse` has no fields: over HTTP a release answers 204 and no body.
#[derive(serde::Serialize)]
struct Released;

impl From<pb::ReleaseResponse> for Released {
    fn from(_: pb::ReleaseResponse) -> Released {
        Released
    }
}

/// The event the table makes: a reserved section `orch` (rows A and B of 5 seats) and a GA
/// section `ga` of 10 places, 4 places per fan.
fn create_request(event: &str, key: &str) -> pb::CreateEventRequest {
    pb::CreateEventRequest {
        event_id: event.to_owned(),
        name: format!("Show {event}"),
        sections: vec![
            pb::SectionSpec {
                section_id: "orch".into(),
                name: "Orchestra".into(),
                price_cents: 9_000,
                layout: Some(pb::section_spec::Layout::Reserved(pb::ReservedLayout {
                    rows: ["A", "B"]
                        .iter()
                        .map(|l| pb::RowSpec {
                            label: (*l).into(),
                            seat_count: 5,
                        })
                        .collect(),
                })),
                price_tiers: Vec::new(),
            },
            pb::SectionSpec {
                section_id: "ga".into(),
                name: "Floor".into(),
                price_cents: 4_000,
                layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(10)),
                price_tiers: Vec::new(),
            },
        ],
        hold_ttl_seconds: 600,
        per_user_limit: 4,
        admit_rate_per_second: 1_000,
        admission_window_seconds: 600,
        sale_opens_at_unix_ms: 0,
        idempotency_key: key.to_owned(),
        join_pow_difficulty_bits: 0,
        cancellation_deadline_unix_ms: 0,
        transfers_disabled: false,
        presale_section_ids: Vec::new(),
        presale_ends_at_unix_ms: 0,
        access_codes: Vec::new(),
    }
}

/// The same event as the HTTP API's create body.
fn create_body(event: &str) -> Value {
    json!({
        "eventId": event,
        "name": format!("Show {event}"),
        "sections": [
            {"sectionId": "orch", "name": "Orchestra", "priceCents": 9000,
             "rows": [{"label": "A", "seatCount": 5}, {"label": "B", "seatCount": 5}]},
            {"sectionId": "ga", "name": "Floor", "priceCents": 4000, "capacity": 10},
        ],
        "holdTtlSeconds": 600,
        "perUserLimit": 4,
        "admitRatePerSecond": 1000,
        "admissionWindowSeconds": 600,
    })
}

fn key(k: &str) -> [(&'static str, &str); 1] {
    [("idempotency-key", k)]
}

/// An exact-seats hold request.
fn seats(event: &str, user: &str, token: &str, ids: &[&str], key: &str) -> pb::HoldRequest {
    pb::HoldRequest {
        event_id: event.into(),
        user_id: user.into(),
        admission_token: token.into(),
        idempotency_key: key.into(),
        selection: Some(pb::hold_request::Selection::Seats(pb::SeatSelection {
            seat_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        })),
        access_code: String::new(),
    }
}

/// Runs the table against one server: makes `event` (which must not exist yet), and compares
/// every row. `admit(event, user)` gives `user` an admission token for `event`.
// Over 70 lines: the table itself, one row after the other.
pub async fn compare<A, F>(faces: &Faces, event: &str, admit: A) -> Table
where
    A: Fn(String, String) -> F,
    F: Future<Output = String>,
{
    let mut t = Table::default();
    let (admin, client, stranger) = (&faces.admin, &faces.client, &faces.stranger);
    let e = event;

    // Events: keys and scopes, validation, idempotency, reads.
    let mut g = admin.grpc.clone();
    t.row::<_, event_types::Event>(
        "create an event (the HTTP call replays the gRPC call's key)",
        g.events.create_event(create_request(e, "faces-create")),
        admin
            .http
            .post("/v1/events", &key("faces-create"), &create_body(e)),
    )
    .await;
    let mut g = client.grpc.clone();
    t.row::<_, event_types::Event>(
        "create with a client key",
        g.events.create_event(create_request("faces-other", "")),
        client
            .http
            .post("/v1/events", &[], &create_body("faces-other")),
    )
    .await;
    let mut g = stranger.grpc.clone();
    t.row::<_, event_types::Event>(
        "create with an unknown key",
        g.events.create_event(create_request("faces-other", "")),
        stranger
            .http
            .post("/v1/events", &[], &create_body("faces-other")),
    )
    .await;
    let mut g = admin.grpc.clone();
    let mut no_sections = create_request("faces-empty", "");
    no_sections.sections.clear();
    let mut body = create_body("faces-empty");
    body["sections"] = json!([]);
    t.row::<_, event_types::Event>(
        "create without sections",
        g.events.create_event(no_sections),
        admin.http.post("/v1/events", &[], &body),
    )
    .await;
    t.row::<_, event_types::Event>(
        "create again under the same key, another event",
        g.events
            .create_event(create_request("faces-else", "faces-create")),
        admin.http.post(
            "/v1/events",
            &key("faces-create"),
            &create_body("faces-else"),
        ),
    )
    .await;
    let mut g = client.grpc.clone();
    t.row::<_, event_types::Event>(
        "read the event",
        g.events
            .get_event(pb::GetEventRequest { event_id: e.into() }),
        client.http.get(&format!("/v1/events/{e}"), &[]),
    )
    .await;
    t.row::<_, event_types::Event>(
        "read an unknown event",
        g.events.get_event(pb::GetEventRequest {
            event_id: "faces-nowhere".into(),
        }),
        client.http.get("/v1/events/faces-nowhere", &[]),
    )
    .await;
    let too_long = "x".repeat(300);
    t.row::<_, event_types::Event>(
        "read an event id over 256 bytes",
        g.events.get_event(pb::GetEventRequest {
            event_id: too_long.clone(),
        }),
        client.http.get(&format!("/v1/events/{too_long}"), &[]),
    )
    .await;
    t.row::<_, event_types::EventPage>(
        "list the events",
        g.events.list_events(pb::ListEventsRequest {
            page_size: 100,
            page_token: String::new(),
        }),
        client.http.get("/v1/events?pageSize=100", &[]),
    )
    .await;

    // The waiting room.
    t.row::<_, json_types::JoinChallenge>(
        "a join challenge of an event without proof of work",
        g.room.get_join_challenge(pb::GetJoinChallengeRequest {
            event_id: e.into(),
            user_id: "fan-1".into(),
        }),
        client
            .http
            .get(&format!("/v1/events/{e}/join-challenge?userId=fan-1"), &[]),
    )
    .await;
    t.row::<_, json_types::QueueToken>(
        "join without a user",
        g.room.join(pb::JoinRequest {
            event_id: e.into(),
            user_id: String::new(),
            session_id: "s".into(),
            join_challenge: String::new(),
            pow_nonce: 0,
        }),
        client.http.get(
            &format!("/v1/events/{e}/queue-token?userId=&sessionId=s"),
            &[],
        ),
    )
    .await;
    t.row::<_, json_types::QueueToken>(
        "join an unknown event",
        g.room.join(pb::JoinRequest {
            event_id: "faces-nowhere".into(),
            user_id: "fan-1".into(),
            session_id: "s".into(),
            join_challenge: String::new(),
            pow_nonce: 0,
        }),
        client.http.get(
            "/v1/events/faces-nowhere/queue-token?userId=fan-1&sessionId=s",
            &[],
        ),
    )
    .await;
    t.row::<_, json_types::QueueStatus>(
        "a queue status with a forged token",
        g.room.get_status(pb::GetStatusRequest {
            queue_token: "forged".into(),
        }),
        client
            .http
            .get(&format!("/v1/queue/{e}/status?token=forged"), &[]),
    )
    .await;

    // Holds: admission, validation, the event's own checks, idempotency, limits.
    let token = admit(e.to_owned(), "fan-1".to_owned()).await;
    let h = |r: pb::HoldRequest| {
        let body = json!({
            "eventId": r.event_id,
            "userId": r.user_id,
            "admissionToken": r.admission_token,
            "seatIds": match &r.selection {
                Some(pb::hold_request::Selection::Seats(s)) => s.seat_ids.clone(),
                _ => Vec::new(),
            },
            "sectionId": match &r.selection {
                Some(pb::hold_request::Selection::BestAvailable(b)) => b.section_id.clone(),
                _ => String::new(),
            },
            "quantity": match &r.selection {
                Some(pb::hold_request::Selection::BestAvailable(b)) => Some(b.quantity),
                _ => None,
            },
            "idempotencyKey": r.idempotency_key,
        });
        (r, body)
    };
    let rows: Vec<(&str, pb::HoldRequest)> = vec![
        (
            "hold without an admission token",
            best(e, "fan-1", "", "ga", 2, ""),
        ),
        (
            "hold with a forged admission token",
            best(e, "fan-1", "forged", "ga", 2, ""),
        ),
        (
            "hold with another fan's admission token",
            best(e, "fan-2", &token, "ga", 2, ""),
        ),
        ("hold without a user", best(e, "", &token, "ga", 2, "")),
        (
            "hold with a control character in the key",
            best(e, "fan-1", &token, "ga", 2, "k\u{7}"),
        ),
        ("hold 0 places", best(e, "fan-1", &token, "ga", 0, "")),
        ("hold 101 places", best(e, "fan-1", &token, "ga", 101, "")),
        (
            "hold in an unknown section",
            best(e, "fan-1", &token, "balcony", 1, ""),
        ),
        (
            "hold an unknown event",
            best("faces-nowhere", "fan-1", &token, "ga", 1, ""),
        ),
        (
            "hold a malformed seat id",
            seats(e, "fan-1", &token, &["orch-A-1"], ""),
        ),
        (
            "hold seats of two sections",
            seats(e, "fan-1", &token, &["orch:A:1", "ga:A:1"], ""),
        ),
        (
            "hold a seat of an unknown row",
            seats(e, "fan-1", &token, &["orch:Z:1"], ""),
        ),
        (
            "hold 2 places (the HTTP call replays the key)",
            best(e, "fan-1", &token, "ga", 2, "faces-h1"),
        ),
        (
            "hold seat A1 (the HTTP call replays the key)",
            seats(e, "fan-1", &token, &["orch:A:1"], "faces-h2"),
        ),
        (
            "hold A1 again: taken (a keyed refusal, replayed)",
            seats(e, "fan-1", &token, &["orch:A:1"], "faces-h3"),
        ),
        (
            "hold 2 more: over the fan's limit",
            best(e, "fan-1", &token, "ga", 2, ""),
        ),
        (
            "a key used for another request",
            best(e, "fan-1", &token, "ga", 1, "faces-h1"),
        ),
    ];
    let mut holds = Vec::new();
    for (name, req) in rows {
        let (req, body) = h(req);
        let mut g = client.grpc.clone();
        let k = req.idempotency_key.clone();
        let headers = if k.is_empty() || k.contains('\u{7}') {
            Vec::new()
        } else {
            vec![("idempotency-key", k.as_str())]
        };
        let answer = t
            .row::<_, json_types::Hold>(
                name,
                g.booking.hold(req),
                client.http.post("/v1/holds", &headers, &body),
            )
            .await;
        if let Some(id) = answer.get("holdId").and_then(Value::as_str) {
            holds.push(id.to_owned());
        }
    }
    assert_eq!(holds.len(), 2, "two holds were made: {holds:?}");
    let (ga_hold, seat_hold) = (holds[0].clone(), holds[1].clone());

    // HoldBatch: items answered as their `Hold`s (keyed items replay the holds above, so the
    // HTTP call answers what the gRPC call did), and refusals of the whole call.
    let item = |user: &str, token: &str, q: u32, key: &str| pb::HoldBatchItem {
        user_id: user.into(),
        admission_token: token.into(),
        idempotency_key: key.into(),
        selection: Some(pb::hold_batch_item::Selection::BestAvailable(
            pb::BestAvailable {
                section_id: "ga".into(),
                quantity: q,
            },
        )),
        access_code: String::new(),
    };
    let item_body = |i: &pb::HoldBatchItem| {
        let q = match &i.selection {
            Some(pb::hold_batch_item::Selection::BestAvailable(b)) => b.quantity,
            _ => 0,
        };
        json!({"userId": i.user_id, "admissionToken": i.admission_token,
            "idempotencyKey": i.idempotency_key, "sectionId": "ga", "quantity": q})
    };
    for (name, event, items) in [
        (
            "a batch of replayed, forged and invalid items",
            e,
            vec![
                item("fan-1", &token, 2, "faces-h1"),
                item("fan-2", "forged", 1, "faces-b1"),
                item("fan-1", &token, 0, "faces-b2"),
                item("fan-1", &token, 1, "faces-h1"),
            ],
        ),
        ("an empty batch", e, Vec::new()),
        (
            "a batch of an unknown event",
            "faces-nowhere",
            vec![item("fan-1", &token, 1, "")],
        ),
    ] {
        let body = json!({"items": items.iter().map(item_body).collect::<Vec<_>>()});
        let mut g = client.grpc.clone();
        t.row::<_, boxoffice_gateway::http::batch::HoldBatchAnswer>(
            name,
            g.booking.hold_batch(pb::HoldBatchRequest {
                event_id: event.into(),
                items,
            }),
            client
                .http
                .post(&format!("/v1/events/{event}/holds/batch"), &[], &body),
        )
        .await;
    }

    // The waitlist: refused while places can be held, without admission; an unknown entry.
    let mut g = client.grpc.clone();
    for (name, user, token) in [
        (
            "join the waitlist while places are free",
            "fan-1",
            token.as_str(),
        ),
        ("join the waitlist with a forged token", "fan-1", "forged"),
        ("join the waitlist without a user", "", token.as_str()),
    ] {
        t.row::<_, boxoffice_gateway::http::waitlist::WaitlistEntry>(
            name,
            g.waitlist.join_waitlist(pb::JoinWaitlistRequest {
                event_id: e.into(),
                user_id: user.into(),
                section_id: "ga".into(),
                quantity: 1,
                admission_token: token.into(),
            }),
            client.http.post(
                &format!("/v1/events/{e}/waitlist"),
                &[],
                &json!({"userId": user, "sectionId": "ga", "quantity": 1,
                    "admissionToken": token}),
            ),
        )
        .await;
    }
    t.row::<_, boxoffice_gateway::http::waitlist::WaitlistEntry>(
        "read a waitlist entry that is not one",
        g.waitlist.get_waitlist_entry(pb::GetWaitlistEntryRequest {
            entry_id: format!("{e}.w01"),
            user_id: "fan-1".into(),
        }),
        client
            .http
            .get(&format!("/v1/waitlist/{e}.w01?userId=fan-1"), &[]),
    )
    .await;

    // Reads of holds: owners only.
    let mut g = client.grpc.clone();
    for (name, hold, user) in [
        ("read one's hold", ga_hold.as_str(), "fan-1"),
        ("read another fan's hold", ga_hold.as_str(), "fan-2"),
        ("read a hold id that is not one", "nonsense", "fan-1"),
    ] {
        t.row::<_, json_types::Hold>(
            name,
            g.booking.get_hold(pb::GetHoldRequest {
                hold_id: hold.into(),
                user_id: user.into(),
            }),
            client
                .http
                .get(&format!("/v1/holds/{hold}?userId={user}"), &[]),
        )
        .await;
    }

    // Confirm: payment, keys, owners.
    let confirm = |hold: &str, user: &str, payment: &str, key: &str| pb::ConfirmRequest {
        hold_id: hold.into(),
        user_id: user.into(),
        payment_token: payment.into(),
        idempotency_key: key.into(),
    };
    let mut order = String::new();
    for (name, req) in [
        (
            "confirm another fan's hold",
            confirm(&ga_hold, "fan-2", "tok_visa", ""),
        ),
        (
            "confirm without a payment token",
            confirm(&ga_hold, "fan-1", "", ""),
        ),
        (
            "confirm a hold id that is not one",
            confirm("nonsense", "fan-1", "tok_visa", ""),
        ),
        (
            "confirm (the HTTP call replays the key)",
            confirm(&ga_hold, "fan-1", "tok_visa", "faces-c1"),
        ),
        (
            "confirm again under the key, another token",
            confirm(&ga_hold, "fan-1", "tok_other", "faces-c1"),
        ),
    ] {
        let body = json!({
            "userId": req.user_id,
            "paymentToken": req.payment_token,
            "idempotencyKey": req.idempotency_key,
        });
        let path = format!("/v1/holds/{}/confirm", req.hold_id);
        let mut g = client.grpc.clone();
        let answer = t
            .row::<_, json_types::Order>(
                name,
                g.booking.confirm(req),
                client.http.post(&path, &[], &body),
            )
            .await;
        if let Some(id) = answer.get("orderId").and_then(Value::as_str) {
            order = id.to_owned();
        }
    }
    assert!(!order.is_empty(), "an order was made");
    let mut g = client.grpc.clone();
    for (name, id, user) in [
        ("read one's order", order.as_str(), "fan-1"),
        ("read another fan's order", order.as_str(), "fan-2"),
        ("read an order id that is not one", "nonsense", "fan-1"),
    ] {
        t.row::<_, json_types::Order>(
            name,
            g.booking.get_order(pb::GetOrderRequest {
                order_id: id.into(),
                user_id: user.into(),
            }),
            client
                .http
                .get(&format!("/v1/orders/{id}?userId={user}"), &[]),
        )
        .await;
    }

    // Moving tickets: refused alike.
    for (name, order_id, to) in [
        ("transfer to nobody", order.clone(), ""),
        (
            "transfer a ticket of an order id that is not one",
            format!("{e}.ga.onothing"),
            "fan-2",
        ),
    ] {
        let ticket = format!("{order_id}.1");
        t.row::<_, boxoffice_gateway::http::orders::Transfer>(
            name,
            g.booking.transfer_tickets(pb::TransferTicketsRequest {
                order_id: order_id.clone(),
                user_id: "fan-1".into(),
                ticket_ids: vec![ticket.clone()],
                to_user_id: to.into(),
                idempotency_key: String::new(),
            }),
            client.http.post(
                &format!("/v1/orders/{order_id}/transfer"),
                &[],
                &json!({"userId": "fan-1", "ticketIds": [ticket], "toUserId": to}),
            ),
        )
        .await;
    }

    // The revocation list of an event that is not one.
    t.row::<_, boxoffice_gateway::http::orders::RevocationList>(
        "the revocation list of an unknown event",
        g.events.get_revocation_list(pb::GetRevocationListRequest {
            event_id: "faces-nowhere".into(),
        }),
        client.http.get("/v1/events/faces-nowhere/revocations", &[]),
    )
    .await;

    // Giving tickets back: refused alike (this event takes no cancellations).
    for (name, order_id, tickets) in [
        ("cancel no tickets", order.clone(), Vec::new()),
        (
            "cancel a ticket of an order id that is not one",
            format!("{e}.ga.onothing"),
            vec![format!("{e}.ga.onothing.1")],
        ),
        (
            "cancel a ticket of an event without cancellations",
            order.clone(),
            vec![format!("{order}.1")],
        ),
    ] {
        let req = pb::CancelTicketsRequest {
            order_id: order_id.clone(),
            user_id: "fan-1".into(),
            ticket_ids: tickets.clone(),
            idempotency_key: String::new(),
        };
        t.row::<_, boxoffice_gateway::http::orders::Cancellation>(
            name,
            g.booking.cancel_tickets(req),
            client.http.post(
                &format!("/v1/orders/{order_id}/cancel"),
                &[],
                &json!({"userId": "fan-1", "ticketIds": tickets}),
            ),
        )
        .await;
    }

    // A fan's orders: every event's (on a cluster, every group's, merged), one event's, a
    // page at a time (the next page's token signed alike), and refused asks.
    let list = |user: &str, event: &str, size: u32, token: &str| pb::ListOrdersRequest {
        user_id: user.into(),
        event_id: event.into(),
        page_size: size,
        page_token: token.into(),
    };
    for (name, req) in [
        ("list one's orders", list("fan-1", "", 0, "")),
        (
            "list one's orders of the event",
            list("fan-1", event, 0, ""),
        ),
        ("list one's orders one at a time", list("fan-1", "", 1, "")),
        ("list another fan's orders", list("fan-9", "", 0, "")),
        (
            "list orders of an event that is not one",
            list("fan-1", "nope", 0, ""),
        ),
        ("list orders without a user", list("", "", 0, "")),
        (
            "list orders with a forged page token",
            list("fan-1", "", 0, "x.y"),
        ),
    ] {
        let path = format!(
            "/v1/users/{}/orders?eventId={}&pageSize={}&pageToken={}",
            req.user_id, req.event_id, req.page_size, req.page_token
        );
        let answer = t
            .row::<_, boxoffice_gateway::http::orders::OrderPage>(
                name,
                g.booking.list_orders(req),
                client.http.get(&path, &[]),
            )
            .await;
        if name == "list one's orders" {
            let orders = answer["orders"].as_array().expect("a page of orders");
            assert!(
                orders.iter().any(|o| o["orderId"] == order.as_str()),
                "{name}: {answer}"
            );
        }
    }

    // Release: owners, then a hold that is no longer active. The first release is gRPC's
    // alone; releasing it again is compared.
    let release = |hold: &str, user: &str| pb::ReleaseRequest {
        hold_id: hold.into(),
        user_id: user.into(),
    };
    let released = |g: &mut Clients, hold: &str, user: &str| {
        let mut g = g.clone();
        let req = release(hold, user);
        async move { g.booking.release(req).await }
    };
    for (name, hold, user) in [
        ("release another fan's hold", seat_hold.as_str(), "fan-2"),
        ("release a confirmed hold", ga_hold.as_str(), "fan-1"),
        ("release a hold id that is not one", "nonsense", "fan-1"),
    ] {
        let mut g = client.grpc.clone();
        let got = t
            .row::<_, Released>(
                name,
                released(&mut g, hold, user),
                client.http.post(
                    &format!("/v1/holds/{hold}/release"),
                    &[],
                    &json!({"userId": user}),
                ),
            )
            .await;
        assert_ne!(got, Value::Null, "{name}: refused");
    }
    let mut g = client.grpc.clone();
    g.booking
        .release(release(&seat_hold, "fan-1"))
        .await
        .expect("fan-1 releases their seat");
    t.row::<_, Released>(
        "release a released hold",
        released(&mut g, &seat_hold, "fan-1"),
        client.http.post(
            &format!("/v1/holds/{seat_hold}/release"),
            &[],
            &json!({"userId": "fan-1"}),
        ),
    )
    .await;
    let answered: Vec<String> = t.reasons().into_iter().map(|(_, r)| r).collect();
    for reason in MUST_ANSWER {
        assert!(
            answered.iter().any(|r| r == reason),
            "no row answered {reason}: {:?}",
            t.reasons()
        );
    }
    t
}

/// The reasons some row of every run of the table must have answered ([`compare`] checks that
/// the table exercised what it claims; the faces' agreement is checked row by row).
pub const MUST_ANSWER: &[&str] = &[
    "INVALID_REQUEST",
    "EVENT_NOT_FOUND",
    "SECTION_NOT_FOUND",
    "SEAT_NOT_FOUND",
    "SEAT_UNAVAILABLE",
    "USER_LIMIT",
    "IDEMPOTENCY_KEY_REUSED",
    "TOKEN_INVALID",
    "HOLD_NOT_FOUND",
    "ORDER_NOT_FOUND",
    "HOLD_NOT_ACTIVE",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
];
