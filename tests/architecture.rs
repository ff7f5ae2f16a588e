//! ARCHITECTURE.md's layering invariants, checked over the source text so
//! they stay true: no import cycle between the crate's top-level modules, and
//! each dependency that belongs to one layer stays there. Test code (a file's
//! `#[cfg(test)]` part, `tests.rs` files) and comments are not checked.
//!
//! `cargo test --test architecture -- --nocapture` prints the module graph.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file below `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A source file: its top-level module (`service` for `src/service/node.rs`),
/// its path below `src/` and its non-test, non-comment text.
struct Source {
    module: String,
    path: String,
    code: String,
}

fn sources() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_string_lossy().into_owned();
        if rel == "lib.rs" || f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let first = rel.split('/').next().unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first).to_owned();
        let text = fs::read_to_string(&f).unwrap();
        // The test module (`#[cfg(test)]` then `mod tests {`, by convention
        // the file's last item) ends the code that is checked.
        let lines: Vec<&str> = text.lines().collect();
        let end = (0..lines.len())
            .find(|&i| {
                lines[i].trim() == "#[cfg(test)]"
                    && lines
                        .get(i + 1)
                        .is_some_and(|n| n.contains("mod ") && n.trim_end().ends_with('{'))
            })
            .unwrap_or(lines.len());
        let code: String = lines[..end]
            .iter()
            .filter(|l| !l.trim_start().starts_with("//"))
            .map(|l| format!("{l}\n"))
            .collect();
        out.push(Source {
            module,
            path: rel,
            code,
        });
    }
    out
}

/// The top-level modules a text names through `crate::` paths, including
/// grouped imports (`use crate::{a::X, b};`).
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().last();
        rest = &rest[i + "crate::".len()..];
        // `localvol_crate::` or similar: not this crate.
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Top-level items of the group, up to its matching brace.
            let (mut depth, mut item_start, mut end) = (0usize, 0usize, group.len());
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        end = j;
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&group[item_start..j]));
                        item_start = j + 1;
                    }
                    _ => {}
                }
            }
            out.insert(ident(&group[item_start..end]));
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("");
    out.remove("self");
    out
}

fn graph(sources: &[Source]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in sources {
        let e = g.entry(s.module.clone()).or_default();
        for r in crate_refs(&s.code) {
            if r != s.module {
                e.insert(r);
            }
        }
    }
    g
}

/// One cycle of the graph, if there is any (depth-first search).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        g: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_owned());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_owned());
        for m in g.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, g, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for n in g.keys() {
        if let Some(c) = visit(n, g, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_cycle_finder_finds_cycles_and_grouped_imports() {
    let refs = crate_refs("use crate::{a::X, b, c::{d, e::F}};\nlet x = crate::g::h();\n");
    assert_eq!(refs, ["a", "b", "c", "g"].map(String::from).into());
    let mut g = BTreeMap::new();
    g.insert("a".to_owned(), BTreeSet::from(["b".to_owned()]));
    g.insert("b".to_owned(), BTreeSet::from(["c".to_owned()]));
    g.insert("c".to_owned(), BTreeSet::new());
    assert_eq!(find_cycle(&g), None);
    g.get_mut("c").unwrap().insert("a".to_owned());
    assert_eq!(
        find_cycle(&g),
        Some(["a", "b", "c", "a"].map(String::from).to_vec())
    );
}

#[test]
fn no_import_cycle_between_modules() {
    let g = graph(&sources());
    for (m, deps) in &g {
        println!(
            "{m} -> {}",
            deps.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    if let Some(c) = find_cycle(&g) {
        panic!("import cycle between modules: {}", c.join(" -> "));
    }
}

/// Files whose (non-test) code mentions `needle`, outside `allowed` modules.
fn offenders(needles: &[&str], allowed: &[&str]) -> Vec<String> {
    sources()
        .into_iter()
        .filter(|s| !allowed.contains(&s.module.as_str()))
        .filter(|s| needles.iter().any(|n| s.code.contains(n)))
        .map(|s| s.path)
        .collect()
}

#[test]
fn grpc_stays_in_the_services_and_the_clients() {
    // server: builds the router; endpoint: the client side of a socket;
    // authority: the socket adapter implements tonic's `Connected`. The CSI
    // clients (`localvol client`, `localvol bench`) are the `cli/` crate's.
    let allowed = ["service", "server", "endpoint", "authority"];
    let found = offenders(&["tonic", "crate::csi"], &allowed);
    assert!(
        found.is_empty(),
        "gRPC or proto types outside {allowed:?}: {found:?}"
    );
}

#[test]
fn only_command_rs_spawns_processes() {
    let found = offenders(
        &["Command::new", "process::Command", "tokio::process"],
        &["command"],
    );
    let found: Vec<_> = found
        .into_iter()
        .filter(|f| {
            // `Cmd::new` is command.rs's own builder, not a spawn.
            let code = &sources().into_iter().find(|s| &s.path == f).unwrap().code;
            code.replace("Cmd::new", "").contains("Command::new")
                || code.contains("process::Command")
                || code.contains("tokio::process")
        })
        .collect();
    assert!(
        found.is_empty(),
        "processes spawned outside command.rs: {found:?}"
    );
}

#[test]
fn only_lvm_runs_lvm() {
    let found = offenders(&["Cmd::new(\"lvm\")"], &["lvm"]);
    assert!(found.is_empty(), "lvm run outside src/lvm/: {found:?}");
}

#[test]
fn only_blockdev_raw_runs_wipefs_and_dd() {
    // The programs that write a device's blocks directly are built (and a
    // leftover copy recognised) in one file.
    let found: Vec<_> = sources()
        .into_iter()
        .filter(|s| s.path != "blockdev/raw.rs")
        .filter(|s| s.code.contains("Cmd::new(\"wipefs\")") || s.code.contains("Cmd::new(\"dd\")"))
        .map(|s| s.path)
        .collect();
    assert!(
        found.is_empty(),
        "wipefs or dd run outside blockdev/raw.rs: {found:?}"
    );
}

#[test]
fn lvm_arguments_are_built_in_lvm() {
    // One builder for lvcreate (and one function per other change), used
    // by the pools and the benchmark's floor alike.
    let found = offenders(&["\"lvcreate\"", "\"lvextend\"", "\"lvchange\""], &["lvm"]);
    assert!(
        found.is_empty(),
        "lvm arguments built outside src/lvm/: {found:?}"
    );
}

#[test]
fn errors_below_the_services_name_failures_not_codes() {
    // Each layer's error enum says what failed (`PoolError::NoSpace`,
    // `NodeError::Occupied`, ...); only `service/status.rs` picks the gRPC
    // code, so no code name appears below the services.
    let allowed = ["service", "authority"];
    let found = offenders(
        &[
            "InvalidArgument",
            "FailedPrecondition",
            "ResourceExhausted",
            "OutOfRange",
            "tonic::Code",
        ],
        &allowed,
    );
    assert!(
        found.is_empty(),
        "gRPC code names below the services: {found:?}"
    );
}

/// The non-test lines of a file: up to its test module (`#[cfg(test)]`
/// then `mod ... {`, by convention the file's last item).
fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim() == "#[cfg(test)]"
                && lines
                    .get(i + 1)
                    .is_some_and(|n| n.contains("mod ") && n.trim_end().ends_with('{'))
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Each function of `lines` (by its `fn` line) and how many lines it spans,
/// braces counted (braces in strings and comments are rare enough here).
fn function_lengths(lines: &[&str]) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let t = l.trim_start();
        let t = t.strip_prefix("pub ").unwrap_or(t);
        let t = t.strip_prefix("pub(crate) ").unwrap_or(t);
        let t = t.strip_prefix("pub(super) ").unwrap_or(t);
        let t = t.strip_prefix("async ").unwrap_or(t);
        let Some(rest) = t.strip_prefix("fn ") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let (mut depth, mut opened) = (0i64, false);
        for (j, body) in lines.iter().enumerate().skip(i) {
            if !opened && body.trim_end().ends_with(';') {
                break;
            }
            for c in body.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth == 0 {
                out.push((name.clone(), j - i + 1));
                break;
            }
        }
    }
    out
}

#[test]
fn the_cli_crate_keeps_its_files_and_functions_short() {
    // `cli/` (the binary: clap, `localvol client`, `localvol bench`): no
    // file over 800 lines and no function over 80, test modules aside.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cli/src");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    assert!(!files.is_empty(), "no sources under {dir:?}");
    let mut long = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).unwrap();
        let lines = non_test_lines(&text);
        let rel = f.strip_prefix(&dir).unwrap().display().to_string();
        if lines.len() > 800 {
            long.push(format!("{rel}: {} lines", lines.len()));
        }
        for (name, n) in function_lengths(&lines) {
            if n > 80 {
                long.push(format!("{rel}: fn {name}: {n} lines"));
            }
        }
    }
    assert!(long.is_empty(), "too long: {long:#?}");
}

#[test]
fn function_lengths_are_counted_by_braces() {
    let code = "fn a() {\n    if x {\n    }\n}\nfn b();\npub async fn c() -> T {\n}\n";
    let lines: Vec<&str> = code.lines().collect();
    assert_eq!(
        function_lengths(&lines),
        [("a".to_owned(), 4), ("c".to_owned(), 2)]
    );
}
