//! This process's memory and a directory's size, as the reports give them: resident memory from
//! `/proc/self/status` (Linux; `None` elsewhere), sizes in bytes.

use std::path::Path;

/// A `/proc/self/status` field given in kB (`VmRSS:`, `VmHWM:`), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resident memory of this process now (`VmRSS`).
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// Peak resident memory of this process (`VmHWM`).
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// The sum of the lengths of every file under `dir` (0 for a directory that does not exist).
pub fn dir_bytes(dir: &Path) -> u64 {
    boxoffice_engine::store::disk_usage(dir).total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_bytes_adds_up_nested_files() {
        let dir = tempfile::tempdir().expect("a temp dir");
        std::fs::write(dir.path().join("a"), [0u8; 10]).expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/b"), [0u8; 5]).expect("write");
        assert_eq!(dir_bytes(dir.path()), 15);
        assert_eq!(dir_bytes(&dir.path().join("missing")), 0);
    }
}
