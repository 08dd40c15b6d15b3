//! Ticket keys over gRPC and restarts: a ticket sold before a key rotation (or before key ids)
//! still verifies after it and after restarts, new tickets carry the new key id, a lost signing
//! key is never replaced silently, and a damaged key file stops the start, named.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use boxoffice_gateway::server::rotate_ticket_key;
use boxoffice_gateway::tickets::{KEY_FILE, KeyRing, PUBLIC_KEYS_DIR, TicketError};
use boxoffice_proto::v1 as pb;
use boxoffice_tests::Clients;
use boxoffice_tests::server::{Home, TestServer};
use ed25519_dalek::Signer;

use crate::grpc::{admitted, best, event, ga};

/// Sells one general-admission place of `event_id` to `user`; the order.
async fn sell(server: &TestServer, event_id: &str, user: &str) -> pb::Order {
    let mut a = server.admin();
    let tok = admitted(&mut a, server.clock(), event_id, user).await;
    let hold = a
        .booking
        .hold(best(event_id, user, &tok, "g", 1, ""))
        .await
        .unwrap()
        .into_inner();
    a.booking
        .confirm(pb::ConfirmRequest {
            hold_id: hold.hold_id,
            user_id: user.into(),
            payment_token: "tok_a".into(),
            idempotency_key: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// A new server with event `tk` (10 general-admission places) and one place sold to `ann`.
async fn a_ticket_sold() -> (TestServer, pb::Order) {
    let server = TestServer::start().await;
    server
        .admin()
        .events
        .create_event(event("tk", vec![ga("g", 10, 100)]))
        .await
        .unwrap();
    let ann = sell(&server, "tk", "ann").await;
    (server, ann)
}

async fn code_of(c: &mut Clients, order: &pb::Order) -> String {
    c.booking
        .get_order(pb::GetOrderRequest {
            order_id: order.order_id.clone(),
            user_id: order.user_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .tickets[0]
        .code
        .clone()
}

/// The key a ticket code names (the second line of its payload).
fn kid_of(code: &str) -> String {
    let payload = URL_SAFE_NO_PAD
        .decode(code.split_once('.').unwrap().0)
        .unwrap();
    let text = String::from_utf8(payload).unwrap();
    assert!(text.starts_with("bt2\n"), "{text:?}");
    text.split('\n').nth(1).unwrap().to_owned()
}

/// The code the server made for `t` before key ids (`bt1`), with the data dir's signing key.
fn bt1_code(home: &Home, order_id: &str, t: &pb::Ticket) -> String {
    let seed: [u8; 32] = hex::decode(
        std::fs::read_to_string(home.path().join(KEY_FILE))
            .unwrap()
            .trim(),
    )
    .unwrap()
    .try_into()
    .unwrap();
    let payload = format!(
        "bt1\ntk\n{}\n{}\n{order_id}\n{}",
        t.section_id, t.seat_id, t.ticket_id
    );
    let sig = ed25519_dalek::SigningKey::from_bytes(&seed).sign(payload.as_bytes());
    format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(payload.as_bytes()),
        URL_SAFE_NO_PAD.encode(sig.to_bytes())
    )
}

fn ring(home: &Home) -> KeyRing {
    KeyRing::load(home.path()).unwrap()
}

async fn start_on(home: &Home) -> TestServer {
    TestServer::builder().home(home.clone()).start().await
}

/// Starts on `home` expecting a refusal; what it said.
async fn refused_start(home: &Home, new_ticket_key: bool) -> String {
    let mut b = TestServer::builder().home(home.clone()).no_wait();
    if new_ticket_key {
        b = b.new_ticket_key();
    }
    let mut refused = b.start().await;
    let why = format!("{:#}", refused.recovery().await.unwrap_err());
    let _ = refused.shutdown_result().await;
    why
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ticket_sold_before_a_rotation_verifies_after_it_and_after_restarts() {
    let (server, ann) = a_ticket_sold().await;
    let home = server.home().clone();
    let first = ring(&home).signer().unwrap().kid();
    let ann_code = ann.tickets[0].code.clone();
    assert_eq!(kid_of(&ann_code), first.to_string());
    // The same ticket as a server from before key ids showed it.
    let ann_bt1 = bt1_code(&home, &ann.order_id, &ann.tickets[0]);
    // No rotation under a running server: it holds the data dir.
    let busy = format!("{:#}", rotate_ticket_key(home.path()).await.unwrap_err());
    assert!(busy.contains("is the server running"), "{busy}");
    server.shutdown().await;
    // A data dir from before key rings: the signing key only.
    std::fs::remove_dir_all(home.path().join(PUBLIC_KEYS_DIR)).unwrap();

    let rotated = rotate_ticket_key(home.path()).await.unwrap();
    assert_eq!(rotated.retired, Some(first));
    assert_ne!(rotated.signing, first);
    assert_eq!(rotated.keys, 2);
    let second = rotated.signing;

    for restart in 0..2 {
        let server = start_on(&home).await;
        let mut c = server.client();
        // The order shows its ticket under the key that signs now; the code sold before
        // keeps verifying, and so does the one from before key ids.
        let reissued = code_of(&mut c, &ann).await;
        assert_eq!(kid_of(&reissued), second.to_string(), "restart {restart}");
        let keys = ring(&home);
        assert_eq!(keys.signer().unwrap().kid(), second);
        for (code, kid, kid_in_code) in [
            (&ann_code, first, true),
            (&ann_bt1, first, false),
            (&reissued, second, true),
        ] {
            let v = keys.verify(code).unwrap();
            assert_eq!(
                (v.kid, v.kid_in_code),
                (kid, kid_in_code),
                "restart {restart}"
            );
            assert_eq!(v.claims.order_id, ann.order_id);
            assert_eq!(v.claims.ticket_id, ann.tickets[0].ticket_id);
        }
        // A new ticket carries the new key.
        let bob = sell(&server, "tk", &format!("bob{restart}")).await;
        assert_eq!(kid_of(&bob.tickets[0].code), second.to_string());
        assert_eq!(keys.verify(&bob.tickets[0].code).unwrap().kid, second);
        // Tampered: refused.
        let mut forged = bob.tickets[0].code.clone().into_bytes();
        let last = forged.len() - 2;
        forged[last] = if forged[last] == b'A' { b'B' } else { b'A' };
        let forged = String::from_utf8(forged).unwrap();
        assert_eq!(keys.verify(&forged), Err(TicketError::BadSignature));
        server.shutdown().await;
    }

    // A code naming a key that is not in the ring: refused, naming the key.
    let only_new = [ring(&home).signer().unwrap().public_key().clone()];
    let err = boxoffice_gateway::tickets::verify(&ann_code, &only_new).unwrap_err();
    assert_eq!(err, TicketError::UnknownKey(first));
    assert!(err.to_string().contains(&first.to_string()), "{err}");
    assert_eq!(
        boxoffice_gateway::tickets::verify(&ann_bt1, &only_new),
        Err(TicketError::BadSignature)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_ticket_key_is_never_replaced_silently_and_kept_public_keys_still_verify() {
    let (server, ann) = a_ticket_sold().await;
    let home = server.home().clone();
    server.shutdown().await;
    let key = home.path().join(KEY_FILE);
    let old_key = std::fs::read_to_string(&key).unwrap();
    let old_kid = ring(&home).signer().unwrap().kid();
    std::fs::remove_file(&key).unwrap();
    // Refused, naming the file and the way out; no new key is made behind the operator's back.
    let why = refused_start(&home, false).await;
    assert!(
        why.contains("ticket-signing.key")
            && why.contains("--new-ticket-key")
            && why.contains("(1 kept) keep verifying"),
        "{why}"
    );
    assert!(!key.exists(), "no key was made");
    // Told to, it starts with a new key; the ticket sold before still verifies with the public
    // key kept in the ring.
    let renewed = TestServer::builder()
        .home(home.clone())
        .new_ticket_key()
        .start()
        .await;
    let new_key = std::fs::read_to_string(&key).unwrap();
    assert_ne!(new_key, old_key);
    let keys = ring(&home);
    assert_ne!(keys.signer().unwrap().kid(), old_kid);
    assert_eq!(keys.keys().len(), 2);
    assert_eq!(keys.verify(&ann.tickets[0].code).unwrap().kid, old_kid);
    renewed.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_key_file_stops_the_start_named_and_is_not_replaced() {
    let server = TestServer::start().await;
    let home = server.home().clone();
    let kid = ring(&home).signer().unwrap().kid();
    server.shutdown().await;
    let public = home.path().join(PUBLIC_KEYS_DIR).join(format!("{kid}.pub"));
    let signing = home.path().join(KEY_FILE);
    for (file, new_ticket_key) in [(&public, false), (&signing, false), (&signing, true)] {
        let good = std::fs::read_to_string(file).unwrap();
        std::fs::write(file, "0123 not a key").unwrap();
        let why = refused_start(&home, new_ticket_key).await;
        assert!(
            why.contains(&file.display().to_string()) && why.contains("damaged"),
            "{why}"
        );
        assert_eq!(std::fs::read_to_string(file).unwrap(), "0123 not a key");
        std::fs::write(file, good).unwrap();
    }
    // A rotation refuses the damaged ring too, and a dir with no keys at all.
    std::fs::write(&public, "zz").unwrap();
    let why = format!("{:#}", rotate_ticket_key(home.path()).await.unwrap_err());
    assert!(why.contains(&public.display().to_string()), "{why}");
    let empty = tempfile::tempdir().unwrap();
    let why = format!("{:#}", rotate_ticket_key(empty.path()).await.unwrap_err());
    assert!(why.contains("has no ticket keys"), "{why}");
    assert_eq!(
        std::fs::read_dir(empty.path()).unwrap().count(),
        0,
        "no log made"
    );
}
