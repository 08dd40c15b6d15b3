//! The whole filesystem in memory: inodes, the current and the durable namespace, the journal of
//! namespace operations not committed yet, and the power cut.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::SystemTime;

use fuser::{Errno, FileAttr, FileType, INodeNo};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::file::FileData;
use crate::report::{Cut, CutReport, Stats};

/// An inode number.
pub(crate) type Ino = u64;
/// The root directory's inode.
pub(crate) const ROOT: Ino = 1;
/// Largest file this filesystem accepts (beyond it writes answer `EFBIG`).
pub(crate) const MAX_FILE_SIZE: u64 = 1 << 32;

/// What an inode is.
#[derive(Debug)]
pub(crate) enum Node {
    /// A regular file and its bytes.
    File(FileData),
    /// A directory (its entries are in the namespaces).
    Dir,
}

/// An inode: its node and the attributes kept for `stat` (these are not subject to cuts).
#[derive(Debug)]
pub(crate) struct Inode {
    node: Node,
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    crtime: SystemTime,
    /// Names in the current namespace.
    nlink: u32,
    /// Open handles (files and directories).
    open: u32,
}

/// A namespace: the entries of every directory.
#[derive(Debug, Clone, Default)]
pub(crate) struct Namespace {
    dirs: HashMap<Ino, BTreeMap<OsString, Ino>>,
}

/// One namespace operation, as recorded in the journal. Replaying the journal in order on the
/// durable namespace gives the current one.
#[derive(Debug, Clone)]
pub(crate) enum NsOp {
    /// A new inode gets a name (create, mknod, mkdir).
    Link {
        parent: Ino,
        name: OsString,
        ino: Ino,
        dir: bool,
    },
    /// A name goes away (unlink, rmdir).
    Unlink { parent: Ino, name: OsString },
    /// A name moves, replacing what the new name pointed to.
    Rename {
        parent: Ino,
        name: OsString,
        newparent: Ino,
        newname: OsString,
    },
}

impl NsOp {
    /// The inode this operation gives a name to, if it creates one.
    fn created(&self) -> Option<Ino> {
        match self {
            NsOp::Link { ino, .. } => Some(*ino),
            _ => None,
        }
    }
}

impl Namespace {
    /// A namespace with an empty root directory.
    fn new() -> Namespace {
        let mut dirs = HashMap::new();
        dirs.insert(ROOT, BTreeMap::new());
        Namespace { dirs }
    }

    fn lookup(&self, parent: Ino, name: &OsStr) -> Option<Ino> {
        self.dirs.get(&parent).and_then(|d| d.get(name)).copied()
    }

    /// Applies `op`; returns the inodes that lost a name.
    fn apply(&mut self, op: &NsOp) -> Vec<Ino> {
        match op {
            NsOp::Link {
                parent,
                name,
                ino,
                dir,
            } => {
                self.dirs
                    .entry(*parent)
                    .or_default()
                    .insert(name.clone(), *ino);
                if *dir {
                    self.dirs.insert(*ino, BTreeMap::new());
                }
                Vec::new()
            }
            NsOp::Unlink { parent, name } => {
                let gone = self.dirs.get_mut(parent).and_then(|d| d.remove(name));
                if let Some(ino) = gone {
                    self.dirs.remove(&ino);
                }
                gone.into_iter().collect()
            }
            NsOp::Rename {
                parent,
                name,
                newparent,
                newname,
            } => {
                let Some(ino) = self.dirs.get_mut(parent).and_then(|d| d.remove(name)) else {
                    return Vec::new();
                };
                let replaced = self
                    .dirs
                    .entry(*newparent)
                    .or_default()
                    .insert(newname.clone(), ino);
                match replaced {
                    Some(old) if old != ino => {
                        self.dirs.remove(&old);
                        vec![old]
                    }
                    _ => Vec::new(),
                }
            }
        }
    }

    /// Every path (relative to the root) and the inode it names.
    fn paths(&self) -> BTreeMap<PathBuf, Ino> {
        let mut out = BTreeMap::new();
        let mut stack = vec![(ROOT, PathBuf::new())];
        while let Some((dir, path)) = stack.pop() {
            for (name, &ino) in self.dirs.get(&dir).into_iter().flatten() {
                let p = path.join(name);
                if self.dirs.contains_key(&ino) {
                    stack.push((ino, p.clone()));
                }
                out.insert(p, ino);
            }
        }
        out
    }

    /// The path of `ino`, if it has a name.
    fn path_of(&self, ino: Ino) -> Option<PathBuf> {
        let mut parts = Vec::new();
        let mut cur = ino;
        while cur != ROOT {
            let (parent, name) = self
                .dirs
                .iter()
                .find_map(|(p, d)| d.iter().find(|(_, i)| **i == cur).map(|(n, _)| (*p, n)))?;
            parts.push(name.clone());
            cur = parent;
            if parts.len() > 4096 {
                return None;
            }
        }
        Some(parts.iter().rev().collect())
    }

    /// The parent directory of the directory `dir`.
    fn parent_of(&self, dir: Ino) -> Ino {
        self.dirs
            .iter()
            .find_map(|(p, d)| d.values().any(|i| *i == dir).then_some(*p))
            .unwrap_or(ROOT)
    }

    /// Every inode with a name, and the root.
    fn named(&self, into: &mut HashSet<Ino>) {
        into.insert(ROOT);
        into.extend(self.dirs.values().flat_map(|d| d.values().copied()));
    }

    /// Whether `ancestor` is `dir` or one of its ancestors.
    fn is_ancestor(&self, ancestor: Ino, dir: Ino) -> bool {
        let mut cur = dir;
        for _ in 0..4096 {
            if cur == ancestor {
                return true;
            }
            if cur == ROOT {
                return false;
            }
            cur = self.parent_of(cur);
        }
        false
    }
}

/// Settings of a cut-in fault that the handlers read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Limits {
    /// Most bytes all current file contents may take together.
    pub(crate) capacity: Option<u64>,
}

/// The filesystem.
#[derive(Debug)]
pub(crate) struct State {
    /// The FUSE session allowed to act on this state; bumped by every cut, so that a session
    /// that outlives its unmount (a lazy one) cannot touch the state after the cut.
    pub(crate) generation: u64,
    inodes: BTreeMap<Ino, Inode>,
    next_ino: Ino,
    next_fh: u64,
    handles: HashMap<u64, Ino>,
    current: Namespace,
    durable: Namespace,
    journal: Vec<NsOp>,
    fsyncs: u64,
    dir_fsyncs: u64,
    failed_fsyncs: u64,
    fsyncs_by_path: BTreeMap<PathBuf, u64>,
    cuts: u64,
}

fn dir_inode(now: SystemTime) -> Inode {
    Inode {
        node: Node::Dir,
        perm: 0o755,
        uid: 0,
        gid: 0,
        atime: now,
        mtime: now,
        ctime: now,
        crtime: now,
        nlink: 2,
        open: 0,
    }
}

impl State {
    /// An empty filesystem: the root directory, owned by `uid`:`gid`.
    pub(crate) fn new(uid: u32, gid: u32) -> State {
        let mut root = dir_inode(SystemTime::now());
        root.uid = uid;
        root.gid = gid;
        let mut inodes = BTreeMap::new();
        inodes.insert(ROOT, root);
        State {
            generation: 0,
            inodes,
            next_ino: ROOT + 1,
            next_fh: 1,
            handles: HashMap::new(),
            current: Namespace::new(),
            durable: Namespace::new(),
            journal: Vec::new(),
            fsyncs: 0,
            dir_fsyncs: 0,
            failed_fsyncs: 0,
            fsyncs_by_path: BTreeMap::new(),
            cuts: 0,
        }
    }

    fn inode(&self, ino: Ino) -> Result<&Inode, Errno> {
        self.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn inode_mut(&mut self, ino: Ino) -> Result<&mut Inode, Errno> {
        self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn file_mut(&mut self, ino: Ino) -> Result<&mut FileData, Errno> {
        match &mut self.inode_mut(ino)?.node {
            Node::File(f) => Ok(f),
            Node::Dir => Err(Errno::EISDIR),
        }
    }

    fn is_dir(&self, ino: Ino) -> bool {
        matches!(self.inodes.get(&ino).map(|i| &i.node), Some(Node::Dir))
    }

    /// The attributes of `ino`.
    pub(crate) fn attr(&self, ino: Ino) -> Result<FileAttr, Errno> {
        let i = self.inode(ino)?;
        let (kind, size) = match &i.node {
            Node::File(f) => (FileType::RegularFile, f.len()),
            Node::Dir => (FileType::Directory, 4096),
        };
        Ok(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: i.atime,
            mtime: i.mtime,
            ctime: i.ctime,
            crtime: i.crtime,
            kind,
            perm: i.perm,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        })
    }

    /// The inode `name` in `parent` names now.
    pub(crate) fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Ino, Errno> {
        if !self.is_dir(parent) {
            return Err(if self.inodes.contains_key(&parent) {
                Errno::ENOTDIR
            } else {
                Errno::ENOENT
            });
        }
        self.current.lookup(parent, name).ok_or(Errno::ENOENT)
    }

    /// Records a namespace operation: applies it to the current namespace and journals it.
    fn record(&mut self, op: NsOp) {
        for ino in self.current.apply(&op) {
            if let Some(i) = self.inodes.get_mut(&ino) {
                i.nlink = i.nlink.saturating_sub(1);
                i.ctime = SystemTime::now();
            }
        }
        self.journal.push(op);
    }

    fn touch_dir(&mut self, dir: Ino) {
        if let Some(i) = self.inodes.get_mut(&dir) {
            let now = SystemTime::now();
            i.mtime = now;
            i.ctime = now;
        }
    }

    /// Creates a file (`dir == false`) or a directory named `name` in `parent`.
    pub(crate) fn create(
        &mut self,
        parent: Ino,
        name: &OsStr,
        dir: bool,
        perm: u16,
        uid: u32,
        gid: u32,
    ) -> Result<Ino, Errno> {
        match self.lookup(parent, name) {
            Ok(_) => return Err(Errno::EEXIST),
            Err(e) if e != Errno::ENOENT => return Err(e),
            Err(_) => {}
        }
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let now = SystemTime::now();
        let mut inode = dir_inode(now);
        inode.perm = perm;
        inode.uid = uid;
        inode.gid = gid;
        if !dir {
            inode.node = Node::File(FileData::default());
            inode.nlink = 1;
        }
        self.inodes.insert(ino, inode);
        self.record(NsOp::Link {
            parent,
            name: name.to_owned(),
            ino,
            dir,
        });
        self.touch_dir(parent);
        Ok(ino)
    }

    /// Removes the name `name` from `parent`: a directory (`rmdir`, which must be empty) or not.
    pub(crate) fn remove(&mut self, parent: Ino, name: &OsStr, rmdir: bool) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        let is_dir = self.is_dir(ino);
        match (rmdir, is_dir) {
            (true, false) => return Err(Errno::ENOTDIR),
            (false, true) => return Err(Errno::EISDIR),
            (true, true) => {
                if self.current.dirs.get(&ino).is_some_and(|d| !d.is_empty()) {
                    return Err(Errno::ENOTEMPTY);
                }
            }
            (false, false) => {}
        }
        self.record(NsOp::Unlink {
            parent,
            name: name.to_owned(),
        });
        self.touch_dir(parent);
        Ok(())
    }

    /// Renames `parent/name` to `newparent/newname`, replacing it if it exists (unless
    /// `noreplace`).
    pub(crate) fn rename(
        &mut self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        noreplace: bool,
    ) -> Result<(), Errno> {
        let ino = self.lookup(parent, name)?;
        if !self.is_dir(newparent) {
            return Err(Errno::ENOTDIR);
        }
        if newname.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        let target = self.current.lookup(newparent, newname);
        if target == Some(ino) {
            return Ok(());
        }
        if let Some(target) = target {
            if noreplace {
                return Err(Errno::EEXIST);
            }
            match (self.is_dir(ino), self.is_dir(target)) {
                (true, false) => return Err(Errno::ENOTDIR),
                (false, true) => return Err(Errno::EISDIR),
                (true, true) => {
                    if self
                        .current
                        .dirs
                        .get(&target)
                        .is_some_and(|d| !d.is_empty())
                    {
                        return Err(Errno::ENOTEMPTY);
                    }
                }
                (false, false) => {}
            }
        }
        if self.is_dir(ino) && self.current.is_ancestor(ino, newparent) {
            return Err(Errno::EINVAL);
        }
        self.record(NsOp::Rename {
            parent,
            name: name.to_owned(),
            newparent,
            newname: newname.to_owned(),
        });
        self.touch_dir(parent);
        self.touch_dir(newparent);
        if let Some(i) = self.inodes.get_mut(&ino) {
            i.ctime = SystemTime::now();
        }
        Ok(())
    }

    /// Opens `ino`; returns the handle.
    pub(crate) fn open(&mut self, ino: Ino) -> Result<u64, Errno> {
        self.inode_mut(ino)?.open += 1;
        let fh = self.next_fh;
        self.next_fh += 1;
        self.handles.insert(fh, ino);
        Ok(fh)
    }

    /// Closes the handle `fh`.
    pub(crate) fn release(&mut self, fh: u64) {
        if let Some(ino) = self.handles.remove(&fh) {
            if let Some(i) = self.inodes.get_mut(&ino) {
                i.open = i.open.saturating_sub(1);
            }
            self.gc();
        }
    }

    /// Up to `size` current bytes of `ino` from `offset`.
    pub(crate) fn read(&self, ino: Ino, offset: u64, size: u32) -> Result<&[u8], Errno> {
        match &self.inode(ino)?.node {
            Node::File(f) => Ok(f.read(offset, size)),
            Node::Dir => Err(Errno::EISDIR),
        }
    }

    /// Checks that `ino` may grow to `new_len` under `limits`.
    fn check_growth(&self, ino: Ino, new_len: u64, limits: Limits) -> Result<(), Errno> {
        if new_len > MAX_FILE_SIZE {
            return Err(Errno::EFBIG);
        }
        let old = match &self.inode(ino)?.node {
            Node::File(f) => f.len(),
            Node::Dir => return Err(Errno::EISDIR),
        };
        if let Some(cap) = limits.capacity
            && new_len > old
            && self.used() + (new_len - old) > cap
        {
            return Err(Errno::ENOSPC);
        }
        Ok(())
    }

    fn modified(&mut self, ino: Ino) {
        if let Some(i) = self.inodes.get_mut(&ino) {
            let now = SystemTime::now();
            i.mtime = now;
            i.ctime = now;
        }
    }

    /// Writes `data` at `offset` in `ino`.
    pub(crate) fn write(
        &mut self,
        ino: Ino,
        offset: u64,
        data: &[u8],
        limits: Limits,
    ) -> Result<u32, Errno> {
        let written = u32::try_from(data.len()).map_err(|_| Errno::EINVAL)?;
        let end = offset.checked_add(data.len() as u64).ok_or(Errno::EFBIG)?;
        let f = self.file_mut(ino)?;
        let old = f.len();
        let new_len = old.max(end);
        self.check_growth(ino, new_len, limits)?;
        self.file_mut(ino)?.write(offset, data);
        self.modified(ino);
        Ok(written)
    }

    /// Truncates or extends `ino` to `len`.
    pub(crate) fn set_len(&mut self, ino: Ino, len: u64, limits: Limits) -> Result<(), Errno> {
        let old = self.file_mut(ino)?.len();
        if old == len {
            return Ok(());
        }
        self.check_growth(ino, len, limits)?;
        self.file_mut(ino)?.set_len(len);
        self.modified(ino);
        Ok(())
    }

    /// `fallocate`: mode 0 extends the file to `offset + length` if it is shorter,
    /// `FALLOC_FL_KEEP_SIZE` only checks; other modes are not supported.
    pub(crate) fn fallocate(
        &mut self,
        ino: Ino,
        offset: u64,
        length: u64,
        mode: i32,
        limits: Limits,
    ) -> Result<(), Errno> {
        let end = offset.checked_add(length).ok_or(Errno::EFBIG)?;
        let old = self.file_mut(ino)?.len();
        match mode {
            0 if end > old => self.set_len(ino, end, limits),
            0 => Ok(()),
            libc::FALLOC_FL_KEEP_SIZE => self.check_growth(ino, old.max(end), limits),
            _ => Err(Errno::EOPNOTSUPP),
        }
    }

    /// Sets attributes other than the size.
    pub(crate) fn set_meta(
        &mut self,
        ino: Ino,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        atime: Option<SystemTime>,
        mtime: Option<SystemTime>,
    ) -> Result<(), Errno> {
        let i = self.inode_mut(ino)?;
        if let Some(mode) = mode {
            i.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = uid {
            i.uid = uid;
        }
        if let Some(gid) = gid {
            i.gid = gid;
        }
        if let Some(t) = atime {
            i.atime = t;
        }
        if let Some(t) = mtime {
            i.mtime = t;
        }
        i.ctime = SystemTime::now();
        Ok(())
    }

    /// Commits the namespace journal: every operation so far becomes durable.
    fn commit(&mut self) {
        for op in std::mem::take(&mut self.journal) {
            self.durable.apply(&op);
        }
        self.gc();
    }

    /// `fsync`/`fdatasync` of a file: makes its content durable and commits the journal; with
    /// `fail`, answers `EIO` and makes nothing durable.
    pub(crate) fn fsync(&mut self, ino: Ino, fail: bool) -> Result<(), Errno> {
        self.inode(ino)?;
        if fail {
            self.failed_fsyncs += 1;
            return Err(Errno::EIO);
        }
        if let Node::File(f) = &mut self.inode_mut(ino)?.node {
            f.sync();
        }
        self.fsyncs += 1;
        if let Some(path) = self.current.path_of(ino) {
            *self.fsyncs_by_path.entry(path).or_default() += 1;
        }
        self.commit();
        Ok(())
    }

    /// `fsync` of a directory: commits the journal; with `fail`, answers `EIO`.
    pub(crate) fn fsyncdir(&mut self, ino: Ino, fail: bool) -> Result<(), Errno> {
        self.inode(ino)?;
        if fail {
            self.failed_fsyncs += 1;
            return Err(Errno::EIO);
        }
        self.dir_fsyncs += 1;
        self.commit();
        Ok(())
    }

    /// The entries of the directory `ino`: `.`, `..`, then the names in order.
    pub(crate) fn entries(&self, ino: Ino) -> Result<Vec<(Ino, FileType, OsString)>, Errno> {
        if !self.is_dir(ino) {
            return Err(if self.inodes.contains_key(&ino) {
                Errno::ENOTDIR
            } else {
                Errno::ENOENT
            });
        }
        let mut out = vec![
            (ino, FileType::Directory, OsString::from(".")),
            (
                self.current.parent_of(ino),
                FileType::Directory,
                OsString::from(".."),
            ),
        ];
        for (name, &child) in self.current.dirs.get(&ino).into_iter().flatten() {
            let kind = if self.is_dir(child) {
                FileType::Directory
            } else {
                FileType::RegularFile
            };
            out.push((child, kind, name.clone()));
        }
        Ok(out)
    }

    /// The sum of the current sizes of the files that have a name now or are open: what a disk
    /// would hold (files kept only in case a cut brings their name back do not count).
    fn used(&self) -> u64 {
        self.inodes
            .values()
            .filter(|i| i.nlink > 0 || i.open > 0)
            .map(|i| match &i.node {
                Node::File(f) => f.len(),
                Node::Dir => 0,
            })
            .sum()
    }

    /// Bytes used (see [`State::used`]), and inodes held.
    pub(crate) fn usage(&self) -> (u64, u64) {
        (self.used(), self.inodes.len() as u64)
    }

    /// Frees the inodes nothing can reach any more: no name now, none in the durable namespace,
    /// none that a prefix of the journal could give back, and no open handle.
    fn gc(&mut self) {
        let mut keep = HashSet::new();
        self.current.named(&mut keep);
        self.durable.named(&mut keep);
        keep.extend(self.journal.iter().filter_map(NsOp::created));
        let dead: Vec<Ino> = self
            .inodes
            .iter()
            .filter(|(ino, i)| i.open == 0 && !keep.contains(ino))
            .map(|(ino, _)| *ino)
            .collect();
        for ino in dead {
            self.inodes.remove(&ino);
        }
    }

    /// Cuts the power (see [`Cut`]). Every handle is forgotten: the caller remounts.
    pub(crate) fn cut(&mut self, cut: Cut) -> CutReport {
        let mut rng = match cut {
            Cut::DropUnsynced => None,
            Cut::KeepSomeUnsynced { seed } => Some(ChaCha8Rng::seed_from_u64(seed)),
        };
        let before = self.current.paths();
        let pending = self.journal.len();
        let kept_ops = rng.as_mut().map_or(0, |r| r.random_range(0..=pending));
        let mut ns = std::mem::take(&mut self.durable);
        for op in &self.journal[..kept_ops] {
            ns.apply(op);
        }
        self.journal.clear();
        self.current = ns.clone();
        self.durable = ns;
        self.handles.clear();
        for i in self.inodes.values_mut() {
            i.open = 0;
        }
        self.gc();

        let mut report = CutReport {
            ops_dropped: pending - kept_ops,
            ops_kept: kept_ops,
            ..CutReport::default()
        };
        let mut reverted = Vec::new();
        for (&ino, inode) in &mut self.inodes {
            if let Node::File(f) = &mut inode.node {
                let fc = match rng.as_mut() {
                    None => f.cut(|| false),
                    Some(r) => {
                        let p = f64::from(r.random_range(0..=4_u8)) / 4.0;
                        f.cut(|| r.random_bool(p))
                    }
                };
                report.bytes_dropped += fc.dropped;
                report.bytes_kept += fc.kept;
                if fc.dropped > 0 {
                    reverted.push(ino);
                }
            }
        }
        let after = self.current.paths();
        report.files_reverted = reverted
            .into_iter()
            .filter_map(|ino| self.current.path_of(ino))
            .collect();
        report.files_reverted.sort();
        report.names_vanished = before
            .iter()
            .filter(|(p, ino)| after.get(*p) != Some(ino))
            .map(|(p, _)| p.clone())
            .collect();
        report.names_reappeared = after
            .iter()
            .filter(|(p, ino)| before.get(*p) != Some(ino))
            .map(|(p, _)| p.clone())
            .collect();
        // link counts follow the new namespace
        let mut links: HashMap<Ino, u32> = HashMap::new();
        for ino in after.values() {
            *links.entry(*ino).or_default() += 1;
        }
        for (ino, i) in &mut self.inodes {
            if matches!(i.node, Node::File(_)) {
                i.nlink = links.get(ino).copied().unwrap_or(0);
            }
        }
        self.cuts += 1;
        report
    }

    /// Counters and what is not durable yet.
    pub(crate) fn stats(&self) -> Stats {
        Stats {
            fsyncs: self.fsyncs,
            dir_fsyncs: self.dir_fsyncs,
            failed_fsyncs: self.failed_fsyncs,
            fsyncs_by_path: self.fsyncs_by_path.clone(),
            unsynced_bytes: self
                .inodes
                .values()
                .map(|i| match &i.node {
                    Node::File(f) => f.unsynced_bytes(),
                    Node::Dir => 0,
                })
                .sum(),
            uncommitted_ops: self.journal.len(),
            used_bytes: self.used(),
            cuts: self.cuts,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const NO_LIMITS: Limits = Limits { capacity: None };

    fn content(s: &mut State, path: &str) -> Option<Vec<u8>> {
        let mut ino = ROOT;
        for part in path.split('/') {
            ino = s.lookup(ino, OsStr::new(part)).ok()?;
        }
        Some(s.read(ino, 0, u32::MAX).ok()?.to_vec())
    }

    fn mkfile(s: &mut State, parent: Ino, name: &str, data: &[u8]) -> Ino {
        let ino = s
            .create(parent, OsStr::new(name), false, 0o644, 0, 0)
            .unwrap();
        s.write(ino, 0, data, NO_LIMITS).unwrap();
        ino
    }

    #[test]
    fn journal_commit_keeps_names_created_before_it() {
        let mut s = State::new(0, 0);
        let a = mkfile(&mut s, ROOT, "a", b"aaa");
        let b = mkfile(&mut s, ROOT, "b", b"bbb");
        s.fsync(b, false).unwrap();
        let _c = mkfile(&mut s, ROOT, "c", b"ccc");
        let report = s.cut(Cut::DropUnsynced);
        assert_eq!(content(&mut s, "a"), Some(Vec::new()));
        assert_eq!(content(&mut s, "b"), Some(b"bbb".to_vec()));
        assert_eq!(content(&mut s, "c"), None);
        assert_eq!(report.ops_dropped, 1);
        assert_eq!(report.names_vanished, vec![PathBuf::from("c")]);
        assert_eq!(report.files_reverted, vec![PathBuf::from("a")]);
        assert_eq!(s.stats().unsynced_bytes, 0);
        let _ = a;
    }

    #[test]
    fn unlink_and_rename_revert_until_committed() {
        let mut s = State::new(0, 0);
        let d = s.create(ROOT, OsStr::new("d"), true, 0o755, 0, 0).unwrap();
        let x = mkfile(&mut s, d, "x", b"xx");
        let y = mkfile(&mut s, d, "y", b"yy");
        s.fsync(x, false).unwrap();
        s.fsync(y, false).unwrap();
        s.remove(d, OsStr::new("x"), false).unwrap();
        s.rename(d, OsStr::new("y"), ROOT, OsStr::new("z"), false)
            .unwrap();
        assert_eq!(content(&mut s, "z"), Some(b"yy".to_vec()));
        s.cut(Cut::DropUnsynced);
        assert_eq!(content(&mut s, "d/x"), Some(b"xx".to_vec()));
        assert_eq!(content(&mut s, "d/y"), Some(b"yy".to_vec()));
        assert_eq!(content(&mut s, "z"), None);
        // now committed by a directory fsync
        s.rename(d, OsStr::new("y"), d, OsStr::new("x"), false)
            .unwrap();
        s.fsyncdir(d, false).unwrap();
        s.cut(Cut::DropUnsynced);
        assert_eq!(content(&mut s, "d/x"), Some(b"yy".to_vec()));
        assert_eq!(content(&mut s, "d/y"), None);
        // the replaced inode is freed
        assert!(s.inode(x).is_err());
    }

    #[test]
    fn a_file_created_and_removed_before_a_cut_can_come_back_with_a_prefix() {
        let mut came_back = false;
        for seed in 0..64 {
            let mut s = State::new(0, 0);
            let keep = mkfile(&mut s, ROOT, "keep", b"k");
            s.fsync(keep, false).unwrap();
            mkfile(&mut s, ROOT, "tmp", b"t");
            s.remove(ROOT, OsStr::new("tmp"), false).unwrap();
            let report = s.cut(Cut::KeepSomeUnsynced { seed });
            // creation kept, removal dropped: the inode must still be there
            if report.ops_kept == 1 {
                let c = content(&mut s, "tmp").expect("tmp is back");
                assert!(c.is_empty() || c == b"t");
                came_back = true;
            }
        }
        assert!(came_back);
    }

    #[test]
    fn rmdir_needs_an_empty_directory_and_rename_checks_kinds() {
        let mut s = State::new(0, 0);
        let d = s.create(ROOT, OsStr::new("d"), true, 0o755, 0, 0).unwrap();
        mkfile(&mut s, d, "f", b"");
        mkfile(&mut s, ROOT, "g", b"");
        assert_eq!(s.remove(ROOT, OsStr::new("d"), true), Err(Errno::ENOTEMPTY));
        assert_eq!(s.remove(ROOT, OsStr::new("d"), false), Err(Errno::EISDIR));
        assert_eq!(
            s.rename(ROOT, OsStr::new("g"), ROOT, OsStr::new("d"), false),
            Err(Errno::EISDIR)
        );
        assert_eq!(
            s.rename(ROOT, OsStr::new("d"), d, OsStr::new("sub"), false),
            Err(Errno::EINVAL)
        );
        assert_eq!(
            s.rename(ROOT, OsStr::new("g"), d, OsStr::new("f"), true),
            Err(Errno::EEXIST)
        );
    }

    #[test]
    fn capacity_refuses_growth_and_changes_nothing() {
        let mut s = State::new(0, 0);
        let f = mkfile(&mut s, ROOT, "f", &[1; 100]);
        let limits = Limits {
            capacity: Some(150),
        };
        assert_eq!(s.write(f, 90, &[2; 70], limits), Err(Errno::ENOSPC));
        assert_eq!(s.set_len(f, 151, limits), Err(Errno::ENOSPC));
        assert_eq!(content(&mut s, "f"), Some(vec![1; 100]));
        assert_eq!(s.write(f, 0, &[3; 150], limits), Ok(150));
        assert_eq!(s.usage().0, 150);
    }
}
