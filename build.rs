//! Generates the CSI bindings from `proto/csi.proto` with the pure-Rust `protox`
//! compiler, so building needs no system `protoc`.
//!
//! Release binaries for glibc are linked with packed relative relocations
//! (`-z pack-relative-relocs`, DT_RELR: glibc 2.36, binutils 2.38, lld 15):
//! the ~20,000 relocations of a position-independent binary then take 6 kB
//! instead of 480 kB, which the loader reads at every start and which stay
//! resident (issue 12: the driver's RSS). An older linker ignores the option
//! with a warning.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    if var("PROFILE") == "release"
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu"
    {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
    let fds = protox::compile(["csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
