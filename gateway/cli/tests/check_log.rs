//! `boxoffice check-log` and `serve --accept-damage` on the command line: exit codes 0 (whole),
//! 1 (damage, named), 2 (cannot run: no dir, no log, a server holds it); a damaged log refuses
//! to serve and says what to do; `--accept-damage` starts, writes its report, and a later plain
//! start and check find the log whole.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod shared;

use shared::text;

fn boxoffice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args(args)
        .env_remove("BOXOFFICE_DATA_DIR")
        .output()
        .unwrap()
}

#[test]
fn check_log_cannot_run_without_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let out = boxoffice(&["check-log", "--data-dir", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no data dir there"), "{}", text(&out));
    assert!(!missing.exists(), "a check never creates the dir");
    let out = boxoffice(&["check-log", "--data-dir", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("no boxoffice log"), "{}", text(&out));
    let out = boxoffice(&["check-log"]);
    assert_eq!(out.status.code(), Some(2), "a data dir must be named");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_log_whole_then_damaged_then_accepted() {
    let dir = tempfile::tempdir().unwrap();
    shared::build(dir.path(), 60, 500).await;
    let d = dir.path().to_str().unwrap();

    let out = boxoffice(&["check-log", "--data-dir", d]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("the log is whole"), "{}", text(&out));
    assert!(text(&out).contains("section/show/floor"), "{}", text(&out));

    shared::cut_in_half(dir.path());
    let db = dir.path().join("db");
    let before = std::fs::read(&db).unwrap();
    let out = boxoffice(&["check-log", "--data-dir", d]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("DAMAGE: stream `section/show/floor`: records at sequence"),
        "{}",
        text(&out)
    );
    let out = boxoffice(&["check-log", "--data-dir", d, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["whole"], false);
    // `--json FILE`, as the drills': the text on stdout, the same JSON in the file.
    let out_dir = tempfile::tempdir().unwrap();
    let file = out_dir.path().join("check-log.json");
    let out = boxoffice(&[
        "check-log",
        "--json",
        file.to_str().unwrap(),
        "--data-dir",
        d,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("DAMAGE: stream"), "{}", text(&out));
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(written["damage"], json["damage"]);
    assert!(
        json["damage"][0]["message"]
            .as_str()
            .unwrap()
            .contains("missing")
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        before,
        "check-log changed nothing"
    );

    // A plain start refuses, exits non-zero, and says what to do.
    let serve = [
        "serve",
        "--data-dir",
        d,
        "--listen",
        "127.0.0.1:0",
        "--metrics-listen",
        "127.0.0.1:0",
    ];
    let out = boxoffice(&serve);
    assert!(!out.status.success());
    let said = text(&out);
    assert!(
        said.contains("the log is damaged") && said.contains("--accept-damage"),
        "{said}"
    );

    // The operator accepts: it serves, and the report says what was found and done.
    let report = dir.path().join("damage-report.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args(serve)
        .args([
            "--accept-damage",
            report.to_str().unwrap(),
            // `build` sold through the engine alone: no ticket key was ever made.
            "--new-ticket-key",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let ready = line.contains("ready: serving");
        seen.push(line);
        if ready {
            break;
        }
    }
    // Keep reading: a closed pipe would fail the server's next line.
    let rest = std::thread::spawn(move || lines.collect::<Vec<_>>());
    assert!(
        seen.iter()
            .any(|l| l.contains("accept-damage: started with")),
        "{seen:#?}"
    );
    // While it runs, every subcommand that works on its data dir refuses at once with exit
    // code 2, naming the server's process (not after waiting for the log's lock).
    let holder = format!("is held by process {} (", child.id());
    for args in [
        vec!["check-log", "--data-dir", d],
        vec!["reconcile", "--data-dir", d],
        vec!["ticket", "rotate-key", "--data-dir", d],
        serve.to_vec(),
        vec!["soak", "--data-dir", d, "--cycles", "10"],
        vec!["sessions", "--data-dir", d, "--sessions", "4"],
    ] {
        let out = boxoffice(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(&holder), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains("boxoffice serve"),
            "{args:?}: {}",
            text(&out)
        );
    }
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let exit = child.wait().unwrap();
    let rest = rest.join().unwrap();
    assert!(exit.success(), "{exit:?} {rest:#?}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(json["by"], "serve --accept-damage");
    assert!(!json["damage"].as_array().unwrap().is_empty());
    assert!(!json["actions"].as_array().unwrap().is_empty());

    // Accepted once: the log is whole from now on.
    std::thread::sleep(Duration::from_millis(200));
    let out = boxoffice(&["check-log", "--data-dir", d]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
}
