//! The VM half of localvol's conformance suite: one test binary, `vm`
//! (`cargo test -p sanity-tests --test vm`), one module per area, for what
//! needs the VM's kernel (device-mapper, project quotas). Those tests are
//! `#[ignore]`d on the host; `make test-vm` boots the VM once and runs this
//! binary there with `--include-ignored --test-threads=1`, once per module
//! (filter `vm_lvm::` and so on, `VM_TESTS` picks modules), so each area
//! gets its own result and time in vm/guest-tests' summary. Every test must
//! live in a module (test-vm refuses one that does not). The few tests here
//! that need no VM kernel also run on the host, with `make sanity`.
//!
//! Shared fixtures (loop-device VGs, `LvmFx`, `thick_and_thin!`, the fault
//! workers) are in the `sanity_tests` library (`src/`).

mod vm_faults;
mod vm_iolimits;
mod vm_luks;
mod vm_lvm;
mod vm_lvm_index;
mod vm_quota;
mod vm_raw_disks;
mod vm_snapshot_metadata;
mod vm_snapshots;
mod vm_wipe;
