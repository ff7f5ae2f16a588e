//! Background tasks tied to their owner's lifetime.

/// Aborts a spawned task when dropped, so a task a function starts ends with
/// it (on return, error or cancellation) instead of running on detached.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
