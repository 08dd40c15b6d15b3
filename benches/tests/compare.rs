//! The comparison's rows on a tiny sale (2,000 contenders, 200 seats, 16 in flight): every seat
//! held once, nothing oversold, nothing else failing, the server's own count agreeing. The
//! Redis rows need `redis-server` on PATH: without it they are skipped (with a message), unless
//! `BOXOFFICE_REQUIRE_REDIS=1`, which makes a missing `redis-server` a failure.

use boxoffice_benches::compare::{self, RowResult, Workload, ours, seeds};

fn tiny() -> Workload {
    Workload {
        contenders: 2_000,
        seats: 200,
        in_flight: 16,
        connections: 16,
        batch: 64,
        health_calls: 0,
        front_redis_connections: 2,
        setup_concurrency: 64,
        keys: false,
    }
}

fn client() -> tokio::runtime::Runtime {
    compare::runtime("compare-test-client").expect("a client runtime")
}

fn assert_sold_out_once(r: &RowResult, w: &Workload) {
    assert_eq!(r.failure(), None, "{r:#?}");
    assert_eq!(r.held, u64::from(w.seats), "{r:#?}");
    assert_eq!(r.distinct_holds, u64::from(w.seats), "{r:#?}");
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
    let (w, client) = (tiny(), client());
    for r in [
        seeds::row_b(&w, &client, &bin).expect("row b"),
        seeds::row_c(&w, &client, &bin).expect("row c"),
    ] {
        assert_sold_out_once(&r, &w);
        assert_eq!(r.seats_left, Some(0), "{r:#?}");
    }
}

#[test]
fn hold_row_sells_every_seat_once() {
    let (w, client) = (tiny(), client());
    let (r, health) = ours::row_a(&w, &client, false).expect("row a");
    assert!(health.is_none());
    assert_sold_out_once(&r, &w);
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
    assert!(compare::Row::parse_list("e").is_err());
}
