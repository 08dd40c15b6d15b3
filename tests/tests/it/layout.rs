//! The code's shape (issue 25), checked on the sources of the library crates (`engine`,
//! `gateway`, its client, `sweeper`, `proto`), not counting code compiled only for tests:
//! - no import circle between the modules of a crate;
//! - no `impl Engine` outside `engine/src/engine.rs`: the engine only composes its components;
//! - no file over 900 lines;
//! - no function over 70 lines unless a comment just above it says why (`// Over 70 lines: …`),
//!   and at most 3 of those.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const LIBRARIES: [&str; 5] = [
    "engine/src",
    "gateway/src",
    "gateway/client/src",
    "sweeper/src",
    "proto/src",
];
const FILE_LINES_MAX: usize = 900;
const FN_LINES_MAX: usize = 70;
const LONG_FNS_MAX: usize = 3;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A crate's source files compiled outside tests, by module path (`a::b`; the root is ``).
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for root in ["lib.rs", "main.rs"] {
        if src.join(root).exists() {
            walk(&src.join(root), String::new(), &mut out);
        }
    }
    out
}

/// Adds `file` as module `path`, then the modules it declares (`mod x;`) that are not
/// `#[cfg(test)]`.
fn walk(file: &Path, path: String, out: &mut BTreeMap<String, String>) {
    let text = std::fs::read_to_string(file).unwrap();
    let dir = if path.is_empty() || file.ends_with("mod.rs") {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let decl = t
            .strip_prefix("pub mod ")
            .or_else(|| t.strip_prefix("pub(crate) mod "))
            .or_else(|| t.strip_prefix("mod "));
        let Some(name) = decl.and_then(|d| d.strip_suffix(';')) else {
            continue;
        };
        if i > 0 && lines[i - 1].trim() == "#[cfg(test)]" {
            continue;
        }
        let child = [
            dir.join(format!("{name}.rs")),
            dir.join(name).join("mod.rs"),
        ]
        .into_iter()
        .find(|p| p.exists());
        let Some(child) = child else { continue };
        let child_path = if path.is_empty() {
            name.to_owned()
        } else {
            format!("{path}::{name}")
        };
        walk(&child, child_path, out);
    }
    out.insert(path, library_part(&text).to_owned());
}

/// A file's text without its `#[cfg(test)] mod tests { … }` (the convention: last in the file).
fn library_part(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// The modules of this crate that `text` (the source of module `me`) names: `crate::a::b`
/// (also inside `use crate::{…}`) and `super::x`, each resolved to the longest module path
/// that exists. A module's own parents are not counted (a child may use what its parent
/// declares).
fn names(me: &str, text: &str, all: &BTreeMap<String, String>) -> BTreeSet<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut paths = Vec::new();
    for (start, prefix) in [("crate::", String::new()), ("super::", parent(me))] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(start) {
            rest = &rest[i + start.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let end = group.find('}').unwrap_or(group.len());
                for item in group[..end].split(',') {
                    paths.push(join(&prefix, &path_at(item.trim())));
                }
            } else {
                paths.push(join(&prefix, &path_at(rest)));
            }
        }
    }
    let mut out = BTreeSet::new();
    for p in paths {
        let segs: Vec<&str> = p.split("::").collect();
        for k in (1..=segs.len()).rev() {
            let m = segs[..k].join("::");
            if all.contains_key(&m) {
                if m != me && !me.starts_with(&format!("{m}::")) {
                    out.insert(m);
                }
                break;
            }
        }
    }
    out
}

fn parent(me: &str) -> String {
    me.rsplit_once("::").map_or("", |(p, _)| p).to_owned()
}

fn join(prefix: &str, path: &str) -> String {
    if prefix.is_empty() {
        path.to_owned()
    } else {
        format!("{prefix}::{path}")
    }
}

/// The `a::b::c` at the start of `s`.
fn path_at(s: &str) -> String {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    s[..end].trim_end_matches(':').to_owned()
}

/// Every import circle of a crate's modules, each as the modules on it.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // A module is on a circle when it reaches itself; its circle is what it reaches that
    // reaches it back.
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&String> = graph[from].iter().collect();
        while let Some(m) = todo.pop() {
            if seen.insert(m.clone()) {
                todo.extend(graph[m].iter());
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut found: BTreeSet<Vec<String>> = BTreeSet::new();
    for (m, r) in &reaches {
        if r.contains(*m) {
            let circle = r
                .iter()
                .filter(|o| reaches[o].contains(*m))
                .cloned()
                .collect();
            found.insert(circle);
        }
    }
    found.into_iter().collect()
}

/// Functions of `text` longer than [`FN_LINES_MAX`]: (name, lines, whether a comment just
/// above says why).
fn long_fns(text: &str) -> Vec<(String, usize, bool)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let indent = &line[..line.len() - t.len()];
        let head = ["pub ", "pub(crate) ", "async ", "const ", "unsafe "]
            .iter()
            .fold(t, |t, p| t.strip_prefix(p).unwrap_or(t));
        let head = head.strip_prefix("async ").unwrap_or(head);
        let Some(rest) = head.strip_prefix("fn ") else {
            continue;
        };
        if t.trim_end().ends_with(';') || t.trim_end().ends_with('}') {
            continue; // a declaration in a trait, or a body on one line
        }
        let close = format!("{indent}}}");
        let Some(end) = (i + 1..lines.len()).find(|&j| lines[j] == close) else {
            continue;
        };
        let n = end - i + 1;
        if n <= FN_LINES_MAX {
            continue;
        }
        let above = lines[..i]
            .iter()
            .rev()
            .take_while(|l| {
                let l = l.trim_start();
                l.starts_with("//") || l.starts_with("#[")
            })
            .any(|l| l.trim_start().starts_with("// Over 70 lines:"));
        let name = path_at(rest);
        let is_test = lines[..i]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with("#[") || l.trim_start().starts_with("//"))
            .any(|l| l.contains("test]") || l.contains("::test"));
        if !is_test {
            out.push((name, n, above));
        }
    }
    out
}

#[test]
fn the_libraries_have_no_import_circle_no_engine_outside_its_file_and_no_long_code() {
    let root = workspace();
    let mut problems = Vec::new();
    let mut long = Vec::new();
    let mut files = 0;
    for lib in LIBRARIES {
        let src = root.join(lib);
        let mods = modules(&src);
        assert!(
            mods.len() > 1 || lib.ends_with("client/src"),
            "{lib}: no modules read"
        );
        files += mods.len();
        let graph: BTreeMap<String, BTreeSet<String>> = mods
            .iter()
            .map(|(m, text)| (m.clone(), names(m, text, &mods)))
            .collect();
        for circle in circles(&graph) {
            problems.push(format!("{lib}: an import circle: {}", circle.join(" → ")));
        }
        for (m, text) in &mods {
            let name = format!("{lib}/{}", if m.is_empty() { "(root)" } else { m });
            let lines = text.lines().count();
            if lines > FILE_LINES_MAX {
                problems.push(format!("{name}: {lines} lines (over {FILE_LINES_MAX})"));
            }
            let engine_file = lib == "engine/src" && m == "engine";
            if !engine_file
                && text
                    .lines()
                    .any(|l| l.starts_with("impl Engine ") || l.contains(" for Engine "))
            {
                problems.push(format!("{name}: an `impl Engine` outside engine.rs"));
            }
            for (f, n, why) in long_fns(text) {
                if !why {
                    problems.push(format!("{name}::{f}: {n} lines, and no comment says why"));
                }
                long.push(format!("{name}::{f} ({n})"));
            }
        }
    }
    assert!(files > 100, "only {files} library files read");
    if long.len() > LONG_FNS_MAX {
        problems.push(format!(
            "{} functions over {FN_LINES_MAX} lines (at most {LONG_FNS_MAX}): {}",
            long.len(),
            long.join(", ")
        ));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_shape_checks_find_what_they_look_for() {
    // A circle of three, and a module that only uses its child: one circle found.
    let mods: BTreeMap<String, String> = [
        ("a", "use crate::b::Thing;"),
        ("b", "use crate::{c, x::y};"),
        ("c", "fn f() { crate::a::g() }"),
        ("d", "use crate::d::e::Z;"),
        ("d::e", "use super::W;"),
        ("x", ""),
        ("x::y", ""),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_owned(), t.to_owned()))
    .collect();
    let graph: BTreeMap<String, BTreeSet<String>> = mods
        .iter()
        .map(|(m, text)| (m.clone(), names(m, text, &mods)))
        .collect();
    assert_eq!(graph["b"], ["c", "x::y"].map(String::from).into());
    assert_eq!(circles(&graph), vec![vec!["a", "b", "c"]]);
    // A long function with and without its comment; a short one.
    let body = "    x();\n".repeat(FN_LINES_MAX);
    let text = format!(
        "// Over 70 lines: a table.\nfn table() {{\n{body}}}\n\npub fn long() {{\n{body}}}\n\nfn short() {{\n}}\n"
    );
    let found = long_fns(&text);
    assert_eq!(
        found,
        vec![
            ("table".to_owned(), FN_LINES_MAX + 2, true),
            ("long".to_owned(), FN_LINES_MAX + 2, false)
        ]
    );
}
