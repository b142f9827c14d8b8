//! Benchmark: N jobs into a real Slurm (`scripts/slurm-dev` cluster alpha), once through
//! Berth and, in the same run, straight to slurmrestd, and the ratio of the two
//! throughputs.
//!
//! - Direct: N `POST /slurm/v0.0.38/job/submit` from 4 keep-alive connections at once
//!   (the fastest way we found; one request at a time is ~30 % slower), with a body like
//!   Berth's.
//! - Through Berth, submitted live: N workloads submitted by 8 concurrent clients into a
//!   fresh database with every controller running in-process (started a few seconds
//!   before, as in production); the clock runs from the first submission until every
//!   workload has its Slurm job (a `backend_ref`). Berth's own intake (validation,
//!   Postgres) shares the two cores with Slurm and the controllers.
//! - Through Berth, from a backlog: the N workloads are stored while the cluster is
//!   cordoned; the clock runs from the uncordon until every one has its job (scheduler,
//!   dispatcher, and status sync following the jobs meanwhile).
//!
//! Three rounds (or as many as the second argument says) of the three, in an order that
//! turns every round, with Slurm's queue drained between runs (this machine is noisy); the
//! ratios are of the medians. Jobs are CPU-only `true` (1 CPU each), so Slurm runs 32
//! at a time and the rest queue.
//!
//! `bench/slurm` runs it; DATABASE_URL must let the role create databases.

#[path = "support/scratch.rs"]
mod scratch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_adapters::Registry;
use berth_adapters::slurm::dev::DevCluster;
use berth_controllers::{Config, Context};
use berth_core::event::Actor;
use serde_json::json;

const SUBMITTERS: usize = 8;
/// Connections the direct run submits from: slurmrestd took bursts fastest this way
/// (~950 jobs/s from 2–8 connections against ~700 one request at a time).
const DIRECT_CLIENTS: usize = 4;
/// Time the controllers run before a measured burst (a first inventory and job listing).
const WARM_UP: Duration = Duration::from_secs(3);
const SECRET: &str = "BENCH_SLURM_TOKEN";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // RUST_LOG=berth_controllers=debug shows each controller pass with its duration.
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let n: usize = std::env::args().nth(1).map_or(Ok(1000), |n| n.parse())?;
    let rounds: usize = std::env::args().nth(2).map_or(Ok(3), |n| n.parse())?;
    let dev = DevCluster::get("alpha");
    let scratch = scratch::Scratch::create().await?;
    let result = run(&scratch.db, &scratch.url, &dev, n, rounds).await;
    scratch.drop().await?;
    result
}

async fn run(
    db: &berth_store::PgPool,
    url: &str,
    dev: &DevCluster,
    n: usize,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    println!("{n} CPU-only jobs into Slurm cluster {} ({} nodes), {rounds} rounds", dev.name, dev.nodes.len());
    let ctx = setup(db, dev).await?;
    // Warm-up, not measured: the first burst into a quiet slurmctld runs slower.
    direct(dev, 200).await?;
    drain(dev).await;
    // Rates per mode: direct, live, backlog.
    let mut rates: [Vec<f64>; 3] = Default::default();
    for round in 0..rounds {
        // slurmctld remembers finished jobs for MinJobAge (300 s), and each one it remembers
        // makes its calls slower: a run that always came later would be at a disadvantage,
        // so the order of the three turns every round.
        let mut order = [Mode::Direct, Mode::Live, Mode::Backlog];
        order.rotate_left(round % 3);
        let mut took = [Duration::ZERO; 3];
        for mode in order {
            took[mode as usize] = match mode {
                Mode::Direct => direct(dev, n).await?,
                Mode::Live | Mode::Backlog => {
                    // Berth runs as it does in production: controllers already up, caches
                    // warm. On a pool of their own, closed when they stop: stopping aborts a
                    // pass wherever it is, which can leave a connection inside a transaction.
                    let ctx = Context { db: berth_store::connect(url, 16).await?, ..ctx.clone() };
                    let mut controllers = berth_controllers::runner::start(&ctx, "bench");
                    tokio::time::sleep(WARM_UP).await;
                    let prefix = format!("{}{round}-", if mode == Mode::Live { "l" } else { "b" });
                    let took = through_berth(db, dev, n, &prefix, mode == Mode::Backlog).await?;
                    controllers.shutdown().await;
                    ctx.db.close().await;
                    took
                }
            };
            drain(dev).await;
        }
        println!(
            "round {round} ({}): direct {:4.0} jobs/s, through Berth submitted live {:4.0} jobs/s, from a backlog {:4.0} jobs/s",
            order.map(|m| m.name()).join(", "),
            rate(n, took[0]),
            rate(n, took[1]),
            rate(n, took[2])
        );
        for (all, t) in rates.iter_mut().zip(took) {
            all.push(rate(n, t));
        }
    }
    let [direct_rates, live_rates, backlog_rates] = rates;
    let (d, l, b) = (median(direct_rates), median(live_rates), median(backlog_rates));
    println!(
        "median: direct to slurmrestd {d:.0} jobs/s; through Berth: submitted live {l:.0} jobs/s, from a backlog {b:.0} jobs/s"
    );
    println!("ratio Berth / direct (target ≥ 0.8): submitted live {:.2}, from a backlog {:.2}", l / d, b / d);
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Direct = 0,
    Live = 1,
    Backlog = 2,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Live => "live",
            Self::Backlog => "backlog",
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// N submits straight to slurmrestd from [`DIRECT_CLIENTS`] connections at once.
async fn direct(dev: &DevCluster, n: usize) -> Result<Duration, Box<dyn std::error::Error>> {
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..DIRECT_CLIENTS {
        let (http, url, user, token, partition) =
            (http.clone(), dev.url.clone(), dev.user.clone(), dev.token.clone(), dev.partition.clone());
        clients.spawn(async move {
            for i in (c..n).step_by(DIRECT_CLIENTS) {
                let body = json!({"script": "#!/bin/bash\nexec 'true'\n", "job": {
                    "name": format!("direct-{i}"), "comment": "bench direct", "partition": partition,
                    "nodes": 1, "tasks": 1, "current_working_directory": "/tmp",
                    "environment": {"PATH": "/usr/local/bin:/usr/bin:/bin"},
                }});
                let answer = http
                    .post(format!("{url}/slurm/v0.0.38/job/submit"))
                    .header("X-SLURM-USER-NAME", &user)
                    .header("X-SLURM-USER-TOKEN", &token)
                    .json(&body)
                    .send()
                    .await
                    .map_err(|e| format!("direct submit {i}: {e}"))?;
                if !answer.status().is_success() {
                    return Err(format!(
                        "direct submit {i}: {} {}",
                        answer.status(),
                        answer.text().await.unwrap_or_default()
                    ));
                }
            }
            Ok(())
        });
    }
    for result in clients.join_all().await {
        result?;
    }
    Ok(started.elapsed())
}

fn parse<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("bench objects parse")
}

/// A flavor, a team and the cluster, and the controllers' context (controllers not running).
async fn setup(db: &berth_store::PgPool, dev: &DevCluster) -> Result<Context, Box<dyn std::error::Error>> {
    let actor = Actor::new("bench", None);
    berth_app::flavor::flavor_apply(db, &actor, "h100", &parse(json!({"spec": {}})), None).await?;
    let team = json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 16}]}});
    berth_app::team::team_apply(db, &actor, "bench", &parse(team), None).await?;
    berth_app::cluster::cluster_apply(db, &actor, &dev.name, &parse(dev.apply_body("h100", SECRET)), None).await?;
    let token = dev.token.clone();
    let backends =
        Registry::new(None).with_secrets(Arc::new(move |name: &str| (name == SECRET).then(|| token.clone())));
    let ctx = Context { db: db.clone(), backends: Arc::new(backends), config: Config::default() };
    berth_controllers::cluster_health::reconcile(&ctx).await?;
    Ok(ctx)
}

/// N workloads through Berth (controllers running), until each has its Slurm job:
/// submitted live (the clock starts at the first submission), or held back by cordoning
/// the cluster and released at once by uncordoning it (`backlog`: the clock starts then).
async fn through_berth(
    db: &berth_store::PgPool,
    dev: &DevCluster,
    n: usize,
    prefix: &str,
    backlog: bool,
) -> Result<Duration, Box<dyn std::error::Error>> {
    let cordon = |cordoned: bool| {
        let mut body = dev.apply_body("h100", SECRET);
        body["spec"]["cordoned"] = json!(cordoned);
        async move { berth_app::cluster::cluster_apply(db, &Actor::new("bench", None), &dev.name, &parse(body), None).await }
    };
    if backlog {
        cordon(true).await?;
    }
    let mut started = Instant::now();
    let mut submitters = tokio::task::JoinSet::new();
    for s in 0..SUBMITTERS {
        let db = db.clone();
        let prefix = prefix.to_owned();
        submitters.spawn(async move {
            let actor = Actor::new("bench", None);
            for i in (s..n).step_by(SUBMITTERS) {
                let spec = json!({"spec": {"kind": "batch", "run": {"command": ["true"]},
                    "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 0}}}});
                berth_app::workload::workload_apply(&db, &actor, "bench", &format!("{prefix}{i}"), &parse(spec), None)
                    .await
                    .expect("submit");
            }
        });
    }
    submitters.join_all().await;
    if backlog {
        tokio::time::sleep(WARM_UP).await;
        started = Instant::now();
        cordon(false).await?;
    }
    loop {
        let with_job: i64 =
            sqlx::query_scalar("SELECT count(*) FROM workloads WHERE name LIKE $1 || '%' AND status ? 'backend_ref'")
                .bind(prefix)
                .fetch_one(db)
                .await?;
        if with_job as usize >= n {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("only {with_job} of {n} workloads reached Slurm in 10 minutes").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until Slurm has no pending or running job left.
async fn drain(dev: &DevCluster) {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let queued = dev.output("squeue", &["-h", "-t", "pending,running,completing", "-o", "%i"]);
        if queued.trim().is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "Slurm's queue did not drain in 10 minutes");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
