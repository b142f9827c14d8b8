//! The change feed: Postgres announces each committed write that the controllers read, on
//! channel [`CHANNEL`]. The triggers of the migrations `notify_changes`,
//! `notify_status_phases` and `workload_submissions_notify_later` send the notifications.
//! This module is the one place in Rust that knows their format: readers get a typed
//! [`Change`], and writers say what they wrote through the functions here.

use berth_core::Error;
use berth_core::workload::Phase;
use sqlx::PgExecutor;
use sqlx::postgres::{PgListener, PgPool};

use crate::db_error;

/// The channel the triggers notify on.
pub const CHANNEL: &str = "berth_changes";

/// What one notification says was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Rows of this table (any write but a status-only write of workloads).
    Table(String),
    /// A statement that wrote only workload statuses, each entering one of these phases.
    WorkloadStatuses(Vec<Phase>),
    /// New workloads submitted (sent after their transactions committed, one for many).
    Submitted,
}

/// The payload of [`Change::Submitted`]. A build that does not know it reads it as a write
/// of a table, which wakes every reader.
const SUBMITTED: &str = "workloads submitted";

/// The prefix of a status-only workload write's payload: `workloads status:Dispatched,Running`.
const STATUSES: &str = "workloads status:";

impl Change {
    /// Reads a notification's payload. A status write naming a phase this build does not
    /// know is read as a write of the table, which wakes every reader.
    pub fn parse(payload: &str) -> Self {
        if payload == SUBMITTED {
            return Self::Submitted;
        }
        let phases = payload.strip_prefix(STATUSES).map(|p| p.split(',').map(Phase::parse).collect());
        match phases {
            Some(Some(phases)) => Self::WorkloadStatuses(phases),
            Some(None) => Self::Table("workloads".into()),
            None => Self::Table(payload.to_owned()),
        }
    }

    /// The payload the triggers send for this change.
    pub fn payload(&self) -> String {
        match self {
            Self::Table(table) => table.clone(),
            Self::Submitted => SUBMITTED.to_owned(),
            Self::WorkloadStatuses(phases) => {
                format!("{STATUSES}{}", phases.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(","))
            }
        }
    }
}

/// What the statement that writes workload statuses hands the trigger (transaction-local
/// setting `berth.status_phases`): the phases written, once each, sorted.
pub(crate) fn status_phases_setting(phases: &[Phase]) -> String {
    let mut written: Vec<&str> = phases.iter().map(|p| p.as_str()).collect();
    written.sort_unstable();
    written.dedup();
    written.join(",")
}

/// Announces `change` (as the triggers would), sent when the surrounding transaction commits.
///
/// # Errors
/// As [`db_error`].
pub async fn notify(db: impl PgExecutor<'_>, change: &Change) -> Result<(), Error> {
    sqlx::query!("SELECT pg_notify($1, $2)", CHANNEL, change.payload()).execute(db).await.map(drop).map_err(db_error)
}

/// A listening connection of its own on [`CHANNEL`].
pub struct ChangeFeed(PgListener);

impl ChangeFeed {
    /// Starts listening; changes committed from now on are received.
    ///
    /// # Errors
    /// As [`db_error`].
    pub async fn listen(db: &PgPool) -> Result<Self, Error> {
        let mut listener = PgListener::connect_with(db).await.map_err(db_error)?;
        listener.listen(CHANNEL).await.map_err(db_error)?;
        Ok(Self(listener))
    }

    /// The next change. After an error the feed may have missed changes: a reader starts
    /// a new one and reads what it follows again.
    ///
    /// # Errors
    /// As [`db_error`] when the connection is lost.
    pub async fn next(&mut self) -> Result<Change, Error> {
        self.0.recv().await.map(|n| Change::parse(n.payload())).map_err(db_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_read_back_as_written() {
        for change in [
            Change::Table("teams".into()),
            Change::Table("workloads".into()),
            Change::WorkloadStatuses(vec![Phase::Dispatched, Phase::Running]),
            Change::Submitted,
        ] {
            assert_eq!(Change::parse(&change.payload()), change);
        }
        assert_eq!(Change::parse("workloads status:Dispatched,Warped"), Change::Table("workloads".into()));
        assert_eq!(status_phases_setting(&[Phase::Running, Phase::Dispatched, Phase::Running]), "Dispatched,Running");
    }
}
