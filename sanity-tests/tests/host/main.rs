//! The host half of localvol's conformance suite: one test binary, `host`
//! (`cargo test -p sanity-tests --test host`), one module per area. Every test
//! starts the real `localvol serve` through the fixtures of the `sanity_tests`
//! library (`src/`), which holds everything the modules share.
//!
//! The modules' tests run in parallel with each other, as libtest schedules
//! them, except two modules that must run alone, in a pass of their own with
//! `--test-threads=1` (`make sanity` runs the binary twice:
//! `-- --skip bench:: --skip fault_injection::`, then
//! `-- --test-threads=1 bench:: fault_injection::`):
//! - `bench`: its node-scale scenarios compare the length of the whole host's
//!   mount table between levels, which any other test's mounts change;
//! - `fault_injection`: four workers and a killer restarting the driver 200
//!   times, timed against the machine's cores.
//!
//! Tests that need the VM's kernel (device-mapper, project quotas) live in the
//! other binary, `vm` (`tests/vm/main.rs`).

mod bad_input;
mod bench;
mod concurrency;
mod controller;
mod ephemeral;
mod fault_injection;
mod grpc_clients;
mod identity;
mod immediate_binding;
mod lifecycle;
mod liveness;
mod node;
mod node_replace;
mod static_volumes;
mod unusable_pools;
mod upstream_findings;
