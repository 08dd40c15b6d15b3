//! The power-cut disk through the kernel: files written with std, a cut, and what is left.
//! Each test skips itself without FUSE (unless `BOXOFFICE_REQUIRE_FUSE=1`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use boxoffice_powercut::{Cut, PowerCutDisk, fuse_or_skip};

/// A disk mounted in a temporary directory; unmounted before the directory goes.
struct Mounted {
    disk: PowerCutDisk,
    _dir: tempfile::TempDir,
}

impl Mounted {
    fn path(&self, name: &str) -> PathBuf {
        self.disk.path().join(name)
    }

    fn cut(&self) -> boxoffice_powercut::CutReport {
        self.disk.power_cut(Cut::DropUnsynced).unwrap()
    }
}

fn mounted(test: &str) -> Option<Mounted> {
    if !fuse_or_skip(test) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let disk = PowerCutDisk::mount(dir.path()).unwrap();
    Some(Mounted { disk, _dir: dir })
}

fn read(path: &Path) -> Option<Vec<u8>> {
    match fs::read(path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("reading {}: {e}", path.display()),
    }
}

/// A write that was not fsynced is gone after a cut; with `fsync` or `fdatasync` it stays.
#[test]
fn unsynced_writes_are_lost_and_synced_ones_kept() {
    let Some(m) = mounted("unsynced_writes_are_lost_and_synced_ones_kept") else {
        return;
    };
    let mut a = File::create(m.path("a")).unwrap();
    a.write_all(b"hello").unwrap();
    a.sync_all().unwrap();
    a.write_all(b" world").unwrap();
    drop(a);

    let mut b = File::create(m.path("b")).unwrap();
    b.write_all(b"data-synced").unwrap();
    b.sync_data().unwrap();
    b.write_all_at(b"DATA", 0).unwrap();
    drop(b);

    let mut c = File::create(m.path("c")).unwrap();
    c.write_all(b"ccc").unwrap();
    c.sync_all().unwrap();
    c.set_len(1).unwrap(); // an unsynced truncation
    drop(c);

    assert_eq!(read(&m.path("a")).unwrap(), b"hello world");
    // syncfs(2) does not reach a FUSE filesystem: it makes nothing durable
    let status = std::process::Command::new("sync")
        .arg("-f")
        .arg(m.disk.path())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(m.disk.stats().unsynced_bytes, 6 + 4 + 2);
    let report = m.cut();
    assert_eq!(read(&m.path("a")).unwrap(), b"hello");
    assert_eq!(read(&m.path("b")).unwrap(), b"data-synced");
    assert_eq!(read(&m.path("c")).unwrap(), b"ccc");
    assert_eq!(report.bytes_dropped, 6 + 4 + 2);
    assert_eq!(
        report.files_reverted,
        vec![PathBuf::from("a"), PathBuf::from("b"), PathBuf::from("c")]
    );
    let stats = m.disk.stats();
    assert_eq!(stats.unsynced_bytes, 0);
    assert_eq!(stats.fsyncs, 3);
    assert_eq!(stats.fsyncs_by_path.get(Path::new("b")), Some(&1));
}

/// A file created and never synced is gone after a cut, unless a later fsync (of any file)
/// committed the journal: then it is there with its durable content, empty.
#[test]
fn new_names_need_a_journal_commit() {
    let Some(m) = mounted("new_names_need_a_journal_commit") else {
        return;
    };
    fs::write(m.path("lost"), b"never synced").unwrap();
    fs::create_dir(m.path("dir")).unwrap();
    let report = m.cut();
    assert_eq!(read(&m.path("lost")), None);
    assert!(!m.path("dir").exists());
    assert_eq!(report.ops_dropped, 2);
    assert_eq!(
        report.names_vanished,
        vec![PathBuf::from("dir"), PathBuf::from("lost")]
    );

    fs::write(m.path("named"), b"content never synced").unwrap();
    fs::create_dir(m.path("dir")).unwrap();
    fs::write(m.path("dir/inner"), b"x").unwrap();
    File::create(m.path("other")).unwrap().sync_all().unwrap(); // commits everything above
    fs::write(m.path("late"), b"created after the commit").unwrap();
    m.cut();
    assert_eq!(read(&m.path("named")).unwrap(), b"");
    assert_eq!(read(&m.path("dir/inner")).unwrap(), b"");
    assert_eq!(read(&m.path("other")).unwrap(), b"");
    assert_eq!(read(&m.path("late")), None);
    let mut names: Vec<_> = fs::read_dir(m.disk.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["dir", "named", "other"]);
}

/// A rename (also one replacing a file) is undone by a cut until the journal is committed, by a
/// file's fsync or a directory's.
#[test]
fn renames_follow_the_journal() {
    let Some(m) = mounted("renames_follow_the_journal") else {
        return;
    };
    for (name, data) in [("old", "OLD"), ("target", "TARGET"), ("tmp", "NEW")] {
        let mut f = File::create(m.path(name)).unwrap();
        f.write_all(data.as_bytes()).unwrap();
        f.sync_all().unwrap();
    }
    fs::rename(m.path("old"), m.path("new")).unwrap();
    fs::rename(m.path("tmp"), m.path("target")).unwrap();
    assert_eq!(read(&m.path("target")).unwrap(), b"NEW");
    assert_eq!(m.disk.stats().uncommitted_ops, 2);
    let report = m.cut();
    assert_eq!(read(&m.path("old")).unwrap(), b"OLD");
    assert_eq!(read(&m.path("new")), None);
    assert_eq!(read(&m.path("target")).unwrap(), b"TARGET");
    assert_eq!(read(&m.path("tmp")).unwrap(), b"NEW");
    assert_eq!(report.names_reappeared.len(), 3); // old, tmp, and target's old inode

    // committed by fsync of the directory
    fs::rename(m.path("tmp"), m.path("target")).unwrap();
    File::open(m.disk.path()).unwrap().sync_all().unwrap();
    // committed by fsync of an unrelated file
    fs::rename(m.path("old"), m.path("new")).unwrap();
    File::create(m.path("unrelated"))
        .unwrap()
        .sync_data()
        .unwrap();
    m.cut();
    assert_eq!(read(&m.path("target")).unwrap(), b"NEW");
    assert_eq!(read(&m.path("tmp")), None);
    assert_eq!(read(&m.path("new")).unwrap(), b"OLD");
    assert_eq!(read(&m.path("old")), None);
    assert_eq!(m.disk.stats().dir_fsyncs, 1);
}

/// With failing fsyncs, `fsync` and `fdatasync` answer EIO, the data stays readable until the
/// cut, and the cut drops it.
#[test]
fn failing_fsync_answers_eio_and_makes_nothing_durable() {
    let Some(m) = mounted("failing_fsync_answers_eio_and_makes_nothing_durable") else {
        return;
    };
    let mut f = File::create(m.path("f")).unwrap();
    f.write_all(b"durable").unwrap();
    f.sync_all().unwrap();
    m.disk.set_fsync_fails(true);
    f.write_all(b" lost").unwrap();
    let err = f.sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let err = f.sync_data().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let err = File::open(m.disk.path()).unwrap().sync_all().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    fs::write(m.path("g"), b"g").unwrap();
    assert_eq!(read(&m.path("f")).unwrap(), b"durable lost");
    drop(f);
    let stats = m.disk.stats();
    assert_eq!((stats.fsyncs, stats.failed_fsyncs), (1, 3));
    m.cut();
    assert_eq!(read(&m.path("f")).unwrap(), b"durable");
    assert_eq!(read(&m.path("g")), None);

    // switched back: fsync works again
    m.disk.set_fsync_fails(false);
    let mut f = OpenOptions::new().append(true).open(m.path("f")).unwrap();
    f.write_all(b" again").unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.cut();
    assert_eq!(read(&m.path("f")).unwrap(), b"durable again");
}

/// A write or extension past the capacity answers ENOSPC and leaves the file as it was.
#[test]
fn a_full_disk_answers_enospc_and_changes_nothing() {
    let Some(m) = mounted("a_full_disk_answers_enospc_and_changes_nothing") else {
        return;
    };
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.path("f"))
        .unwrap();
    f.write_all(&[7; 1000]).unwrap();
    m.disk.set_capacity(Some(m.disk.stats().used_bytes + 1000));
    let err = f.write_all_at(&[9; 2000], 500).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let err = f.set_len(5000).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    let err = fs::write(m.path("g"), [1; 1001]).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert_eq!(f.metadata().unwrap().len(), 1000);
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, vec![7; 1000]);
    // overwriting in place and growing within the capacity still work
    f.write_all_at(&[8; 1000], 0).unwrap();
    f.write_all_at(&[8; 500], 1000).unwrap();
    assert_eq!(read(&m.path("f")).unwrap(), vec![8; 1500]);
    let vfs = free_bytes(m.disk.path());
    assert!(vfs <= 1000, "statfs says {vfs} bytes free");
    m.disk.set_capacity(None);
    f.write_all_at(&[1; 5000], 1500).unwrap();
}

/// Free bytes as statfs reports them.
fn free_bytes(path: &Path) -> u64 {
    let out = std::process::Command::new("stat")
        .args(["-f", "-c", "%a %S"])
        .arg(path)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let mut parts = text.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    parts.next().unwrap() * parts.next().unwrap()
}

/// The history every seed of `keep_some_unsynced` starts from: a synced file of 12 pages, then
/// unsynced overwrites, an extension, a new file and a rename.
fn keep_some_history(m: &Mounted) -> (Vec<u8>, Vec<u8>) {
    let durable: Vec<u8> = (0..12 * 4096).map(|i| (i % 251) as u8).collect();
    let mut f = File::create(m.path("f")).unwrap();
    f.write_all(&durable).unwrap();
    f.sync_all().unwrap();
    let mut current = durable.clone();
    for (off, len, byte) in [
        (100, 5000, 0xAA),
        (6 * 4096, 4096 * 3, 0xBB),
        (11 * 4096 + 7, 9000, 0xCC),
    ] {
        f.write_all_at(&vec![byte; len], off as u64).unwrap();
        if off + len > current.len() {
            current.resize(off + len, 0);
        }
        current[off..off + len].fill(byte);
    }
    drop(f);
    fs::write(m.path("new"), b"new file").unwrap();
    fs::rename(m.path("new"), m.path("renamed")).unwrap();
    (durable, current)
}

/// `KeepSomeUnsynced`: every byte is its durable or its pre-cut value; across seeds both happen;
/// the same seed gives the same result.
#[test]
fn keep_some_unsynced_keeps_only_durable_or_current_bytes() {
    if !fuse_or_skip("keep_some_unsynced_keeps_only_durable_or_current_bytes") {
        return;
    }
    let mut outcomes = Vec::new();
    let (mut saw_kept, mut saw_dropped, mut saw_names) = (false, false, [false; 3]);
    for seed in 0..24 {
        let m = mounted("keep_some_unsynced").unwrap();
        let (durable, current) = keep_some_history(&m);
        let report = m.disk.power_cut(Cut::KeepSomeUnsynced { seed }).unwrap();
        let after = read(&m.path("f")).unwrap();
        assert!(after.len() >= durable.len() && after.len() <= current.len());
        for (i, &b) in after.iter().enumerate() {
            let d = durable.get(i).copied().unwrap_or(0);
            assert!(
                b == d || b == current[i],
                "seed {seed}: byte {i} is {b:#x}, durable {d:#x}, current {:#x}",
                current[i]
            );
            saw_kept |= b == current[i] && b != d;
            saw_dropped |= b != current[i];
        }
        let names = (read(&m.path("new")), read(&m.path("renamed")));
        match report.ops_kept {
            0 => assert_eq!(names, (None, None)),
            1 => assert!(names.0.is_some() && names.1.is_none()),
            _ => assert!(names.0.is_none() && names.1.is_some()),
        }
        saw_names[report.ops_kept.min(2)] = true;
        outcomes.push((seed, after, names, report));
    }
    assert!(
        saw_kept && saw_dropped,
        "kept {saw_kept}, dropped {saw_dropped}"
    );
    assert_eq!(saw_names, [true; 3]);
    let distinct: std::collections::HashSet<_> = outcomes.iter().map(|o| o.1.clone()).collect();
    assert!(
        distinct.len() > 3,
        "only {} distinct outcomes",
        distinct.len()
    );
    // the same seed again: the same result
    for (seed, after, names, report) in outcomes.into_iter().take(4) {
        let m = mounted("keep_some_unsynced").unwrap();
        keep_some_history(&m);
        let again = m.disk.power_cut(Cut::KeepSomeUnsynced { seed }).unwrap();
        assert_eq!(again, report, "seed {seed}");
        assert_eq!(read(&m.path("f")).unwrap(), after, "seed {seed}");
        assert_eq!((read(&m.path("new")), read(&m.path("renamed"))), names);
    }
}

/// After a cut, reads and `stat` see the reverted state at once, for files whose sizes and
/// pages the kernel had cached just before (the cut remounts: nothing stale survives).
#[test]
fn reads_after_a_cut_see_the_reverted_bytes() {
    let Some(m) = mounted("reads_after_a_cut_see_the_reverted_bytes") else {
        return;
    };
    // Small files, checked at once after the cut (well within the kernel's attribute TTL): one
    // shrunk by an unsynced truncate, one grown by an unsynced append; the kernel has their
    // sizes from the truncate and the write (a read would refresh them).
    let mut shrunk = File::create(m.path("shrunk")).unwrap();
    shrunk.write_all(&[5; 3 * 4096]).unwrap();
    shrunk.sync_all().unwrap();
    shrunk.set_len(100).unwrap();
    drop(shrunk);
    let mut grown = File::create(m.path("grown")).unwrap();
    grown.write_all(b"base").unwrap();
    grown.sync_all().unwrap();
    grown.write_all(&[6; 10000]).unwrap();
    drop(grown);
    m.cut();
    let shrunk = read(&m.path("shrunk")).unwrap();
    assert!(
        shrunk == vec![5; 3 * 4096],
        "the truncation was not undone: {} bytes",
        shrunk.len()
    );
    assert_eq!(read(&m.path("grown")).unwrap(), b"base");
    assert_eq!(fs::metadata(m.path("shrunk")).unwrap().len(), 3 * 4096);
    assert_eq!(fs::metadata(m.path("grown")).unwrap().len(), 4);

    // A big file, read whole into the page cache before the cut.
    let size = 8 << 20;
    let synced: Vec<u8> = (0..size).map(|i| (i * 7 % 256) as u8).collect();
    let mut f = File::create(m.path("big")).unwrap();
    f.write_all(&synced).unwrap();
    f.sync_data().unwrap();
    // overwrite every other 64 KiB block, read it all back (into the kernel's page cache)
    for block in (0..size / 65536).step_by(2) {
        f.write_all_at(&[0xEE; 65536], (block * 65536) as u64)
            .unwrap();
    }
    f.write_all_at(b"tail", size as u64).unwrap();
    let mut seen = Vec::new();
    File::open(m.path("big"))
        .unwrap()
        .read_to_end(&mut seen)
        .unwrap();
    assert_eq!(seen.len(), size + 4);
    assert_eq!(&seen[..4], &[0xEE; 4]);
    drop(f);
    let report = m.cut();
    assert!(report.bytes_dropped > 0);
    assert_eq!(fs::metadata(m.path("big")).unwrap().len(), size as u64);
    let back = read(&m.path("big")).unwrap();
    assert!(
        back == synced,
        "the content after the cut is not the synced one"
    );
    // and the disk goes on working: write, sync, cut, read
    let f = OpenOptions::new().write(true).open(m.path("big")).unwrap();
    f.write_all_at(b"second", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    m.cut();
    assert_eq!(&read(&m.path("big")).unwrap()[..6], b"second");
}

/// Deleting a synced file, and the names in a directory, come back after a cut; and a file
/// still open after its unlink keeps working until closed.
#[test]
fn unlinks_are_undone_and_open_unlinked_files_work() {
    let Some(m) = mounted("unlinks_are_undone_and_open_unlinked_files_work") else {
        return;
    };
    fs::create_dir(m.path("d")).unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(m.path("d/f"))
        .unwrap();
    f.write_all(b"keep me").unwrap();
    f.sync_all().unwrap();
    fs::remove_file(m.path("d/f")).unwrap();
    fs::remove_dir(m.path("d")).unwrap();
    // POSIX: the open handle still reads and writes the inode
    f.write_all(b", still open").unwrap();
    let mut back = String::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_string(&mut back).unwrap();
    assert_eq!(back, "keep me, still open");
    drop(f);
    assert!(!m.path("d").exists());
    m.cut();
    assert_eq!(read(&m.path("d/f")).unwrap(), b"keep me");

    // committed removal stays removed
    fs::remove_file(m.path("d/f")).unwrap();
    fs::remove_dir(m.path("d")).unwrap();
    File::open(m.disk.path()).unwrap().sync_all().unwrap();
    m.cut();
    assert!(!m.path("d").exists());
    assert_eq!(m.disk.stats().used_bytes, 0);
}

/// A cut with a file still open (a process the test forgot to kill) still happens, after a
/// lazy unmount; the old handle cannot reach the new state.
#[test]
fn a_handle_left_open_cannot_touch_the_state_after_a_cut() {
    let Some(m) = mounted("a_handle_left_open_cannot_touch_the_state_after_a_cut") else {
        return;
    };
    let mut f = File::create(m.path("f")).unwrap();
    f.write_all(b"synced").unwrap();
    f.sync_all().unwrap();
    f.write_all(b" unsynced").unwrap();
    m.cut(); // busy for 5 s, then detached
    let err = f.write_all(b" after the cut").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    assert_eq!(f.sync_all().unwrap_err().raw_os_error(), Some(libc::EIO));
    drop(f);
    assert_eq!(read(&m.path("f")).unwrap(), b"synced");
}

/// What std and sled use works in the mount: directories, copies (`copy_file_range` falls back
/// to read/write), renames over a file, listing, permissions and times, `flock` (kept by the
/// kernel), and what is not supported fails cleanly.
#[test]
fn std_fs_operations_work() {
    let Some(m) = mounted("std_fs_operations_work") else {
        return;
    };
    fs::create_dir_all(m.path("a/b/c")).unwrap();
    fs::write(m.path("a/b/c/f"), b"0123456789").unwrap();
    assert_eq!(fs::copy(m.path("a/b/c/f"), m.path("a/g")).unwrap(), 10);
    assert_eq!(read(&m.path("a/g")).unwrap(), b"0123456789");
    fs::write(m.path("a/h"), b"h").unwrap();
    fs::rename(m.path("a/h"), m.path("a/g")).unwrap();
    assert_eq!(read(&m.path("a/g")).unwrap(), b"h");
    let mut names: Vec<_> = fs::read_dir(m.path("a"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().into_string().unwrap(),
                e.file_type().unwrap().is_dir(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(names, [("b".to_owned(), true), ("g".to_owned(), false)]);

    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(m.path("a/g"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        fs::metadata(m.path("a/g")).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let when = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    File::options()
        .write(true)
        .open(m.path("a/g"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    assert_eq!(
        fs::metadata(m.path("a/g")).unwrap().modified().unwrap(),
        when
    );

    // flock, as sled takes it on its data file: the kernel keeps it locally
    let first = File::open(m.path("a/g")).unwrap();
    let second = File::open(m.path("a/g")).unwrap();
    first.try_lock().unwrap();
    assert!(
        second.try_lock().is_err(),
        "a second exclusive flock was granted"
    );
    first.unlock().unwrap();
    second.try_lock().unwrap();
    drop((first, second));

    assert!(fs::hard_link(m.path("a/g"), m.path("a/link")).is_err());
    assert!(std::os::unix::fs::symlink("g", m.path("a/sym")).is_err());
    assert_eq!(
        fs::remove_dir(m.path("a")).unwrap_err().raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
    fs::remove_dir_all(m.path("a")).unwrap();
    assert_eq!(fs::read_dir(m.disk.path()).unwrap().count(), 0);
    assert_eq!(m.disk.stats().used_bytes, 0);
}

/// `set_op_delay` slows writes and fsyncs down; a write past the largest file size fails.
#[test]
fn slow_disk_and_file_size_limit() {
    let Some(m) = mounted("slow_disk_and_file_size_limit") else {
        return;
    };
    let mut f = File::create(m.path("f")).unwrap();
    m.disk.set_op_delay(std::time::Duration::from_millis(100));
    let t = std::time::Instant::now();
    f.write_all(b"slow").unwrap();
    f.sync_data().unwrap();
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    // A stalled disk (a delay of a minute) mended while a write and a sync wait on it: they
    // end then, not a minute later.
    m.disk.set_op_delay(std::time::Duration::from_secs(60));
    let t = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(200));
            m.disk.set_op_delay(std::time::Duration::ZERO);
        });
        f.write_all(b"fast").unwrap();
        f.sync_data().unwrap();
    });
    assert!(
        t.elapsed() < std::time::Duration::from_secs(30),
        "{:?}",
        t.elapsed()
    );
    let err = f.write_all_at(b"x", 1 << 33).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EFBIG), "{err}");
}
