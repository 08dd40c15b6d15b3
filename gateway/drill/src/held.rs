//! A data dir another process holds: found at once, before anything is opened, and named.
//!
//! While a server (or any command that opened the engine) runs on a data dir, sled holds an
//! exclusive `flock` on its `db` file (one per Raft group: `db` and `group-G/db`). Opening the
//! engine there would wait for the lock and then fail; every subcommand that works on a data
//! dir asks here first instead, and refuses at once with a [`UsageError`] (exit code 2) that
//! names the process holding it where the system says (Linux's `/proc/locks`).

use std::path::{Path, PathBuf};

use crate::secret::UsageError;

/// Refuses `data_dir` if another process holds any of its logs. A dir with no log yet (or no
/// dir) is free. The check takes each lock for a moment and gives it back.
pub fn refuse_if_held(data_dir: &Path) -> Result<(), UsageError> {
    for db in logs_of(data_dir) {
        let Ok(file) = std::fs::File::open(&db) else {
            continue;
        };
        match file.try_lock() {
            Ok(()) => {
                let _ = file.unlock();
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let by = holder_of(&db)
                    .map(|h| format!(" by {h}"))
                    .unwrap_or_else(|| " by another process".into());
                return Err(UsageError::new(format!(
                    "the data dir {} is held{by} (its log {} is locked): stop it first, or \
                     give another --data-dir",
                    data_dir.display(),
                    db.display()
                )));
            }
            // Locks not supported here: let the engine's own open decide.
            Err(std::fs::TryLockError::Error(_)) => {}
        }
    }
    Ok(())
}

/// The logs of a data dir: `db`, and each group's `group-G/db`.
fn logs_of(data_dir: &Path) -> Vec<PathBuf> {
    let mut logs = vec![data_dir.join("db")];
    if let Ok(entries) = std::fs::read_dir(data_dir) {
        let mut groups: Vec<PathBuf> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("group-"))
            .map(|e| e.path().join("db"))
            .collect();
        groups.sort();
        logs.extend(groups);
    }
    logs.into_iter().filter(|p| p.is_file()).collect()
}

/// "process PID (COMMAND LINE)" of the process whose `flock` is on `file`, if the system says.
fn holder_of(file: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(file).ok()?.ino();
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let pid = holder_in(&locks, inode)?;
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|raw| {
            let words: Vec<String> = raw
                .split(|&b| b == 0)
                .filter(|w| !w.is_empty())
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect();
            words.join(" ")
        })
        .filter(|c| !c.is_empty());
    Some(match command {
        Some(c) => format!("process {pid} ({})", shorten(&c, 120)),
        None => format!("process {pid}"),
    })
}

/// The pid of the `FLOCK` on inode `inode` in the text of `/proc/locks`
/// (`1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF`).
fn holder_in(locks: &str, inode: u64) -> Option<u32> {
    locks.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // A lock someone waits for is listed with "->" after its number: skip those.
        if fields.get(1) != Some(&"FLOCK") {
            return None;
        }
        let ino = fields.get(5)?.rsplit(':').next()?.parse::<u64>().ok()?;
        (ino == inode)
            .then(|| fields.get(4)?.parse().ok())
            .flatten()
    })
}

fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_read_from_proc_locks() {
        let locks = "1: POSIX  ADVISORY  WRITE 10 fd:01:77 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4242 fd:01:1234567 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 5151 fd:01:1234567 0 EOF\n";
        assert_eq!(holder_in(locks, 1234567), Some(4242));
        assert_eq!(holder_in(locks, 77), None, "a POSIX lock is not sled's");
        assert_eq!(holder_in(locks, 99), None);
    }

    #[test]
    fn a_held_dir_is_refused_at_once_naming_this_process_and_a_free_one_passes() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(refuse_if_held(dir.path()), Ok(()), "no log yet: free");
        let db = std::fs::File::create(dir.path().join("db")).unwrap();
        assert_eq!(
            refuse_if_held(dir.path()),
            Ok(()),
            "a log nobody holds: free"
        );
        // A second open file description's flock conflicts, even in this process.
        db.lock().unwrap();
        let e = refuse_if_held(dir.path()).unwrap_err().to_string();
        assert!(e.contains("is held by process"), "{e}");
        assert!(
            e.contains(&std::process::id().to_string()),
            "names the holder: {e}"
        );
        db.unlock().unwrap();
        std::fs::create_dir(dir.path().join("group-1")).unwrap();
        let g = std::fs::File::create(dir.path().join("group-1").join("db")).unwrap();
        g.lock().unwrap();
        let e = refuse_if_held(dir.path()).unwrap_err().to_string();
        assert!(e.contains("group-1"), "a group's log counts too: {e}");
    }
}
