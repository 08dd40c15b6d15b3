//! The FUSE side: [`fuser::Filesystem`] over the shared [`State`].

use std::ffi::OsStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, BsdFileFlags, Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::state::{Limits, State};

/// How long the kernel may cache names and attributes. Every change reaches the state through
/// the kernel, so its caches stay right within one mount; a cut remounts, which empties them.
const TTL: Duration = Duration::from_secs(1);

/// `u64::MAX` in [`Shared::capacity`]: no capacity limit.
const UNLIMITED: u64 = u64::MAX;

/// What the test process and the FUSE session share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) fsync_fails: AtomicBool,
    capacity: AtomicU64,
    op_delay_nanos: AtomicU64,
}

impl Shared {
    pub(crate) fn new(state: State) -> Shared {
        Shared {
            state: Mutex::new(state),
            fsync_fails: AtomicBool::new(false),
            capacity: AtomicU64::new(UNLIMITED),
            op_delay_nanos: AtomicU64::new(0),
        }
    }

    /// The state, even if a handler panicked while holding it.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_capacity(&self, bytes: Option<u64>) {
        self.capacity
            .store(bytes.unwrap_or(UNLIMITED), Ordering::SeqCst);
    }

    fn limits(&self) -> Limits {
        let cap = self.capacity.load(Ordering::SeqCst);
        Limits {
            capacity: (cap != UNLIMITED).then_some(cap),
        }
    }

    pub(crate) fn set_op_delay(&self, delay: Duration) {
        let nanos = u64::try_from(delay.as_nanos()).unwrap_or(u64::MAX);
        self.op_delay_nanos.store(nanos, Ordering::SeqCst);
    }

    /// Sleeps for the configured delay (a slow disk), outside the state lock. The delay is read
    /// again every 20 ms at most, so lowering it (a stalled disk mended) ends a wait early.
    fn delay(&self) {
        let started = std::time::Instant::now();
        loop {
            let nanos = self.op_delay_nanos.load(Ordering::SeqCst);
            let left = Duration::from_nanos(nanos).saturating_sub(started.elapsed());
            if left.is_zero() {
                return;
            }
            std::thread::sleep(left.min(Duration::from_millis(20)));
        }
    }
}

/// One FUSE session's view of the shared state: refuses to act (`EIO`) once a cut has moved the
/// state to a later generation.
pub(crate) struct Fs {
    shared: Arc<Shared>,
    generation: u64,
}

impl Fs {
    pub(crate) fn new(shared: Arc<Shared>, generation: u64) -> Fs {
        Fs { shared, generation }
    }

    /// Runs `f` on the state if this session is still the current one.
    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T, Errno>) -> Result<T, Errno> {
        let mut state = self.shared.lock();
        if state.generation != self.generation {
            return Err(Errno::EIO);
        }
        f(&mut state)
    }
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

/// The permission bits of `mode` under `umask`.
fn perm(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.with(|s| s.lookup(parent.0, name).and_then(|ino| s.attr(ino))) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.with(|s| s.attr(ino.0)) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let limits = self.shared.limits();
        let res = self.with(|s| {
            if let Some(size) = size {
                s.set_len(ino.0, size, limits)?;
            }
            if mode.is_some()
                || uid.is_some()
                || gid.is_some()
                || atime.is_some()
                || mtime.is_some()
            {
                s.set_meta(ino.0, mode, uid, gid, atime.map(time), mtime.map(time))?;
            }
            s.attr(ino.0)
        });
        match res {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        // Regular files only: sled and std need nothing else.
        let kind = mode & libc::S_IFMT;
        if kind != 0 && kind != libc::S_IFREG {
            reply.error(Errno::EPERM);
            return;
        }
        let res = self.with(|s| {
            let ino = s.create(
                parent.0,
                name,
                false,
                perm(mode, umask),
                req.uid(),
                req.gid(),
            )?;
            s.attr(ino)
        });
        match res {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let res = self.with(|s| {
            let ino = s.create(
                parent.0,
                name,
                true,
                perm(mode, umask),
                req.uid(),
                req.gid(),
            )?;
            s.attr(ino)
        });
        match res {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with(|s| s.remove(parent.0, name, false)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.with(|s| s.remove(parent.0, name, true)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            // RENAME_EXCHANGE and RENAME_WHITEOUT are not supported.
            reply.error(Errno::EINVAL);
            return;
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        match self.with(|s| s.rename(parent.0, name, newparent.0, newname, noreplace)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|s| s.open(ino.0)) {
            Ok(fh) => reply.opened(FileHandle(fh), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let res = self.with(|s| {
            let ino = s.create(
                parent.0,
                name,
                false,
                perm(mode, umask),
                req.uid(),
                req.gid(),
            )?;
            let fh = s.open(ino)?;
            Ok((s.attr(ino)?, fh))
        });
        match res {
            Ok((attr, fh)) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(fh),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let state = self.shared.lock();
        if state.generation != self.generation {
            reply.error(Errno::EIO);
            return;
        }
        match state.read(ino.0, offset, size) {
            Ok(data) => reply.data(data),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        self.shared.delay();
        let limits = self.shared.limits();
        match self.with(|s| s.write(ino.0, offset, data, limits)) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        match self.with(|s| {
            s.release(fh.0);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.delay();
        let fail = self.shared.fsync_fails.load(Ordering::SeqCst);
        match self.with(|s| s.fsync(ino.0, fail)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        match self.with(|s| s.entries(ino.0)) {
            Ok(entries) => {
                let skip = usize::try_from(offset).unwrap_or(usize::MAX);
                for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(skip) {
                    if reply.add(INodeNo(child), i as u64 + 1, kind, &name) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(e),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.shared.delay();
        let fail = self.shared.fsync_fails.load(Ordering::SeqCst);
        match self.with(|s| s.fsyncdir(ino.0, fail)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        const BLOCK: u64 = 4096;
        let total = self.shared.limits().capacity.unwrap_or(1 << 40);
        let (used, inodes) = self.shared.lock().usage();
        let free = total.saturating_sub(used) / BLOCK;
        reply.statfs(
            total / BLOCK,
            free,
            free,
            inodes + 1_000_000,
            1_000_000,
            BLOCK as u32,
            255,
            BLOCK as u32,
        );
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // No permission checks: the tests run as the mount's owner.
        match self.with(|s| s.attr(ino.0).map(|_| ())) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let limits = self.shared.limits();
        match self.with(|s| s.fallocate(ino.0, offset, length, mode, limits)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }
}
