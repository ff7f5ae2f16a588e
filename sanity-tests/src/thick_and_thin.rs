//! LVM scenarios run against a thick and a thin pool (`tests/vm/vm_lvm.rs`,
//! `tests/vm/vm_snapshots.rs` and others): [`LvmKind`], the
//! [`thick_and_thin!`](crate::thick_and_thin!) macro and what it runs.

use std::time::Instant;

use crate::MI;

/// A filesystem size mkfs.xfs accepts: it refuses those below 300 MiB.
pub const XFS_SIZE: i64 = 320 * MI;

/// The two kinds of LVM pool every VM scenario runs against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LvmKind {
    Thick,
    Thin,
}

/// `thick_and_thin!(a, b)` defines `mod thick_and_thin` with one test per
/// scenario (`async fn(LvmKind)` beside the invocation), each running it
/// against a thick and a thin pool at once: lvm commands are slow under TCG
/// and the VM has two vCPUs. The tests are ignored on the host; `make test-vm`
/// runs them in the VM.
#[macro_export]
macro_rules! thick_and_thin {
    ($($scenario:ident),* $(,)?) => {
        mod thick_and_thin {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[ignore = "needs device-mapper: run by make test-vm in the VM"]
                async fn $scenario() {
                    $crate::on_thick_and_thin(
                        concat!(module_path!(), "::", stringify!($scenario)),
                        super::$scenario,
                    )
                    .await
                }
            )*
        }
    };
}

/// Runs `scenario` for both kinds concurrently; fails (naming the kind and
/// its panic) when either failed. Prints how long each took (shown with
/// `--nocapture`; the total VM time is budgeted).
pub async fn on_thick_and_thin<F, Fut>(name: &str, scenario: F)
where
    F: Fn(LvmKind) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let runs: Vec<_> = [LvmKind::Thick, LvmKind::Thin]
        .into_iter()
        .map(|kind| {
            let (label, run) = (format!("{name}::{kind:?}"), scenario(kind));
            let task = tokio::spawn(async move {
                let start = Instant::now();
                run.await;
                eprintln!("{label} took {:.1?}", start.elapsed());
            });
            (kind, task)
        })
        .collect();
    let mut failed = Vec::new();
    for (kind, task) in runs {
        if let Err(e) = task.await {
            let why = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into()),
                Err(e) => e.to_string(),
            };
            failed.push(format!("{kind:?}: {why}"));
        }
    }
    assert!(failed.is_empty(), "{name} failed:\n{}", failed.join("\n"));
}

/// The LV of a localvol volume id (`<pool>.<key>` → `lv-<key>`).
pub fn lv_name(volume_id: &str) -> String {
    let (_, key) = volume_id
        .rsplit_once('.')
        .unwrap_or_else(|| panic!("{volume_id:?} is not a localvol volume id"));
    format!("lv-{key}")
}
