//! sled 0.34.7 on the power-cut disk: what it flushed and fsynced survives a cut, what it did
//! not is gone, and it opens cleanly after cut upon cut. Skips itself without FUSE (unless
//! `BOXOFFICE_REQUIRE_FUSE=1`).
//!
//! sled writes in another process (the helper binary `powercut-sled-child`, see
//! `boxoffice_powercut::sled_plan`), killed with SIGKILL before the cut: dropping a `sled::Db`
//! fsyncs its data file (sled's `Log` drop), so a graceful close would make everything durable.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use boxoffice_powercut::sled_plan::{DONE, INSERTED, key, open_quiet, value};
use boxoffice_powercut::{Cut, PowerCutDisk, fuse_or_skip};

/// Checks that every key of `must` is there with its value; returns how many of `may` are there
/// (each with its value, never another).
fn check(db: &sled::Db, must: std::ops::Range<u64>, may: std::ops::Range<u64>, what: &str) -> u64 {
    for i in must {
        let got = db.get(key(i)).unwrap();
        assert_eq!(
            got.as_deref(),
            Some(&value(i)[..]),
            "{what}: flushed and synced key {i} lost or wrong"
        );
    }
    let mut present = 0;
    for i in may {
        if let Some(v) = db.get(key(i)).unwrap() {
            assert_eq!(
                &v[..],
                &value(i)[..],
                "{what}: unsynced key {i} has a wrong value"
            );
            present += 1;
        }
    }
    present
}

/// A child running `plan` on the database in `dir`, and its output.
fn spawn_child(dir: &Path, plan: &str) -> (Child, std::io::Lines<BufReader<ChildStdout>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_powercut-sled-child"))
        .arg(dir)
        .arg(plan)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

/// Runs `plan` in a child until it prints [`DONE`], then kills it with SIGKILL.
fn run_and_kill(dir: &Path, plan: &str) {
    let (mut child, lines) = spawn_child(dir, plan);
    let mut done = false;
    for line in lines {
        if line.unwrap().contains(DONE) {
            done = true;
            break;
        }
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(done, "the child did not finish its plan {plan:?}: {status}");
}

#[test]
fn sled_keeps_what_it_flushed_and_fsynced() {
    if !fuse_or_skip("sled_keeps_what_it_flushed_and_fsynced") {
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let disk = PowerCutDisk::mount(mnt.path()).unwrap();
    let dir = disk.path().join("db");
    run_and_kill(&dir, "quiet,sync:0:500,flush:500:1000,insert:1000:1100");
    assert!(disk.stats().unsynced_bytes > 0);
    let report = disk.power_cut(Cut::DropUnsynced).unwrap();
    assert!(report.bytes_dropped > 0, "{report:?}");
    let db = open_quiet(&dir);
    let present = check(&db, 0..500, 500..1100, "after the cut");
    assert_eq!(present, 0, "keys never fsynced survived the cut");
    assert_eq!(db.len(), 500);
}

/// sled's `flush` alone (pwrite and `sync_file_range`) does not make anything durable: a power
/// cut right after it loses every key (sled#1452; the engine fsyncs the data file itself).
#[test]
fn sled_flush_alone_is_not_durable() {
    if !fuse_or_skip("sled_flush_alone_is_not_durable") {
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let disk = PowerCutDisk::mount(mnt.path()).unwrap();
    let dir = disk.path().join("db");
    run_and_kill(&dir, "quiet,flush:0:200");
    disk.power_cut(Cut::DropUnsynced).unwrap();
    let db = open_quiet(&dir);
    assert_eq!(check(&db, 0..0, 0..200, "after flush alone"), 0);
    assert_eq!(db.len(), 0);
}

/// 20 cycles of: a child opens sled, inserts and fsyncs a batch, inserts another (flushed by
/// sled every other cycle, never fsynced), is killed; a cut (all unsynced data dropped, or every
/// third time a seeded part of it kept); sled reopens here and every synced key is there.
#[test]
fn sled_reopens_cleanly_after_many_cuts() {
    if !fuse_or_skip("sled_reopens_cleanly_after_many_cuts") {
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let disk = PowerCutDisk::mount(mnt.path()).unwrap();
    let dir = disk.path().join("db");
    const BATCH: u64 = 200;
    // Batches flushed and fsynced (must be there), and batches never fsynced (may be there,
    // with the right value only if so).
    let mut must: Vec<std::ops::Range<u64>> = Vec::new();
    let mut may: Vec<std::ops::Range<u64>> = Vec::new();
    let check_all = |must: &[std::ops::Range<u64>], may: &[std::ops::Range<u64>], what: &str| {
        let db = open_quiet(&dir);
        for r in must {
            check(&db, r.clone(), 0..0, what);
        }
        may.iter()
            .map(|r| check(&db, 0..0, r.clone(), what))
            .sum::<u64>()
        // dropping the db here fsyncs what recovery found: already durable after the cut
    };
    let mut next = 0;
    let (mut dropped, mut kept, mut kept_keys) = (0, 0, 0);
    for cycle in 0..20_u64 {
        let unsynced = if cycle % 2 == 0 { "flush" } else { "insert" };
        let plan = format!(
            "quiet,sync:{}:{},{unsynced}:{}:{}",
            next,
            next + BATCH,
            next + BATCH,
            next + 2 * BATCH
        );
        run_and_kill(&dir, &plan);
        must.push(next..next + BATCH);
        may.push(next + BATCH..next + 2 * BATCH);
        next += 2 * BATCH;
        let cut = if cycle % 3 == 2 {
            Cut::KeepSomeUnsynced { seed: cycle }
        } else {
            Cut::DropUnsynced
        };
        let report = disk.power_cut(cut).unwrap();
        dropped += report.bytes_dropped;
        kept += report.bytes_kept;
        check_all(&must, &may, &format!("cycle {cycle} ({cut:?})"));
        if cut == Cut::DropUnsynced {
            let db = open_quiet(&dir);
            let this_cycle = may.last().cloned().unwrap_or(0..0);
            let survived = check(&db, 0..0, this_cycle, &format!("cycle {cycle}"));
            assert_eq!(
                survived, 0,
                "cycle {cycle}: unsynced keys survived a DropUnsynced cut"
            );
        } else {
            let db = open_quiet(&dir);
            kept_keys += check(&db, 0..0, may.last().cloned().unwrap_or(0..0), "kept");
        }
    }
    eprintln!("KeepSomeUnsynced cuts kept {kept_keys} unsynced keys");
    eprintln!("the cuts dropped {dropped} bytes and kept {kept} unsynced bytes");
    assert!(dropped > 0);
    assert!(disk.stats().fsyncs >= 20);
}

/// The real shape of a crash test: sled with its default settings in another process, killed
/// with SIGKILL while it writes, then a power cut: every key it fsynced is there, sled opens,
/// and the keys its background flusher fsynced may be there too (each with its value).
#[test]
fn sled_survives_kill_9_and_a_cut() {
    if !fuse_or_skip("sled_survives_kill_9_and_a_cut") {
        return;
    }
    let mnt = tempfile::tempdir().unwrap();
    let disk = PowerCutDisk::mount(mnt.path()).unwrap();
    let dir = disk.path().join("db");
    for round in 0..3_u64 {
        let start = 1_000_000 * (round + 1);
        let (mut child, lines) = spawn_child(
            &dir,
            &format!(
                "default,sync:{start}:{},forever:{}",
                start + 1000,
                start + 1000
            ),
        );
        let mut inserted = 0;
        let began = std::time::Instant::now();
        for line in lines {
            if let Some((_, n)) = line.unwrap().split_once(INSERTED) {
                inserted = n.trim().parse().unwrap();
                // long enough for sled's background flusher (every 500 ms) to fsync a few times
                if inserted >= start + 5000 && began.elapsed() > Duration::from_millis(1500) {
                    break;
                }
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        assert!(
            inserted >= start + 5000,
            "round {round}: the child stopped at {inserted}"
        );
        let report = disk.power_cut(Cut::DropUnsynced).unwrap();
        let db = open_quiet(&dir);
        for earlier in 0..round {
            let s = 1_000_000 * (earlier + 1);
            check(
                &db,
                s..s + 1000,
                0..0,
                &format!("round {round}, keys of round {earlier}"),
            );
        }
        let present = check(
            &db,
            start..start + 1000,
            start + 1000..inserted,
            &format!("round {round}"),
        );
        eprintln!(
            "round {round}: {present} of {} keys written after the sync survived; the cut \
             dropped {} bytes",
            inserted - start - 1000,
            report.bytes_dropped
        );
    }
}
