//! The `boxoffice serve` binary: starts with no setup (generated keys, a data dir under the
//! current directory), serves, and drains on SIGTERM: exit code 0, log flushed.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn read_until(rx: &mpsc::Receiver<String>, needle: &str, seen: &mut Vec<String>) {
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no `{needle}` in {seen:#?}"));
        seen.push(line.clone());
        if line.contains(needle) {
            return;
        }
    }
}

/// `boxoffice serve` on loopback ports the system picks, in `cwd`.
fn serve_in(cwd: &std::path::Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_boxoffice"));
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ])
    .current_dir(cwd);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_no_setup_then_drain_on_sigterm() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = serve_in(cwd.path())
        .env_remove("BOXOFFICE_ADMIN_KEYS")
        .env_remove("BOXOFFICE_CLIENT_KEYS")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut seen = Vec::new();
    read_until(&rx, "ready: serving", &mut seen);
    let key = |prefix: &str| {
        seen.iter()
            .find_map(|l| l.strip_prefix(prefix).map(|k| k.trim().to_owned()))
            .unwrap()
    };
    let admin = key("generated admin key:");
    let client = key("generated client key:");
    assert!(admin.starts_with("adm_") && client.starts_with("cli_"));
    let addr = seen
        .iter()
        .find_map(|l| l.strip_prefix("gRPC listening on "))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_owned();
    assert!(
        cwd.path().join("boxoffice-data").is_dir(),
        "data dir under the current directory"
    );

    // It serves: an admin call with the generated key works, a client key cannot create.
    let ch = boxoffice_client::connect(&format!("http://{addr}"))
        .await
        .unwrap();
    let bearer = boxoffice_client::Bearer::new(&admin).unwrap();
    let mut events =
        boxoffice_proto::v1::event_service_client::EventServiceClient::with_interceptor(
            ch.clone(),
            bearer,
        );
    events
        .create_event(boxoffice_proto::v1::CreateEventRequest {
            event_id: "e".into(),
            name: "E".into(),
            sections: vec![boxoffice_proto::v1::SectionSpec {
                section_id: "g".into(),
                name: "G".into(),
                price_cents: 1,
                layout: Some(
                    boxoffice_proto::v1::section_spec::Layout::GeneralAdmissionCapacity(10),
                ),
            }],
            ..Default::default()
        })
        .await
        .unwrap();

    // SIGTERM: drain, flush, exit 0.
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    read_until(&rx, "stopped; log flushed", &mut seen);
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit {exit:?}");
}

#[test]
fn ticket_verify_and_reconcile_on_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let signer = boxoffice_gateway::tickets::TicketSigner::load_or_create(dir.path()).unwrap();
    let code = signer.sign(&boxoffice_gateway::tickets::TicketClaims {
        event_id: "e".into(),
        section_id: "s".into(),
        seat_id: "s:A:1".into(),
        order_id: "e.s.o1".into(),
        ticket_id: "e.s.o1.1".into(),
    });
    let bin = env!("CARGO_BIN_EXE_boxoffice");
    let data_dir = dir.path().to_str().unwrap();
    let out = Command::new(bin)
        .args(["ticket", "public-key", "--data-dir", data_dir])
        .output()
        .unwrap();
    assert!(out.status.success());
    let public_key = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert_eq!(public_key, signer.public_key_hex());
    let out = Command::new(bin)
        .args(["ticket", "verify", &code, "--public-key", &public_key])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid ticket"));
    let mut forged = code.clone().into_bytes();
    forged[3] ^= 1;
    let forged = String::from_utf8(forged).unwrap();
    let out = Command::new(bin)
        .args(["ticket", "verify", &forged, "--data-dir", data_dir])
        .output()
        .unwrap();
    assert!(!out.status.success(), "a forged code fails");
    let out = Command::new(bin)
        .args(["reconcile", "--data-dir", data_dir])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("reconciliation clean"));
}

/// A bad idempotency window, as a flag or in the environment, refuses to start before anything
/// is opened: out of range (0, over 30 days) or not a number. The refusal names the flag.
#[test]
fn serve_refuses_a_bad_idempotency_window() {
    let cwd = tempfile::tempdir().unwrap();
    let refused = |flag: Option<&str>, env: Option<&str>| {
        let mut cmd = serve_in(cwd.path());
        cmd.env_remove("BOXOFFICE_IDEMPOTENCY_WINDOW_SECONDS");
        if let Some(v) = flag {
            cmd.args(["--idempotency-window-seconds", v]);
        }
        if let Some(v) = env {
            cmd.env("BOXOFFICE_IDEMPOTENCY_WINDOW_SECONDS", v);
        }
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{flag:?} {env:?}: {stderr}");
        assert!(stderr.contains("--idempotency-window-seconds"), "{stderr}");
    };
    refused(Some("0"), None);
    refused(Some("2592001"), None);
    refused(Some("1d"), None);
    refused(None, Some("-5"));
    assert!(
        !cwd.path().join("boxoffice-data").exists(),
        "nothing was opened"
    );
}
