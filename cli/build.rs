//! Link arguments of release binaries for glibc.
//!
//! Packed relative relocations (`-z pack-relative-relocs`, DT_RELR: glibc
//! 2.36, binutils 2.38, lld 15): the ~20,000 relocations of a
//! position-independent binary then take 6 kB instead of 480 kB, which the
//! loader reads at every start and which stay resident on every node. An
//! older linker ignores the option with a warning.
//!
//! The hot functions first (`symbol-order.txt`, lld's
//! `--symbol-ordering-file`; see `cli/symbol-order`): the functions a serving
//! driver runs, laid out together, so that the pages the kernel maps around
//! them hold little else. Only where lld links, which rustc does by default
//! for x86_64 Linux since 1.90, and no other linker was asked for (GNU ld
//! before 2.43 has no ordering option). `LOCALVOL_SYMBOL_ORDER=0` turns it
//! off.

use std::process::Command;

fn main() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=symbol-order.txt");
    println!("cargo:rerun-if-env-changed=LOCALVOL_SYMBOL_ORDER");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    if var("PROFILE") != "release"
        || var("CARGO_CFG_TARGET_OS") != "linux"
        || var("CARGO_CFG_TARGET_ENV") != "gnu"
    {
        return;
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");

    let rustflags = var("CARGO_ENCODED_RUSTFLAGS");
    let lld = var("CARGO_CFG_TARGET_ARCH") == "x86_64"
        && rustc_minor(&var("RUSTC")).is_some_and(|minor| minor >= 90)
        && var("RUSTC_LINKER").is_empty()
        && !rustflags.contains("linker")
        && !rustflags.contains("link-self-contained");
    if lld && var("LOCALVOL_SYMBOL_ORDER") != "0" {
        let list = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("symbol-order.txt");
        if list.is_file() {
            println!(
                "cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}",
                list.display()
            );
            // A name the binary lacks (the list is older than the code or
            // the compiler) is skipped; `cli/symbol-order check` counts them.
            println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
        }
    }
}

/// The minor version of the compiler cargo runs (`rustc 1.95.0 (...)`).
fn rustc_minor(rustc: &str) -> Option<u32> {
    let out = Command::new(if rustc.is_empty() { "rustc" } else { rustc })
        .arg("-V")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace()
        .nth(1)?
        .split('.')
        .nth(1)?
        .parse()
        .ok()
}
