//! Reading what happened: workload events and the audit log.

use berth_core::Error;
use berth_core::event::{AuditRecord, Event};
use berth_core::page::{Page, PageRequest};
use berth_store::audit::AuditFilter;
use berth_store::{PgPool, audit, event, workload};

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
