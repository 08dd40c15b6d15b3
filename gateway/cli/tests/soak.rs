//! The `boxoffice soak` binary, short: the cycles, then the restart in a fresh process. Counts
//! only (never a time or a memory figure).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Command;

#[test]
fn a_short_soak_with_its_restart_adds_up() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let json = dir.path().join("soak.json");
    let out = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
        .args(["soak", "--cycles", "2000", "--concurrency", "8"])
        .args([
            "--sample-every",
            "1000",
            "--rss-ratio-max",
            "1000",
            "--data-dir",
        ])
        .arg(&data_dir)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("result: nothing held at the end"),
        "{stdout}"
    );
    assert!(stdout.contains("restart (fresh process)"), "{stdout}");
    let report = std::fs::read_to_string(&json).unwrap();
    for want in [
        "\"holds\":2000",
        "\"releases\":2000",
        "\"errors\":0",
        "\"counts_end\":[8,8,0,0]",
        "\"quota_end\":0",
        "\"clean\":true",
    ] {
        assert!(report.contains(want), "{want} in {report}");
    }
    assert!(report.contains("\"reopened\":{"), "{report}");
}

/// A soak that misses its memory target fails with exit code 1 and says by how much; one that
/// could not measure memory fails too. Nothing leaked, so never exit code 3.
#[test]
fn a_soak_that_misses_its_memory_target_exits_1() {
    for (extra, want) in [
        (
            ["--rss-ratio-max", "0.01", "--sample-every", "100"],
            "result: FAILED: memory grew past its target (ratio ",
        ),
        (
            ["--rss-ratio-max", "1000", "--sample-every", "1000"],
            "result: FAILED: memory was not measured (fewer cycles than --sample-every)",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_boxoffice"))
            .args(["soak", "--cycles", "200", "--concurrency", "4"])
            .args(extra)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(want), "{want:?} in {stdout}");
        assert!(stdout.contains("nothing leaked"), "{stdout}");
    }
}
