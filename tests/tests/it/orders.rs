//! A fan's orders (issue 29, point 1): `ListOrders` and `GET /v1/users/{userId}/orders` show a
//! user their own orders, newest first, a page at a time with a signed page token; bad input is
//! refused with its documented reason; a restart shows the same listing.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::cases::{case, check_error_cases};
use boxoffice_tests::server::TestServer;
use tonic::Code;

use crate::grpc::{admitted, best, event, ga, reserved};

/// Holds `q` places of `section` for `user` and pays for them: the order.
async fn buy(
    c: &mut Clients,
    event: &str,
    user: &str,
    token: &str,
    section: &str,
    q: u32,
) -> pb::Order {
    let hold = c
        .booking
        .hold(best(event, user, token, section, q, ""))
        .await
        .unwrap()
        .into_inner();
    c.booking
        .confirm(pb::ConfirmRequest {
            hold_id: hold.hold_id,
            user_id: user.into(),
            payment_token: "tok_ok".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

fn ask(user: &str, event: &str, size: u32, token: &str) -> pb::ListOrdersRequest {
    pb::ListOrdersRequest {
        user_id: user.into(),
        event_id: event.into(),
        page_size: size,
        page_token: token.into(),
    }
}

/// Every page of `user`'s orders (of `event`, or all), `size` at a time: the orders, and how
/// many pages it took.
pub(crate) async fn all_orders(
    c: &mut Clients,
    user: &str,
    event: &str,
    size: u32,
) -> (Vec<pb::Order>, usize) {
    let (mut orders, mut pages, mut token) = (Vec::new(), 0, String::new());
    loop {
        let page = c
            .booking
            .list_orders(ask(user, event, size, &token))
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        let most = match size {
            0 => 20,
            n => n.min(100) as usize,
        };
        assert!(
            page.orders.len() <= most,
            "a page of {} orders for a page size of {size}",
            page.orders.len()
        );
        orders.extend(page.orders);
        if page.next_page_token.is_empty() {
            return (orders, pages);
        }
        token = page.next_page_token;
        assert!(pages < 100, "pages without end");
    }
}

fn ids(orders: &[pb::Order]) -> Vec<String> {
    orders.iter().map(|o| o.order_id.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_lists_their_own_orders_newest_first_a_page_at_a_time() {
    let server = TestServer::start().await;
    let clock = server.clock().clone();
    let mut a = server.admin();
    let mut c = server.client();
    a.events
        .create_event(event("e1", vec![ga("g", 20, 100)]))
        .await
        .unwrap();
    a.events
        .create_event(event(
            "e2",
            vec![ga("g", 20, 250), reserved("r", &[("A", 6)], 400)],
        ))
        .await
        .unwrap();
    let ann1 = admitted(&mut c, &clock, "e1", "ann").await;
    let ann2 = admitted(&mut c, &clock, "e2", "ann").await;
    let bob1 = admitted(&mut c, &clock, "e1", "bob").await;
    // ann's orders, each a millisecond later than the one before; two made in the same
    // millisecond (ties are ordered by id); bob's in between.
    let mut anns = Vec::new();
    for (ev, tok, section, q) in [
        ("e1", &ann1, "g", 1),
        ("e2", &ann2, "g", 2),
        ("e1", &ann1, "g", 1),
        ("e2", &ann2, "r", 2),
    ] {
        clock.advance_ms(1);
        anns.push(buy(&mut c, ev, "ann", tok, section, q).await);
        if anns.len() == 2 {
            buy(&mut c, "e1", "bob", &bob1, "g", 3).await;
        }
    }
    anns.push(buy(&mut c, "e1", "ann", &ann1, "g", 1).await);
    let mut newest_first = anns.clone();
    newest_first.sort_by(|a, b| {
        (b.created_at_unix_ms, &b.order_id).cmp(&(a.created_at_unix_ms, &a.order_id))
    });

    // Every page size gives the same listing, newest first, each order as GetOrder shows it
    // (its codes too).
    for size in [1, 2, 3, 5, 0, 1_000] {
        let (orders, pages) = all_orders(&mut c, "ann", "", size).await;
        assert_eq!(orders, newest_first, "page size {size}");
        let expected_pages = match size {
            0 | 1_000 | 5 => 1,
            n => 5_usize.div_ceil(n as usize),
        };
        assert_eq!(pages, expected_pages, "page size {size}");
    }
    for o in &newest_first {
        let got = c
            .booking
            .get_order(pb::GetOrderRequest {
                order_id: o.order_id.clone(),
                user_id: "ann".into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(&got, o);
        assert!(o.tickets.iter().all(|t| !t.code.is_empty()));
    }
    // One event's.
    let (of_e2, _) = all_orders(&mut c, "ann", "e2", 1).await;
    let e2: Vec<pb::Order> = newest_first
        .iter()
        .filter(|o| o.event_id == "e2")
        .cloned()
        .collect();
    assert_eq!(of_e2, e2);
    assert_eq!(of_e2.len(), 2);
    // Only one's own: bob sees his one order, cat none (and no token).
    let (bobs, _) = all_orders(&mut c, "bob", "", 2).await;
    assert_eq!(bobs.len(), 1);
    assert!(bobs.iter().all(|o| o.user_id == "bob"));
    let cats = c
        .booking
        .list_orders(ask("cat", "", 0, ""))
        .await
        .unwrap()
        .into_inner();
    assert!(cats.orders.is_empty() && cats.next_page_token.is_empty());

    // Bad input: refused with its reason, nothing listed.
    let token = c
        .booking
        .list_orders(ask("ann", "", 2, ""))
        .await
        .unwrap()
        .into_inner()
        .next_page_token;
    assert!(!token.is_empty());
    let mut altered = token.clone().into_bytes();
    let at = altered.len() / 3;
    altered[at] = if altered[at] == b'A' { b'B' } else { b'A' };
    let altered = String::from_utf8(altered).unwrap();
    let table = vec![
        case(
            "no user",
            ask("", "", 2, ""),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("user_id"),
        case(
            "an unknown event",
            ask("ann", "nope", 2, ""),
            Code::NotFound,
            "EVENT_NOT_FOUND",
        ),
        case(
            "ann's token shown by bob",
            ask("bob", "", 2, &token),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("page_token"),
        case(
            "the token of every event's listing for one event's",
            ask("ann", "e1", 2, &token),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("page_token"),
        case(
            "an altered token",
            ask("ann", "", 2, &altered),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("page_token"),
        case(
            "not a token",
            ask("ann", "", 2, "e1.g.o01"),
            Code::InvalidArgument,
            "INVALID_REQUEST",
        )
        .field("page_token"),
    ];
    let mut look = server.client();
    check_error_cases(
        "ListOrders",
        table,
        async |r| c.booking.list_orders(r).await,
        async || all_orders(&mut look, "ann", "", 10).await.0,
    )
    .await;

    // Over HTTP: the same pages, and the same refusals.
    let http = server.http(Some(boxoffice_tests::server::CLIENT));
    let (mut over_http, mut next) = (Vec::new(), String::new());
    loop {
        let answer = http
            .get(
                &format!("/v1/users/ann/orders?pageSize=2&pageToken={next}"),
                &[],
            )
            .await;
        assert_eq!(answer.status, 200, "{:?}", answer.body);
        let page = answer.json();
        for o in page["orders"].as_array().unwrap() {
            over_http.push(o["orderId"].as_str().unwrap().to_owned());
            assert!(!o["tickets"][0]["code"].as_str().unwrap().is_empty());
        }
        next = page["nextPageToken"].as_str().unwrap().to_owned();
        if next.is_empty() {
            break;
        }
    }
    assert_eq!(over_http, ids(&newest_first));
    let one = http.get("/v1/users/ann/orders?eventId=e2", &[]).await;
    assert_eq!(one.json()["orders"].as_array().unwrap().len(), 2);
    let stolen = http
        .get(&format!("/v1/users/bob/orders?pageToken={token}"), &[])
        .await;
    assert_eq!(stolen.status, 400);
    assert_eq!(stolen.reason(), "INVALID_REQUEST");
    let unknown = http.get("/v1/users/ann/orders?eventId=nope", &[]).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.reason(), "EVENT_NOT_FOUND");
    let no_key = server.http(None).get("/v1/users/ann/orders", &[]).await;
    assert_eq!(no_key.status, 401);

    // A restart shows the same listing, and a token given before it still pages on.
    let home = server.home().clone();
    server.shutdown().await;
    let server = TestServer::builder().home(home).start().await;
    let mut c = server.client();
    let (after, _) = all_orders(&mut c, "ann", "", 2).await;
    assert_eq!(after, newest_first);
    let rest = c
        .booking
        .list_orders(ask("ann", "", 10, &token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&rest.orders), ids(&newest_first[2..]));
}
