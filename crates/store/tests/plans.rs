//! The plans of the queries the controllers run on every pass, over every workload: what
//! keeps them from costing a scan of the whole table, or a statement per row.

use sqlx::PgPool;

mod support;

use support::{batch_workloads, names};

/// The plan of `query` over 5,000 unfinished workloads, a few of them stopping.
async fn plan(db: &PgPool, query: &str) -> String {
    let mut conn = db.acquire().await.unwrap();
    for statement in [
        "INSERT INTO teams (uid, name, spec) VALUES (gen_random_uuid(), 'nlp', '{}')",
        "INSERT INTO workloads (uid, team_uid, team_name, name, kind, phase, flavors, spec, deletion_timestamp)
         SELECT gen_random_uuid(), (SELECT uid FROM teams), 'nlp', 'w' || i, 'batch',
                CASE WHEN i % 2 = 0 THEN 'Pending' ELSE 'Running' END, '{h100}', '{}',
                CASE WHEN i % 1000 = 0 THEN now() END
         FROM generate_series(1, 5000) AS i",
        "ANALYZE workloads",
    ] {
        sqlx::query(statement).execute(&mut *conn).await.unwrap();
    }
    let lines: Vec<String> =
        sqlx::query_scalar(&format!("EXPLAIN (VERBOSE) {query}")).fetch_all(&mut *conn).await.unwrap();
    lines.join("\n")
}

/// The deletion controller's look for stopping workloads reads only those (a partial index).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn stopping_workloads_are_found_by_their_index(db: PgPool) {
    let plan = plan(
        &db,
        "SELECT uid FROM workloads WHERE phase = ANY('{Pending,Running}')
         AND (deletion_timestamp IS NOT NULL OR status ? 'cancellation') ORDER BY uid",
    )
    .await;
    assert!(plan.contains("workloads_stopping"), "{plan}");
}

/// The scheduler's view of a spec is computed inline in the reading query (a nested
/// statement per row would cost twice as much): the plan shows the function's body.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_spec_for_scheduling_is_computed_inline(db: PgPool) {
    let plan = plan(&db, "SELECT workload_spec_for_scheduling(spec) FROM workloads").await;
    assert!(plan.contains("jsonb_set(") && !plan.contains("workload_spec_for_scheduling("), "{plan}");
}

/// ANALYZE keeps no statistics of the spec and status documents (sorting both of 30,000
/// sampled workloads was 7 % of the machine during a burst of creates), and keeps those of
/// the columns the queries filter on.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn analyze_keeps_no_statistics_of_the_documents(db: PgPool) {
    plan(&db, "SELECT 1").await;
    let mut described: Vec<String> =
        sqlx::query_scalar("SELECT attname::text FROM pg_stats WHERE tablename = 'workloads'")
            .fetch_all(&db)
            .await
            .unwrap();
    described.sort();
    assert!(described.iter().any(|c| c == "phase") && described.iter().any(|c| c == "labels"), "{described:?}");
    assert!(!described.iter().any(|c| c == "spec" || c == "status"), "{described:?}");
}

/// Flushes this connection's statistics at once (not up to a second later), for the
/// scan counters read next.
async fn flush_statistics(conn: &mut sqlx::PgConnection) {
    sqlx::query("SELECT pg_stat_force_next_flush()").execute(&mut *conn).await.unwrap();
}

/// Scans of `workloads` so far (sequential, by index), statistics flushed first.
async fn scans(conn: &mut sqlx::PgConnection) -> (i64, i64) {
    scans_of(conn, "workloads").await
}

/// Scans of `table` so far (sequential, by index), statistics flushed first.
async fn scans_of(conn: &mut sqlx::PgConnection, table: &str) -> (i64, i64) {
    flush_statistics(conn).await;
    sqlx::query_as("SELECT seq_scan, coalesce(idx_scan, 0) FROM pg_stat_user_tables WHERE relname = $1")
        .bind(table)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// Every read of the change feed finds what was written since its cursor through the
/// `written_by` index, also once every row has been written again (as at a site where
/// 100,000 workloads run): a read whose bounds the planner could not see (a subquery of the
/// snapshot) was planned as a scan of the whole table, 100–200 ms a read at 127,000 rows.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_change_feed_is_read_through_its_index(db: PgPool) {
    use berth_core::workload::Phase;
    use berth_store::workload as store;
    let mut conn = db.acquire().await.unwrap();
    batch_workloads(
        &mut conn,
        5_000,
        "Running",
        &[
            "UPDATE workloads SET status = '{\"phase\": \"Running\"}'",
            "UPDATE workloads SET status = '{\"phase\": \"Running\", \"attempt\": 0}'",
            "ANALYZE workloads",
        ],
    )
    .await;
    let cursor = support::cursor(&db).await;
    for statement in [
        "UPDATE workloads SET updated_at = now() WHERE team_name = 'nlp' AND name IN ('w1', 'w2', 'w3')",
        "DELETE FROM workloads WHERE team_name = 'nlp' AND name = 'w4'",
        // Explained only: in GET's feed, not the scheduler's.
        "INSERT INTO workload_explanations (uid, attempt) SELECT uid, 0 FROM workloads WHERE name = 'w5'",
    ] {
        sqlx::query(statement).execute(&mut *conn).await.unwrap();
    }

    let before = scans(&mut conn).await;
    let written = store::workload_list_written_since(&mut *conn, &cursor, &[]).await.unwrap();
    assert_eq!(names(written), ["w1", "w2", "w3"]);
    let feed = store::workload_feed_read(&mut *conn, Some(cursor.clone())).await.unwrap();
    assert_eq!(
        (names(feed.written), feed.deleted.len()),
        (vec!["w1".into(), "w2".into(), "w3".into(), "w5".into()], 1)
    );
    assert_eq!(store::workload_deleted_since(&mut *conn, &cursor).await.unwrap().len(), 1);
    assert_eq!(store::workload_in_phase(&mut *conn, Phase::Running, Some(&cursor)).await.unwrap().len(), 3);
    let work = store::workload_backend_work_written_since(&mut *conn, &[Phase::Running], &cursor).await.unwrap();
    assert_eq!(work.len(), 3);
    let after = scans(&mut conn).await;
    assert_eq!(after.0, before.0, "the feed's reads scanned the table ({before:?} → {after:?})");
    assert!(after.1 >= before.1 + 4, "the feed's reads went through the index ({before:?} → {after:?})");
}

/// Scans through the index `name` so far, statistics flushed first.
async fn index_scans(conn: &mut sqlx::PgConnection, name: &str) -> i64 {
    flush_statistics(conn).await;
    sqlx::query_scalar("SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = $1")
        .bind(name)
        .fetch_one(&mut *conn)
        .await
        .unwrap()
}

/// The idle reaper's and the autoscaler's looks go through `workloads_serving` (of the
/// inference and notebook workloads only), also with statistics from before most workloads
/// ran, when `workloads_phase` looked the cheaper way to those `Running` and the reaper
/// visited every running workload.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_serving_looks_go_through_their_index(db: PgPool) {
    let mut conn = db.acquire().await.unwrap();
    batch_workloads(&mut conn, 5_000, "Pending", &["ANALYZE workloads", "UPDATE workloads SET phase = 'Running'"])
        .await;
    let (serving, phase) =
        (index_scans(&mut conn, "workloads_serving").await, index_scans(&mut conn, "workloads_phase").await);
    let (before, _) = scans(&mut conn).await;
    assert!(berth_store::workload::workload_list_idle_candidates(&mut *conn).await.unwrap().is_empty());
    assert!(berth_store::workload::workload_list_serving(&mut *conn).await.unwrap().is_empty());
    let (after, _) = scans(&mut conn).await;
    assert_eq!(index_scans(&mut conn, "workloads_phase").await, phase, "through the phase index");
    assert_eq!(after, before, "by a scan of the table");
    assert_eq!(index_scans(&mut conn, "workloads_serving").await, serving + 2);
}

/// The reads of the change feed (the scheduler's, GET's) look up each workload's
/// explanation by its uid, also when Postgres plans a statement once for any bounds (as it
/// may after a few runs of a prepared statement): joined, the explanations were read whole
/// in such a plan, 10.9 ms a scheduler cycle on average during bench/api-load's creates.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_change_feed_reads_explanations_by_uid_in_any_plan(db: PgPool) {
    let mut conn = db.acquire().await.unwrap();
    batch_workloads(
        &mut conn,
        5_000,
        "Pending",
        &[
            // Each written by a transaction of its own, as they are: ids older than any
            // transaction running now (so never in a later cursor's feed, even on a fresh
            // cluster whose ids are still low).
            "UPDATE workloads SET written_by = greatest(3, oldest - 1 - substr(name, 2)::int % greatest(oldest - 4, 1))::text::xid8
             FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS oldest) AS now",
            "INSERT INTO workload_explanations (uid, attempt, pending_reason, written_by)
             SELECT uid, 0, '{\"code\": \"NoClusterFits\", \"message\": \"-\"}', written_by FROM workloads",
            "ANALYZE workloads",
            "ANALYZE workload_explanations",
        ],
    )
    .await;
    let cursor = support::cursor(&db).await;
    for statement in [
        "UPDATE workloads SET updated_at = now() WHERE name IN ('w1', 'w2')",
        "SET plan_cache_mode = force_generic_plan",
    ] {
        sqlx::query(statement).execute(&mut *conn).await.unwrap();
    }

    let (before, _) = scans_of(&mut conn, "workload_explanations").await;
    let written = berth_store::workload::workload_list_written_since(&mut *conn, &cursor, &[]).await.unwrap();
    let feed = berth_store::workload::workload_feed_read(&mut *conn, Some(cursor)).await.unwrap();
    for read in [written, feed.written] {
        assert_eq!(names(read.clone()), ["w1", "w2"]);
        assert!(read.iter().all(|w| w.status.pending_reason.is_some()), "the explanations are merged in");
    }
    let (after, _) = scans_of(&mut conn, "workload_explanations").await;
    assert_eq!(after, before, "the explanations were scanned whole");
}

/// berthd's connections run without JIT compilation (see `berth_store::connect`): with it,
/// the scheduler's read of the change feed took 490 ms a cycle at 127,000 workloads
/// (bench/controllers scale), compiling a plan kept for any parameters.
#[tokio::test]
async fn berthds_connections_compile_no_plan() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let db = berth_store::connect(&url, 1).await.unwrap();
    let jit: String = sqlx::query_scalar("SHOW jit").fetch_one(&db).await.unwrap();
    assert_eq!(jit, "off");
}
