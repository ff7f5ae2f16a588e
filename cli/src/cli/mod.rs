//! The command-line CSI clients of the one `localvol` binary: `localvol
//! client` (one RPC at a time, for operators) and `localvol bench` (lifecycle
//! benchmarks against any CSI driver's socket). They use the driver library
//! only as any client would (endpoints, sizes, the proto bindings, and the
//! LVM and mount helpers of the bench's bare floor); the library knows
//! nothing of them.

pub mod bench;
pub mod client;
