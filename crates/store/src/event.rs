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
