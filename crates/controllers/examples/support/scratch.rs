//! A scratch database for a benchmark: created on the `DATABASE_URL` server (whose role
//! must be allowed to create databases), migrated, and dropped by [`Scratch::drop`].
//!
//! `BENCH_SQL` is run on it after the migrations, to measure a schema change before writing
//! its migration (e.g. `BENCH_SQL='DROP INDEX workloads_labels' bench/slurm`).

use sqlx::{Connection, Executor};

pub struct Scratch {
    admin: sqlx::PgConnection,
    name: String,
    /// For a benchmark that opens pools of its own (not every one does).
    #[allow(dead_code)]
    pub url: String,
    pub db: berth_store::PgPool,
}

impl Scratch {
    pub async fn create() -> Result<Self, Box<dyn std::error::Error>> {
        let base = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
        static CREATED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nth = CREATED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("berth_bench_{}_{nth}", std::process::id());
        let mut admin = sqlx::PgConnection::connect(&base).await?;
        admin.execute(format!("CREATE DATABASE {name}").as_str()).await?;
        let url = format!("{}/{name}", base.rsplit_once('/').ok_or("DATABASE_URL names no database")?.0);
        let db = berth_store::connect(&url, 32).await?;
        berth_store::migrate(&db).await?;
        if let Ok(sql) = std::env::var("BENCH_SQL") {
            sqlx::raw_sql(&sql).execute(&db).await?;
        }
        Ok(Self { admin, name, url, db })
    }

    pub async fn drop(mut self) -> Result<(), Box<dyn std::error::Error>> {
        self.db.close().await;
        // An autovacuum worker (which the role may not terminate) can hold the database
        // for a moment after a large run.
        let drop = format!("DROP DATABASE {} WITH (FORCE)", self.name);
        for _ in 0..30 {
            if self.admin.execute(drop.as_str()).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        self.admin.execute(drop.as_str()).await?;
        Ok(())
    }
}
