//! What a power cut keeps ([`Cut`]), what it did ([`CutReport`]), and a disk's counters
//! ([`Stats`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

/// What survives a power cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Only what was made durable: every file's synced content, the committed namespace.
    DropUnsynced,
    /// A drive that happened to write part of the rest: for each file, a random subset of the
    /// 4 KiB pages changed since its last sync keeps its current bytes (the others revert; a file
    /// grows past its durable size only as far as a kept page reaches, and a byte past the durable
    /// size on a page not kept reads as zero), and a random prefix of the uncommitted namespace
    /// operations survives. A page is kept or reverted whole (no torn sectors). The same seed on
    /// the same history gives the same result.
    KeepSomeUnsynced {
        /// Seeds the choices.
        seed: u64,
    },
}

/// What a power cut dropped and kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CutReport {
    /// Bytes of file content that changed, went away or came back (a truncation undone).
    pub bytes_dropped: u64,
    /// Unsynced bytes that survived (only with [`Cut::KeepSomeUnsynced`]).
    pub bytes_kept: u64,
    /// Files (their paths after the cut) whose content the cut changed.
    pub files_reverted: Vec<PathBuf>,
    /// Uncommitted namespace operations dropped.
    pub ops_dropped: usize,
    /// Uncommitted namespace operations kept (only with [`Cut::KeepSomeUnsynced`]).
    pub ops_kept: usize,
    /// Paths that named something before the cut and no longer do (or name something else).
    pub names_vanished: Vec<PathBuf>,
    /// Paths that name something after the cut that they did not name before (an unlink or a
    /// rename undone).
    pub names_reappeared: Vec<PathBuf>,
}

/// Counters of a disk (since it was mounted first, across cuts).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// `fsync`/`fdatasync` calls on files that made data durable.
    pub fsyncs: u64,
    /// `fsync` calls on directories that committed the namespace journal.
    pub dir_fsyncs: u64,
    /// `fsync` calls answered with `EIO` (see [`crate::PowerCutDisk::set_fsync_fails`]).
    pub failed_fsyncs: u64,
    /// Successful file fsyncs by the file's path (relative to the mount) at the time.
    pub fsyncs_by_path: BTreeMap<PathBuf, u64>,
    /// Byte positions where a file's current content differs from its durable content now.
    pub unsynced_bytes: u64,
    /// Namespace operations not committed yet.
    pub uncommitted_ops: usize,
    /// Sum of the current sizes of all files (what [`crate::PowerCutDisk::set_capacity`] limits).
    pub used_bytes: u64,
    /// Power cuts so far.
    pub cuts: u64,
}
