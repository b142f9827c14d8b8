//! Helpers shared by the adapter integration tests.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `check` every 50 ms until it gives a value; fails after `timeout`, saying what
/// it waited for.
pub async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
