//! localvol: a Kubernetes CSI driver for node-local storage.
//!
//! See ARCHITECTURE.md for the code map and the invariants.

pub mod authority;
pub mod blockdev;
pub mod command;
pub mod config;
pub mod controller;
pub mod discovery;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod fsutil;
pub mod ids;
pub mod locks;
pub mod lvm;
pub mod metrics;
pub mod mount;
pub mod nodeops;
pub mod orphans;
pub mod pool;
pub mod quota;
pub mod server;
pub mod service;
pub mod size;

/// Bindings generated from `proto/csi.proto` (CSI spec v1.11).
#[allow(clippy::all, missing_docs)]
pub mod csi {
    tonic::include_proto!("csi.v1");
}
