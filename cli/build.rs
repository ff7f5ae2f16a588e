//! Release binaries for glibc are linked with packed relative relocations
//! (`-z pack-relative-relocs`, DT_RELR: glibc 2.36, binutils 2.38, lld 15):
//! the ~20,000 relocations of a position-independent binary then take 6 kB
//! instead of 480 kB, which the loader reads at every start and which stay
//! resident on every node. An older linker ignores the option with a
//! warning.

fn main() {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("PROFILE") == "release"
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}
