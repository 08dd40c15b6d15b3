//! A disk that can lose power, for crash tests: an in-memory FUSE filesystem
//! ([`PowerCutDisk`]) that keeps, for every file, what reads see now and what an `fsync` made
//! durable, and for the namespace (names, directories, renames) the same two versions.
//!
//! - `write`, truncation and `fallocate` change the current content only.
//! - `fsync` or `fdatasync` of a file makes its current content durable and commits the
//!   namespace journal: every create, mkdir, unlink, rmdir and rename done so far becomes durable
//!   (as one ext4 journal commit would). `fsync` of a directory commits the journal only.
//!   `close`, `sync_file_range`, `syncfs`/`sync` (the kernel does not pass them to a FUSE
//!   filesystem) and sled's `flush` alone make nothing durable.
//! - [`PowerCutDisk::power_cut`] unmounts (every process using the disk must be dead already),
//!   reverts every file and the namespace to their durable state ([`Cut::DropUnsynced`]), or
//!   lets a seeded random part of the unsynced pages and a prefix of the uncommitted namespace
//!   operations survive ([`Cut::KeepSomeUnsynced`]), and mounts the result again at the same
//!   path, so that no kernel cache of the old state survives either.
//!
//! Faults can be switched on at any time: failing fsyncs ([`PowerCutDisk::set_fsync_fails`]),
//! a full disk ([`PowerCutDisk::set_capacity`]), slow writes and fsyncs
//! ([`PowerCutDisk::set_op_delay`]). File modes and times are kept but not subject to cuts.
//!
//! Mounting needs `/dev/fuse` and, as root, nothing else (fuser mounts with `mount(2)`); other
//! users need `fusermount3` (Debian's `fuse3`). [`available`] says whether this machine can.
//! Locks (`flock`, `fcntl`) are left to the kernel, which keeps them locally per mount.
//!
//! Kernel caches: writes go through to the filesystem at once (no writeback cache), names and
//! attributes are cached for 1 s (every change passes through the kernel, so within one mount
//! they stay right), pages are dropped at each open. A cut remounts, so nothing the kernel
//! cached of the old state survives it; no `direct_io` is needed.

mod file;
mod fs;
mod report;
pub mod sled_plan;
mod state;

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use fuser::{BackgroundSession, Config, MountOption};
use rustix::io::Errno;
use rustix::mount::UnmountFlags;

use crate::fs::{Fs, Shared};
pub use crate::report::{Cut, CutReport, Stats};
use crate::state::State;

/// An in-memory filesystem mounted with FUSE that loses what was not fsynced when
/// [`power_cut`](PowerCutDisk::power_cut) is called (see the crate doc). Unmounted on drop.
#[derive(Debug)]
pub struct PowerCutDisk {
    mountpoint: PathBuf,
    shared: Arc<Shared>,
    session: Mutex<Option<BackgroundSession>>,
}

/// Starts a FUSE session serving `shared` (as of `generation`) at `mountpoint`.
fn spawn(
    shared: &Arc<Shared>,
    mountpoint: &Path,
    generation: u64,
) -> io::Result<BackgroundSession> {
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("powercut".to_owned())];
    fuser::spawn_mount(Fs::new(Arc::clone(shared), generation), mountpoint, &config)
}

/// Unmounts `mountpoint` and waits for `session` to end. A mount that stays busy for 5 s (a
/// process still using it) is detached lazily; its session then ends when the last user goes, and
/// cannot touch the state meanwhile (its generation is stale after the cut).
fn unmount(mountpoint: &Path, session: BackgroundSession) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match rustix::mount::unmount(mountpoint, UnmountFlags::empty()) {
            Ok(()) => break,
            Err(Errno::INTR) => {}
            Err(Errno::BUSY) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(Errno::BUSY) => {
                rustix::mount::unmount(mountpoint, UnmountFlags::DETACH)?;
                // The session thread goes on until the last user closes the detached mount.
                return Ok(());
            }
            // Not mounted any more (someone unmounted it): nothing to do.
            Err(Errno::INVAL) => break,
            // Not root: ask the setuid helper.
            Err(Errno::PERM) => {
                fusermount_unmount(mountpoint)?;
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    // The kernel ends the connection on unmount; the session thread sees it and returns.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !session.guard.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    if session.guard.is_finished() {
        // The session's own result (its end after the unmount) is of no interest.
        let _ = session.join();
    }
    Ok(())
}

/// `fusermount3 -u -z` (or `fusermount`), for a mount made by a user other than root.
fn fusermount_unmount(mountpoint: &Path) -> io::Result<()> {
    let mut last = io::Error::other("neither fusermount3 nor fusermount ran");
    for helper in ["fusermount3", "fusermount"] {
        match std::process::Command::new(helper)
            .args(["-u", "-z", "--"])
            .arg(mountpoint)
            .output()
        {
            Ok(out) if out.status.success() => return Ok(()),
            Ok(out) => {
                last = io::Error::other(format!(
                    "{helper} -u failed: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl PowerCutDisk {
    /// Mounts an empty filesystem at `mountpoint` (an existing empty directory).
    pub fn mount(mountpoint: &Path) -> io::Result<PowerCutDisk> {
        let mountpoint = mountpoint.canonicalize()?;
        if std::fs::read_dir(&mountpoint)?.next().is_some() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not empty", mountpoint.display()),
            ));
        }
        let state = State::new(
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        );
        let shared = Arc::new(Shared::new(state));
        let session = spawn(&shared, &mountpoint, 0)?;
        Ok(PowerCutDisk {
            mountpoint,
            shared,
            session: Mutex::new(Some(session)),
        })
    }

    /// Where the disk is mounted (canonical).
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// Cuts the power: unmounts (every process using the mount must be dead already: kill them
    /// with SIGKILL and wait for them first), reverts to the durable state as `cut` says, and
    /// mounts the result again at the same path.
    pub fn power_cut(&self, cut: Cut) -> io::Result<CutReport> {
        let mut session = self.session.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(old) = session.take() {
            unmount(&self.mountpoint, old)?;
        }
        let (report, generation) = {
            let mut state = self.shared.lock();
            state.generation += 1;
            (state.cut(cut), state.generation)
        };
        *session = Some(spawn(&self.shared, &self.mountpoint, generation)?);
        Ok(report)
    }

    /// From now on (`true`), every `fsync`, `fdatasync` and directory `fsync` answers `EIO` and
    /// makes nothing durable; what was written stays readable. A later successful fsync (after
    /// `false`) makes the file's whole current content durable (kinder than Linux, which may
    /// have dropped the pages whose writeback failed).
    pub fn set_fsync_fails(&self, fail: bool) {
        self.shared.fsync_fails.store(fail, Ordering::SeqCst);
    }

    /// Limits the sum of the current sizes of all files to `bytes` (`None`: no limit). A write,
    /// truncate or `fallocate` that would grow a file past it answers `ENOSPC` and changes
    /// nothing (a `write(2)` larger than one FUSE request may still be written in part).
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.shared.set_capacity(bytes);
    }

    /// Makes every write, fsync and directory fsync take at least `delay` (zero: no delay). The
    /// disk serves one request at a time, so the requests behind a slow one wait too. A long
    /// delay is a stalled disk; lowering it ends the waits under way (each waits for the delay
    /// as it is now).
    pub fn set_op_delay(&self, delay: Duration) {
        self.shared.set_op_delay(delay);
    }

    /// Counters, and what is not durable yet.
    pub fn stats(&self) -> Stats {
        self.shared.lock().stats()
    }
}

impl Drop for PowerCutDisk {
    fn drop(&mut self) {
        let session = self
            .session
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(session) = session {
            // Nothing to do about a failure here; the mount goes away with this process.
            let _ = unmount(&self.mountpoint, session);
        }
    }
}

/// Whether FUSE can be used here: `/dev/fuse` opens, and a disk mounts and unmounts (tried once
/// per process, in a directory under the temporary directory). `Err` says what is missing.
pub fn available() -> Result<(), String> {
    static PROBE: OnceLock<Result<(), String>> = OnceLock::new();
    PROBE.get_or_init(probe).clone()
}

/// Mounts a disk in a fresh directory, checks it answers, and unmounts it.
fn probe() -> Result<(), String> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| format!("cannot open /dev/fuse: {e}"))?;
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "powercut-probe-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let res = PowerCutDisk::mount(&dir)
        .map_err(|e| {
            let helper = if rustix::process::geteuid().is_root() {
                ""
            } else {
                " (not root: is fusermount3, Debian's `fuse3`, installed?)"
            };
            format!("cannot mount a FUSE filesystem{helper}: {e}")
        })
        .and_then(|disk| {
            std::fs::metadata(disk.path())
                .map(drop)
                .map_err(|e| format!("the FUSE mount does not answer: {e}"))
        });
    let _ = std::fs::remove_dir(&dir);
    res
}

/// For tests: `true` if FUSE is [`available`]; otherwise prints why and returns `false` (the
/// test should return), or panics if the environment variable `BOXOFFICE_REQUIRE_FUSE` is `1`.
pub fn fuse_or_skip(test: &str) -> bool {
    match available() {
        Ok(()) => true,
        Err(why) => {
            if std::env::var("BOXOFFICE_REQUIRE_FUSE").is_ok_and(|v| v == "1") {
                panic!("{test}: FUSE is required (BOXOFFICE_REQUIRE_FUSE=1) but: {why}");
            }
            eprintln!("{test}: skipped, FUSE is not available: {why}");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_disk_can_be_shared_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::PowerCutDisk>();
    }
}
