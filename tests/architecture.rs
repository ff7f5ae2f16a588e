//! ARCHITECTURE.md's layering invariants, checked over the source text so
//! they stay true: no import cycle between the crate's top-level modules, and
//! each dependency that belongs to one layer stays there, and the dependency
//! table in ARCHITECTURE.md is the code's. Test code (a file's `#[cfg(test)]`
//! part, `tests.rs` and `*_tests.rs` files) and comments are not checked.
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
        let name = f.file_name().unwrap().to_string_lossy();
        if rel == "lib.rs" || name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let first = rel.split('/').next().unwrap();
        let module = first.strip_suffix(".rs").unwrap_or(first).to_owned();
        let text = fs::read_to_string(&f).unwrap();
        // Every `#[cfg(test)]` item is test code, wherever it stands.
        let code: String = non_test_lines(&text)
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

/// The files a rule looks at (`scope`) whose (non-test) code breaks it
/// (`breaks`), by path: every rule below is one call.
fn offenders_where(
    scope: impl Fn(&Source) -> bool,
    breaks: impl Fn(&Source) -> bool,
) -> Vec<String> {
    sources()
        .into_iter()
        .filter(|s| scope(s) && breaks(s))
        .map(|s| s.path)
        .collect()
}

/// Files whose (non-test) code mentions a needle, outside `allowed` modules.
fn offenders(needles: &[&str], allowed: &[&str]) -> Vec<String> {
    offenders_where(
        |s| !allowed.contains(&s.module.as_str()),
        |s| needles.iter().any(|n| s.code.contains(n)),
    )
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

/// Whether `code` has `needle`; one that starts like an identifier must
/// start one (`lock_volume`, not the `lock_` of `block_metadata`, a proto
/// field the SnapshotMetadata service must encode).
fn names(code: &str, needle: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    if !needle.starts_with(ident) {
        return code.contains(needle);
    }
    code.match_indices(needle)
        .any(|(i, _)| !code[..i].chars().next_back().is_some_and(ident))
}

#[test]
fn the_service_check_matches_whole_names() {
    assert!(names("d.lock_volume(&id)", "lock_"));
    assert!(names("lock_new(d)", "lock_"));
    assert!(!names("block_metadata: tuples", "lock_"));
    assert!(names("x.pools.get(p)", ".pools"));
}

#[test]
fn the_services_take_no_lock_call_no_pool_and_write_no_cgroup() {
    // `service/` decodes requests and encodes answers; the operations layer
    // (`ops/`) takes the volume's lock, looks it up, calls the pool or the
    // node pipeline and writes `io.max`. status.rs maps every layer's error
    // (`locks::Busy`, `nodeops::NodeError`, ...), so it may name them.
    let calls = [
        "lock_",
        "try_lock",
        ".locks",
        ".pools",
        "pool.",
        "dyn Pool",
        ".snapshots()",
        ".block_maps()",
        ".require(",
        ".find(",
        "find_ephemeral",
        "device_of",
        "check_storage",
        "require_usable",
        "enforce_io_limits",
        "cgroup_paths",
        "cgroup_root",
        "iolimit::enforce",
    ];
    let layers = ["locks::", "nodeops::", "pool::Pool"];
    let found = offenders_where(
        |s| s.module == "service",
        |s| {
            calls.iter().any(|n| names(&s.code, n))
                || (!s.path.ends_with("status.rs") && layers.iter().any(|n| s.code.contains(n)))
        },
    );
    assert!(
        found.is_empty(),
        "locks, pool calls, the node pipeline or cgroup writes in service/ (they belong in ops/): {found:?}"
    );
}

#[test]
fn the_operations_layer_sees_no_grpc_and_locks_in_one_place() {
    // ops/ takes decoded values and returns domain values and `OpError`;
    // its one lock function (`ops/mod.rs`) is the only place an RPC locks.
    assert!(sources().iter().any(|s| s.module == "ops"), "no src/ops/");
    let grpc = offenders_where(
        |s| s.module == "ops",
        |s| {
            ["tonic", "crate::csi", "csi::", "prost"]
                .iter()
                .any(|n| s.code.contains(n))
        },
    );
    assert!(grpc.is_empty(), "gRPC or proto types in ops/: {grpc:?}");
    let locks = offenders_where(
        |s| s.module == "ops" && s.path != "ops/mod.rs",
        |s| {
            ["try_lock", "lock_volume", "lock_with_source", ".locks"]
                .iter()
                .any(|n| s.code.contains(n))
        },
    );
    assert!(
        locks.is_empty(),
        "locks taken outside ops/mod.rs's `lock`/`lock_new`: {locks:?}"
    );
}

#[test]
fn only_command_rs_spawns_processes() {
    let found = offenders_where(
        |s| s.module != "command",
        |s| {
            // `Cmd::new` is command.rs's own builder, not a spawn.
            s.code.replace("Cmd::new", "").contains("Command::new")
                || s.code.contains("process::Command")
                || s.code.contains("tokio::process")
        },
    );
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
fn only_blockdev_raw_runs_the_programs_that_write_blocks() {
    // The programs that write a device's blocks directly are built (and a
    // leftover copy recognised) in one file.
    let programs = ["wipefs", "dd", "blkdiscard", "shred"].map(|p| format!("Cmd::new(\"{p}\")"));
    let found = offenders_where(
        |s| s.path != "blockdev/raw.rs",
        |s| programs.iter().any(|p| s.code.contains(p.as_str())),
    );
    assert!(
        found.is_empty(),
        "wipefs, dd, blkdiscard or shred run outside blockdev/raw.rs: {found:?}"
    );
}

/// The top-level modules `lib.rs` compiles only for tests (`#[cfg(test)]
/// mod testing;`): `sources()` reads their files like any other.
fn test_only_modules() -> BTreeSet<String> {
    let lib = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let lines: Vec<&str> = lib.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter(|w| w[0] == "#[cfg(test)]")
        .filter_map(|w| w[1].strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn programs_is_every_program_the_driver_runs() {
    // `command::PROGRAMS` is what the image checks look for in the image
    // (`localvol config programs`): every `Cmd::new("...")` outside tests,
    // and nothing else. A program that is not a literal would escape that,
    // so each such run is named here with its reason.
    let not_literal = [
        // A discovery class's `cleanup` command: the operator's program.
        "discovery/cleanup.rs",
    ];
    let test_only = test_only_modules();
    let mut run = BTreeMap::<String, Vec<String>>::new();
    let mut unnamed = Vec::new();
    for s in sources()
        .into_iter()
        .filter(|s| !test_only.contains(&s.module))
    {
        for (i, part) in s.code.split("Cmd::new(").skip(1).enumerate() {
            match part.strip_prefix('"').and_then(|p| p.split_once('"')) {
                Some((program, _)) => run
                    .entry(program.to_owned())
                    .or_default()
                    .push(s.path.clone()),
                None if not_literal.contains(&s.path.as_str()) => {}
                None => unnamed.push(format!("{} (run {})", s.path, i + 1)),
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "Cmd::new of a program that is not a literal (name it in PROGRAMS and run it by \
         its literal, or list the file here with its reason): {unnamed:?}"
    );
    let listed: BTreeSet<String> = localvol::command::PROGRAMS
        .iter()
        .map(|p| p.to_string())
        .collect();
    let found: BTreeSet<String> = run.keys().cloned().collect();
    assert_eq!(
        listed,
        found,
        "command::PROGRAMS is not the programs the source runs: missing {:?}, never run {:?} \
         (where each runs: {run:?})",
        found.difference(&listed).collect::<Vec<_>>(),
        listed.difference(&found).collect::<Vec<_>>(),
    );
    let mut sorted = localvol::command::PROGRAMS.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(
        sorted,
        localvol::command::PROGRAMS,
        "PROGRAMS in order, each once"
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

#[test]
fn the_services_choose_no_code_but_invalid_argument() {
    // A handler refuses bad input with INVALID_ARGUMENT while it decodes;
    // every other code is chosen in service/status.rs (from a layer's error
    // or a `Refusal`), so a code is decided in one place.
    let mut found = Vec::new();
    for s in sources() {
        if s.module != "service" || s.path.ends_with("status.rs") {
            continue;
        }
        for (i, line) in s.code.lines().enumerate() {
            let mut rest = line;
            while let Some(at) = rest.find("Status::") {
                rest = &rest[at + "Status::".len()..];
                let ctor: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if ctor != "invalid_argument" && rest[ctor.len()..].starts_with('(') {
                    found.push(format!("{}:{}: Status::{ctor}", s.path, i + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "statuses other than INVALID_ARGUMENT built in service/: {found:#?}"
    );
}

/// ARCHITECTURE.md's "Module dependencies" block as a graph: `a -> b, c`
/// entries (several may share a line, a list may go on over indented
/// lines) and one `(no dependencies: ...)` list.
fn documented_graph(doc: &str) -> BTreeMap<String, BTreeSet<String>> {
    let from = doc
        .find("Module dependencies")
        .expect("ARCHITECTURE.md has a \"Module dependencies\" section");
    let block = &doc[from..];
    let open = block.find("```\n").expect("the section has a code block") + 4;
    let block = &block[open..];
    let block = &block[..block.find("```").expect("the code block ends")];
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let (table, leaves) = match block.find("(no dependencies:") {
        Some(i) => {
            let rest = &block[i + "(no dependencies:".len()..];
            let end = rest
                .find(')')
                .expect("the no-dependencies list ends with ')'");
            (&block[..i], &rest[..end])
        }
        None => (block, ""),
    };
    for m in leaves.split(',').map(str::trim).filter(|m| !m.is_empty()) {
        g.entry(m.to_owned()).or_default();
    }
    let tokens: Vec<&str> = table.split_whitespace().collect();
    let mut current: Option<String> = None;
    let mut i = 0;
    while i < tokens.len() {
        if tokens.get(i + 1) == Some(&"->") {
            current = Some(tokens[i].to_owned());
            g.entry(tokens[i].to_owned()).or_default();
            i += 2;
            continue;
        }
        let m = current
            .as_ref()
            .unwrap_or_else(|| panic!("{:?} before any `module ->`", tokens[i]));
        g.get_mut(m)
            .unwrap()
            .insert(tokens[i].trim_end_matches(',').to_owned());
        i += 1;
    }
    g
}

#[test]
fn the_documented_table_reads_both_layouts() {
    let doc = "Module dependencies\n\n```\na -> b, c      d -> b\ne -> a, b,\n     c\n(no dependencies: b,\nc)\n```\n";
    let g = documented_graph(doc);
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(g["a"], set(&["b", "c"]));
    assert_eq!(g["d"], set(&["b"]));
    assert_eq!(g["e"], set(&["a", "b", "c"]));
    assert!(g["b"].is_empty() && g["c"].is_empty());
    assert_eq!(g.len(), 5);
}

/// The table in ARCHITECTURE.md is the code's graph: every module, and for
/// each exactly the modules it uses. On a difference the code's table is
/// printed, ready to paste.
#[test]
fn architecture_md_dependency_table_is_the_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let documented = documented_graph(&doc);
    let code = graph(&sources());
    if documented != code {
        let mut table = String::new();
        let mut leaves = Vec::new();
        for (m, deps) in &code {
            if deps.is_empty() {
                leaves.push(m.as_str());
            } else {
                let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
                table.push_str(&format!("{m} -> {}\n", deps.join(", ")));
            }
        }
        table.push_str(&format!("(no dependencies: {})\n", leaves.join(", ")));
        let mut diff = Vec::new();
        for m in documented
            .keys()
            .chain(code.keys())
            .collect::<BTreeSet<_>>()
        {
            let (d, c) = (documented.get(m), code.get(m));
            if d != c {
                diff.push(format!("  {m}: documented {d:?}, code {c:?}"));
            }
        }
        panic!(
            "ARCHITECTURE.md's module dependencies differ from the code:\n{}\nthe code's table:\n{table}",
            diff.join("\n")
        );
    }
}

/// A file's text without its `#[cfg(test)]` items (an inline test module,
/// a gated helper): each attribute line drops the item that follows it, up
/// to its closing brace or its `;`.
fn non_test_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "#[cfg(test)]" {
            out.push(lines[i]);
            i += 1;
            continue;
        }
        let mut depth = 0i64;
        let mut opened = false;
        let mut j = i + 1;
        while j < lines.len() {
            for d in brace_deltas(lines[j]) {
                depth += d;
                opened = true;
            }
            if (opened && depth <= 0) || (!opened && lines[j].trim_end().ends_with(';')) {
                break;
            }
            j += 1;
        }
        i = j + 1;
    }
    out
}

/// The braces of one line of code as +1/-1, outside strings, character
/// literals and `//` comments.
fn brace_deltas(line: &str) -> Vec<i64> {
    let c: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => break,
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    i += if c[i] == '\\' { 2 } else { 1 };
                }
            }
            // A character literal ('{', '\'', '\n'), not a lifetime.
            '\'' if c.get(i + 2) == Some(&'\'') => i += 2,
            '\'' if c.get(i + 1) == Some(&'\\') => {
                i += 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
            }
            '{' => out.push(1),
            '}' => out.push(-1),
            _ => {}
        }
        i += 1;
    }
    out
}

/// `(name, first line, length in lines)` of each function in `lines`.
fn functions(lines: &[&str]) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let mut words = l.split_whitespace().peekable();
        while words.peek().is_some_and(|w| {
            w.starts_with("pub") || ["async", "unsafe", "const", "extern"].contains(w)
        }) {
            words.next();
        }
        if words.next() != Some("fn") {
            continue;
        }
        let name: String = words
            .next()
            .unwrap_or("")
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let (mut depth, mut opened) = (0i64, false);
        for (j, line) in lines.iter().enumerate().skip(i) {
            for d in brace_deltas(line) {
                depth += d;
                opened = true;
            }
            if !opened && line.trim_end().ends_with(';') {
                break; // a declaration without a body
            }
            if opened && depth <= 0 {
                out.push((name.clone(), i + 1, j - i + 1));
                break;
            }
        }
    }
    out
}

#[test]
fn the_size_checks_skip_test_items_and_strings() {
    let text = "fn a() {\n    let s = \"{{\";\n    let c = '{';\n}\n#[cfg(test)]\nfn t() {\n    x();\n}\n#[cfg(test)]\nmod tests;\nfn b<'a>(x: &'a str) {\n}\n";
    let lines = non_test_lines(text);
    assert_eq!(lines.len(), 6, "{lines:?}");
    let f = functions(&lines);
    assert_eq!(f, [("a".into(), 1, 4), ("b".into(), 5, 2)]);
}

/// Issue-sized limits that keep each file and function readable: no file
/// over 800 non-test lines, no non-test function over 80, in every crate of
/// the workspace (`tests.rs` / `*_tests.rs` files and `tests/` are test
/// code).
#[test]
fn no_file_over_800_and_no_function_over_80_non_test_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "sanity-tests/src", "cli/src"] {
        if root.join(dir).is_dir() {
            rust_files(&root.join(dir), &mut files);
        }
    }
    files.sort();
    let mut over = Vec::new();
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let rel = f.strip_prefix(root).unwrap().display().to_string();
        let text = fs::read_to_string(f).unwrap();
        let lines = non_test_lines(&text);
        if lines.len() > 800 {
            over.push(format!("{rel}: {} non-test lines", lines.len()));
        }
        for (name, at, len) in functions(&lines) {
            if len > 80 {
                over.push(format!(
                    "{rel}: fn {name} (non-test line {at}) has {len} lines"
                ));
            }
        }
    }
    assert!(over.is_empty(), "over the limits:\n  {}", over.join("\n  "));
}
