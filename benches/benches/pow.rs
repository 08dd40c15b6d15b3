//! The proof of work before `Join` (issue 12, point 3): what a join costs a client and what a
//! join costs the server to check.
//!
//! - `pow/solve/{0,12,16,20}`: one client solving one fresh challenge (each iteration a new
//!   challenge, so the figure is the mean over many searches; the work of one search is
//!   geometric, about `2^bits` hashes, so a single search varies a lot). 20 bits is about a
//!   million hashes: few samples.
//! - `pow/hash`: one try of the search (the challenge's midstate cloned, 8 bytes, finalize):
//!   the unit the solve times are multiples of.
//! - `pow/issue`: the server issuing a challenge (`GetJoinChallenge` without the RPC: one HMAC).
//! - `pow/verify/{accepted,reused,wrong_nonce}`: the server checking a `Join`'s proof at 16
//!   bits (signature and binding, expiry, one SHA-256, one insert into the used set), the cost is
//!   the same at every difficulty. Accepted: each timed check uses a challenge not used yet
//!   (given back untimed afterwards); reused: the refusal of a used one; wrong nonce: the
//!   refusal of a hash too weak.
//! - `pow/join_rpc/{0,12}`: a fan's whole way into the line over gRPC against an embedded
//!   server: `GetJoinChallenge` (at 12 bits), the search, `Join`; at 0 bits the `Join` alone.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use boxoffice_client::{Bearer, join_request, pow};
use boxoffice_gateway::pow::JoinChallenges;
use boxoffice_gateway::tokens::TokenSigner;
use boxoffice_proto::v1 as pb;
use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};

const NOW_MS: u64 = 1_767_225_600_000;

fn challenges() -> (TokenSigner, JoinChallenges) {
    (
        TokenSigner::new(b"bench-secret"),
        JoinChallenges::new(300_000),
    )
}

fn solve(c: &mut Criterion) {
    let (signer, ch) = challenges();
    let mut g = c.benchmark_group("pow/solve");
    let fan = AtomicU64::new(0);
    for bits in [0u32, 12, 16, 20] {
        // 20 bits: ~1M hashes a search, so flat sampling with few searches per sample.
        if bits >= 16 {
            g.sampling_mode(SamplingMode::Flat)
                .sample_size(10)
                .measurement_time(Duration::from_secs(if bits >= 20 { 20 } else { 8 }));
        } else {
            g.sampling_mode(SamplingMode::Auto)
                .sample_size(50)
                .measurement_time(Duration::from_secs(5));
        }
        g.bench_with_input(BenchmarkId::from_parameter(bits), &bits, |b, &bits| {
            b.iter_custom(|iters| {
                // Fresh challenges, made before the clock starts.
                let all: Vec<String> = (0..iters)
                    .map(|_| {
                        let user = format!("fan-{}", fan.fetch_add(1, Ordering::Relaxed));
                        ch.issue(&signer, "bench", &user, NOW_MS).challenge
                    })
                    .collect();
                let started = Instant::now();
                for c in &all {
                    black_box(pow::solve(black_box(c), bits));
                }
                started.elapsed()
            });
        });
    }
    g.finish();
}

fn hash_and_issue(c: &mut Criterion) {
    let (signer, ch) = challenges();
    let challenge = ch.issue(&signer, "bench", "fan", NOW_MS).challenge;
    let mut g = c.benchmark_group("pow");
    g.measurement_time(Duration::from_secs(3));
    let mut n = 0u64;
    g.bench_function("hash", |b| {
        b.iter(|| {
            n = n.wrapping_add(1);
            black_box(pow::pow_hash(black_box(&challenge), n))
        });
    });
    g.bench_function("issue", |b| {
        b.iter(|| black_box(ch.issue(&signer, black_box("bench"), "fan-1", NOW_MS)));
    });
    g.finish();
}

fn verify(c: &mut Criterion) {
    const BITS: u32 = 16;
    let (signer, ch) = challenges();
    // A pool of solved challenges (solving is not what is measured here).
    let pool: Vec<(String, String, u64)> = (0..32)
        .map(|i| {
            let user = format!("fan-{i}");
            let challenge = ch.issue(&signer, "bench", &user, NOW_MS).challenge;
            let nonce = pow::solve(&challenge, BITS);
            (user, challenge, nonce)
        })
        .collect();
    let mut g = c.benchmark_group("pow/verify");
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("accepted", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for i in 0..iters {
                let (user, challenge, nonce) = &pool[i as usize % pool.len()];
                let started = Instant::now();
                let used = ch.check(&signer, challenge, *nonce, "bench", user, BITS, NOW_MS);
                total += started.elapsed();
                ch.give_back(used.expect("a solved challenge is accepted"));
            }
            total
        });
    });
    for (user, challenge, nonce) in &pool {
        ch.check(&signer, challenge, *nonce, "bench", user, BITS, NOW_MS)
            .expect("accepted");
    }
    let (user, challenge, nonce) = &pool[0];
    g.bench_function("reused", |b| {
        b.iter(|| {
            black_box(ch.check(&signer, challenge, *nonce, "bench", user, BITS, NOW_MS))
                .expect_err("used already")
        });
    });
    let wrong = (0..)
        .find(|n| !pow::is_solution(challenge, *n, BITS))
        .expect("a wrong nonce");
    g.bench_function("wrong_nonce", |b| {
        b.iter(|| {
            black_box(ch.check(&signer, challenge, wrong, "bench", user, BITS, NOW_MS))
                .expect_err("too weak")
        });
    });
    g.finish();
}

fn join_rpc(c: &mut Criterion) {
    let rt = boxoffice_benches::runtime();
    let (_dir, server, ch) = rt.block_on(boxoffice_benches::grpc_server());
    let key = Bearer::new("bench-admin").expect("key");
    let clients = boxoffice_client::Clients::new(&ch, &key);
    for bits in [0u32, 12] {
        let mut events = clients.events.clone();
        rt.block_on(events.create_event(pb::CreateEventRequest {
            event_id: format!("pow{bits}"),
            name: "bench".into(),
            sections: vec![pb::SectionSpec {
                section_id: "g".into(),
                name: "G".into(),
                price_cents: 1,
                layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(10)),
                price_tiers: Vec::new(),
            }],
            join_pow_difficulty_bits: bits,
            ..Default::default()
        }))
        .expect("event");
    }
    let mut g = c.benchmark_group("pow/join_rpc");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    let fan = AtomicU64::new(0);
    for bits in [0u32, 12] {
        let event_id = format!("pow{bits}");
        g.bench_with_input(BenchmarkId::from_parameter(bits), &bits, |b, &bits| {
            b.to_async(&rt).iter(|| {
                let mut room = clients.room.clone();
                let event_id = event_id.clone();
                let user = format!("fan-{}", fan.fetch_add(1, Ordering::Relaxed));
                async move {
                    let challenge = if bits == 0 {
                        pb::JoinChallenge::default()
                    } else {
                        room.get_join_challenge(pb::GetJoinChallengeRequest {
                            event_id: event_id.clone(),
                            user_id: user.clone(),
                        })
                        .await
                        .expect("challenge")
                        .into_inner()
                    };
                    let join = join_request(&event_id, &user, "s", &challenge);
                    black_box(room.join(join).await.expect("joined"))
                }
            });
        });
    }
    g.finish();
    rt.block_on(server.shutdown()).expect("shutdown");
}

criterion_group! {
    name = benches;
    config = boxoffice_benches::criterion();
    targets = solve, hash_and_issue, verify, join_rpc
}
criterion_main!(benches);
