//! This process's memory and a directory's size, as the reports give them: resident memory from
//! `/proc/self/status` (Linux; `None` elsewhere), sizes in bytes; and the process's
//! transparent-huge-page switch ([`keep_off_huge_pages`]).

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

/// Keeps this process's memory off transparent huge pages (`prctl(PR_SET_THP_DISABLE)`, for
/// the whole process and its children, from now on; Linux only, elsewhere nothing to do).
/// Returns whether the switch is on.
///
/// Why: mimalloc asks the kernel for huge pages on its arenas (`madvise`), and the kernel then
/// zeroes a whole 2 MiB page on the first touch of any byte of it, again each time mimalloc
/// gives memory back and takes it again. A durable success-heavy run of `HoldBatch` (the
/// comparison's row d, 200,000 holds) spent about a quarter of all its CPU samples in the
/// kernel's `clear_page_erms` under those faults; with the switch on the same run went from
/// about 39,000 to 65,000 holds/s and its p99 from about 40 ms to 4 ms (BENCHMARKS.md, "Huge
/// pages off"). The binaries call it first thing (`boxoffice`, the benches).
pub fn keep_off_huge_pages() -> bool {
    #[cfg(target_os = "linux")]
    {
        rustix::thread::disable_transparent_huge_pages(true).is_ok()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// Whether this process's memory is kept off transparent huge pages
/// ([`keep_off_huge_pages`]).
pub fn huge_pages_off() -> bool {
    #[cfg(target_os = "linux")]
    {
        rustix::thread::transparent_huge_pages_are_disabled().unwrap_or(false)
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// The sum of the lengths of every file under `dir` (0 for a directory that does not exist).
pub fn dir_bytes(dir: &Path) -> u64 {
    boxoffice_engine::store::disk_usage(dir).total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_are_kept_off_in_a_child() {
        // The switch is for the whole process: set it in a child so the test binary's other
        // tests keep the default.
        if std::env::var_os("BOXOFFICE_THP_CHILD").is_some() {
            assert!(keep_off_huge_pages());
            assert!(huge_pages_off());
            return;
        }
        // A runner that was itself started with the switch on passes it down (it is inherited):
        // then only the child's own call is checked.
        let inherited = huge_pages_off();
        if inherited {
            eprintln!("huge pages already off in this test process (inherited)");
        }
        let me = std::env::current_exe().expect("this test binary");
        let status = std::process::Command::new(me)
            .args([
                "--exact",
                "memory::tests::huge_pages_are_kept_off_in_a_child",
            ])
            .env("BOXOFFICE_THP_CHILD", "1")
            .status()
            .expect("the child");
        assert!(status.success());
    }

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
