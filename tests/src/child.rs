//! Crash tests re-run their own test binary as a child process that runs one test (the child
//! side of the crash), and kill it or let it die. A filter that matches no test would make the
//! child run nothing and exit at once; so the child announces itself with [`announce`] and the
//! parent, through [`ChildTest`], fails unless it saw that announcement.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Lines, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};

/// The line a child test prints before anything else it prints.
pub const STARTED: &str = "BOXOFFICE-CHILD-TEST-STARTED";

/// The name the test harness gives the test `test` of the module `module_path` (as
/// `module_path!()` spells it): the module path without the crate's name, then the test, e.g.
/// `it::kill9` and `crash_child` make `kill9::crash_child`.
pub fn test_name(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

/// The harness's name of the test function `$test` of the calling module, for
/// [`ChildTest::spawn`]. Checks at compile time that `$test` is a function of that module.
#[macro_export]
macro_rules! child_test_name {
    ($test:ident) => {{
        let _: fn() = $test;
        $crate::child::test_name(module_path!(), stringify!($test))
    }};
}

/// Called by the child test first thing once it knows it is the child: tells the parent that
/// the filter found it and it runs.
pub fn announce() {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{STARTED}");
    let _ = out.flush();
}

/// This test binary, started again to run exactly one test, with its stdout read line by line
/// and its stdin open for [`ChildTest::send_line`].
pub struct ChildTest {
    name: String,
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    started: bool,
}

impl ChildTest {
    /// Starts this test binary running only the test called `name` (see [`child_test_name`]),
    /// with `envs` set, its output not captured (`--nocapture`), its stdin a pipe from the
    /// parent and its stderr dropped.
    pub fn spawn(name: String, envs: &[(&str, &OsStr)]) -> ChildTest {
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe)
            .args(["--exact", &name, "--nocapture", "--test-threads=1"])
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the child test starts");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        ChildTest {
            name,
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            started: false,
        }
    }

    /// The next line the child test printed after its announcement (the harness's own lines
    /// before it are skipped); `None` once the child's stdout is closed. Fails the test if the
    /// child closed its stdout without having announced itself: then it ran no test.
    pub fn next_line(&mut self) -> Option<String> {
        loop {
            let line = match self.lines.next() {
                Some(Ok(line)) => line,
                Some(Err(_)) | None => {
                    assert!(
                        self.started,
                        "the child never started the test {:?}: does the filter name a test of \
                         this binary, and does the test call child::announce()?",
                        self.name
                    );
                    return None;
                }
            };
            if self.started {
                return Some(line);
            }
            // The harness prints `test <name> ... ` without a line end before the test's output.
            self.started = line.ends_with(STARTED);
        }
    }

    /// Writes `line` to the child's stdin (for children that take commands there). Fails the
    /// test if the child is gone.
    pub fn send_line(&mut self, line: &str) {
        writeln!(self.stdin, "{line}")
            .and_then(|()| self.stdin.flush())
            .unwrap_or_else(|e| panic!("the child test {:?} takes no more input: {e}", self.name));
    }

    /// Every line the child test prints from here until it closes its stdout.
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
