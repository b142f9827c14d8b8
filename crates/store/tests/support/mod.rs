//! What the store's integration tests share: workloads seeded in SQL, feed cursors.

use berth_core::workload::Workload;
use berth_store::workload::{self as store, FeedCursor};
use sqlx::PgPool;

/// `count` batch workloads `w1`, `w2`, … of team `nlp` in `phase`, with specs that read
/// back, then the statements `then`.
pub async fn batch_workloads(conn: &mut sqlx::PgConnection, count: i32, phase: &str, then: &[&str]) {
    sqlx::query("INSERT INTO teams (uid, name, spec) VALUES (gen_random_uuid(), 'nlp', '{}')")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query(
        r#"INSERT INTO workloads (uid, team_uid, team_name, name, kind, phase, flavors, spec)
           SELECT gen_random_uuid(), (SELECT uid FROM teams), 'nlp', 'w' || i, 'batch', $1, '{h100}',
                  '{"kind": "batch", "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}}}'
           FROM generate_series(1, $2) AS i"#,
    )
    .bind(phase)
    .bind(count)
    .execute(&mut *conn)
    .await
    .unwrap();
    for statement in then {
        sqlx::query(statement).execute(&mut *conn).await.unwrap();
    }
}

/// A cursor at this moment: what is written from now on is in the feed read with it.
pub async fn cursor(db: &PgPool) -> FeedCursor {
    let mut tx = berth_store::begin_snapshot(db).await.unwrap();
    let cursor = store::change_cursor(&mut *tx).await.unwrap();
    berth_store::commit(tx).await.unwrap();
    cursor
}

/// The workloads' names, sorted.
pub fn names(workloads: Vec<Workload>) -> Vec<String> {
    let mut names: Vec<String> = workloads.into_iter().map(|w| w.metadata.name).collect();
    names.sort();
    names
}
