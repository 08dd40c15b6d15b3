//! `promtool` (Prometheus's checker, Debian's `prometheus` package) for the tests of the
//! metrics and the alert rules. Where it is missing a check is skipped, saying so on the
//! process's stderr (past the test harness's capture), unless `BOXOFFICE_REQUIRE_PROMTOOL` is
//! set (CI installs it and sets that): then a missing promtool fails the test.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs `promtool ARGS` (in `dir`, if given) with `input` on its stdin: `None` if promtool is
/// not installed, else whether it succeeded and what it printed (stdout, then stderr).
pub fn run(args: &[&str], dir: Option<&Path>, input: &str) -> Option<(bool, String)> {
    let mut cmd = Command::new("promtool");
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => panic!("promtool does not start: {e}"),
    };
    child
        .stdin
        .take()
        .expect("promtool's stdin")
        .write_all(input.as_bytes())
        .expect("promtool reads its input");
    let out = child.wait_with_output().expect("promtool ends");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), printed))
}

/// [`run`], or `None` after saying that `what` was skipped (failing instead where promtool is
/// required).
pub fn run_or_skip(
    args: &[&str],
    dir: Option<&Path>,
    input: &str,
    what: &str,
) -> Option<(bool, String)> {
    let ran = run(args, dir, input);
    if ran.is_none() {
        boxoffice_engine::tiers::skip_unless_required(
            "promtool",
            &format!(
                "promtool not installed ({what}); install Debian's `prometheus` package, as \
                 .ci/run does"
            ),
        );
    }
    ran
}
