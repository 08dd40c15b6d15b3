//! Seat maps over gRPC: built once per change and shared, reused within the staleness window
//! with the time they were known true, capped in size (a whole event over the cap is refused
//! with `SEAT_MAP_TOO_LARGE`, one section comes in pages of whole rows). And, ignored unless
//! asked for, the memory of a release server under concurrent maps of a 4 x 1,000,000-seat
//! event (`BENCHMARKS.md`).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use boxoffice_engine::Clock;
use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::cases::expect_err;
use boxoffice_tests::server::TestServer;
use prost::Message as _;
use tonic::Code;
use tonic_types::StatusExt;

use crate::grpc::{admitted, event, ga, reserved};

fn ask(event: &str, section: &str, first_row: u32) -> pb::GetSeatMapRequest {
    pb::GetSeatMapRequest {
        event_id: event.into(),
        section_id: section.into(),
        first_row,
    }
}

async fn map(c: &mut Clients, event: &str, section: &str, first_row: u32) -> pb::SeatMap {
    c.events
        .get_seat_map(ask(event, section, first_row))
        .await
        .unwrap()
        .into_inner()
}

fn status_of(map: &pb::SeatMap, seat_id: &str) -> i32 {
    map.sections
        .iter()
        .flat_map(|s| &s.seats)
        .find(|s| s.seat_id == seat_id)
        .unwrap()
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_a_map_that_shows_a_hold_once_the_staleness_window_is_over() {
    let server = TestServer::builder()
        .seat_map_staleness(Duration::from_secs(1))
        .start()
        .await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(event(
            "sm",
            vec![
                reserved("orch", &[("A", 10), ("B", 10)], 9_000),
                ga("floor", 5, 5_000),
            ],
        ))
        .await
        .unwrap();
    let ann = admitted(&mut c, &clock, "sm", "ann").await;

    // Two readers at once get the same map, true now.
    let t0 = clock.now_ms();
    let (mut r1, mut r2) = (server.client(), server.client());
    let (m1, m2) = tokio::join!(map(&mut r1, "sm", "", 0), map(&mut r2, "sm", "", 0));
    assert_eq!(m1, m2);
    assert_eq!(m1.as_of_unix_ms, t0 as i64);
    assert!(m1.sections.iter().all(|s| s.as_of_unix_ms == t0 as i64));
    assert_eq!((m1.sections.len(), m1.sections[0].seats.len()), (2, 20));
    assert_eq!(m1.next_first_row, 0);
    let available = pb::SeatStatus::Available as i32;
    assert_eq!(status_of(&m1, "orch:A:1"), available);

    // A hold: within the window (less than 1 s after the map was known true) readers still get
    // the map they share, as of when it was known true.
    c.booking
        .hold(pb::HoldRequest {
            event_id: "sm".into(),
            user_id: "ann".into(),
            admission_token: ann,
            idempotency_key: String::new(),
            selection: Some(pb::hold_request::Selection::Seats(pb::SeatSelection {
                seat_ids: vec!["orch:A:1".into()],
            })),
            access_code: String::new(),
        })
        .await
        .unwrap();
    let stale = map(&mut c, "sm", "", 0).await;
    assert_eq!(status_of(&stale, "orch:A:1"), available);
    assert_eq!(stale.sections[0].held, 0);
    assert_eq!(
        stale.as_of_unix_ms, t0 as i64,
        "as of when it was known true"
    );
    assert_eq!(stale.sections[0].as_of_unix_ms, t0 as i64);
    // The unchanged section is true now.
    assert_eq!(stale.sections[1].as_of_unix_ms, t0 as i64);
    clock.advance_ms(999);
    let still = map(&mut c, "sm", "orch", 0).await;
    assert_eq!(status_of(&still, "orch:A:1"), available);
    assert_eq!(still.as_of_unix_ms, t0 as i64);
    let floor = map(&mut c, "sm", "floor", 0).await;
    assert_eq!(
        floor.as_of_unix_ms,
        (t0 + 999) as i64,
        "unchanged: true now"
    );

    // Once the window is over, the next reader gets the map rebuilt: the seat is held.
    clock.advance_ms(1);
    let t1 = clock.now_ms();
    let fresh = map(&mut c, "sm", "", 0).await;
    assert_eq!(status_of(&fresh, "orch:A:1"), pb::SeatStatus::Held as i32);
    assert_eq!(
        (fresh.sections[0].held, fresh.sections[0].available),
        (1, 19)
    );
    assert_eq!(fresh.as_of_unix_ms, t1 as i64);
    // Nothing changes: later reads get the same map, true at their time.
    clock.advance_ms(60_000);
    let later = map(&mut c, "sm", "", 0).await;
    assert_eq!(later.as_of_unix_ms, (t1 + 60_000) as i64);
    assert_eq!(later.sections[0].seats, fresh.sections[0].seats);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_window_a_hold_shows_at_once() {
    // Test servers use no staleness window (as the other tests rely on).
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(event("now", vec![reserved("orch", &[("A", 4)], 100)]))
        .await
        .unwrap();
    let ann = admitted(&mut c, &clock, "now", "ann").await;
    let before = map(&mut c, "now", "", 0).await;
    assert_eq!(before.sections[0].held, 0);
    c.booking
        .hold(crate::grpc::best("now", "ann", &ann, "orch", 2, ""))
        .await
        .unwrap();
    let after = map(&mut c, "now", "", 0).await;
    assert_eq!(after.sections[0].held, 2);
    assert_eq!(after.as_of_unix_ms, clock.now_ms() as i64);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_event_over_the_limit_is_refused_and_its_sections_come_in_pages() {
    const LIMIT: usize = 256 * 1024;
    let server = TestServer::builder()
        .seat_map_max_bytes(LIMIT)
        .start()
        .await;
    let mut a = server.admin();
    let mut c = server.client();
    let rows: Vec<(String, u32)> = (0..30).map(|r| (format!("R{r}"), 1_000)).collect();
    let rows: Vec<(&str, u32)> = rows.iter().map(|(l, n)| (l.as_str(), *n)).collect();
    a.events
        .create_event(event(
            "big",
            vec![reserved("stalls", &rows, 100), ga("floor", 100, 100)],
        ))
        .await
        .unwrap();

    // The whole event: refused, saying how big it is, the limit, and what to do instead.
    let err = c.events.get_seat_map(ask("big", "", 0)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    let info = err.get_error_details().error_info().cloned().unwrap();
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        ("SEAT_MAP_TOO_LARGE", "boxoffice")
    );
    assert_eq!(info.metadata["limit"], LIMIT.to_string());
    let size: usize = info.metadata["size"].parse().unwrap();
    assert!(size > LIMIT, "{size}");
    assert!(err.message().contains("section_id"), "{}", err.message());

    // One section: pages of whole rows, each within the limit, following next_first_row.
    let mut seats = Vec::new();
    let mut first_row = 0;
    let mut pages = 0;
    loop {
        let page = map(&mut c, "big", "stalls", first_row).await;
        assert!(page.encoded_len() <= LIMIT, "{}", page.encoded_len());
        assert_eq!(page.sections.len(), 1);
        let s = &page.sections[0];
        assert_eq!((s.capacity, s.available), (30_000, 30_000));
        assert_eq!(s.seats.len() % 1_000, 0, "whole rows");
        assert_eq!(s.seats[0].row, format!("R{first_row}"));
        seats.extend(s.seats.iter().map(|s| s.seat_id.clone()));
        pages += 1;
        if page.next_first_row == 0 {
            break;
        }
        assert!(page.next_first_row > first_row);
        first_row = page.next_first_row;
    }
    assert!(pages > 1, "the section is larger than one page");
    let expected: Vec<String> = (0..30)
        .flat_map(|r| (1..=1_000).map(move |n| format!("stalls:R{r}:{n}")))
        .collect();
    assert_eq!(seats, expected, "every seat once, in order");
    let floor = map(&mut c, "big", "floor", 0).await;
    assert_eq!(
        (floor.sections[0].available, floor.next_first_row),
        (100, 0)
    );
    assert!(floor.sections[0].seats.is_empty());

    // Bad asks: rows past the end, rows without a section, unknown section and event.
    for (req, code, reason) in [
        (
            ask("big", "stalls", 30),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        ),
        (
            ask("big", "floor", 1),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        ),
        (ask("big", "", 1), Code::InvalidArgument, "INVALID_REQUEST"),
        (ask("big", "nope", 0), Code::NotFound, "SECTION_NOT_FOUND"),
        (ask("nope", "", 0), Code::NotFound, "EVENT_NOT_FOUND"),
    ] {
        let r = c.events.get_seat_map(req).await;
        if reason == "INVALID_REQUEST" {
            let e = r.as_ref().unwrap_err();
            let info = e.get_error_details().error_info().cloned().unwrap();
            assert_eq!(info.metadata["field"], "first_row");
        }
        expect_err(r, code, reason);
    }
    server.shutdown().await;
}

/// The peak memory of a release server (`BOXOFFICE_BIN=target/release/boxoffice`) serving
/// `BOXOFFICE_MAP_READERS` (4) readers that each read the whole seat map of a 4 x 1,000,000-seat
/// event `BOXOFFICE_MAP_ROUNDS` (5) times at once: whole-event reads where the server answers
/// them, else (`SEAT_MAP_TOO_LARGE`) every section in pages, the 4 sections at once. Prints
/// the server's resident memory after the event was created and its peak (VmHWM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: needs BOXOFFICE_BIN (a release build); see BENCHMARKS.md"]
async fn seat_map_memory_of_a_release_server() {
    let bin = std::env::var("BOXOFFICE_BIN").expect("BOXOFFICE_BIN names a boxoffice binary");
    let readers: usize = env_or("BOXOFFICE_MAP_READERS", 4);
    let rounds: usize = env_or("BOXOFFICE_MAP_ROUNDS", 5);
    let dir = tempfile::tempdir().unwrap();
    let free_port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
    };
    let (addr, metrics) = (free_port(), free_port());
    let mut child = std::process::Command::new(&bin)
        .args(["serve", "--listen", &addr.to_string()])
        .args(["--metrics-listen", &metrics.to_string()])
        .arg("--data-dir")
        .arg(dir.path())
        .args(["--admin-key", "admin-key", "--client-key", "client-key"])
        .args(["--token-secret", "a-token-secret-for-the-measurement"])
        .args(["--durability", "buffered"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let channel = loop {
        match boxoffice_tests::connect(&format!("http://{addr}")).await {
            Ok(ch) => break ch,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    let admin = Clients::new(
        &channel,
        &boxoffice_tests::Bearer::new("admin-key").unwrap(),
    );
    let sections: Vec<pb::SectionSpec> = (0..4)
        .map(|s| {
            let rows: Vec<(String, u32)> = (0..1_000).map(|r| (format!("R{r}"), 1_000)).collect();
            let rows: Vec<(&str, u32)> = rows.iter().map(|(l, n)| (l.as_str(), *n)).collect();
            reserved(&format!("s{s}"), &rows, 100)
        })
        .collect();
    let create = event("mega", sections);
    loop {
        let mut admin = admin.clone();
        match admin.events.create_event(create.clone()).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("creating the event: {e}"),
        }
    }
    let rss_before = proc_status_kb(pid, "VmRSS:");
    let started = std::time::Instant::now();
    let mut bytes_read = 0usize;
    let mut how = "";
    for _ in 0..rounds {
        let mut tasks = Vec::new();
        for _ in 0..readers {
            let channel = channel.clone();
            tasks.push(tokio::spawn(async move { read_whole_map(channel).await }));
        }
        for t in tasks {
            let (n, h) = t.await.unwrap();
            bytes_read += n;
            how = h;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let peak = proc_status_kb(pid, "VmHWM:");
    let _ = child.kill();
    let _ = child.wait();
    println!(
        "seat-map memory: {readers} readers x {rounds} rounds of the whole map of 4 x 1,000,000 \
         seats ({how}): server RSS after creating the event {} MB, peak (VmHWM) {} MB; {} MB \
         read in {secs:.1} s",
        rss_before / 1024,
        peak / 1024,
        bytes_read / 1_000_000
    );
}

fn env_or(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn proc_status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A `SeatMap` read with its sections left encoded (the reader builds nothing per seat).
#[derive(Clone, PartialEq, prost::Message)]
struct MapHead {
    #[prost(string, tag = "1")]
    event_id: String,
    #[prost(bytes = "vec", repeated, tag = "3")]
    sections: Vec<Vec<u8>>,
    #[prost(uint32, tag = "4")]
    next_first_row: u32,
}

/// Reads the whole map of event `mega` once: in one answer if the server gives it, else each
/// section in pages, the sections at once. Returns the bytes read and how.
async fn read_whole_map(channel: tonic::transport::Channel) -> (usize, &'static str) {
    match get_map(&channel, ask("mega", "", 0)).await {
        Ok((_, n)) => (n, "whole-event answers"),
        Err(e) => {
            assert_eq!(
                e.get_error_details().error_info().map(|i| i.reason.clone()),
                Some("SEAT_MAP_TOO_LARGE".to_owned()),
                "{e}"
            );
            let mut tasks = Vec::new();
            for s in 0..4 {
                let channel = channel.clone();
                tasks.push(tokio::spawn(async move {
                    let (mut row, mut total) = (0, 0);
                    loop {
                        let (head, n) = get_map(&channel, ask("mega", &format!("s{s}"), row))
                            .await
                            .unwrap();
                        total += n;
                        if head.next_first_row == 0 {
                            return total;
                        }
                        row = head.next_first_row;
                    }
                }));
            }
            let mut n = 0;
            for t in tasks {
                n += t.await.unwrap();
            }
            (
                n,
                "refused whole: 4 sections at once in pages of at most 4 MiB",
            )
        }
    }
}

/// One `GetSeatMap` call with the client key, without a receive limit; the head of the answer
/// and the size of its sections.
async fn get_map(
    channel: &tonic::transport::Channel,
    req: pb::GetSeatMapRequest,
) -> Result<(MapHead, usize), tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone()).max_decoding_message_size(usize::MAX);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(req);
    request
        .metadata_mut()
        .insert("authorization", "Bearer client-key".parse().unwrap());
    let path = http::uri::PathAndQuery::from_static("/boxoffice.v1.EventService/GetSeatMap");
    let codec = tonic_prost::ProstCodec::<pb::GetSeatMapRequest, MapHead>::default();
    let head = grpc.unary(request, path, codec).await?.into_inner();
    let n = head.sections.iter().map(Vec::len).sum();
    Ok((head, n))
}
