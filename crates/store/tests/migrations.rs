//! Several replicas may start at once: migrations must serialize, not collide.

use sqlx::PgPool;

#[sqlx::test(migrations = false)]
async fn concurrent_migrations_all_succeed_and_apply_each_once(pool: PgPool) {
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { berth_store::migrate(&pool).await })
        })
        .collect();
    for run in runs {
        run.await.expect("task").expect("migration");
    }
    let applied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success").fetch_one(&pool).await.unwrap();
    assert_eq!(applied, berth_store::MIGRATOR.iter().count() as i64);
    berth_store::ping(&pool).await.expect("usable after migrating");
}
