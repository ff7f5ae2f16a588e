//! What the host gives the suite: the `localvol` binary under test, the
//! version it must report, and whether the tests run as root.

use std::fs;
use std::path::{Path, PathBuf};

/// The workspace root (the parent of this crate).
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("sanity-tests lives inside the workspace")
        .to_path_buf()
}

/// Path of the `localvol` binary under test; panics with instructions when it
/// is missing.
pub fn localvol_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("LOCALVOL_BIN") {
        let p = PathBuf::from(p);
        assert!(
            p.is_file(),
            "LOCALVOL_BIN={} does not exist or is not a file",
            p.display()
        );
        return p;
    }
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) if Path::new(&t).is_absolute() => PathBuf::from(t),
        Some(t) => workspace_dir().join(t),
        None => workspace_dir().join("target"),
    };
    let p = target.join("debug").join("localvol");
    assert!(
        p.is_file(),
        "the localvol binary is missing at {}: run `cargo build --bin localvol` first \
         (or point LOCALVOL_BIN at a built binary)",
        p.display()
    );
    p
}

/// The version in the workspace's root Cargo.toml `[package]` section: what
/// GetPluginInfo must report.
pub fn crate_version() -> String {
    let text = fs::read_to_string(workspace_dir().join("Cargo.toml")).expect("reading Cargo.toml");
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
            continue;
        }
        if in_package {
            if let Some(rest) = line.strip_prefix("version") {
                let v = rest.trim_start().trim_start_matches('=').trim();
                return v.trim_matches('"').to_owned();
            }
        }
    }
    panic!("no version in the [package] section of the workspace Cargo.toml");
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Tests that mount call this first: without root they fail loudly instead of
/// passing without having checked anything.
pub fn require_root() {
    assert!(
        is_root(),
        "this test mounts and needs root (CI runs the suite as root); \
         run it with sudo or in the project's VM"
    );
}
