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
        .env_remove("BOXOFFICE_ADMIN_KEY")
        .env_remove("BOXOFFICE_CLIENT_KEY")
        .env_remove("BOXOFFICE_ADMIN_KEY_FILE")
        .env_remove("BOXOFFICE_CLIENT_KEY_FILE")
        .env_remove("BOXOFFICE_ADMIN_KEYS")
        .env_remove("BOXOFFICE_CLIENT_KEYS")
        .env_remove("BOXOFFICE_ADMIN_KEYS_FILE")
        .env_remove("BOXOFFICE_CLIENT_KEYS_FILE")
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
                price_tiers: Vec::new(),
            }],
            ..Default::default()
        })
        .await
        .unwrap();

    // The process keeps itself off transparent huge pages (docs/operations.md).
    #[cfg(target_os = "linux")]
    {
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
        let thp = status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(str::trim);
        assert_eq!(thp, Some("0"), "huge pages kept off");
    }

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

/// Runs `boxoffice ARGS`: (success, stdout, stderr).
fn boxoffice(args: &[&str]) -> (bool, String, String) {
    let out = run(args);
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Runs `boxoffice ARGS`: (stdout and stderr, exit code).
fn boxoffice_status(args: &[&str]) -> (String, i32) {
    let out = run(args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (text, out.status.code().unwrap_or(-1))
}

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args(args)
        .output()
        .unwrap()
}

/// The lines of `ticket public-key`: (kid, hex, role).
fn key_lines(stdout: &str) -> Vec<(String, String, String)> {
    stdout
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            assert_eq!(w.len(), 3, "{l:?}");
            (w[0].to_owned(), w[1].to_owned(), w[2].to_owned())
        })
        .collect()
}

#[test]
fn ticket_keys_verify_rotate_and_reconcile_on_the_command_line() {
    use boxoffice_gateway::tickets;
    let dir = tempfile::tempdir().unwrap();
    let signer = tickets::open_for_signing(dir.path(), true)
        .unwrap()
        .unwrap();
    let claims = tickets::TicketClaims {
        event_id: "e".into(),
        section_id: "s".into(),
        seat_id: "s:A:1".into(),
        order_id: "e.s.o1".into(),
        ticket_id: "e.s.o1.1".into(),
    };
    let code = signer.sign(&claims);
    let data_dir = dir.path().to_str().unwrap();
    let (ok, out, _) = boxoffice(&["ticket", "public-key", "--data-dir", data_dir]);
    assert!(ok);
    let first = signer.public_key();
    assert_eq!(
        key_lines(&out),
        [(
            first.kid().to_string(),
            first.to_hex(),
            "signing".to_owned()
        )]
    );
    let (ok, out, _) = boxoffice(&["ticket", "verify", &code, "--public-key", &first.to_hex()]);
    assert!(ok && out.contains("valid ticket"), "{out}");
    assert!(out.contains(&format!("key     {}", first.kid())), "{out}");
    let mut forged = code.clone().into_bytes();
    forged[3] ^= 1;
    let forged = String::from_utf8(forged).unwrap();
    let (ok, out, _) = boxoffice(&["ticket", "verify", &forged, "--data-dir", data_dir]);
    assert!(
        !ok && out.contains("NOT VALID"),
        "a forged code fails: {out}"
    );

    // A revocation list (as the server serves it): a code it names is not valid; one it does
    // not name is; a list that is not genuine, or another event's, checks nothing (exit 2).
    let list = |event: &str, ids: &[&str]| {
        let l = tickets::Revocations {
            event_id: event.into(),
            as_of_ms: 1_000,
            ticket_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
        };
        let file = dir
            .path()
            .join(format!("revoked-{event}-{}.json", ids.len()));
        let signed = signer.sign_revocations(&l);
        std::fs::write(
            &file,
            serde_json::json!({"eventId": event, "signed": signed}).to_string(),
        )
        .unwrap();
        (file.to_str().unwrap().to_owned(), signed)
    };
    let (revoking, signed) = list("e", &["e.s.o1.1", "e.s.o2.1"]);
    let (out, code_of) = boxoffice_status(&[
        "ticket",
        "verify",
        &code,
        "--data-dir",
        data_dir,
        "--revocations",
        &revoking,
    ]);
    assert_eq!(code_of, 1, "{out}");
    assert!(
        out.contains("NOT VALID: ticket e.s.o1.1 was revoked"),
        "{out}"
    );
    let (clean, _) = list("e", &["e.s.o2.1"]);
    let (out, code_of) = boxoffice_status(&[
        "ticket",
        "verify",
        &code,
        "--data-dir",
        data_dir,
        "--revocations",
        &clean,
    ]);
    assert_eq!(code_of, 0, "{out}");
    assert!(
        out.contains("valid ticket") && out.contains("not revoked"),
        "{out}"
    );
    let forged_list = dir.path().join("forged.txt");
    std::fs::write(&forged_list, signed.replacen('.', "x.", 1)).unwrap();
    let (other, _) = list("other-event", &["e.s.o1.1"]);
    for (name, file) in [
        ("forged", forged_list.to_str().unwrap().to_owned()),
        ("another event's", other),
    ] {
        let (out, code_of) = boxoffice_status(&[
            "ticket",
            "verify",
            &code,
            "--data-dir",
            data_dir,
            "--revocations",
            &file,
        ]);
        assert_eq!(code_of, 2, "{name} list: {out}");
    }

    // Rotation: a new signing key, the old one still verifies.
    let (ok, _, err) = boxoffice(&["ticket", "rotate-key", "--data-dir", data_dir]);
    assert!(ok, "{err}");
    assert!(
        err.contains(&format!("key {} retired", first.kid())),
        "{err}"
    );
    let (ok, out, _) = boxoffice(&["ticket", "public-key", "--data-dir", data_dir]);
    assert!(ok);
    let lines = key_lines(&out);
    assert_eq!(lines.len(), 2, "{out}");
    assert_eq!(lines[0].2, "signing");
    assert_ne!(lines[0].0, first.kid().to_string());
    assert_eq!(
        lines[1],
        (
            first.kid().to_string(),
            first.to_hex(),
            "verifying".to_owned()
        )
    );
    let (ok, out, _) = boxoffice(&["ticket", "verify", &code, "--data-dir", data_dir]);
    assert!(ok && out.contains("valid ticket"), "{out}");
    let (ok, out, _) = boxoffice(&[
        "ticket",
        "verify",
        &code,
        "--public-key",
        &lines[0].1,
        "--public-key",
        &first.to_hex(),
    ]);
    assert!(ok && out.contains("valid ticket"), "{out}");
    // A code whose key is not given: refused, naming the key.
    let (ok, out, _) = boxoffice(&["ticket", "verify", &code, "--public-key", &lines[0].1]);
    assert!(!ok, "{out}");
    assert!(
        out.contains(&format!("NOT VALID: signed with key {}", first.kid())),
        "{out}"
    );

    // Bad input: clear errors.
    let (ok, _, err) = boxoffice(&["ticket", "verify", &code, "--public-key", "zz"]);
    assert!(
        !ok && err.contains("--public-key \"zz\": invalid public key"),
        "{err}"
    );
    let (ok, out, _) = boxoffice(&["ticket", "verify", "garbage", "--data-dir", data_dir]);
    assert!(
        !ok && out.contains("NOT VALID: malformed ticket code"),
        "{out}"
    );
    let empty = tempfile::tempdir().unwrap();
    let empty_dir = empty.path().to_str().unwrap();
    for sub in ["public-key", "rotate-key"] {
        let (ok, _, err) = boxoffice(&["ticket", sub, "--data-dir", empty_dir]);
        assert!(!ok && err.contains("no ticket keys"), "{sub}: {err}");
    }
    let (ok, _, err) = boxoffice(&["ticket", "verify", &code, "--data-dir", empty_dir]);
    assert!(!ok && err.contains("no ticket keys"), "{err}");
    assert_eq!(
        std::fs::read_dir(empty.path()).unwrap().count(),
        0,
        "nothing made"
    );

    let (ok, out, _) = boxoffice(&["reconcile", "--data-dir", data_dir]);
    assert!(ok, "{out}");
    assert!(out.contains("reconciliation clean"));
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

/// A seat-map response limit outside 256 KiB to 64 MiB refuses to start, naming the flag,
/// before anything is opened.
#[test]
fn serve_refuses_a_seat_map_limit_out_of_range() {
    let cwd = tempfile::tempdir().unwrap();
    for v in ["262143", "67108865", "4MiB"] {
        let out = serve_in(cwd.path())
            .env_remove("BOXOFFICE_SEAT_MAP_MAX_BYTES")
            .args(["--seat-map-max-bytes", v])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{v}: {stderr}");
        assert!(stderr.contains("--seat-map-max-bytes"), "{stderr}");
    }
    assert!(
        !cwd.path().join("boxoffice-data").exists(),
        "nothing was opened"
    );
}

#[test]
fn secrets_are_never_printed_and_a_missing_dir_is_not_a_clean_store() {
    let bin = env!("CARGO_BIN_EXE_boxoffice");
    for (args, var) in [
        (vec!["serve", "--help"], "BOXOFFICE_ADMIN_KEY"),
        (vec!["serve", "--help"], "BOXOFFICE_CLIENT_KEY"),
        (vec!["serve", "--help"], "BOXOFFICE_TOKEN_SECRET"),
        (vec!["serve", "--help"], "BOXOFFICE_TOKEN_SECRET_FILE"),
        (vec!["loadgen", "--help"], "BOXOFFICE_ADMIN_KEY"),
        (vec!["loadgen", "--help"], "BOXOFFICE_CLIENT_KEY"),
        (vec!["flash-sale", "--help"], "BOXOFFICE_ADMIN_KEY"),
    ] {
        let out = Command::new(bin)
            .args(&args)
            .env(var, "s3cr3t-value")
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(var), "{args:?} documents {var}");
        assert!(
            !text.contains("s3cr3t-value"),
            "{args:?} printed {var}'s value"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let out = Command::new(bin)
        .args(["reconcile", "--data-dir", missing.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no boxoffice log"));
    assert!(!missing.exists(), "reconcile does not create the dir");
}
