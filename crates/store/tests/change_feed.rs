//! The change feed's mark: which transaction last wrote each workload row.

use berth_core::workload::{WorkloadSpec, WorkloadStatus};
use berth_store::workload as store;
use sqlx::PgPool;

mod support;

use support::{batch_workloads, cursor, names};

/// The names of the workloads written since `cursor`, sorted.
async fn written_since(db: &PgPool, cursor: &store::FeedCursor) -> Vec<String> {
    let mut conn = db.acquire().await.unwrap();
    names(store::workload_list_written_since(&mut *conn, cursor, &[]).await.unwrap())
}

/// The uid and version of workload `name`.
async fn row(db: &PgPool, name: &str) -> (uuid::Uuid, i64) {
    sqlx::query_as("SELECT uid, resource_version FROM workloads WHERE name = $1")
        .bind(name)
        .fetch_one(db)
        .await
        .unwrap()
}

/// Each of the store's writes marks its writer without the row trigger (here dropped), so
/// the trigger need not run on every row: a status write, a spec change and a deletion
/// each reach the feed. And an UPDATE that does not mark it (psql, a migration) still
/// does, through the trigger, which runs for such a write only.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_stores_writes_mark_their_writer_and_the_trigger_marks_any_other(db: PgPool) {
    batch_workloads(&mut db.acquire().await.unwrap(), 5, "Pending", &[]).await;

    let before = cursor(&db).await;
    sqlx::query("DROP TRIGGER workloads_writer ON workloads").execute(&db).await.unwrap();
    let mut tx = berth_store::begin(&db).await.unwrap();
    let (uid, version) = row(&db, "w1").await;
    let status = WorkloadStatus { message: Some("written".into()), ..WorkloadStatus::default() };
    let writes = [store::StatusWrite { uid: berth_core::WorkloadId(uid), resource_version: version, status }];
    assert_eq!(store::workload_write_statuses(&mut tx, &writes).await.unwrap().len(), 1);
    let spec: WorkloadSpec = serde_json::from_value(serde_json::json!(
        {"kind": "batch", "tasks": {"count": 2, "resources": {"flavors": ["h100"], "gpus": 1}}}
    ))
    .unwrap();
    let labels = [("v".to_owned(), "2".to_owned())].into();
    store::workload_update_spec(&mut tx, berth_core::WorkloadId(row(&db, "w2").await.0), &labels, &spec, 2)
        .await
        .unwrap();
    store::workload_mark_deleted(&mut tx, berth_core::WorkloadId(row(&db, "w3").await.0)).await.unwrap();
    berth_store::commit(tx).await.unwrap();
    assert_eq!(written_since(&db, &before).await, ["w1", "w2", "w3"], "the store's writes, without the trigger");

    // A write with no mark of its own, without the trigger: the feed misses it (what the
    // trigger is there for) ...
    let before = cursor(&db).await;
    sqlx::query("UPDATE workloads SET updated_at = now() WHERE name = 'w4'").execute(&db).await.unwrap();
    assert!(written_since(&db, &before).await.is_empty(), "an unmarked write is not in the feed without the trigger");
    // ... and with the trigger back, as the migrations leave it, the feed has it.
    sqlx::query(
        "CREATE TRIGGER workloads_writer BEFORE UPDATE ON workloads
         FOR EACH ROW WHEN (NEW.written_by = OLD.written_by) EXECUTE FUNCTION workloads_mark_writer()",
    )
    .execute(&db)
    .await
    .unwrap();
    let before = cursor(&db).await;
    sqlx::query("UPDATE workloads SET updated_at = now() WHERE name = 'w5'").execute(&db).await.unwrap();
    assert_eq!(written_since(&db, &before).await, ["w5"], "an unmarked write, through the trigger");
}
