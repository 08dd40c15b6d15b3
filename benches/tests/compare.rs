//! The comparison's rows on a tiny sale (2,000 contenders, 200 seats, 16 in flight) and a tiny
//! success-heavy one (2,000 places): every seat held once, nothing oversold, nothing else
//! failing, the server's own count agreeing; and the full seeds' script's own rules (a key's
//! first answer, the per-user limit, the expiry index). The Redis rows need `redis-server` on
//! PATH: without it they are skipped (with a message), unless `BOXOFFICE_REQUIRE_REDIS=1`, which
//! makes a missing `redis-server` a failure.

use boxoffice_benches::compare::seeds::{Answer, Design};
use boxoffice_benches::compare::{self, Kind, RowResult, Workload, ours, seeds};

fn tiny() -> Workload {
    Workload {
        kind: Kind::Sale,
        contenders: 2_000,
        seats: 200,
        in_flight: 16,
        connections: 16,
        batch: 64,
        health_calls: 0,
        front_redis_connections: 2,
        setup_concurrency: 64,
        keys: true,
    }
}

fn client() -> tokio::runtime::Runtime {
    compare::runtime("compare-test-client").expect("a client runtime")
}

fn assert_sold_out_once(r: &RowResult, w: &Workload) {
    assert_eq!(r.failure(), None, "{r:#?}");
    assert!(r.failed_checks.is_empty(), "{r:#?}");
    assert_eq!(r.held, u64::from(w.seats), "{r:#?}");
    assert_eq!(r.distinct_holds, u64::from(w.seats), "{r:#?}");
    assert!(r.held_latency.p50_ms > 0.0, "{r:#?}");
    if r.sold_out > 0 {
        assert!(r.sold_out_latency.p50_ms > 0.0, "{r:#?}");
    }
    assert_eq!(
        r.sold_out,
        (w.contenders - w.seats as usize) as u64,
        "{r:#?}"
    );
    assert_eq!(r.other_errors, 0, "{r:#?}");
    assert_eq!(r.oversold, 0, "{r:#?}");
    assert!(r.failed_checks.is_empty(), "{r:#?}");
}

/// The `redis-server` to use, or `None` to skip (missing, and not required).
fn redis_server() -> Option<std::path::PathBuf> {
    match seeds::find_redis_server() {
        Some(p) => Some(p),
        None => {
            boxoffice_engine::tiers::skip_unless_required(
                "redis",
                "redis-server is not on PATH: the Redis rows are skipped",
            );
            None
        }
    }
}

#[test]
fn redis_rows_sell_every_seat_once() {
    let Some(bin) = redis_server() else { return };
    let client = client();
    for w in [tiny(), tiny().as_kind(Kind::Success)] {
        for r in [
            seeds::row_b(&w, &client, &bin).expect("row b"),
            seeds::row_c(&w, &client, &bin).expect("row c"),
            seeds::row_e(&w, &client, &bin).expect("row e"),
        ] {
            assert_sold_out_once(&r, &w);
            assert_eq!(r.seats_left, Some(0), "{r:#?}");
        }
    }
}

#[test]
fn our_rows_sell_every_seat_once() {
    let client = client();
    let w = tiny();
    let (r, health) = ours::row_a(&w, &client, false).expect("row a");
    assert!(health.is_none());
    assert_sold_out_once(&r, &w);
    let w = tiny().as_kind(Kind::Success);
    assert_eq!(w.seats, 2_000);
    let (r, _) = ours::row_d(&w, &client, false).expect("row d");
    assert_sold_out_once(&r, &w);
    assert_eq!(r.sold_out, 0, "{r:#?}");
}

/// The full script against a live Redis: a key's first answer comes back and nothing changes;
/// the per-user limit, the section's counter, the hold record and the expiry index.
#[test]
fn full_script_keeps_the_seeds_rules() {
    let Some(bin) = redis_server() else { return };
    let redis = seeds::RedisServer::start(&bin).expect("redis-server");
    let w = Workload {
        contenders: 4,
        seats: 32,
        ..tiny()
    };
    assert_eq!(w.section_capacity(0), 2);
    client().block_on(async {
        let mut con = seeds::connections(&redis.url(), 1).await.unwrap().remove(0);
        let script = seeds::seed(&mut con, &w, Design::Full).await.unwrap();
        let mut hold = async |user: &str, key: &str| {
            seeds::reserve(Design::Full, &script, &mut con, "s0", 1, user, key)
                .await
                .unwrap()
        };
        let first = hold("u1", "k1").await;
        let Answer::Held(id) = first.clone() else {
            panic!("{first:?}")
        };
        assert_eq!(
            hold("u1", "k1").await,
            first,
            "a retry gets the first answer"
        );
        assert_eq!(
            hold("u1", "k2").await,
            Answer::UserLimit,
            "the per-user limit"
        );
        assert_eq!(
            hold("u1", "k2").await,
            Answer::UserLimit,
            "a stored refusal"
        );
        assert!(matches!(hold("u2", "k3").await, Answer::Held(_)));
        assert_eq!(hold("u3", "k4").await, Answer::SoldOut, "s0 has 2 places");
        // Without a key nothing is stored, and a retry is a new attempt.
        assert_eq!(hold("u4", "").await, Answer::SoldOut);
        let mut con = seeds::connections(&redis.url(), 1).await.unwrap().remove(0);
        let get = |key: String| redis::cmd("GET").arg(key).to_owned();
        let left: i64 = get(seeds::section_key("s0"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(left, 0);
        let other: i64 = get(seeds::section_key("s1"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(other, 2, "another section's counter is untouched");
        let indexed: u64 = redis::cmd("ZCARD")
            .arg(seeds::expiry_key())
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(indexed, 2, "one entry per hold, none for a replay");
        let user: String = redis::cmd("HGET")
            .arg(format!("hold:{id}"))
            .arg("user")
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(user, "u1");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(format!("hold:{id}"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert!((1..=600_000).contains(&ttl), "the hold expires: {ttl}");
        let stored: String = get(seeds::idempotency_key("k4"))
            .query_async(&mut con)
            .await
            .unwrap();
        assert_eq!(
            stored, "SOLD_OUT",
            "refusals are stored under their key too"
        );
    });
}

#[test]
fn workload_splits_seats_over_sections() {
    let w = Workload {
        seats: 10_003,
        ..Workload::full()
    };
    assert_eq!(w.sections(), 16);
    assert_eq!((0..16).map(|s| w.section_capacity(s)).sum::<u32>(), 10_003);
    assert_eq!(w.expected_held(), 10_003);
    let few = Workload {
        contenders: 5,
        seats: 3,
        ..Workload::full()
    };
    assert_eq!(few.sections(), 3);
    assert_eq!(few.expected_held(), 3);
    assert!(
        compare::Row::parse_list("c, a").is_ok_and(|r| r == [compare::Row::A, compare::Row::C])
    );
    assert!(compare::Row::parse_list("f").is_err());
    assert_eq!(
        compare::Row::parse_list("e,a").unwrap(),
        [compare::Row::A, compare::Row::E]
    );
    assert_eq!(
        Kind::parse_list("success, sale").unwrap(),
        [Kind::Sale, Kind::Success]
    );
    assert!(Kind::parse_list("both").is_err());
    let success = Workload::full().as_kind(Kind::Success);
    assert_eq!((success.seats, success.expected_held()), (100_000, 100_000));
}
