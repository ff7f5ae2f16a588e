//! Generates the CSI bindings from `proto/csi.proto` with the pure-Rust `protox`
//! compiler, so building needs no system `protoc`. (The binary's link options
//! are in `cli/build.rs`: this package has no binary.)

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let fds = protox::compile(["csi.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
