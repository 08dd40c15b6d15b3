//! The writer of the sled tests (`tests/sled.rs`): a plan of sled writes that the helper
//! binary `powercut-sled-child` follows in a process of its own, which the test then kills with
//! SIGKILL before it cuts the power (dropping a `sled::Db` fsyncs its data file, so a graceful
//! close would make everything durable). The keys, their values and the durable write are
//! shared with the test, which checks what survived.

use std::fs::File;
use std::path::Path;
use std::time::Duration;

/// What the writer prints once its plan is done.
pub const DONE: &str = "POWERCUT-CHILD-DONE";
/// What the writer prints before each count of keys inserted (plan step `forever`).
pub const INSERTED: &str = "POWERCUT-CHILD-INSERTED ";

/// Key `i`.
pub fn key(i: u64) -> [u8; 8] {
    i.to_be_bytes()
}

/// The value of key `i` (of a length that varies with `i`).
pub fn value(i: u64) -> Vec<u8> {
    format!("value of key {i} ")
        .repeat(1 + (i % 7) as usize)
        .into_bytes()
}

/// sled without its background flusher: nothing reaches the disk durably unless the writer
/// flushes and fsyncs. sled releases its file lock from a background thread a little after the
/// last handle of the previous instance is dropped, so a busy lock is retried for up to
/// [`LOCK_WAIT`] (as the engine's `SledKv::open` does).
pub fn open_quiet(dir: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match sled::Config::new().path(dir).flush_every_ms(None).open() {
            Err(e)
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => {
                return other.unwrap_or_else(|e| panic!("sled opens {}: {e}", dir.display()));
            }
        }
    }
}

/// How long [`open_quiet`] waits for a previous instance's lock to go.
pub const LOCK_WAIT: Duration = Duration::from_secs(10);

/// What the engine does to make sled durable: sled's flush (which ends in `sync_file_range`,
/// not durable), then an fsync of its data file.
pub fn flush_and_sync(db: &sled::Db, dir: &Path) {
    db.flush().unwrap_or_else(|e| panic!("sled's flush: {e}"));
    File::open(dir.join("db"))
        .and_then(|f| f.sync_data())
        .unwrap_or_else(|e| panic!("the fsync of sled's data file: {e}"));
}

/// Inserts `keys`, each with its value.
pub fn insert(db: &sled::Db, keys: std::ops::Range<u64>) {
    for i in keys {
        db.insert(key(i), value(i))
            .unwrap_or_else(|e| panic!("inserting key {i}: {e}"));
    }
}

/// Follows `plan` on the database in `dir`, steps separated by commas: `quiet` or `default`
/// (open sled without its background flusher, or with its defaults: a flusher that fsyncs every
/// 500 ms; first step), `insert:A:B` (keys A..B), `flush:A:B` (insert, then sled's flush),
/// `sync:A:B` (insert, then sled's flush and an fsync of the data file), `forever:A` (insert from
/// A on without end, printing [`INSERTED`] and a count every 1000 keys). Then prints [`DONE`]
/// and waits to be killed. Panics on a plan it does not understand.
pub fn run(dir: &Path, plan: &str) -> ! {
    let mut db = None;
    for step in plan.split(',') {
        let parts: Vec<&str> = step.split(':').collect();
        let n = |i: usize| -> u64 {
            parts
                .get(i)
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("step {step:?}: no number {i}"))
        };
        let open = |db: &Option<sled::Db>| -> sled::Db {
            db.clone()
                .unwrap_or_else(|| panic!("step {step:?} before sled is open"))
        };
        match parts[0] {
            "quiet" => db = Some(open_quiet(dir)),
            "default" => db = Some(sled::open(dir).unwrap_or_else(|e| panic!("sled opens: {e}"))),
            "insert" => insert(&open(&db), n(1)..n(2)),
            "flush" => {
                insert(&open(&db), n(1)..n(2));
                open(&db)
                    .flush()
                    .unwrap_or_else(|e| panic!("sled's flush: {e}"));
            }
            "sync" => {
                insert(&open(&db), n(1)..n(2));
                flush_and_sync(&open(&db), dir);
            }
            "forever" => {
                let db = open(&db);
                for i in n(1).. {
                    insert(&db, i..i + 1);
                    if (i + 1) % 1000 == 0 {
                        println!("{INSERTED}{}", i + 1);
                    }
                }
            }
            other => panic!("unknown step {other}"),
        }
    }
    println!("{DONE}");
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
