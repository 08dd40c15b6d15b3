//! Crash tests run their child side in a process of its own: the helper binary
//! `boxoffice-test-child ROLE` of this package ([`child_bin!`]; roles in
//! `src/bin/boxoffice-test-child.rs`), which the test kills or lets die. A child side is never
//! a `#[test]`, so no test passes by doing nothing. A role the binary does not know would make
//! the child exit at once; so the child announces itself with [`announce`] and the parent,
//! through [`ChildTest`], fails unless it saw that announcement.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// The line a child test prints before anything else it prints.
pub const STARTED: &str = "BOXOFFICE-CHILD-TEST-STARTED";

/// The path of the helper binary `boxoffice-test-child`, for [`ChildTest::spawn`] (Cargo
/// builds it for this package's tests and names it to them at compile time).
#[macro_export]
macro_rules! child_bin {
    () => {
        env!("CARGO_BIN_EXE_boxoffice-test-child")
    };
}

/// Called by a child role first thing: tells the parent that the role was found and runs.
pub fn announce() {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{STARTED}");
    let _ = out.flush();
}

/// The helper binary running one child role, with its stdout read line by line and its stdin
/// open for [`ChildTest::send_line`].
pub struct ChildTest {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    started: bool,
}

impl ChildTest {
    /// Starts the helper binary `exe` ([`child_bin!`]) in role `role`, with `envs` set, its
    /// stdin a pipe from the parent and its stderr dropped.
    pub fn spawn(exe: &str, role: &str, envs: &[(&str, &OsStr)]) -> ChildTest {
        let mut child = Command::new(exe)
            .arg(role)
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the child starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        ChildTest {
            name: role.to_owned(),
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            started: false,
        }
    }

    /// The next line the child printed after its announcement (lines before it are skipped);
    /// `None` once the child's stdout is closed. Fails the test if the child closed its stdout
    /// without having announced itself: then it ran no role.
    pub fn next_line(&mut self) -> Option<String> {
        loop {
            let line = match self.lines.next() {
                Some(Ok(line)) => line,
                Some(Err(_)) | None => {
                    assert!(
                        self.started,
                        "the child never started the role {:?}: does boxoffice-test-child know \
                         it, and does it call child::announce()?",
                        self.name
                    );
                    return None;
                }
            };
            if self.started {
                return Some(line);
            }
            self.started = line == STARTED;
        }
    }

    /// Writes `line` to the child's stdin (for children that take commands there). Fails the
    /// test if the child is gone.
    pub fn send_line(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("the child {:?} takes no more input: {e}", self.name));
    }

    /// Every line the child prints from here until it closes its stdout.
    pub fn rest(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next_line()).collect()
    }

    /// Sends SIGKILL (no destructor, no flush, no goodbye) and reaps the child.
    pub fn kill(&mut self) {
        self.child.kill().expect("the child is killed");
        self.child.wait().expect("the child is reaped");
    }

    /// Waits for the child to end.
    pub fn wait(&mut self) -> ExitStatus {
        self.child.wait().expect("the child is reaped")
    }
}

impl Drop for ChildTest {
    fn drop(&mut self) {
        // A parent that failed half-way leaves no child behind.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
