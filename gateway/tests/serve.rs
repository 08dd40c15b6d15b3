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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_no_setup_then_drain_on_sigterm() {
    let cwd = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
        ])
        .current_dir(cwd.path())
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
    let ch = boxoffice_gateway::loadgen::connect(&format!("http://{addr}"))
        .await
        .unwrap();
    let bearer = boxoffice_gateway::loadgen::Bearer::new(&admin).unwrap();
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
