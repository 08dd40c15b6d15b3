//! The command line's one vocabulary, through the built binary: keys and the token secret read
//! from files (`--*-file`, `*_FILE`), the old names still accepted, the exit-code table (0 ok,
//! 1 findings or failed checks, 2 usage, 3 a broken promise) in every `--help` and as the
//! commands exit, loadgen failing when calls fail, log lines without colour when redirected and
//! as JSON with `--log-format json`.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod shared;

use shared::text;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use boxoffice_proto::v1 as pb;

const BIN: &str = env!("CARGO_BIN_EXE_boxoffice");

/// Every variable the commands read for keys, removed so that the caller's environment does
/// not leak into a test.
const KEY_VARS: &[&str] = &[
    "BOXOFFICE_ADMIN_KEY",
    "BOXOFFICE_ADMIN_KEY_FILE",
    "BOXOFFICE_CLIENT_KEY",
    "BOXOFFICE_CLIENT_KEY_FILE",
    "BOXOFFICE_TOKEN_SECRET",
    "BOXOFFICE_TOKEN_SECRET_FILE",
    "BOXOFFICE_ADMIN_KEYS",
    "BOXOFFICE_ADMIN_KEYS_FILE",
    "BOXOFFICE_CLIENT_KEYS",
    "BOXOFFICE_CLIENT_KEYS_FILE",
    "BOXOFFICE_SECTION_IN_FLIGHT_MAX",
    "BOXOFFICE_SECTION_INFLIGHT_MAX",
    "BOXOFFICE_LOG_FORMAT",
    "BOXOFFICE_DATA_DIR",
    "NO_COLOR",
];

/// `boxoffice ARGS` with a clean environment (no key variables).
fn boxoffice(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for v in KEY_VARS {
        cmd.env_remove(v);
    }
    cmd
}

/// A running `boxoffice serve` on loopback: its address, its stdout lines so far, and its
/// stderr (all of it, once it exits).
struct Server {
    child: Child,
    addr: String,
    stdout: Vec<String>,
    lines: mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<Vec<u8>>>,
}

impl Drop for Server {
    /// A test that fails before [`Server::stop`] leaves no server running.
    fn drop(&mut self) {
        if self.stderr.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    /// Starts `serve` in `dir` (data dir `dir/data`) with `args` and the variables `env`, and
    /// waits until it serves.
    fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        let data = dir.join("data");
        let mut cmd = boxoffice(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics-listen",
            "127.0.0.1:0",
            "--data-dir",
            data.to_str().unwrap(),
            "--durability",
            "buffered",
        ]);
        cmd.args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut b = Vec::new();
            let _ = err.read_to_end(&mut b);
            b
        });
        let mut stdout = Vec::new();
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("serve did not get ready: {stdout:#?}"));
            stdout.push(line.clone());
            if line.contains("ready: serving") {
                break;
            }
        }
        let addr = stdout
            .iter()
            .find_map(|l| l.strip_prefix("gRPC listening on "))
            .and_then(|l| l.split_whitespace().next())
            .unwrap()
            .to_owned();
        Server {
            child,
            addr,
            stdout,
            lines,
            stderr: Some(stderr),
        }
    }

    fn target(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGTERM; waits for the exit (0 expected): everything it wrote, (stdout, stderr).
    fn stop(mut self) -> (String, Vec<u8>) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let exit = self.child.wait().unwrap();
        assert!(exit.success(), "serve exit {exit:?}");
        self.stdout.extend(self.lines.try_iter());
        let stderr = self.stderr.take().unwrap().join().unwrap();
        (self.stdout.join("\n"), stderr)
    }
}

/// Creates a one-section event with `key`: the gRPC status if refused.
async fn create_event(target: &str, key: &str, event_id: &str) -> Result<(), tonic::Status> {
    let ch = boxoffice_client::connect(target).await.unwrap();
    let mut events = pb::event_service_client::EventServiceClient::with_interceptor(
        ch,
        boxoffice_client::Bearer::new(key).unwrap(),
    );
    events
        .create_event(pb::CreateEventRequest {
            event_id: event_id.into(),
            name: "E".into(),
            sections: vec![pb::SectionSpec {
                section_id: "g".into(),
                name: "G".into(),
                price_cents: 1,
                layout: Some(pb::section_spec::Layout::GeneralAdmissionCapacity(10)),
                price_tiers: Vec::new(),
            }],
            ..Default::default()
        })
        .await
        .map(|_| ())
}

/// Joins the waiting room of `event_id` with `key` (a client call).
async fn join(target: &str, key: &str, event_id: &str) -> Result<(), tonic::Status> {
    let ch = boxoffice_client::connect(target).await.unwrap();
    let mut room = pb::waiting_room_service_client::WaitingRoomServiceClient::with_interceptor(
        ch,
        boxoffice_client::Bearer::new(key).unwrap(),
    );
    room.join(pb::JoinRequest {
        event_id: event_id.into(),
        user_id: "u".into(),
        session_id: "s".into(),
        ..Default::default()
    })
    .await
    .map(|_| ())
}

/// Keys and the token secret from files, as the flag and as the `_FILE` variable: the keys in
/// them are the server's (a call with another key is refused), trailing newlines trimmed,
/// several admin keys one per line; the clients read theirs from files too (loadgen exits 0
/// when every call succeeded). No secret is ever printed, and the redirected log has no colour.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_from_files_serve_and_are_never_printed() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let admin_file = file("admin", "adm-first-secret\n\nadm-second-secret\n");
    let client_file = file("client", "cli-file-secret\r\n");
    let token_file = file("token", "tok-file-secret\n");
    let server = Server::start(
        dir.path(),
        &["--admin-key-file", &admin_file],
        &[
            ("BOXOFFICE_CLIENT_KEY_FILE", client_file.as_str()),
            ("BOXOFFICE_TOKEN_SECRET_FILE", token_file.as_str()),
        ],
    );
    let target = server.target();

    create_event(&target, "adm-first-secret", "e1")
        .await
        .unwrap();
    create_event(&target, "adm-second-secret", "e2")
        .await
        .unwrap();
    let refused = create_event(&target, "adm-other", "e3").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    join(&target, "cli-file-secret", "e1").await.unwrap();
    let refused = join(&target, "cli-other", "e1").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    // loadgen with both keys from files: every call succeeds, exit 0.
    let admin_one = file("admin-one", "adm-second-secret\n");
    let out = boxoffice(&[
        "loadgen",
        "--target",
        &target,
        "--admin-key-file",
        &admin_one,
        "--requests",
        "200",
        "--concurrency",
        "4",
        "--connections",
        "1",
    ])
    .env("BOXOFFICE_CLIENT_KEY_FILE", &client_file)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let lg = text(&out);

    let (stdout, stderr) = server.stop();
    assert!(
        !stdout.contains("generated"),
        "keys came from files: {stdout}"
    );
    let stderr = String::from_utf8(stderr).unwrap();
    assert!(
        !stderr.contains("--token-secret"),
        "the token secret came from a file: {stderr}"
    );
    assert!(stderr.contains("INFO"), "a log line was written: {stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "no colour in a redirected log: {stderr:?}"
    );
    for secret in [
        "adm-first-secret",
        "adm-second-secret",
        "cli-file-secret",
        "tok-file-secret",
    ] {
        for (what, text) in [("stdout", &stdout), ("stderr", &stderr), ("loadgen", &lg)] {
            assert!(!text.contains(secret), "{what} shows {secret}: {text}");
        }
    }
}

/// The old names still work: `BOXOFFICE_ADMIN_KEYS` / `BOXOFFICE_CLIENT_KEYS` (comma-separated)
/// and `--section-inflight-max` for the server; `--api-key`, `--hold-ttl-ms`, `--pay-rate`,
/// `--admit-rate`, ... for flash-sale. And `--log-format json` (or `BOXOFFICE_LOG_FORMAT=json`)
/// writes one JSON object per line, the command's own warnings and errors included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_names_still_work_and_json_logs_parse() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &["--section-inflight-max", "5000", "--log-format", "json"],
        &[
            ("BOXOFFICE_ADMIN_KEYS", "adm-old-1,adm-old-2"),
            ("BOXOFFICE_CLIENT_KEYS", "cli-old"),
        ],
    );
    let target = server.target();
    create_event(&target, "adm-old-2", "e1").await.unwrap();
    join(&target, "cli-old", "e1").await.unwrap();
    let out = boxoffice(&[
        "flash-sale",
        "--target",
        &target,
        "--api-key",
        "adm-old-1",
        "--fans",
        "40",
        "--seats",
        "8",
        "--arrival-seconds",
        "0.2",
        "--hold-ttl-ms",
        "1000",
        "--pay-rate",
        "0.5",
        "--decline-rate",
        "0.1",
        "--exact-rate",
        "0.1",
        "--waitlist-rate",
        "0.1",
        "--admit-rate",
        "1000",
        "--concurrency",
        "16",
    ])
    .output()
    .unwrap();
    // Parsed and run against the server: 0 if clean, 1 if some call failed; never 2 (usage).
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "the old flags are accepted: {}",
        text(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("every seat sold at most once"),
        "{}",
        text(&out)
    );
    let (_, stderr) = server.stop();
    let stderr = String::from_utf8(stderr).unwrap();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "RUST_LOG=info writes lines");
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line:?}"));
        assert!(v["timestamp"].is_string(), "{line}");
        assert!(v["level"].is_string(), "{line}");
        assert!(v["target"].is_string(), "{line}");
        assert!(v["fields"].is_object(), "{line}");
    }
    assert!(stderr.contains("engine recovered"), "{stderr}");
    // The command's own warnings are JSON events too (no --token-secret was given).
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("\"level\":\"WARN\"") && l.contains("no --token-secret")),
        "{stderr}"
    );

    // And its errors: the variable works as the flag does.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("typo");
    let out = boxoffice(&["reconcile", "--data-dir", missing.to_str().unwrap()])
        .env("BOXOFFICE_LOG_FORMAT", "json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let line = String::from_utf8(out.stderr).unwrap();
    let v: serde_json::Value = serde_json::from_str(line.trim()).unwrap();
    assert_eq!(v["level"], "ERROR", "{line}");
    assert!(
        v["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("no boxoffice log"),
        "{line}"
    );
}

/// A key given twice (value and file, in any mix of flags and variables), a file that is not
/// there or is empty: exit 2 before anything is opened, the message names the flag or path and
/// never a secret.
#[test]
fn key_files_wrongly_given_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let key = dir.path().join("key");
    std::fs::write(&key, "file-secret-value\n").unwrap();
    let empty = dir.path().join("empty");
    std::fs::write(&empty, "\n").unwrap();
    let missing = dir.path().join("no-such-key");
    let (k, e, m, d) = (
        key.to_str().unwrap(),
        empty.to_str().unwrap(),
        missing.to_str().unwrap(),
        data.to_str().unwrap(),
    );
    let serve = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = boxoffice(&["serve", "--data-dir", d, "--listen", "127.0.0.1:0"]);
        cmd.args(args).envs(env.iter().copied());
        cmd.output().unwrap()
    };
    let cases: Vec<(Output, &str)> = vec![
        (
            serve(&["--admin-key", "value-secret", "--admin-key-file", k], &[]),
            "--admin-key-file",
        ),
        (
            serve(
                &["--client-key-file", k],
                &[("BOXOFFICE_CLIENT_KEY", "value-secret")],
            ),
            "--client-key",
        ),
        (
            serve(
                &["--token-secret", "value-secret"],
                &[("BOXOFFICE_TOKEN_SECRET_FILE", k)],
            ),
            "--token-secret",
        ),
        (
            serve(
                &[],
                &[
                    ("BOXOFFICE_ADMIN_KEYS", "value-secret"),
                    ("BOXOFFICE_ADMIN_KEYS_FILE", k),
                ],
            ),
            "BOXOFFICE_ADMIN_KEYS_FILE",
        ),
        (
            serve(&[], &[("BOXOFFICE_SECTION_INFLIGHT_MAX", "lots")]),
            "BOXOFFICE_SECTION_INFLIGHT_MAX",
        ),
        (serve(&["--admin-key-file", m], &[]), m),
        (serve(&[], &[("BOXOFFICE_CLIENT_KEY_FILE", m)]), m),
        (serve(&["--token-secret-file", e], &[]), e),
        (
            boxoffice(&[
                "loadgen",
                "--admin-key-file",
                m,
                "--client-key",
                "value-secret",
            ])
            .output()
            .unwrap(),
            m,
        ),
        (
            boxoffice(&[
                "loadgen",
                "--admin-key",
                "value-secret",
                "--client-key-file",
                e,
            ])
            .output()
            .unwrap(),
            e,
        ),
        (
            boxoffice(&[
                "flash-sale",
                "--target",
                "http://127.0.0.1:9",
                "--admin-key-file",
                m,
            ])
            .output()
            .unwrap(),
            m,
        ),
        (
            boxoffice(&["sessions", "--target", "http://127.0.0.1:9"])
                .output()
                .unwrap(),
            "--admin-key",
        ),
        (
            boxoffice(&[
                "flash-sale",
                "--hold-ttl-ms",
                "1000",
                "--hold-ttl-seconds",
                "1",
            ])
            .output()
            .unwrap(),
            "--hold-ttl-seconds",
        ),
        (
            boxoffice(&["flash-sale", "--pay-share", "1.5"])
                .output()
                .unwrap(),
            "--pay-share",
        ),
        (
            boxoffice(&[
                "loadgen",
                "--admin-key",
                "a",
                "--client-key",
                "c",
                "--requests",
                "0",
            ])
            .output()
            .unwrap(),
            "--requests",
        ),
    ];
    for (out, named) in cases {
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        let all = text(&out);
        assert!(all.contains(named), "names {named}: {all}");
        assert!(
            !all.contains("file-secret-value"),
            "a file's content shown: {all}"
        );
        assert!(!all.contains("value-secret"), "a secret shown: {all}");
    }
    assert!(!data.exists(), "nothing was opened");
}

/// Every subcommand's `--help` lists the exit codes and documents the key flags and variables
/// (their values, set in the environment, are never shown).
#[test]
fn every_help_lists_the_exit_codes_and_hides_secrets() {
    let subcommands: &[&[&str]] = &[
        &[],
        &["serve"],
        &["flash-sale"],
        &["loadgen"],
        &["sessions"],
        &["ticket"],
        &["ticket", "public-key"],
        &["ticket", "verify"],
        &["ticket", "rotate-key"],
        &["reconcile"],
        &["check-log"],
        &["soak"],
    ];
    for sub in subcommands {
        let mut args = sub.to_vec();
        args.push("--help");
        let mut cmd = boxoffice(&args);
        for v in [
            "BOXOFFICE_ADMIN_KEY",
            "BOXOFFICE_CLIENT_KEY",
            "BOXOFFICE_TOKEN_SECRET",
            "BOXOFFICE_ADMIN_KEY_FILE",
            "BOXOFFICE_CLIENT_KEY_FILE",
            "BOXOFFICE_TOKEN_SECRET_FILE",
        ] {
            cmd.env(v, "s3cr3t-value");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{sub:?}: {}", text(&out));
        let help = String::from_utf8(out.stdout).unwrap();
        for line in [
            "Exit codes:",
            "0  ok",
            "1  findings",
            "2  usage",
            "3  a broken promise",
        ] {
            assert!(
                help.contains(line),
                "{sub:?} --help lacks {line:?}:\n{help}"
            );
        }
        assert!(!help.contains("s3cr3t-value"), "{sub:?} printed a secret");
    }
    let help = |sub: &str| {
        String::from_utf8(boxoffice(&[sub, "--help"]).output().unwrap().stdout).unwrap()
    };
    let serve = help("serve");
    for name in [
        "--admin-key-file",
        "BOXOFFICE_ADMIN_KEY_FILE",
        "--client-key-file",
        "BOXOFFICE_CLIENT_KEY_FILE",
        "--token-secret-file",
        "BOXOFFICE_TOKEN_SECRET_FILE",
        "--section-in-flight-max",
        "--log-format",
    ] {
        assert!(serve.contains(name), "serve --help lacks {name}");
    }
    for sub in ["loadgen", "flash-sale", "sessions"] {
        let h = help(sub);
        assert!(h.contains("--admin-key-file") && h.contains("BOXOFFICE_ADMIN_KEY_FILE"));
        assert!(
            !h.contains("--api-key"),
            "{sub}: the old name is not documented"
        );
    }
}

/// loadgen exits 1 with a summary on stderr when calls fail: a server whose sections take no
/// queued request (`--section-in-flight-max 0`) sheds every Hold with OVERLOADED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loadgen_exits_1_when_calls_fail() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        &[
            "--section-in-flight-max",
            "0",
            "--admin-key",
            "adm",
            "--client-key",
            "cli",
            "--token-secret",
            "t",
        ],
        &[],
    );
    let out = boxoffice(&[
        "loadgen",
        "--target",
        &server.target(),
        "--requests",
        "100",
        "--concurrency",
        "4",
        "--connections",
        "1",
    ])
    .env("BOXOFFICE_ADMIN_KEY", "adm")
    .env("BOXOFFICE_CLIENT_KEY", "cli")
    .output()
    .unwrap();
    server.stop();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("loadgen: FAILED: 100 of 100 Hold calls failed")
            && stderr.contains("OVERLOADED"),
        "{}",
        text(&out)
    );
}

/// The processes whose command line mentions `needle` (Linux: `/proc/*/cmdline`), this test's
/// own excepted: a cluster run's nodes are named by their data dirs.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let me = std::process::id().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(cmd) = std::fs::read(entry.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(needle) {
                found.push(format!("{pid}: {cmd}"));
            }
        }
    }
    found
}

/// The demo of issue 13: `flash-sale --nodes 3 --kill-leader-after 1` plays the sale against
/// three `serve` processes, kills the leader with SIGKILL a second after the opening, and the
/// fans go on through the other nodes. It exits 0; its JSON report names the killed node and
/// the failover time, reads back every acknowledged hold and order (none lost), sold no seat
/// twice, and the live nodes' copies reconcile; no node process outlives the run.
/// `flash-sale` against a local cluster (`flags` say which), 2,000 fans for 300 seats over
/// 3 s: its output, with the temporary dir, the cluster's data dir and the JSON report's path.
fn cluster_sale(
    flags: &[&str],
) -> (
    std::process::Output,
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let json = dir.path().join("report.json");
    let mut args = vec!["flash-sale"];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--fans", "2000", "--seats", "300", "--arrival-seconds", "3"]);
    args.extend_from_slice(&["--data-dir", data.to_str().unwrap()]);
    args.extend_from_slice(&["--json", json.to_str().unwrap()]);
    let out = boxoffice(&args).output().unwrap();
    (out, dir, data, json)
}

#[test]
fn a_flash_sale_on_three_nodes_loses_nothing_when_the_leader_is_killed() {
    let (out, _dir, data, json) = cluster_sale(&["--nodes", "3", "--kill-leader-after", "1"]);
    if out.status.code() != Some(0) {
        // The nodes' own account of what went wrong (their logs go before the temp dir).
        let mut logs = String::new();
        for i in 1..=3 {
            let log =
                std::fs::read_to_string(data.join(format!("node{i}.log"))).unwrap_or_default();
            let tail: Vec<&str> = log
                .lines()
                .filter(|l| l.contains("WARN") || l.contains("ERROR"))
                .filter(|l| !l.contains("forwarding to the leader failed"))
                .collect();
            let from = tail.len().saturating_sub(40);
            logs.push_str(&format!(
                "--- node{i}.log (last warnings) ---\n{}\n",
                tail[from..].join("\n")
            ));
        }
        panic!("exit {:?}: {}\n{logs}", out.status.code(), text(&out));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    for row in [
        "nodes ",
        "leader killed (SIGKILL)",
        "failover (until a leader serves again)",
        "calls failed during the failover (retried)",
        "fans sent back to the line",
        "acknowledged but lost (must be 0)",
        "elections while the sale ran",
        "every seat sold at most once",
    ] {
        assert!(
            stdout.contains(row),
            "the report lacks {row:?}: {}",
            text(&out)
        );
    }
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| {
        report[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {report}"))
    };
    assert_eq!(n("nodes"), 3);
    assert!((1..=3).contains(&n("killed_node")), "{report}");
    assert!(n("elections") >= 1, "the kill forced an election: {report}");
    assert!(report["failover_ms"].is_u64(), "a failover time: {report}");
    assert_ne!(
        report["new_leader"], report["killed_node"],
        "another node leads: {report}"
    );
    assert_eq!(n("acknowledged_lost"), 0, "{report}");
    assert!(
        n("acknowledged_holds") > 0 && n("acknowledged_orders") > 0,
        "holds and orders were read back: {report}"
    );
    assert!(
        n("calls_failed_in_failover") > 0,
        "the kill failed some calls, which were retried: {report}"
    );
    // Fans still in line when every place was taken were told so (in a run whose line had
    // emptied first, every fan admitted, there was nobody left to tell).
    assert!(
        (n("told_sold_out") > 0 && report["told_sold_out_max_ms"].is_u64())
            || n("admitted") == 2_000,
        "fans in line were told the sale sold out: {report}"
    );
    for k in [
        "oversold",
        "double_booked",
        "invariant_violations",
        "reconciliation_findings",
        "errors",
        "held",
    ] {
        assert_eq!(n(k), 0, "{k}: {report}");
    }
    assert_eq!(n("tickets"), n("sold"), "{report}");
    assert!(n("sold") > 0 && n("sold") <= 300, "{report}");
    assert_eq!(report["clean"], true);
    for i in 1..=3 {
        assert!(
            data.join(format!("node{i}")).is_dir(),
            "node {i} kept its data under --data-dir"
        );
    }
    let left = processes_mentioning(data.to_str().unwrap());
    assert!(left.is_empty(), "nodes outlived the run: {left:?}");
}

/// A cluster run stopped by a signal (SIGTERM here; Ctrl-C is handled the same) stops its
/// three nodes before it exits (code 1): none is left running.
#[test]
fn an_interrupted_cluster_run_leaves_no_node_running() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("cluster");
    let mut child = boxoffice(&[
        "flash-sale",
        "--nodes",
        "3",
        "--fans",
        "1000000",
        "--arrival-seconds",
        "600",
        "--data-dir",
        data.to_str().unwrap(),
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Until the three nodes serve and the sale runs (its progress lines).
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while processes_mentioning(data.to_str().unwrap()).len() < 3
        || !(1..=3).all(|i| {
            std::fs::read_to_string(data.join(format!("node{i}.log")))
                .is_ok_and(|l| l.contains("ready: serving"))
        })
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the nodes did not start"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    let left = processes_mentioning(data.to_str().unwrap());
    assert!(left.is_empty(), "nodes outlived the run: {left:?}");
}

/// Issue 27's demo: `flash-sale --nodes 5 --replace-node-after 1` plays the sale against five
/// `serve` processes and replaces a follower by a sixth node mid-sale (it catches up, votes,
/// and the old one is removed and stopped). It exits 0; its report names both nodes, reads
/// back every acknowledged hold and order through the live nodes (the new one among them),
/// none lost, and every live copy reconciles.
#[test]
fn a_flash_sale_on_five_nodes_loses_nothing_when_a_node_is_replaced() {
    let (out, _dir, data, json) = cluster_sale(&["--nodes", "5", "--replace-node-after", "1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("node replaced (live)"),
        "{}",
        text(&out)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let n = |k: &str| {
        report[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} in {report}"))
    };
    assert_eq!(n("nodes"), 5);
    assert!((1..=5).contains(&n("replaced_node")), "{report}");
    assert_eq!(n("replaced_by"), 6, "the spare took its place: {report}");
    assert!(report["replace_ms"].is_u64(), "{report}");
    assert_eq!(n("acknowledged_lost"), 0, "{report}");
    assert!(n("acknowledged_orders") > 0, "{report}");
    for k in [
        "oversold",
        "double_booked",
        "invariant_violations",
        "reconciliation_findings",
        "errors",
    ] {
        assert_eq!(n(k), 0, "{k}: {report}");
    }
    // The new node kept a copy of its own (checked offline with the others).
    assert!(
        data.join("node6").is_dir(),
        "node 6 ran with its own data dir"
    );
    let left = processes_mentioning(data.to_str().unwrap());
    assert!(left.is_empty(), "nodes outlived the run: {left:?}");
}

/// `--nodes` is 1, 3 or 5; `--kill-leader-after` and `--replace-node-after` need a cluster;
/// a cluster run starts its own cluster, so not with `--target` (nor `--naive`). Each is a
/// usage error (exit 2) naming the flag, and nothing is started.
#[test]
fn cluster_flags_wrongly_given_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("never");
    let d = data.to_str().unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["--nodes", "2"], "--nodes"),
        (&["--nodes", "4"], "--nodes"),
        (&["--kill-leader-after", "1"], "--kill-leader-after"),
        (&["--replace-node-after", "1"], "--replace-node-after"),
        (
            &["--nodes", "1", "--kill-leader-after", "1"],
            "--kill-leader-after",
        ),
        (
            &[
                "--nodes",
                "3",
                "--target",
                "http://127.0.0.1:9",
                "--admin-key",
                "k",
            ],
            "--target",
        ),
        (&["--nodes", "3", "--naive"], "--naive"),
    ];
    for (args, named) in cases {
        let mut all = vec!["flash-sale", "--data-dir", d];
        all.extend_from_slice(args);
        let out = boxoffice(&all).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(
            text(&out).contains(named),
            "{args:?} names {named}: {}",
            text(&out)
        );
    }
    assert!(!data.exists(), "nothing was started");
    let negative = boxoffice(&["flash-sale", "--nodes", "3", "--kill-leader-after=-1"])
        .output()
        .unwrap();
    assert_eq!(negative.status.code(), Some(2), "{}", text(&negative));
}

/// Every subcommand path at every depth, as `--help` lists them (`Commands:`), `help` aside.
fn subcommand_paths() -> Vec<Vec<String>> {
    fn children(path: &[String]) -> Vec<String> {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = boxoffice(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{path:?}: {}", text(&out));
        let help = String::from_utf8(out.stdout).unwrap();
        help.lines()
            .skip_while(|l| *l != "Commands:")
            .skip(1)
            .take_while(|l| !l.trim().is_empty())
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .filter(|name| name != "help")
            .collect()
    }
    let mut all = Vec::new();
    let mut todo = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        for name in children(&path) {
            let mut sub = path.clone();
            sub.push(name);
            todo.push(sub.clone());
            all.push(sub);
        }
    }
    all
}

/// `boxoffice completions SHELL` and `boxoffice man --out-dir`: every subcommand at every depth
/// is completed (asked of bash itself) and has its page, each parent's page naming its children's.
#[test]
fn completions_and_man_pages_cover_every_subcommand() {
    let paths = subcommand_paths();
    assert!(paths.len() >= 28, "{paths:?}");
    for must in [
        &["completions"][..],
        &["man"],
        &["ticket", "verify"],
        &["sale", "set"],
    ] {
        assert!(paths.iter().any(|p| p == must), "{must:?} in {paths:?}");
    }
    let dir = tempfile::tempdir().unwrap();

    // bash: what the completion function offers after each parent path is its subcommands.
    let out = boxoffice(&["completions", "bash"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let script = dir.path().join("boxoffice.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    let mut parents: Vec<Vec<String>> = vec![Vec::new()];
    parents.extend(paths.iter().map(|p| p[..p.len() - 1].to_vec()));
    parents.sort();
    parents.dedup();
    for parent in &parents {
        let words: Vec<String> = std::iter::once("boxoffice".to_owned())
            .chain(parent.iter().cloned())
            .chain([String::new()])
            .map(|w| format!("'{w}'"))
            .collect();
        let prev = parent.last().map_or("boxoffice", String::as_str);
        let probe = format!(
            "source '{}'; COMP_WORDS=({}); COMP_CWORD={}; _boxoffice boxoffice '' '{prev}'; \
             printf '%s\\n' \"${{COMPREPLY[@]}}\"",
            script.display(),
            words.join(" "),
            parent.len() + 1
        );
        let out = Command::new("bash").args(["-c", &probe]).output().unwrap();
        assert!(out.status.success(), "{parent:?}: {}", text(&out));
        let offered = String::from_utf8(out.stdout).unwrap();
        let offered: Vec<&str> = offered.lines().collect();
        for child in paths
            .iter()
            .filter(|p| p.len() == parent.len() + 1 && p.starts_with(parent))
        {
            let name = child.last().unwrap();
            assert!(
                offered.contains(&name.as_str()),
                "bash after {parent:?} offers {offered:?}, not {name}"
            );
        }
    }
    // The other shells: every subcommand is named in the script.
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = boxoffice(&["completions", shell]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", text(&out));
        let script = String::from_utf8(out.stdout).unwrap();
        for p in &paths {
            assert!(
                script.contains(p.last().unwrap().as_str()),
                "{shell}: {p:?}"
            );
        }
    }
    let out = boxoffice(&["completions", "tcsh"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "an unknown shell is a usage error"
    );

    // man: one page per path, and no other; each parent's page names its children's pages.
    let pages = dir.path().join("man1");
    let out = boxoffice(&["man", "--out-dir", pages.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let page_of = |p: &[String]| {
        std::iter::once("boxoffice")
            .chain(p.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("-")
    };
    let mut expected: Vec<String> = parents
        .iter()
        .chain(paths.iter())
        .map(|p| format!("{}.1", page_of(p)))
        .collect();
    expected.sort();
    expected.dedup();
    let mut written: Vec<String> = std::fs::read_dir(&pages)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(written, expected);
    for child in &paths {
        let parent = page_of(&child[..child.len() - 1]);
        let roff = std::fs::read_to_string(pages.join(format!("{parent}.1"))).unwrap();
        let named = format!("{}(1)", page_of(child).replace('-', "\\-"));
        assert!(roff.contains(&named), "{parent}.1 does not name {named}");
        let own = std::fs::read_to_string(pages.join(format!("{}.1", page_of(child)))).unwrap();
        assert!(own.contains(".TH"), "{child:?}: not a man page");
    }
    // Without --out-dir: the command's page on stdout.
    let out = boxoffice(&["man"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.contains(".TH boxoffice 1") && page.contains("boxoffice\\-serve(1)"));
}
