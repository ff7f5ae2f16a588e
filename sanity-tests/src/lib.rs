//! Shared harness for localvol's CSI conformance suite: the fixtures every module of
//! its two test binaries uses (`tests/host/main.rs`, `tests/vm/main.rs`).
//!
//! Every test starts the real `localvol serve` binary on a unix socket in a
//! fresh temp dir (with its own pool, kubelet dir and config) and talks to it
//! through the generated CSI client. [`Driver`]'s `Drop` kills the process and
//! unmounts everything it left below its temp dir before removing the dir, so a
//! failing test never leaves mounts behind.
//!
//! The binary is `$LOCALVOL_BIN`, else `<target>/debug/localvol` (`<target>` is
//! `$CARGO_TARGET_DIR` or the workspace's `target/`): build it first with
//! `cargo build --bin localvol`.
//!
//! This file is the index: the test modules `use sanity_tests::*`, and every
//! module below re-exports its items here.
//!
//! | module | what |
//! |---|---|
//! | `environ` | the binary under test, its version, root |
//! | `opts` | [`DriverOpts`], [`PoolOpts`], [`LvmPoolOpts`]: the driver's flags and config |
//! | `driver` | [`Driver`] (the process and its temp dir; `paths.rs` its dirs and log, `calls.rs` its panicking convenience calls), [`Csi`], [`retry_busy`] |
//! | `requests` | request builders ([`create_req`], [`mount_cap`], ...) and capability lists |
//! | `assertions` | [`must`], [`ok`], [`assert_code`], [`must_fail`], [`assert_file`] |
//! | `mounts` | the mount table ([`MountLine`], [`MountSnapshot`]) |
//! | `sentinel` | [`Sentinel`]: a directory that must never change |
//! | `sys` | commands, files, devices and processes of the host |
//! | `metrics` | the driver's `/metrics` endpoint |
//! | `loopdev` | [`LoopDevice`] and [`LoopFs`] (VM tests: quotas, raw disks) |
//! | `lvm` | [`LoopVg`]: a volume group on a loop device (VM tests) |
//! | `thick_and_thin` | [`LvmKind`], [`thick_and_thin!`], [`on_thick_and_thin`] |
//! | `lvm_fx` | [`LvmFx`]: a driver serving one LVM pool on its own VG |
//! | [`faults`] | the fault-injection killer (`mod.rs`) and workers (`workers.rs`) |
//! | [`replace`] | node replaced vs node lost |

pub use localvol::csi::volume_capability::access_mode::Mode as AccessMode;

mod assertions;
mod driver;
mod environ;
pub mod faults;
mod loopdev;
mod lvm;
mod lvm_fx;
mod metrics;
mod mounts;
mod opts;
pub mod replace;
mod requests;
mod sentinel;
mod sys;
mod thick_and_thin;

pub use assertions::*;
pub use driver::*;
pub use environ::*;
pub use loopdev::*;
pub use lvm::*;
pub use lvm_fx::{LvmFx, TAG_DELETED};
pub use metrics::*;
pub use mounts::*;
pub use opts::*;
pub use requests::*;
pub use sentinel::*;
pub use sys::*;
pub use thick_and_thin::*;

/// The topology key every localvol volume and node carries.
pub const TOPOLOGY_KEY: &str = "topology.localvol.csi.dev/node";
/// The node id drivers get unless a test picks another.
pub const NODE_ID: &str = "sanity-node-1";
/// Prefix of every driver temp dir (`grep localvol-sanity /proc/self/mountinfo`
/// finds leftovers).
pub const DIR_PREFIX: &str = "localvol-sanity-";

pub const KI: i64 = 1 << 10;
pub const MI: i64 = 1 << 20;
pub const GI: i64 = 1 << 30;

#[cfg(test)]
mod tests;
