//! SQL for the audit log.

use berth_core::Error;
use berth_core::event::{Actor, AuditRecord, AuditVerb};
use berth_core::page::{Page, PageRequest};
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::db_error;

/// One mutation to record.
pub struct AuditEntry<'a> {
    pub actor: &'a Actor,
    pub verb: AuditVerb,
    pub kind: &'static str,
    pub team: Option<&'a str>,
    pub name: &'a str,
    pub uid: Uuid,
    pub generation_before: Option<i64>,
    pub generation_after: Option<i64>,
    /// For an update: the spec before and after it.
    pub spec_change: Option<(serde_json::Value, serde_json::Value)>,
}

/// Which audit records a list returns. `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub kind: Option<String>,
    pub name: Option<String>,
    pub actor: Option<String>,
    /// Only changes made at or after this time...
    pub since: Option<DateTime<Utc>>,
    /// ... and before this one.
    pub until: Option<DateTime<Utc>>,
}

/// Appends an audit record.
///
/// # Errors
/// As [`db_error`].
pub async fn audit_record(db: impl PgExecutor<'_>, e: &AuditEntry<'_>) -> Result<(), Error> {
    sqlx::query!(
        r#"INSERT INTO audit_log (actor, verb, kind, team, name, uid, generation_before, generation_after, request_id,
                                     spec_before, spec_after)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"#,
        e.actor.subject,
        e.verb.as_str(),
        e.kind,
        e.team,
        e.name,
        e.uid,
        e.generation_before,
        e.generation_after,
        e.actor.request_id,
        e.spec_change.as_ref().map(|c| &c.0),
        e.spec_change.as_ref().map(|c| &c.1),
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// Lists audit records, newest first.
///
/// # Errors
/// As [`db_error`].
pub async fn audit_list(
    db: impl PgExecutor<'_>,
    filter: &AuditFilter,
    page: &PageRequest<i64>,
) -> Result<Page<AuditRecord>, Error> {
    let rows = sqlx::query!(
        r#"SELECT id, at, actor, verb, kind, team, name, uid, generation_before, generation_after, request_id,
                  spec_before, spec_after
           FROM audit_log
           WHERE ($1::text IS NULL OR kind = $1) AND ($2::text IS NULL OR name = $2)
             AND ($3::text IS NULL OR actor = $3) AND ($4::bigint IS NULL OR id < $4)
             AND ($6::timestamptz IS NULL OR at >= $6) AND ($7::timestamptz IS NULL OR at < $7)
           ORDER BY id DESC LIMIT $5"#,
        filter.kind,
        filter.name,
        filter.actor,
        page.after,
        i64::from(page.limit) + 1,
        filter.since,
        filter.until,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(Page::from_rows(rows, page.limit, |r| r.id).map(|r| AuditRecord {
        id: r.id,
        time: r.at,
        actor: r.actor,
        verb: AuditVerb::from_db(&r.verb),
        kind: r.kind,
        team: r.team,
        name: r.name,
        uid: r.uid,
        generation_before: r.generation_before,
        generation_after: r.generation_after,
        request_id: r.request_id,
        spec_before: r.spec_before,
        spec_after: r.spec_after,
    }))
}
