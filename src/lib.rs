//! localvol: a Kubernetes CSI driver for node-local storage.
//!
//! See ARCHITECTURE.md for the code map and the invariants.

mod attributes;
mod authority;
pub mod blockdev;
pub mod command;
pub mod config;
pub mod controller;
mod crypt;
pub mod discovery;
mod dm;
mod driver;
pub mod endpoint;
pub mod error;
mod fsutil;
pub mod ids;
pub mod iolimit;
mod k8s;
pub mod liveness;
mod locks;
pub mod lvm;
mod memory;
pub mod metrics;
mod monitor;
pub mod mount;
mod nodeops;
mod ops;
mod orphans;
mod pool;
pub mod quota;
mod runs;
pub mod server;
mod service;
pub mod size;
mod task;
#[cfg(test)]
mod testing;

/// The driver's version (the workspace root's `Cargo.toml`): what
/// GetPluginInfo reports and `localvol --version` prints.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `localvol config check --storage-class` and `--snapshot-class`: classes
/// decoded as CreateVolume and CreateSnapshot decode them.
pub use service::classes as class_check;

/// The tests' fake Kubernetes API server (`k8s/fake.rs`), for the test
/// crates that start the real binary against it; never in a normal build.
#[cfg(feature = "fake-api")]
pub use k8s::fake as fake_api;

/// Bindings generated from `proto/csi.proto` (CSI spec v1.11).
#[allow(clippy::all, missing_docs)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}
