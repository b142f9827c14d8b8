//! Reading what happened: workload events, the audit log, and GPU usage over time.

use berth_core::Error;
use berth_core::event::{AuditRecord, Event};
use berth_core::page::{Page, PageRequest};
use berth_core::team::{UsageHistory, UsagePoint, UsageSeries};
use berth_store::audit::AuditFilter;
use berth_store::{PgPool, audit, event, usage, workload};

use crate::context::OpContext;
use chrono::{DateTime, TimeDelta, Utc};

/// A workload's events, oldest first, in words the caller may read.
///
/// # Errors
/// [`Error::NotFound`] when the workload does not exist or the caller cannot see its
/// team; store errors.
pub async fn workload_events(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    page: &PageRequest<i64>,
) -> Result<Page<Event>, Error> {
    opctx.access().read_team(team)?;
    let w = workload::workload_fetch(db, team, name).await?.ok_or_else(|| crate::workload::not_found(team, name))?;
    let mut events = event::event_list(db, w.metadata.uid, page).await?;
    let redactor = opctx.redactor();
    for e in &mut events.items {
        e.message = redactor.text(&e.message);
    }
    Ok(events)
}

/// A team's events (its budgets crossing 80 % and 100 %), oldest first.
///
/// # Errors
/// [`Error::NotFound`] when the team does not exist or the caller cannot see it; store
/// errors.
pub async fn team_events(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    page: &PageRequest<i64>,
) -> Result<Page<Event>, Error> {
    opctx.access().read_team(team)?;
    let t = berth_store::team::team_fetch(db, team)
        .await?
        .ok_or_else(|| Error::NotFound { kind: "team", name: team.to_owned() })?;
    event::event_list(db, t.metadata.uid, page).await
}

/// Audit records, newest first: platform admins and global viewers only.
///
/// # Errors
/// [`Error::Forbidden`] for anyone else; store errors.
pub async fn audit_list(
    db: &PgPool,
    opctx: &OpContext,
    filter: &AuditFilter,
    page: &PageRequest<i64>,
) -> Result<Page<AuditRecord>, Error> {
    if !opctx.access().reads_all() {
        return Err(Error::Forbidden("only platform admins and global viewers may read the audit log".into()));
    }
    audit::audit_list(db, filter, page).await
}

/// How far back usage history may be asked for (the orphan collector keeps 30 days).
pub const USAGE_HISTORY_MAX_DAYS: i64 = 30;

/// GPUs allocated per team and flavor since `since` (at most [`USAGE_HISTORY_MAX_DAYS`]
/// ago), of the teams the caller can see, and of one flavor when given.
///
/// # Errors
/// Store errors. A `since` outside the retention window is moved into it (the answer's
/// `since` says from when it reads).
pub async fn usage_history(
    db: &PgPool,
    opctx: &OpContext,
    since: DateTime<Utc>,
    flavor: Option<&str>,
) -> Result<UsageHistory, Error> {
    let only = opctx.visible_teams();
    let now = Utc::now();
    // History is kept for the retention window: an earlier start reads from its
    // beginning, a later one (in the future) from now.
    let since = since.clamp(now - TimeDelta::days(USAGE_HISTORY_MAX_DAYS), now);
    let mut history = UsageHistory { since, series: Vec::new() };
    for c in usage::usage_history(db, since, only.as_deref()).await? {
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
