//! The controllers' clock: the system's, or, in tests, one moved forward by hand so that
//! what waits days (retention) can be checked in a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

/// The time as the controllers read it: the system's, plus however far a test moved it.
/// Copies share the offset, so moving one moves the clock of every controller holding it.
#[derive(Debug, Clone, Default)]
pub struct Clock {
    ahead_ms: Arc<AtomicI64>,
}

impl Clock {
    pub fn now(&self) -> DateTime<Utc> {
        Utc::now() + TimeDelta::milliseconds(self.ahead_ms.load(Ordering::Relaxed))
    }

    /// Moves the clock forward by `by` (tests).
    pub fn advance(&self, by: Duration) {
        let ms = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.ahead_ms.fetch_add(ms, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advanced_clock_reads_later_in_every_copy() {
        let clock = Clock::default();
        let copy = clock.clone();
        let before = copy.now();
        clock.advance(Duration::from_secs(86_400));
        let after = copy.now();
        assert!(after - before >= TimeDelta::days(1), "{before} → {after}");
        assert!(after - before < TimeDelta::days(1) + TimeDelta::minutes(1), "{before} → {after}");
    }
}
