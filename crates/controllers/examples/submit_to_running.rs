//! Benchmark: submits N workloads (mixed gang sizes, 100 teams) into 3 simulated clusters
//! with room for all, with the controllers running in-process on a fresh database, and
//! prints admissions/s, dispatches/s and submit→Admitted / submit→Running latency
//! percentiles, all measured from the database's own timestamps.
//!
//! `bench/controllers` runs it; DATABASE_URL must let the role create databases.
//!
//! Two modes: `stream` (the default) submits while the controllers run, so latency is
//! measured from submission; `backlog` submits everything first and then starts the
//! controllers, so admissions/s and dispatches/s measure the controllers alone.
//!
//! ```text
//! cargo run --release -p berth-controllers --example submit_to_running -- 20000 stream
//! cargo run --release -p berth-controllers --example submit_to_running -- 20000 backlog
//! ```

#[path = "support/scale.rs"]
mod scale;
#[path = "support/scratch.rs"]
mod scratch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_adapters::Registry;
use berth_app::context::OpContext;
use berth_controllers::{Config, Context};
use serde_json::json;

/// The allocator berthd runs the controllers with.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const TEAMS: usize = 100;
const CLUSTERS: usize = 3;
const SUBMITTERS: usize = 8;

#[tokio::main]
async fn main() -> Result<()> {
    let workloads: usize = std::env::args().nth(1).map_or(Ok(20_000), |n| n.parse())?;
    let arg = |n: usize, default: usize| std::env::args().nth(n).map_or(Ok(default), |v| v.parse());
    let scratch = scratch::Scratch::create().await?;
    let result = match std::env::args().nth(2).as_deref() {
        None | Some("stream") => run(&scratch.db, workloads, false).await,
        Some("backlog") => run(&scratch.db, workloads, true).await,
        Some("scale") => scale::run(&scratch.db, workloads, arg(3, 100_000)?, arg(4, 1000)?).await,
        Some(other) => Err(format!("unknown mode {other:?}: stream, backlog or scale").into()),
    };
    scratch.drop().await?;
    result
}

fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("bench objects parse")
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Nodes per cluster with room for `workloads` of 1, 2 or 4 GPUs (2.33 on average), and 10 %
/// to spare.
fn nodes_for(workloads: usize) -> usize {
    (workloads * 7 / 3 / 8 / CLUSTERS) * 11 / 10 + 1
}

/// A bench workload's spec: `count` tasks of one H100 GPU each, running for months.
fn spec(i: usize, count: usize) -> serde_json::Value {
    json!({"kind": "training", "priority": (i % 3) * 10,
        "tasks": {"count": count, "resources": {"flavors": ["h100"], "gpus": 1}},
        "sim": {"duration_seconds": 1e7}})
}

/// The flavor, `CLUSTERS` simulated clusters of `nodes_per_cluster` 8-GPU nodes and `teams`
/// teams each guaranteed an equal half of the GPUs; the controllers' context, under a
/// lease as in berthd (every write is fenced with its epoch).
async fn world(db: &berth_store::PgPool, nodes_per_cluster: usize, teams: usize) -> Result<Context> {
    let actor = OpContext::system("bench");
    berth_app::flavor::flavor_apply(db, &actor, "h100", &parse(json!({"spec": {}})), None).await?;
    for c in 0..CLUSTERS {
        let spec = json!({"spec": {"kind": "sim", "sim": {
            "node_groups": [{"name": "n", "count": nodes_per_cluster, "flavor": "h100", "gpus_per_node": 8}]}}});
        berth_app::cluster::cluster_apply(db, &actor, &format!("sim-{c}"), &parse(spec), None).await?;
    }
    let guarantee = nodes_per_cluster * 8 * CLUSTERS / teams / 2;
    for t in 0..teams {
        let spec = json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": guarantee}]}});
        berth_app::team::team_apply(db, &actor, &format!("team-{t}"), &parse(spec), None).await?;
    }
    let mut lease = db.acquire().await?.detach();
    let epoch = berth_store::controller::leader_take(&mut lease, "bench", chrono::Utc::now()).await?;
    let ctx = Context {
        db: db.clone(),
        backends: Arc::new(Registry::new(None)),
        config: Config::default(),
        epoch: Some(epoch),
        clock: berth_controllers::Clock::default(),
        world: Default::default(),
        dispatch: Default::default(),
        followed: Default::default(),
        job_api: None,
    };
    // Record the inventories before the burst.
    berth_controllers::cluster_health::reconcile(&ctx).await?;
    Ok(ctx)
}

async fn run(db: &berth_store::PgPool, workloads: usize, backlog: bool) -> Result<()> {
    let actor = OpContext::system("bench");
    let nodes_per_cluster = nodes_for(workloads);
    let ctx = world(db, nodes_per_cluster, TEAMS).await?;
    let mut controllers: Option<tokio::task::JoinSet<()>> =
        if backlog { None } else { Some(berth_controllers::runner::start(&ctx, "bench")) };
    println!(
        "{workloads} workloads, {TEAMS} teams, {CLUSTERS} clusters × {nodes_per_cluster} nodes × 8 GPUs; \
         {SUBMITTERS} concurrent submitters; {}",
        if backlog { "all submitted before the controllers start" } else { "controllers running during submission" }
    );
    let started = Instant::now();
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|s| {
            let db = db.clone();
            let actor = actor.clone();
            tokio::spawn(async move {
                for i in (s..workloads).step_by(SUBMITTERS) {
                    let count = [1, 2, 4][i % 3];
                    let input = parse(json!({"spec": spec(i, count)}));
                    let team = format!("team-{}", i % TEAMS);
                    berth_app::workload::workload_apply(&db, &actor, &team, &format!("w{i}"), &input, None)
                        .await
                        .expect("submitted");
                }
            })
        })
        .collect();
    for s in submitters {
        s.await?;
    }
    let submitted = started.elapsed();
    let controllers_started = Instant::now();
    let mut controllers = controllers.take().unwrap_or_else(|| berth_controllers::runner::start(&ctx, "bench"));
    // Polled from outside as well: event times are taken inside the writing transaction.
    let mut all_admitted = None;
    loop {
        let (pending, running): (i64, i64) =
            sqlx::query_as("SELECT count(*) FILTER (WHERE phase = 'Pending'), count(*) FILTER (WHERE phase = 'Running') FROM workloads")
                .fetch_one(db)
                .await?;
        if pending == 0 && all_admitted.is_none() {
            all_admitted = Some(controllers_started.elapsed());
        }
        if running as usize == workloads {
            break;
        }
        if started.elapsed() > Duration::from_secs(900) {
            return Err(format!("only {running} of {workloads} running after 15 minutes").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_running = controllers_started.elapsed();
    controllers.abort_all();
    println!("submitted in {:.2} s ({:.0}/s)", submitted.as_secs_f64(), workloads as f64 / submitted.as_secs_f64());

    // Seconds since the first submission of each workload's admission and start.
    let rows: Vec<(f64, f64, f64)> = sqlx::query_as(
        "WITH first AS (SELECT min(created_at) AS t0 FROM workloads)
         SELECT extract(epoch FROM w.created_at - first.t0)::float8,
                extract(epoch FROM a.created_at - first.t0)::float8,
                extract(epoch FROM r.created_at - first.t0)::float8
         FROM workloads w, first,
              LATERAL (SELECT created_at FROM events WHERE object_uid = w.uid AND reason = 'Admitted' ORDER BY id LIMIT 1) a,
              LATERAL (SELECT created_at FROM events WHERE object_uid = w.uid AND details ->> 'to' = 'Running' ORDER BY id LIMIT 1) r",
    )
    .fetch_all(db)
    .await?;
    let last_submit = rows.iter().map(|r| r.0).fold(0.0, f64::max);
    let last_admitted = rows.iter().map(|r| r.1).fold(0.0, f64::max);
    let last_running = rows.iter().map(|r| r.2).fold(0.0, f64::max);
    println!(
        "last submission at {last_submit:.2} s, last admission at {last_admitted:.2} s, last start at {last_running:.2} s"
    );
    if backlog {
        let admitting = all_admitted.unwrap_or(all_running).as_secs_f64();
        let dispatching = all_running.as_secs_f64();
        println!(
            "admissions/s: {:.0} (all {workloads} admitted {admitting:.2} s after the controllers started)",
            workloads as f64 / admitting
        );
        println!(
            "dispatches/s: {:.0} (all running {dispatching:.2} s after the controllers started)",
            workloads as f64 / dispatching
        );
    } else {
        println!(
            "admissions/s: {:.0} (over {last_admitted:.2} s from the first submission)",
            workloads as f64 / last_admitted
        );
        println!("dispatches/s: {:.0} (over {last_running:.2} s)", workloads as f64 / last_running);
    }
    println!("submit→Admitted: {}", percentiles(rows.iter().map(|r| r.1 - r.0).collect()));
    println!("submit→Running:  {}", percentiles(rows.iter().map(|r| r.2 - r.0).collect()));
    let scheduler: Option<serde_json::Value> =
        sqlx::query_scalar("SELECT status FROM controller_status WHERE name = 'scheduler'").fetch_optional(db).await?;
    if let Some(s) = scheduler {
        println!("scheduler: {} cycles, last {:.1} ms", s["runs"], s["last_pass_ms"].as_f64().unwrap_or_default());
    }
    Ok(())
}

/// p50, p99 and max of seconds, in milliseconds.
fn percentiles(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "none".to_owned();
    }
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() - 1) as f64 * p).round() as usize] * 1000.0;
    format!("p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms", at(0.5), at(0.99), at(1.0))
}
