//! The plans of the queries the controllers run on every pass, over every workload: what
//! keeps them from costing a scan of the whole table, or a statement per row.

use sqlx::PgPool;

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
