//! The end-to-end gRPC path against an embedded server (`Durability::Sync`, loopback): one
//! client, one call at a time, so each figure is the latency of one call through tonic, the
//! gate, the services and (for hold and confirm) the engine and its group commit.
//! `health` is the empty-RPC floor; `status_poll` a waiting-room poll; `hold` a durable hold;
//! `confirm` a durable confirm (payment through the simulated provider included).

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use boxoffice_client::{Authed, Bearer};
use boxoffice_proto::v1 as pb;
use criterion::{Criterion, criterion_group, criterion_main};

struct Env {
    _dir: tempfile::TempDir,
    _server: boxoffice_gateway::server::Running,
    ch: tonic::transport::Channel,
    key: Bearer,
    users: Vec<(String, String)>,
    queue_token: String,
}

const USERS: usize = 400;

async fn env() -> Env {
    let (dir, server, ch) = boxoffice_benches::grpc_server().await;
    let key = Bearer::new("bench-admin").expect("key");
    let mut events =
        pb::event_service_client::EventServiceClient::with_interceptor(ch.clone(), key.clone());
    events
        .create_event(pb::CreateEventRequest {
            event_id: "bench".into(),
            name: "bench".into(),
            sections: (0..16)
                .map(|s| pb::SectionSpec {
                    section_id: format!("s{s}"),
                    name: format!("S{s}"),
                    price_cents: 100,
                    layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(
                        1_000_000,
                    )),
                    price_tiers: Vec::new(),
                })
                .collect(),
            hold_ttl_seconds: 86_400,
            per_user_limit: 100,
            admit_rate_per_second: 1_000_000,
            admission_window_seconds: 86_400,
            sale_opens_at_unix_ms: 0,
            idempotency_key: String::new(),
            join_pow_difficulty_bits: 0,
            cancellation_deadline_unix_ms: 0,
            transfers_disabled: false,
            presale_section_ids: Vec::new(),
            presale_ends_at_unix_ms: 0,
            access_codes: Vec::new(),
        })
        .await
        .expect("event");
    let mut room = pb::waiting_room_service_client::WaitingRoomServiceClient::with_interceptor(
        ch.clone(),
        key.clone(),
    );
    let mut users = Vec::new();
    let mut first_queue_token = String::new();
    for u in 0..USERS {
        let user = format!("u{u}");
        let t = room
            .join(pb::JoinRequest {
                event_id: "bench".into(),
                user_id: user.clone(),
                session_id: "s".into(),
                ..Default::default()
            })
            .await
            .expect("join")
            .into_inner();
        if u == 0 {
            first_queue_token = t.queue_token.clone();
        }
        let token = loop {
            let s = room
                .get_status(pb::GetStatusRequest {
                    queue_token: t.queue_token.clone(),
                })
                .await
                .expect("status")
                .into_inner();
            if s.state == pb::QueueState::Admitted as i32 {
                break s.admission_token;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        users.push((user, token));
    }
    Env {
        _dir: dir,
        _server: server,
        ch,
        key,
        users,
        queue_token: first_queue_token,
    }
}

fn booking(e: &Env) -> pb::booking_service_client::BookingServiceClient<Authed> {
    pb::booking_service_client::BookingServiceClient::with_interceptor(e.ch.clone(), e.key.clone())
}

fn hold_req(e: &Env, n: u64) -> pb::HoldRequest {
    let (user, token) = &e.users[(n / 100) as usize % USERS];
    pb::HoldRequest {
        event_id: "bench".into(),
        user_id: user.clone(),
        admission_token: token.clone(),
        idempotency_key: String::new(),
        selection: Some(pb::hold_request::Selection::BestAvailable(
            pb::BestAvailable {
                section_id: format!("s{}", n % 16),
                quantity: 1,
            },
        )),
        access_code: String::new(),
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("rt");
    let e = Arc::new(rt.block_on(env()));
    let n = Arc::new(AtomicU64::new(0));
    let mut g = c.benchmark_group("grpc");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    let health = tonic_health::pb::health_client::HealthClient::new(e.ch.clone());
    g.bench_function("health", |b| {
        b.to_async(&rt).iter(|| {
            let mut h = health.clone();
            async move {
                black_box(
                    h.check(tonic_health::pb::HealthCheckRequest {
                        service: String::new(),
                    })
                    .await
                    .expect("check"),
                )
            }
        })
    });
    let room = pb::waiting_room_service_client::WaitingRoomServiceClient::with_interceptor(
        e.ch.clone(),
        e.key.clone(),
    );
    g.bench_function("status_poll", |b| {
        b.to_async(&rt).iter(|| {
            let (mut r, token) = (room.clone(), e.queue_token.clone());
            async move {
                black_box(
                    r.get_status(pb::GetStatusRequest { queue_token: token })
                        .await
                        .expect("status"),
                )
            }
        })
    });
    g.bench_function("hold", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (e, n) = (e.clone(), n.clone());
            async move {
                let mut client = booking(&e);
                // A user may hold 100 places: iterations are spread over the admitted users.
                let start = Instant::now();
                for _ in 0..iters {
                    let k = n.fetch_add(1, Ordering::Relaxed) % (USERS as u64 * 100 / 2);
                    black_box(client.hold(hold_req(&e, k)).await.expect("hold"));
                }
                start.elapsed()
            }
        })
    });
    g.bench_function("confirm", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (e, n) = (e.clone(), n.clone());
            async move {
                let mut client = booking(&e);
                let mut holds = Vec::new();
                for _ in 0..iters {
                    let k = USERS as u64 * 100 / 2
                        + n.fetch_add(1, Ordering::Relaxed) % (USERS as u64 * 100 / 2);
                    let h = client
                        .hold(hold_req(&e, k))
                        .await
                        .expect("hold")
                        .into_inner();
                    holds.push(h);
                }
                let start = Instant::now();
                for h in holds {
                    black_box(
                        client
                            .confirm(pb::ConfirmRequest {
                                hold_id: h.hold_id,
                                user_id: h.user_id,
                                payment_token: "tok_bench".into(),
                                idempotency_key: String::new(),
                            })
                            .await
                            .expect("confirm"),
                    );
                }
                start.elapsed()
            }
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = boxoffice_benches::criterion();
    targets = bench
}
criterion_main!(benches);
