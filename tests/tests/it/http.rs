//! The HTTP/JSON API over real HTTP: every seed path (queue token, queue status, seat map, book,
//! holds, orders, confirm, release) and the reads and creates beside them, with the same keys,
//! validation, idempotency and reasons as gRPC; errors as problem details; the seat map's
//! caching headers and conditional GETs; the OpenAPI document.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::time::Duration;

use boxoffice_tests::http::{Answer, Http};
use boxoffice_tests::server::{ADMIN, CLIENT, TestServer};
use http::StatusCode;
use serde_json::{Value, json};

/// An event `id` with a reserved section `orch` (rows A and B of 5 seats) and a GA section of
/// `ga` places, created over HTTP with the admin key.
async fn create(admin: &Http, id: &str, ga: u32) -> Answer {
    admin
        .post(
            "/v1/events",
            &[("idempotency-key", &format!("create-{id}"))],
            &json!({
                "eventId": id,
                "name": format!("Show {id}"),
                "sections": [
                    {"sectionId": "orch", "name": "Orchestra", "priceCents": 9000,
                     "rows": [{"label": "A", "seatCount": 5}, {"label": "B", "seatCount": 5}]},
                    {"sectionId": "ga", "name": "Floor", "priceCents": 4000, "capacity": ga},
                ],
                "holdTtlSeconds": 60,
                "perUserLimit": 4,
                "admitRatePerSecond": 1000,
                "admissionWindowSeconds": 120,
            }),
        )
        .await
}

/// Joins over HTTP and polls the queue status (advancing the manual clock) until admitted;
/// returns the admission token.
async fn admitted(server: &TestServer, fan: &Http, event: &str, user: &str) -> String {
    let t = fan
        .get(
            &format!("/v1/events/{event}/queue-token?userId={user}&sessionId=s"),
            &[],
        )
        .await;
    assert_eq!(t.status, StatusCode::OK, "{t:?}");
    let token = t.json()["token"].as_str().unwrap().to_owned();
    assert!(t.json()["etaSec"].is_u64());
    for _ in 0..500 {
        let s = fan
            .get(&format!("/v1/queue/{event}/status?token={token}"), &[])
            .await;
        assert_eq!(s.status, StatusCode::OK, "{s:?}");
        let s = s.json();
        if s["state"] == "ADMITTED" {
            assert!(s["admissionExpiresAtUnixMs"].as_i64().unwrap() > 0);
            return s["admissionToken"].as_str().unwrap().to_owned();
        }
        assert_eq!(s["state"], "WAITING");
        server.clock().advance_ms(20);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{user} was not admitted to {event}");
}

fn key(k: &str) -> [(&'static str, &str); 1] {
    [("idempotency-key", k)]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sale_over_http_holds_confirms_and_releases_with_the_contracts_answers() {
    let server = TestServer::start().await;
    let admin = server.http(Some(ADMIN));
    let fan = server.http(Some(CLIENT));
    let made = create(&admin, "web", 10).await;
    assert_eq!(made.status, StatusCode::CREATED, "{made:?}");
    assert_eq!(made.header("location"), "/v1/events/web");
    assert_eq!(made.json()["state"], "ON_SALE");
    // The same create again answers the same event.
    let again = create(&admin, "web", 10).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.json()["eventId"], "web");

    let token = admitted(&server, &fan, "web", "ann").await;
    // The seeds' book: one exact seat, with the admission token.
    let booked = fan
        .post(
            "/v1/events/web/book",
            &key("book-1"),
            &json!({"userId": "ann", "token": token, "seatId": "orch:A:1"}),
        )
        .await;
    assert_eq!(booked.status, StatusCode::CREATED, "{booked:?}");
    let hold = booked.json();
    let hold_id = hold["holdId"].as_str().unwrap().to_owned();
    assert_eq!(booked.header("location"), format!("/v1/holds/{hold_id}"));
    assert_eq!(hold["seatIds"], json!(["orch:A:1"]));
    assert_eq!(hold["status"], "HELD");
    assert!(hold["expiresAt"].as_str().unwrap().ends_with('Z'));
    assert!(hold["expiresAtUnixMs"].as_i64().unwrap() > 0);
    // A retry with the same key answers the first answer; a new key for the same seat is
    // refused, naming the seat.
    let retry = fan
        .post(
            "/v1/events/web/book",
            &key("book-1"),
            &json!({"userId": "ann", "token": token, "seatId": "orch:A:1"}),
        )
        .await;
    assert_eq!(retry.json()["holdId"], hold["holdId"]);
    let taken = fan
        .post(
            "/v1/events/web/book",
            &key("book-2"),
            &json!({"userId": "ann", "token": token, "seatId": "orch:A:1"}),
        )
        .await;
    assert_eq!(taken.status, StatusCode::CONFLICT);
    assert_eq!(taken.reason(), "SEAT_UNAVAILABLE");
    assert_eq!(taken.json()["metadata"]["seat_id"], "orch:A:1");
    assert_eq!(
        taken.json()["type"],
        "urn:boxoffice:reason:SEAT_UNAVAILABLE"
    );
    assert_eq!(taken.json()["grpcCode"], "FAILED_PRECONDITION");

    // The case study's POST /v1/holds: best available in the GA section.
    let ga = fan
        .post(
            "/v1/holds",
            &[],
            &json!({"eventId": "web", "userId": "ann", "admissionToken": token,
                    "sectionId": "ga", "quantity": 2, "idempotencyKey": "hold-ga"}),
        )
        .await;
    assert_eq!(ga.status, StatusCode::CREATED, "{ga:?}");
    assert_eq!(ga.json()["quantity"], 2);
    assert_eq!(ga.json()["sectionId"], "ga");
    let ga_id = ga.json()["holdId"].as_str().unwrap().to_owned();
    // Over the limit of 4 (3 held): USER_LIMIT, with the limit and what is used.
    let greedy = fan
        .post(
            "/v1/events/web/book",
            &key("book-greedy"),
            &json!({"userId": "ann", "token": token, "sectionId": "ga", "quantity": 2}),
        )
        .await;
    assert_eq!(greedy.status, StatusCode::CONFLICT);
    assert_eq!(greedy.reason(), "USER_LIMIT");
    assert_eq!(greedy.json()["metadata"]["limit"], "4");
    assert_eq!(greedy.json()["metadata"]["used"], "3");

    // GET the hold (its holder only).
    let got = fan
        .get(&format!("/v1/holds/{hold_id}?userId=ann"), &[])
        .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.json()["holdId"], hold["holdId"]);
    let other = fan
        .get(&format!("/v1/holds/{hold_id}?userId=bob"), &[])
        .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    assert_eq!(other.reason(), "HOLD_NOT_FOUND");

    // Confirm: the order, its tickets, the seeds' ticketId; a retry answers the same order.
    let paid = fan
        .post(
            &format!("/v1/holds/{hold_id}/confirm"),
            &key("pay-1"),
            &json!({"userId": "ann", "paymentToken": "tok_visa"}),
        )
        .await;
    assert_eq!(paid.status, StatusCode::CREATED, "{paid:?}");
    let order = paid.json();
    let order_id = order["orderId"].as_str().unwrap().to_owned();
    assert_eq!(paid.header("location"), format!("/v1/orders/{order_id}"));
    assert_eq!(order["status"], "CONFIRMED");
    assert_eq!(order["amountCents"], 9000);
    assert_eq!(order["tickets"][0]["seatId"], "orch:A:1");
    assert_eq!(order["ticketId"], order["tickets"][0]["ticketId"]);
    assert!(!order["tickets"][0]["code"].as_str().unwrap().is_empty());
    let repaid = fan
        .post(
            &format!("/v1/holds/{hold_id}/confirm"),
            &key("pay-1"),
            &json!({"userId": "ann", "paymentToken": "tok_visa"}),
        )
        .await;
    assert_eq!(repaid.json()["orderId"], order["orderId"]);
    let read = fan
        .get(&format!("/v1/orders/{order_id}?userId=ann"), &[])
        .await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.json()["orderId"], order["orderId"]);

    // Release the GA hold: 204; again: HOLD_NOT_ACTIVE; the hold reads RELEASED.
    let released = fan
        .post(
            &format!("/v1/holds/{ga_id}/release"),
            &[],
            &json!({"userId": "ann"}),
        )
        .await;
    assert_eq!(released.status, StatusCode::NO_CONTENT, "{released:?}");
    assert!(released.body.is_empty());
    let twice = fan
        .post(
            &format!("/v1/holds/{ga_id}/release"),
            &[],
            &json!({"userId": "ann"}),
        )
        .await;
    assert_eq!(twice.status, StatusCode::CONFLICT);
    assert_eq!(twice.reason(), "HOLD_NOT_ACTIVE");
    let gone = fan.get(&format!("/v1/holds/{ga_id}?userId=ann"), &[]).await;
    assert_eq!(gone.json()["status"], "RELEASED");

    // The case study's POST /v1/orders for a new hold, with a declined card: the hold stays.
    let second = fan
        .post(
            "/v1/events/web/book",
            &key("book-3"),
            &json!({"userId": "ann", "token": token, "seatIds": ["orch:B:1", "orch:B:2"]}),
        )
        .await;
    assert_eq!(second.status, StatusCode::CREATED, "{second:?}");
    let second_id = second.json()["holdId"].as_str().unwrap().to_owned();
    let declined = fan
        .post(
            "/v1/orders",
            &[],
            &json!({"holdId": second_id, "userId": "ann", "paymentToken": "tok_decline",
                    "idempotencyKey": "pay-2"}),
        )
        .await;
    assert_eq!(declined.status, StatusCode::CONFLICT, "{declined:?}");
    assert_eq!(declined.reason(), "PAYMENT_DECLINED");
    let ok = fan
        .post(
            "/v1/orders",
            &[],
            &json!({"holdId": second_id, "userId": "ann", "paymentToken": "tok_visa",
                    "idempotencyKey": "pay-3"}),
        )
        .await;
    assert_eq!(ok.status, StatusCode::CREATED, "{ok:?}");
    assert_eq!(ok.json()["tickets"].as_array().unwrap().len(), 2);

    // The event and the list show the counts.
    let e = fan.get("/v1/events/web", &[]).await.json();
    let orch = &e["sections"][0];
    assert_eq!(
        (orch["sold"].as_u64(), orch["kind"].as_str()),
        (Some(3), Some("RESERVED"))
    );
    let page = fan.get("/v1/events?pageSize=10", &[]).await.json();
    assert_eq!(page["events"][0]["eventId"], "web");
    assert_eq!(page["nextPageToken"], "");
    server.shutdown().await;
}

/// Every kind of bad input answers a problem with the contract's reason and field, and changes
/// nothing: afterwards the event's counts are as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_answers_problems_with_the_contracts_reasons_and_changes_nothing() {
    let server = TestServer::start().await;
    let admin = server.http(Some(ADMIN));
    let fan = server.http(Some(CLIENT));
    assert_eq!(create(&admin, "bad", 4).await.status, StatusCode::CREATED);
    let token = admitted(&server, &fan, "bad", "ann").await;
    let before = fan.get("/v1/events/bad", &[]).await.json()["sections"].clone();

    // No key, an unknown key: 401 without a reason, and WWW-Authenticate.
    for who in [server.http(None), server.http(Some("nope"))] {
        let a = who.get("/v1/events/bad", &[]).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED);
        assert_eq!(a.reason(), "");
        assert_eq!(a.json()["type"], "about:blank");
        assert_eq!(a.json()["grpcCode"], "UNAUTHENTICATED");
        assert!(a.header("www-authenticate").starts_with("Bearer"));
    }
    // A client key cannot create events.
    let forbidden = create(&fan, "mine", 1).await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);

    let book = |body: Value, k: &'static str| {
        let fan = fan.clone();
        async move { fan.post("/v1/events/bad/book", &key(k), &body).await }
    };
    // (answer, status, reason, field)
    let cases: Vec<(Answer, StatusCode, &str, Option<&str>)> = vec![
        (
            fan.send(
                http::Method::POST,
                "/v1/events/bad/book",
                &key("k1"),
                b"{not json".to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("request"),
        ),
        (
            book(
                json!({"userId": "ann", "token": token, "seatId": "orch:A:1", "extra": 1}),
                "k2",
            )
            .await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("request"),
        ),
        (
            book(json!({"token": token, "seatId": "orch:A:1"}), "k3").await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("user_id"),
        ),
        (
            fan.post(
                "/v1/events/bad/book",
                &key("k4"),
                &json!({"userId": "ann", "token": token, "seatId": "orch:A:1",
                        "idempotencyKey": "other"}),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("idempotency_key"),
        ),
        (
            book(
                json!({"userId": "ann", "token": token, "seatId": "orch:A:1", "quantity": 1}),
                "k5",
            )
            .await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("selection"),
        ),
        (
            book(
                json!({"userId": "ann", "token": "forged", "seatId": "orch:A:1"}),
                "k6",
            )
            .await,
            StatusCode::UNAUTHORIZED,
            "TOKEN_INVALID",
            None,
        ),
        (
            book(
                json!({"userId": "ann", "token": token, "seatId": "orch:Z:9"}),
                "k7",
            )
            .await,
            StatusCode::NOT_FOUND,
            "SEAT_NOT_FOUND",
            None,
        ),
        (
            book(
                json!({"userId": "ann", "token": token, "sectionId": "ga", "quantity": 5}),
                "k8",
            )
            .await,
            StatusCode::CONFLICT,
            "USER_LIMIT",
            None,
        ),
        (
            fan.post(
                "/v1/events/nosuch/book",
                &key("k9"),
                &json!({"userId": "ann", "token": token, "seatId": "orch:A:1"}),
            )
            .await,
            StatusCode::NOT_FOUND,
            "EVENT_NOT_FOUND",
            None,
        ),
        (
            fan.get("/v1/events/nosuch/seats", &[]).await,
            StatusCode::NOT_FOUND,
            "EVENT_NOT_FOUND",
            None,
        ),
        (
            fan.get("/v1/events/bad/seats?section=nope", &[]).await,
            StatusCode::NOT_FOUND,
            "SECTION_NOT_FOUND",
            None,
        ),
        (
            fan.get("/v1/events/bad/seats?firstRow=x", &[]).await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("request"),
        ),
        (
            fan.get("/v1/events/bad/queue-token?sessionId=s", &[]).await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("user_id"),
        ),
        (
            fan.get("/v1/queue/bad/status?token=garbage", &[]).await,
            StatusCode::UNAUTHORIZED,
            "TOKEN_INVALID",
            None,
        ),
        (
            fan.get("/v1/holds/h-nope?userId=ann", &[]).await,
            StatusCode::NOT_FOUND,
            "HOLD_NOT_FOUND",
            None,
        ),
        (
            fan.get("/v1/orders/o-nope?userId=ann", &[]).await,
            StatusCode::NOT_FOUND,
            "ORDER_NOT_FOUND",
            None,
        ),
        (
            fan.post("/v1/holds/h-nope/release", &[], &json!({})).await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("user_id"),
        ),
        (
            fan.post(
                "/v1/orders",
                &[],
                &json!({"holdId": "h-nope", "userId": "ann", "paymentToken": "tok_visa"}),
            )
            .await,
            StatusCode::NOT_FOUND,
            "HOLD_NOT_FOUND",
            None,
        ),
        (
            admin
                .post(
                    "/v1/events",
                    &[],
                    &json!({"eventId": "e", "name": "", "sections": []}),
                )
                .await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            None,
        ),
        (
            // Over 256 KiB.
            fan.send(
                http::Method::POST,
                "/v1/holds",
                &[],
                format!("{{\"userId\": \"{}\"}}", "x".repeat(300 * 1024)).into_bytes(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "INVALID_REQUEST",
            Some("request"),
        ),
    ];
    for (i, (answer, status, reason, field)) in cases.iter().enumerate() {
        assert_eq!(answer.status, *status, "case {i}: {answer:?}");
        assert_eq!(answer.reason(), *reason, "case {i}");
        let p = answer.json();
        assert_eq!(p["status"], status.as_u16(), "case {i}");
        assert!(!p["detail"].as_str().unwrap().is_empty(), "case {i}");
        if let Some(f) = field {
            assert_eq!(p["field"], *f, "case {i}: {p}");
        }
    }
    // A queue token of this event sent to another event's status path.
    let t = fan
        .get("/v1/events/bad/queue-token?userId=bob&sessionId=s", &[])
        .await
        .json();
    let wrong = fan
        .get(
            &format!(
                "/v1/queue/other/status?token={}",
                t["token"].as_str().unwrap()
            ),
            &[],
        )
        .await;
    assert_eq!(wrong.reason(), "TOKEN_INVALID");
    // An unknown path: a 404 problem.
    let lost = fan.get("/v1/nowhere", &[]).await;
    assert_eq!(lost.status, StatusCode::NOT_FOUND);
    assert_eq!(lost.json()["status"], 404);

    let after = fan.get("/v1/events/bad", &[]).await.json()["sections"].clone();
    assert_eq!(before, after, "nothing was held by the refused calls");
    server.shutdown().await;
}

/// The seat map: labelled "as of", `Cache-Control: public, max-age=5`, an `ETag` of the
/// sections' versions that holds while nothing changes (not a clock: time passing keeps it)
/// and moves with a hold, `Last-Modified` from the last change; `If-None-Match` and
/// `If-Modified-Since` answer 304.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seat_map_is_cacheable_and_its_etag_moves_with_the_seats_only() {
    let server = TestServer::start().await;
    let admin = server.http(Some(ADMIN));
    let fan = server.http(Some(CLIENT));
    assert_eq!(create(&admin, "map", 4).await.status, StatusCode::CREATED);
    let first = fan.get("/v1/events/map/seats", &[]).await;
    assert_eq!(first.status, StatusCode::OK, "{first:?}");
    assert_eq!(first.header("cache-control"), "public, max-age=5");
    let etag = first.header("etag");
    assert!(etag.starts_with("W/\""), "{etag}");
    let modified = first.header("last-modified");
    assert!(httpdate::parse_http_date(&modified).is_ok(), "{modified}");
    let map = first.json();
    assert!(map["asOf"].as_str().unwrap().ends_with('Z'));
    let orch = &map["sections"][0];
    assert_eq!(orch["seats"].as_array().unwrap().len(), 10);
    assert_eq!(orch["seats"][0]["status"], "AVAILABLE");
    assert!(orch["version"].is_u64());

    // Time passes, nothing changes: the same validator, and 304 for it.
    server.clock().advance_ms(10_000);
    let later = fan.get("/v1/events/map/seats", &[]).await;
    assert_eq!(later.header("etag"), etag);
    assert_ne!(
        later.json()["asOfUnixMs"],
        map["asOfUnixMs"],
        "as of moves, the tag not"
    );
    let cached = fan
        .get("/v1/events/map/seats", &[("if-none-match", &etag)])
        .await;
    assert_eq!(cached.status, StatusCode::NOT_MODIFIED);
    assert!(cached.body.is_empty());
    assert_eq!(cached.header("etag"), etag);
    assert_eq!(cached.header("cache-control"), "public, max-age=5");
    let since = fan
        .get("/v1/events/map/seats", &[("if-modified-since", &modified)])
        .await;
    assert_eq!(since.status, StatusCode::NOT_MODIFIED);
    // One section's page has a validator of its own.
    let page = fan.get("/v1/events/map/seats?section=orch", &[]).await;
    assert_ne!(page.header("etag"), etag);
    assert_eq!(page.json()["sections"].as_array().unwrap().len(), 1);

    // A hold changes a section: a new validator, and the stale one gets the map.
    server.clock().advance_ms(2_000);
    let token = admitted(&server, &fan, "map", "ann").await;
    let held = fan
        .post(
            "/v1/events/map/book",
            &key("map-1"),
            &json!({"userId": "ann", "token": token, "seatId": "orch:A:2"}),
        )
        .await;
    assert_eq!(held.status, StatusCode::CREATED);
    let fresh = fan
        .get("/v1/events/map/seats", &[("if-none-match", &etag)])
        .await;
    assert_eq!(fresh.status, StatusCode::OK);
    let new_tag = fresh.header("etag");
    assert_ne!(new_tag, etag);
    let seats = &fresh.json()["sections"][0]["seats"];
    assert_eq!(seats[1]["seatId"], "orch:A:2");
    assert_eq!(seats[1]["status"], "HELD");
    let old_since = fan
        .get(
            "/v1/events/map/seats",
            &[("if-modified-since", "Thu, 01 Jan 1970 00:00:01 GMT")],
        )
        .await;
    assert_eq!(old_since.status, StatusCode::OK);
    let same = fan
        .get("/v1/events/map/seats", &[("if-none-match", &new_tag)])
        .await;
    assert_eq!(same.status, StatusCode::NOT_MODIFIED);
    server.shutdown().await;
}

/// The OpenAPI document is served, generated from the handlers: every path the API serves is
/// in it, with the problem schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_names_every_path() {
    let server = TestServer::start().await;
    let doc = server.http(None).get("/v1/openapi.json", &[]).await;
    assert_eq!(doc.status, StatusCode::OK);
    let doc = doc.json();
    assert!(doc["openapi"].as_str().unwrap().starts_with('3'));
    for (path, method) in [
        ("/v1/events/{id}/queue-token", "get"),
        ("/v1/events/{id}/join-challenge", "get"),
        ("/v1/queue/{eventId}/status", "get"),
        ("/v1/events/{id}/seats", "get"),
        ("/v1/events/{id}/book", "post"),
        ("/v1/holds", "post"),
        ("/v1/orders", "post"),
        ("/v1/holds/{holdId}/confirm", "post"),
        ("/v1/holds/{holdId}/release", "post"),
        ("/v1/holds/{holdId}", "get"),
        ("/v1/orders/{orderId}", "get"),
        ("/v1/events", "post"),
        ("/v1/events", "get"),
        ("/v1/events/{id}", "get"),
        ("/v1/events/{id}/sale", "post"),
        ("/v1/events/{id}/sale/{action}", "post"),
        ("/v1/users/{userId}/orders", "get"),
        ("/v1/events/{id}/holds/batch", "post"),
        ("/v1/events/{id}/waitlist", "post"),
        ("/v1/waitlist/{entryId}", "get"),
        ("/v1/orders/{orderId}/cancel", "post"),
        ("/v1/orders/{orderId}/transfer", "post"),
        ("/v1/events/{id}/revocations", "get"),
    ] {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is in the document"
        );
    }
    assert!(doc["components"]["schemas"]["Problem"].is_object());
    assert!(doc["components"]["schemas"]["UpdateSaleBody"].is_object());
    assert!(doc["components"]["schemas"]["OrderPage"].is_object());
    assert!(doc["components"]["schemas"]["PriceTier"].is_object());
    assert!(doc["components"]["schemas"]["PriceTierStatus"].is_object());
    assert!(doc["components"]["schemas"]["Hold"]["properties"]["placePricesCents"].is_object());
    assert!(doc["components"]["securitySchemes"]["bearer"].is_object());
    server.shutdown().await;
}

/// An HTTP caller that gives up while its confirm is being charged (the connection closed
/// mid-call) loses nothing and is never charged twice: the work goes on without it, and the
/// retry with the same key gets the order the first call made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leaves_mid_confirm_gets_its_order_on_retry_charged_once() {
    use boxoffice_tests::payments::Gated;
    let payments = tempfile::tempdir().unwrap();
    let provider = Gated::open(payments.path());
    let server = TestServer::builder()
        .payments(provider.clone())
        .start()
        .await;
    let admin = server.http(Some(ADMIN));
    let fan = server.http(Some(CLIENT));
    assert_eq!(create(&admin, "gone", 4).await.status, StatusCode::CREATED);
    let token = admitted(&server, &fan, "gone", "ann").await;
    let held = fan
        .post(
            "/v1/events/gone/book",
            &key("gone-1"),
            &json!({"userId": "ann", "token": token, "sectionId": "ga"}),
        )
        .await;
    assert_eq!(held.status, StatusCode::CREATED, "{held:?}");
    let hold_id = held.json()["holdId"].as_str().unwrap().to_owned();
    let confirm = {
        let (fan, path) = (fan.clone(), format!("/v1/holds/{hold_id}/confirm"));
        move || {
            let (fan, path) = (fan.clone(), path.clone());
            async move {
                fan.post(
                    &path,
                    &key("pay-gone"),
                    &json!({"userId": "ann", "paymentToken": "tok_visa"}),
                )
                .await
            }
        }
    };
    // The first call reaches the provider, which holds the charge; the caller leaves.
    let first = tokio::spawn(confirm());
    provider.arrived.acquire().await.unwrap().forget();
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    provider.gate.add_permits(1);
    // The retry (with the same key) gets the order once the first call's work is done.
    let order = boxoffice_tests::wait::periodic_check(
        "the retry gets the order",
        boxoffice_tests::wait::PATIENCE,
        async || {
            let a = confirm().await;
            if a.status == StatusCode::CREATED {
                Ok(a.json())
            } else {
                Err(format!("{a:?}"))
            }
        },
    )
    .await;
    assert_eq!(order["holdId"], hold_id.as_str());
    assert_eq!(order["tickets"].as_array().unwrap().len(), 1);
    let again = confirm().await;
    assert_eq!(
        again.json()["orderId"],
        order["orderId"],
        "the same order again"
    );
    // One charge only: no second one ever reached the provider's gate.
    assert_eq!(provider.arrived.available_permits(), 0);
    let e = fan.get("/v1/events/gone", &[]).await.json();
    assert_eq!(e["sections"][1]["sold"], 1);
    server.shutdown().await;
}

/// The calls that were gRPC only (issue 29, point 7): `HoldBatch` at
/// `POST /v1/events/{id}/holds/batch` (each item a hold of its own, or the problem its `Hold`
/// would have answered), and the waitlist at `POST /v1/events/{id}/waitlist` and
/// `GET /v1/waitlist/{entryId}`: a fan waits, a release offers the places to them as a hold,
/// they pay, and their entry is fulfilled; only the fan reads their entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_batches_and_the_waitlist_over_http() {
    let server = TestServer::start().await;
    let admin = server.http(Some(ADMIN));
    let fan = server.http(Some(CLIENT));
    assert_eq!(create(&admin, "wb", 3).await.status, StatusCode::CREATED);
    let ann = admitted(&server, &fan, "wb", "ann").await;
    let bob = admitted(&server, &fan, "wb", "bob").await;
    let cat = admitted(&server, &fan, "wb", "cat").await;
    // One batch: ann takes 2 floor places, bob 1 (the floor's last), cat's item is refused
    // (sold out), and an item without its token is refused as a `Hold` would be.
    let batch = json!({"items": [
        {"userId": "ann", "admissionToken": ann, "sectionId": "ga", "quantity": 2,
         "idempotencyKey": "b-ann"},
        {"userId": "bob", "admissionToken": bob, "sectionId": "ga", "quantity": 1},
        {"userId": "cat", "admissionToken": cat, "sectionId": "ga", "quantity": 1},
        {"userId": "cat", "sectionId": "ga", "quantity": 1},
    ]});
    let answer = fan.post("/v1/events/wb/holds/batch", &[], &batch).await;
    assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
    let results = answer.json()["results"].as_array().unwrap().clone();
    assert_eq!(results.len(), 4);
    assert_eq!(results[0]["hold"]["quantity"], 2);
    assert_eq!(results[0]["hold"]["status"], "HELD");
    assert_eq!(results[1]["hold"]["userId"], "bob");
    assert_eq!(results[2]["error"]["reason"], "SOLD_OUT");
    assert_eq!(results[2]["error"]["status"], 409);
    assert!(results[2].get("hold").is_none());
    assert_eq!(results[3]["error"]["reason"], "INVALID_REQUEST");
    assert_eq!(results[3]["error"]["field"], "items[3].admission_token");
    let ann_hold = results[0]["hold"]["holdId"].as_str().unwrap().to_owned();
    // The keyed item replayed by a second batch: the same hold.
    let again = fan
        .post(
            "/v1/events/wb/holds/batch",
            &[],
            &json!({"items": [{"userId": "ann", "admissionToken": ann, "sectionId": "ga",
                "quantity": 2, "idempotencyKey": "b-ann"}]}),
        )
        .await;
    assert_eq!(
        again.json()["results"][0]["hold"]["holdId"],
        ann_hold.as_str()
    );
    // Whole-call refusals.
    let empty = fan
        .post("/v1/events/wb/holds/batch", &[], &json!({"items": []}))
        .await;
    assert_eq!(
        (empty.status, empty.reason()),
        (StatusCode::BAD_REQUEST, "INVALID_REQUEST".into())
    );
    let unknown = fan
        .post("/v1/events/wb/holds/batch", &[], &json!({"itemz": []}))
        .await;
    assert_eq!(unknown.status, StatusCode::BAD_REQUEST);
    // Seats and a quantity in one item: the HTTP layer cannot make the item (gRPC's is a
    // oneof), so the whole call is refused, naming it.
    let both = fan
        .post(
            "/v1/events/wb/holds/batch",
            &[],
            &json!({"items": [{"userId": "cat", "admissionToken": cat, "seatIds": ["orch:A:1"],
                "quantity": 1}]}),
        )
        .await;
    assert_eq!(both.status, StatusCode::BAD_REQUEST);
    assert_eq!(both.json()["field"], "items[0].selection");

    // cat waits for a floor place; a second join answers the same entry.
    let join = json!({"userId": "cat", "sectionId": "ga", "quantity": 1, "admissionToken": cat});
    let joined = fan.post("/v1/events/wb/waitlist", &[], &join).await;
    assert_eq!(joined.status, StatusCode::CREATED, "{joined:?}");
    let entry = joined.json();
    assert_eq!(
        (entry["state"].as_str(), entry["position"].as_u64()),
        (Some("WAITING"), Some(1))
    );
    let id = entry["entryId"].as_str().unwrap().to_owned();
    assert_eq!(joined.header("location"), format!("/v1/waitlist/{id}"));
    let rejoined = fan.post("/v1/events/wb/waitlist", &[], &join).await;
    assert_eq!(rejoined.json()["entryId"], id.as_str());
    // Only cat reads it; a join while the orchestra is free is refused.
    let stranger = fan.get(&format!("/v1/waitlist/{id}?userId=ann"), &[]).await;
    assert_eq!(
        (stranger.status, stranger.reason()),
        (StatusCode::NOT_FOUND, "ENTRY_NOT_FOUND".into())
    );
    let free = fan
        .post(
            "/v1/events/wb/waitlist",
            &[],
            &json!({"userId": "ann", "sectionId": "orch", "quantity": 1, "admissionToken": ann}),
        )
        .await;
    assert_eq!(
        (free.status, free.reason()),
        (StatusCode::CONFLICT, "PLACES_AVAILABLE".into())
    );
    // bob releases: the place is offered to cat as a hold in her name; she pays.
    let released = fan
        .post(
            &format!(
                "/v1/holds/{}/release",
                results[1]["hold"]["holdId"].as_str().unwrap()
            ),
            &[],
            &json!({"userId": "bob"}),
        )
        .await;
    assert_eq!(released.status, StatusCode::NO_CONTENT);
    // Cat's entry, once it is in `state`.
    let entry_in = async |state: &str| {
        boxoffice_tests::wait::periodic_check(
            &format!("cat's entry is {state}"),
            boxoffice_tests::wait::PATIENCE,
            async || {
                let e = fan
                    .get(&format!("/v1/waitlist/{id}?userId=cat"), &[])
                    .await
                    .json();
                if e["state"] == state { Ok(e) } else { Err(e) }
            },
        )
        .await
    };
    let offered = entry_in("OFFERED").await;
    let offer = offered["offeredHoldId"].as_str().unwrap().to_owned();
    assert_eq!(offered["position"], 0);
    let paid = fan
        .post(
            &format!("/v1/holds/{offer}/confirm"),
            &[],
            &json!({"userId": "cat", "paymentToken": "tok_visa"}),
        )
        .await;
    assert_eq!(paid.status, StatusCode::CREATED, "{paid:?}");
    entry_in("FULFILLED").await;
    server.shutdown().await;
}
