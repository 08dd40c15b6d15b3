//! Secrets on the command line, and how a command can be called wrongly.
//!
//! Every key and the token secret is given either as a value (`--admin-key KEY`,
//! `BOXOFFICE_ADMIN_KEY`) or in a file (`--admin-key-file PATH`, `BOXOFFICE_ADMIN_KEY_FILE`), as
//! Docker and Kubernetes mount secrets. A file's trailing newline is trimmed. A file that cannot
//! be read, is empty or is not text is a [`UsageError`] naming the flag and the path, never the
//! content. Giving both the value and the file is refused by clap (`conflicts_with`) when both
//! are canonical names, and by [`legacy_env`]'s callers for the old variable names.

use std::fmt;
use std::path::Path;

/// The command was called wrongly (a bad flag or value, an unreadable key file, nothing to work
/// on): the `boxoffice` binary exits with code 2, as clap does for its own usage errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(String);

impl UsageError {
    /// A usage error saying `message`.
    pub fn new(message: impl Into<String>) -> UsageError {
        UsageError(message.into())
    }
}

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Whether `error` (or anything in its chain) is a [`UsageError`].
pub fn is_usage(error: &anyhow::Error) -> bool {
    error
        .chain()
        .any(|c| c.downcast_ref::<UsageError>().is_some())
}

/// The content of the secret file `path` given with `flag`, its trailing newline (`\n` or
/// `\r\n`, any number) trimmed. Unreadable, not UTF-8 or empty: a [`UsageError`] that names
/// `flag` and the path, never the content.
pub fn read_file(flag: &str, path: &Path) -> Result<String, UsageError> {
    let bytes = std::fs::read(path).map_err(|e| {
        UsageError(format!(
            "{flag} {}: cannot read the file: {e}",
            path.display()
        ))
    })?;
    let text = String::from_utf8(bytes).map_err(|_| {
        UsageError(format!(
            "{flag} {}: the file is not UTF-8 text",
            path.display()
        ))
    })?;
    let trimmed = text.trim_end_matches(['\n', '\r']);
    if trimmed.trim().is_empty() {
        return Err(UsageError(format!(
            "{flag} {}: the file is empty",
            path.display()
        )));
    }
    Ok(trimmed.to_owned())
}

/// One secret: `value` if given, else the content of `file` (one line; `flag` names the file
/// flag in errors), else `None`.
pub fn one(
    flag: &str,
    value: Option<String>,
    file: Option<&Path>,
) -> Result<Option<String>, UsageError> {
    if let Some(v) = value {
        return Ok(Some(v));
    }
    let Some(path) = file else {
        return Ok(None);
    };
    let text = read_file(flag, path)?;
    if text.contains(['\n', '\r']) {
        return Err(UsageError(format!(
            "{flag} {}: the file holds more than one line; it takes one secret",
            path.display()
        )));
    }
    Ok(Some(text))
}

/// Several keys (`serve` accepts many of each scope): `values` if any, else the lines of `file`
/// (each trimmed, blank ones skipped; `flag` names the file flag in errors).
pub fn many(
    flag: &str,
    values: Vec<String>,
    file: Option<&Path>,
) -> Result<Vec<String>, UsageError> {
    if !values.is_empty() {
        return Ok(values);
    }
    let Some(path) = file else {
        return Ok(Vec::new());
    };
    Ok(read_file(flag, path)?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// A renamed variable that is still read (old scripts keep working; only the canonical name
/// is documented): its value, if set and not empty.
pub fn legacy_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The old names of a secret, read when none of its canonical names was given: the value
/// variable `value_var` and the file variable `file_var` (both set: a [`UsageError`]). Returns
/// the values (the value variable split at commas) or the file's path.
pub fn legacy_pair(
    value_var: &str,
    file_var: &str,
) -> Result<(Vec<String>, Option<std::path::PathBuf>), UsageError> {
    match (legacy_env(value_var), legacy_env(file_var)) {
        (Some(_), Some(_)) => Err(UsageError(format!(
            "{value_var} and {file_var} are both set: give the secret or its file, not both"
        ))),
        (Some(v), None) => Ok((
            v.split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect(),
            None,
        )),
        (None, Some(p)) => Ok((Vec::new(), Some(p.into()))),
        (None, None) => Ok((Vec::new(), None)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::*;

    #[test]
    fn a_file_is_read_without_its_trailing_newline_and_errors_never_show_the_content() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("key");
        std::fs::write(&f, "s3cr3t\r\n\n").unwrap();
        assert_eq!(read_file("--admin-key-file", &f).unwrap(), "s3cr3t");
        assert_eq!(
            one("--admin-key-file", None, Some(&f)).unwrap().as_deref(),
            Some("s3cr3t")
        );
        assert_eq!(
            one("--admin-key-file", Some("v".into()), Some(&f))
                .unwrap()
                .as_deref(),
            Some("v")
        );

        // (Secrets no temp dir's random name can contain: the error names the file.)
        std::fs::write(&f, "first-SECRET\n\n  second-SECRET \n").unwrap();
        assert_eq!(
            many("--admin-key-file", vec![], Some(&f)).unwrap(),
            ["first-SECRET", "second-SECRET"]
        );
        let e = one("--admin-key-file", None, Some(&f))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("more than one line") && !e.contains("SECRET"),
            "{e}"
        );

        std::fs::write(&f, "\n").unwrap();
        let e = read_file("--token-secret-file", &f)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("empty") && e.contains(&f.display().to_string()),
            "{e}"
        );

        let missing = dir.path().join("nope");
        let e = read_file("--client-key-file", &missing)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--client-key-file") && e.contains("nope"), "{e}");

        std::fs::write(&f, [0xff, 0xfe, b's']).unwrap();
        assert!(
            read_file("--x", &f)
                .unwrap_err()
                .to_string()
                .contains("UTF-8")
        );
    }

    #[test]
    fn usage_errors_are_found_in_a_chain() {
        let e = anyhow::Error::new(UsageError::new("bad")).context("running");
        assert!(is_usage(&e));
        assert!(!is_usage(&anyhow::anyhow!("other")));
    }
}
