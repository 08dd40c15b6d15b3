//! Build facts for `boxoffice_build_info`: the git commit (when built from a git checkout; a
//! source tarball has none, and that is not an error) and the compiler's version. Either may be
//! given instead with `BOXOFFICE_GIT_COMMIT` / read from `RUSTC`.

use std::process::Command;

fn run(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// Reruns this script when the checked-out commit moves (only files that exist: a missing one
/// would make cargo run it at every build).
fn watch_git(args: &[&str]) {
    if let Some(path) = run("git", args)
        && std::path::Path::new(&path).exists()
    {
        println!("cargo:rerun-if-changed={path}");
    }
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=BOXOFFICE_GIT_COMMIT");
    let commit = std::env::var("BOXOFFICE_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| run("git", &["rev-parse", "--short=12", "HEAD"]));
    if let Some(commit) = commit {
        println!("cargo:rustc-env=BOXOFFICE_GIT_COMMIT={commit}");
        watch_git(&["rev-parse", "--git-path", "HEAD"]);
        watch_git(&["rev-parse", "--git-path", "packed-refs"]);
        if let Some(branch) = run("git", &["symbolic-ref", "-q", "HEAD"]) {
            watch_git(&["rev-parse", "--git-path", &branch]);
        }
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    if let Some(version) = run(&rustc, &["--version"]) {
        // `rustc 1.95.0 (abcdef 2026-01-01)` -> `1.95.0`
        let version = version
            .split_whitespace()
            .nth(1)
            .unwrap_or(&version)
            .to_owned();
        println!("cargo:rustc-env=BOXOFFICE_RUSTC_VERSION={version}");
    }
}
