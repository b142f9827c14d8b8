//! Reading what happened: workload events, the audit log, and GPU usage over time.

use berth_core::Error;
use berth_core::event::{AuditRecord, Event};
use berth_core::page::{Page, PageRequest};
use berth_core::team::{UsageHistory, UsagePoint, UsageSeries};
use berth_store::audit::AuditFilter;
use berth_store::{PgPool, audit, event, usage, workload};
use chrono::{DateTime, TimeDelta, Utc};

/// A workload's events, oldest first.
///
/// # Errors
/// [`Error::NotFound`] when the workload does not exist; store errors.
pub async fn workload_events(
    db: &PgPool,
    team: &str,
    name: &str,
    page: &PageRequest<i64>,
) -> Result<Page<Event>, Error> {
    let w = workload::workload_fetch(db, team, name).await?.ok_or_else(|| crate::workload::not_found(team, name))?;
    event::event_list(db, w.metadata.uid, page).await
}

/// Audit records, newest first.
///
/// # Errors
/// Store errors.
pub async fn audit_list(
    db: &PgPool,
    filter: &AuditFilter,
    page: &PageRequest<i64>,
) -> Result<Page<AuditRecord>, Error> {
    audit::audit_list(db, filter, page).await
}

/// How far back usage history may be asked for (the orphan collector keeps 30 days).
pub const USAGE_HISTORY_MAX_DAYS: i64 = 30;

/// GPUs allocated per team and flavor since `since` (at most [`USAGE_HISTORY_MAX_DAYS`]
/// ago), only of the teams in `only` when given, and of one flavor when given.
///
/// # Errors
/// [`Error::Invalid`] naming `since` when it is too far back or in the future; store errors.
pub async fn usage_history(
    db: &PgPool,
    since: DateTime<Utc>,
    flavor: Option<&str>,
    only: Option<&[String]>,
) -> Result<UsageHistory, Error> {
    let now = Utc::now();
    if since < now - TimeDelta::days(USAGE_HISTORY_MAX_DAYS) || since > now {
        return Err(Error::invalid("since", format!("must lie within the last {USAGE_HISTORY_MAX_DAYS} days")));
    }
    let mut history = UsageHistory { since, series: Vec::new() };
    for c in usage::usage_history(db, since, only).await? {
        if flavor.is_some_and(|f| f != c.flavor) {
            continue;
        }
        let point = UsagePoint { at: c.at, allocated: c.allocated, borrowed: c.borrowed };
        match history.series.last_mut() {
            Some(s) if s.team == c.team && s.flavor == c.flavor => s.points.push(point),
            _ => history.series.push(UsageSeries { team: c.team, flavor: c.flavor, points: vec![point] }),
        }
    }
    Ok(history)
}
