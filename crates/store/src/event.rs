//! SQL for events.

use berth_core::Error;
use berth_core::event::{Event, EventType};
use berth_core::page::{Page, PageRequest};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::db_error;

/// Records an event about an object.
///
/// # Errors
/// As [`db_error`].
pub async fn event_record(
    db: impl PgExecutor<'_>,
    kind: &str,
    uid: Uuid,
    event_type: EventType,
    reason: &str,
    message: &str,
) -> Result<(), Error> {
    sqlx::query!(
        "INSERT INTO events (object_kind, object_uid, type, reason, message) VALUES ($1, $2, $3, $4, $5)",
        kind,
        uid,
        event_type.as_str(),
        reason,
        message
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}

/// Lists an object's events, oldest first.
///
/// # Errors
/// As [`db_error`].
pub async fn event_list(db: impl PgExecutor<'_>, uid: Uuid, page: &PageRequest<i64>) -> Result<Page<Event>, Error> {
    let rows = sqlx::query!(
        r#"SELECT id, type AS event_type, reason, message, created_at FROM events
           WHERE object_uid = $1 AND ($2::bigint IS NULL OR id > $2)
           ORDER BY id LIMIT $3"#,
        uid,
        page.after,
        i64::from(page.limit) + 1
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(Page::from_rows(rows, page.limit, |r| r.id).map(|r| Event {
        id: r.id,
        event_type: EventType::from_db(&r.event_type),
        reason: r.reason,
        message: r.message,
        time: r.created_at,
    }))
}

/// An event to record with [`event_record_many`].
pub struct NewEvent {
    pub uid: Uuid,
    pub event_type: EventType,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<serde_json::Value>,
}

/// Records many events about objects of one kind, in one statement, in the given order.
///
/// # Errors
/// As [`db_error`].
pub async fn event_record_many(db: impl PgExecutor<'_>, kind: &str, events: &[NewEvent]) -> Result<(), Error> {
    if events.is_empty() {
        return Ok(());
    }
    let uids: Vec<Uuid> = events.iter().map(|e| e.uid).collect();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let reasons: Vec<&str> = events.iter().map(|e| e.reason).collect();
    let messages: Vec<&str> = events.iter().map(|e| e.message.as_str()).collect();
    let details: Vec<Option<serde_json::Value>> = events.iter().map(|e| e.details.clone()).collect();
    sqlx::query!(
        r#"INSERT INTO events (object_kind, object_uid, type, reason, message, details)
           SELECT $1, u.uid, u.type, u.reason, u.message, u.details
           FROM unnest($2::uuid[], $3::text[], $4::text[], $5::text[], $6::jsonb[])
                WITH ORDINALITY AS u (uid, type, reason, message, details, i)
           ORDER BY u.i"#,
        kind,
        &uids,
        &types as &[&str],
        &reasons as &[&str],
        &messages as &[&str],
        &details as &[Option<serde_json::Value>],
    )
    .execute(db)
    .await
    .map_err(db_error)?;
    Ok(())
}
