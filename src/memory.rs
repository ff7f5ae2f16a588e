//! Giving freed heap back to the kernel after a burst.
//!
//! A full ListVolumes of a node with 10,000 volumes builds its answer in a
//! few MB of small allocations that are all freed once it is sent. glibc
//! keeps freed memory inside its heaps and returns only the top of each, so
//! without help the driver's resident set stays at its peak (and RSS is
//! paid on every node). [`release_soon`] asks glibc to hand back every
//! free page (`malloc_trim(0)`) shortly after such a burst, once the answer
//! has gone out; bursts close together share one trim.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Answers with at least this many entries are followed by a trim.
pub const LARGE_ANSWER: usize = 1000;

/// How long after the call the trim runs: the answer is encoded and written
/// after the handler returns.
const DELAY: Duration = Duration::from_millis(200);

static PENDING: AtomicBool = AtomicBool::new(false);

/// Schedules one `malloc_trim(0)` on the blocking pool in [`DELAY`], unless
/// one is already scheduled. Outside a tokio runtime (a caller that is plain
/// code, such as a page built in a unit test) it does nothing; a no-op where
/// the C library has no `malloc_trim`.
pub fn release_soon() {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    runtime.spawn(async {
        tokio::time::sleep(DELAY).await;
        PENDING.store(false, Ordering::Release);
        let _ = tokio::task::spawn_blocking(trim).await;
    });
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: malloc_trim only walks and shrinks the allocator's own heaps.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of calls schedules one trim, and a later burst another.
    #[tokio::test]
    async fn bursts_share_one_trim() {
        release_soon();
        assert!(PENDING.load(Ordering::Acquire));
        release_soon();
        tokio::time::sleep(DELAY * 3).await;
        assert!(!PENDING.load(Ordering::Acquire), "the trim ran");
        release_soon();
        assert!(PENDING.load(Ordering::Acquire));
    }

    /// Plain code may build a large answer too (`ops::page` in a unit
    /// test): outside a runtime the call returns, where `tokio::spawn`
    /// panicked. (PENDING is shared with the test above, which runs beside
    /// this one, so its value is not checked here.)
    #[test]
    fn without_a_runtime_it_returns() {
        release_soon();
    }
}
