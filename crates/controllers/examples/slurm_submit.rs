//! Benchmark: N jobs into a real Slurm (`scripts/slurm-dev` cluster `bench`), through
//! Berth and, in the same run, straight to slurmrestd, and the ratio of the throughputs.
//!
//! - Direct: N `POST /slurm/{newest API}/job/submit` from 4 keep-alive connections at once
//!   (the fastest way we found; one request at a time is ~30 % slower), each the body Berth
//!   posts for one of the bench's workloads (written by Berth's own Slurm adapter).
//! - Through Berth, submitted live one at a time: N workloads submitted by 8 concurrent
//!   clients, one workload per call of the application layer (what `PUT` runs, without
//!   HTTP), into a fresh database with every controller running in-process (started a few
//!   seconds before, as in production); the clock runs from the first submission until
//!   every workload has its Slurm job (a `backend_ref`). Berth's own intake (validation,
//!   Postgres) shares the two cores with Slurm and the controllers.
//! - Through Berth, submitted live in batches: the same, 100 workloads per call (what
//!   `POST /api/v1/teams/{team}/workloads` runs).
//! - Through Berth, from a backlog: the N workloads are stored while the cluster is
//!   cordoned; the clock runs from the uncordon until every one has its job (scheduler,
//!   dispatcher, and status sync following the jobs meanwhile).
//!
//! Every run starts from a Slurm cluster reset to empty state and warmed up, and each
//! Berth run has a fresh database. Three rounds (or as many as the second argument says) of
//! the four, in an order that turns every round (this machine is noisy); the ratios are of
//! the medians. Each job asks for 1 CPU, so Slurm runs 32 at a time and queues the rest. The
//! third argument says what the jobs do:
//!
//! - `sleep` (default): they run for 10 minutes, like the long jobs a GPU cluster runs, and
//!   are cancelled after each run. The cluster is already full with 32 of the warm-up's
//!   jobs, as a GPU cluster usually is, so the measured jobs only queue.
//! - `true`: they end at once, so while the later submissions arrive slurmctld is also
//!   launching and reaping jobs (32 at a time); a run that takes longer meets more of that.
//!
//! After each run it prints the CPU seconds each process group used during the run
//! (measured from `/proc`; the bench process is Berth's API layer and controllers).
//!
//! Arguments: jobs, rounds, `sleep` or `true`, and the modes to run (`direct,batches`;
//! all by default). `BENCH_CPUS=split` (set up by `bench/slurm`) runs Slurm's daemons on
//! CPU 0 and everything else on CPU 1, as if Slurm had its own machine.
//! `BENCH_PERF_CONTROL=FIFO` turns a `perf record --control fifo:FIFO` on for the
//! measured runs only. `RUST_LOG=berth_controllers::runner=debug,slurm_submit=info` logs
//! every controller pass between the start and the end of each run.
//!
//! `bench/slurm` runs it; DATABASE_URL must let the role create databases.

#[path = "support/scratch.rs"]
mod scratch;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_adapters::Registry;
use berth_adapters::slurm::dev::DevCluster;
use berth_app::context::OpContext;
use berth_controllers::{Config, Context};
use serde_json::{Value, json};

const SUBMITTERS: usize = 8;
/// Workloads per request in the `batches` mode.
const BATCH: usize = 100;
/// Connections the direct run submits from: slurmrestd took bursts fastest this way
/// (~950 jobs/s from 2–8 connections against ~700 one request at a time).
const DIRECT_CLIENTS: usize = 4;
/// Time the controllers run, once the cluster is Healthy, before a measured burst.
const WARM_UP: Duration = Duration::from_secs(3);
const SECRET: &str = "BERTH_CREDENTIAL_BENCH_SLURM";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // RUST_LOG=berth_controllers=debug shows each controller pass with its duration.
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(1000), |n| n.parse())?;
    let rounds: usize = args.next().map_or(Ok(3), |n| n.parse())?;
    let job = match args.next().as_deref() {
        None | Some("sleep") => Job::Sleep,
        Some("true") => Job::True,
        Some(other) => return Err(format!("jobs are `sleep` or `true`, not {other}").into()),
    };
    let modes = match args.next() {
        None => MODES.to_vec(),
        Some(list) => list
            .split(',')
            .map(|name| MODES.into_iter().find(|m| m.name() == name).ok_or(format!("no mode {name}")))
            .collect::<Result<_, _>>()?,
    };
    run(n, rounds, job, &modes).await
}

/// The `scripts/slurm-dev` cluster the bench submits to, its own so that resetting it
/// disturbs no test.
const CLUSTER: &str = "bench";

/// [`CLUSTER`] started from empty state, warmed up by a first burst (a quiet slurmctld
/// takes its first burst slower), its queue empty again. slurmctld keeps finished jobs
/// for MinJobAge (300 s) and every job it holds makes submitting slower, so each run
/// starts from the same state.
async fn fresh_cluster(job: Job) -> Result<DevCluster, Box<dyn std::error::Error>> {
    for command in ["reset", "start"] {
        let script = berth_adapters::slurm::dev::script();
        // BENCH_CPUS=split (bench/slurm): Slurm's daemons on CPU 0, the rest on CPU 1.
        let out = if std::env::var("BENCH_CPUS").as_deref() == Ok("split") {
            std::process::Command::new("taskset").args(["-c", "0"]).arg(script).args([command, CLUSTER]).output()?
        } else {
            std::process::Command::new(script).args([command, CLUSTER]).output()?
        };
        if !out.status.success() {
            return Err(format!("slurm-dev {command} {CLUSTER}: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
    }
    let dev = DevCluster::get(CLUSTER);
    // Named as no Berth job is: those that stay running are not Berth's orphans to cancel.
    let mut warm_up = bodies(&dev, 200, job).await?;
    for (i, (_, body)) in warm_up.iter_mut().enumerate() {
        body["job"]["name"] = json!(format!("warm-up-{i}"));
    }
    direct(&dev, warm_up).await?;
    if job == Job::Sleep {
        // The warm-up's jobs that run stay, once Slurm has started as many as fit: the
        // cluster is full, as a GPU cluster usually is, so the measured jobs only queue and
        // none is launched during a run (slurmd starting 32 jobs costs ~0.3 CPU-seconds,
        // which would land in whichever run is under way then).
        // sinfo %C: allocated/idle/other/total CPUs.
        let full = || async { dev.output("sinfo", &["-h", "-o", "%C"]).trim().split('/').nth(1) == Some("0") };
        wait_until("Slurm to fill the cluster", Duration::from_secs(60), full).await?;
        dev.output("scancel", &["--user", &dev.user, "--state", "PENDING"]);
    }
    wait_queue(&dev, |q| q.lines().all(|state| state == "RUNNING")).await?;
    Ok(dev)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Job {
    Sleep,
    True,
}

impl Job {
    fn command(self) -> &'static [&'static str] {
        match self {
            Self::Sleep => &["sleep", "600"],
            Self::True => &["true"],
        }
    }
}

async fn run(n: usize, rounds: usize, job: Job, modes: &[Mode]) -> Result<(), Box<dyn std::error::Error>> {
    println!("{n} CPU-only jobs (`{}`) into the Slurm dev cluster {CLUSTER}, {rounds} rounds", job.command().join(" "));
    let mut rates: [Vec<f64>; MODES.len()] = Default::default();
    for round in 0..rounds {
        // The order of the modes turns every round, so none always runs first.
        let mut order = modes.to_vec();
        order.rotate_left(round % modes.len());
        let mut took = [Duration::ZERO; MODES.len()];
        let mut cpu = [[0.0; 6]; MODES.len()];
        for &mode in &order {
            let dev = fresh_cluster(job).await?;
            if round == 0 && mode == order[0] {
                println!("Slurm {} (slurmrestd {})", dev.release, dev.api);
            }
            (took[mode as usize], cpu[mode as usize]) = match mode {
                Mode::Direct => {
                    let bodies = bodies(&dev, n, job).await?;
                    let before = cpu_seconds();
                    profiler("enable");
                    let took = direct(&dev, bodies).await?;
                    profiler("disable");
                    (took, minus(cpu_seconds(), before))
                }
                _ => through_berth(&dev, n, job, mode).await?,
            };
            empty_queue(&dev, job).await?;
        }
        println!("round {round} (in the order {}):", order.iter().map(|m| m.name()).collect::<Vec<_>>().join(", "));
        for &mode in modes {
            let used: Vec<String> =
                CPU_GROUPS.iter().zip(cpu[mode as usize]).map(|(group, s)| format!("{group} {s:.2}")).collect();
            println!(
                "  {:>4.0} jobs/s {}; CPU seconds: {}",
                rate(n, took[mode as usize]),
                mode.title(),
                used.join(", ")
            );
        }
        for &mode in modes {
            rates[mode as usize].push(rate(n, took[mode as usize]));
        }
    }
    let medians = rates.map(|r| if r.is_empty() { f64::NAN } else { median(r) });
    let direct = medians[Mode::Direct as usize];
    println!("medians, and the ratio to direct (target ≥ 0.8):");
    for &mode in modes {
        let m = medians[mode as usize];
        // Without a direct run (modes picked) there is no ratio.
        let ratio = if direct.is_nan() { String::new() } else { format!(" ({:.2})", m / direct) };
        println!("  {m:>4.0} jobs/s {}{ratio}", mode.title());
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Direct = 0,
    Live = 1,
    Batches = 2,
    Backlog = 3,
}

const MODES: [Mode; 4] = [Mode::Direct, Mode::Live, Mode::Batches, Mode::Backlog];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Live => "live",
            Self::Batches => "batches",
            Self::Backlog => "backlog",
        }
    }

    fn title(self) -> String {
        match self {
            Self::Direct => "straight to slurmrestd".into(),
            Self::Live => "through Berth, submitted live one at a time".into(),
            Self::Batches => format!("through Berth, submitted live in batches of {BATCH}"),
            Self::Backlog => "through Berth, from a backlog".into(),
        }
    }
}

/// Process groups whose CPU time is shown per run; the bench itself is Berth. The last is
/// the whole machine (every process and the kernel), which shows what the groups miss.
const CPU_GROUPS: [&str; 6] = ["slurmctld", "slurmrestd", "slurmd", "postgres", "berth", "whole machine"];

/// CPU seconds (user + system) used so far by the live processes of each of
/// [`CPU_GROUPS`], and by the whole machine, from `/proc`.
fn cpu_seconds() -> [f64; 6] {
    let me = std::process::id().to_string();
    let mut sums = [0.0; 6];
    // The first line of /proc/stat: "cpu user nice system idle iowait irq softirq ...".
    let machine = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<f64> = machine.split_whitespace().skip(1).take(7).map(|f| f.parse().unwrap_or(0.0)).collect();
    sums[5] = [0, 1, 2, 5, 6].iter().map(|&i| ticks[i]).sum::<f64>() / 100.0;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // "pid (comm) state ...": comm may hold spaces, so split at the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        let group = match head.split_once('(').map_or("", |(_, comm)| comm) {
            "slurmctld" => 0,
            "slurmrestd" => 1,
            "slurmd" => 2,
            "postgres" => 3,
            _ if pid == me => 4,
            _ => continue,
        };
        // utime and stime are the line's fields 14 and 15; `rest` starts at field 3.
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = fields[11..13].iter().map(|f| f.parse::<f64>().unwrap_or(0.0)).sum();
        sums[group] += ticks / 100.0;
    }
    sums
}

/// Turns a `perf record --control fifo:PATH` on or off, when `BENCH_PERF_CONTROL` names
/// its fifo, so that a profile covers the measured runs only.
fn profiler(command: &str) {
    if let Ok(fifo) = std::env::var("BENCH_PERF_CONTROL") {
        std::fs::write(fifo, format!("{command}\n")).expect("perf's control fifo takes the command");
    }
}

fn minus(a: [f64; 6], b: [f64; 6]) -> [f64; 6] {
    std::array::from_fn(|i| a[i] - b[i])
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

/// The very jobs Berth's dispatcher submits for the bench's workloads (its request, written
/// by Berth's Slurm adapter: the same script, environment, limits and comment): each one's
/// path and body.
async fn bodies(dev: &DevCluster, n: usize, job: Job) -> Result<Vec<(String, Value)>, Box<dyn std::error::Error>> {
    let spec: berth_core::cluster::ClusterSpec = parse(dev.apply_body(&dev.gpu_type, SECRET)["spec"].clone());
    let adapter = berth_adapters::slurm::SlurmCluster::new(&spec, dev.token.clone())?;
    let mut bodies = Vec::with_capacity(n);
    for i in 0..n {
        // The bench's workload as stored and admitted, and what the dispatcher asks of it.
        let mut stored = bench_workload(i, &dev.gpu_type, job);
        stored["metadata"].as_object_mut().expect("metadata").extend([
            ("team".into(), json!("bench")),
            ("uid".into(), json!(uuid::Uuid::now_v7())),
            ("generation".into(), json!(1)),
            ("resource_version".into(), json!("1")),
            ("creation_timestamp".into(), json!(chrono::Utc::now())),
            ("update_timestamp".into(), json!(chrono::Utc::now())),
        ]);
        let admission = json!({"cluster": CLUSTER, "flavor": dev.gpu_type, "borrowed": false, "placement": []});
        stored["status"] = json!({"phase": "Admitted", "admission": admission});
        let request = berth_controllers::dispatcher::request(&parse(stored), Duration::from_secs(30), None);
        bodies.push(adapter.submit_request(&request).await?);
    }
    Ok(bodies)
}

/// The bench's workload `i`: one task on `flavor` without GPUs, running `job`.
fn bench_workload(i: usize, flavor: &str, job: Job) -> Value {
    json!({"metadata": {"name": format!("w{i}")}, "spec": {"kind": "batch", "run": {"command": job.command()},
        "tasks": {"count": 1, "resources": {"flavors": [flavor], "gpus": 0}}}})
}

/// Posts each of `bodies` straight to slurmrestd, from [`DIRECT_CLIENTS`] connections.
async fn direct(dev: &DevCluster, bodies: Vec<(String, Value)>) -> Result<Duration, Box<dyn std::error::Error>> {
    let (n, bodies) = (bodies.len(), Arc::new(bodies));
    let http = reqwest::Client::new();
    let started = Instant::now();
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..DIRECT_CLIENTS {
        let (http, url, user, token, bodies) =
            (http.clone(), dev.url.clone(), dev.user.clone(), dev.token.clone(), bodies.clone());
        clients.spawn(async move {
            for i in (c..n).step_by(DIRECT_CLIENTS) {
                let (path, body) = &bodies[i];
                let answer = http
                    .post(format!("{url}{path}"))
                    .header("X-SLURM-USER-NAME", &user)
                    .header("X-SLURM-USER-TOKEN", &token)
                    .json(body)
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

/// N workloads through Berth into a fresh database, with every controller running (as in
/// production: started [`WARM_UP`] before), until each has its Slurm job: submitted live
/// (the clock starts at the first submission), or held back by cordoning the cluster and
/// released at once by uncordoning it (`backlog`: the clock starts then). Returns the
/// time and the CPU seconds used meanwhile.
async fn through_berth(
    dev: &DevCluster,
    n: usize,
    job: Job,
    mode: Mode,
) -> Result<(Duration, [f64; 6]), Box<dyn std::error::Error>> {
    let backlog = mode == Mode::Backlog;
    let scratch = scratch::Scratch::create().await?;
    let db = &scratch.db;
    let actor = OpContext::system("bench");
    berth_app::flavor::flavor_apply(db, &actor, &dev.gpu_type, &parse(json!({"spec": {}})), None).await?;
    let team = json!({"spec": {"quotas": [{"flavor": &dev.gpu_type, "guaranteed": 16}]}});
    berth_app::team::team_apply(db, &actor, "bench", &parse(team), None).await?;
    let cluster = |cordoned: bool| {
        let mut body = dev.apply_body(&dev.gpu_type, SECRET);
        body["spec"]["cordoned"] = json!(cordoned);
        let actor = actor.clone();
        async move { berth_app::cluster::cluster_apply(db, &actor, &dev.name, &parse(body), None).await }
    };
    cluster(backlog).await?;
    let token = dev.token.clone();
    let backends =
        Registry::new(None).with_secrets(Arc::new(move |name: &str| (name == SECRET).then(|| token.clone())));
    // The controllers on a pool of their own, closed when they stop: stopping aborts a pass
    // wherever it is, which can leave a connection inside a transaction.
    let ctx = Context {
        db: berth_store::connect(&scratch.url, 16).await?,
        backends: Arc::new(backends),
        config: Config::default(),
        epoch: None,
        clock: berth_controllers::Clock::default(),
        world: Default::default(),
        dispatch: Default::default(),
        followed: Default::default(),
        job_api: None,
    };
    let mut controllers = berth_controllers::runner::start(&ctx, "bench");
    // Until the cluster's first inventory is in (it lists every job slurmctld remembers,
    // which takes seconds once it holds thousands), and a little longer.
    let healthy = || async {
        let health: Result<Option<String>, _> =
            sqlx::query_scalar("SELECT status->>'health' FROM clusters").fetch_one(db).await;
        health.ok().flatten().as_deref() == Some("Healthy")
    };
    wait_until("the cluster to be Healthy", Duration::from_secs(120), healthy).await?;
    tokio::time::sleep(WARM_UP).await;

    let mut changes = berth_store::changes::ChangeFeed::listen(db).await?;
    let mut started = Instant::now();
    let mut before = cpu_seconds();
    if !backlog {
        profiler("enable");
        tracing::info!("measured run starts");
    }
    let mut submitters = tokio::task::JoinSet::new();
    for s in 0..SUBMITTERS {
        let (db, flavor) = (db.clone(), dev.gpu_type.clone());
        submitters.spawn(async move {
            let actor = OpContext::system("bench");
            let workload = |i: usize| bench_workload(i, &flavor, job);
            if mode == Mode::Batches {
                for first in (s * BATCH..n).step_by(SUBMITTERS * BATCH) {
                    let items: Vec<_> = (first..n.min(first + BATCH)).map(workload).collect();
                    berth_app::workload::workload_create_batch(
                        &db,
                        &actor,
                        "bench",
                        &parse(json!({"items": items})),
                        None,
                    )
                    .await
                    .expect("submit");
                }
                return;
            }
            for i in (s..n).step_by(SUBMITTERS) {
                berth_app::workload::workload_apply(&db, &actor, "bench", &format!("w{i}"), &parse(workload(i)), None)
                    .await
                    .expect("submit");
            }
        });
    }
    submitters.join_all().await;
    tracing::info!("every workload stored after {:?}", started.elapsed());
    if backlog {
        tokio::time::sleep(WARM_UP).await;
        started = Instant::now();
        before = cpu_seconds();
        profiler("enable");
        cluster(false).await?;
    }
    // Every workload is stored by now; wait until none is left before its dispatch,
    // counting (index-only) each time the dispatcher wrote, so that the waiting costs
    // Berth little and ends within a few milliseconds of the last write.
    let dispatched = |change: &berth_store::changes::Change| {
        use berth_core::workload::Phase;
        matches!(change, berth_store::changes::Change::WorkloadStatuses(phases)
            if phases.iter().any(|p| !matches!(p, Phase::Pending | Phase::Admitted)))
    };
    loop {
        let waiting: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads WHERE phase IN ('Pending', 'Admitted')")
            .fetch_one(db)
            .await?;
        if waiting == 0 {
            break;
        }
        if started.elapsed() > Duration::from_secs(600) {
            return Err(format!("{waiting} of {n} workloads did not reach Slurm in 10 minutes").into());
        }
        // The dispatcher's next write, or a second (should a notification be lost).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while let Ok(change) = tokio::time::timeout_at(deadline, changes.next()).await {
            if dispatched(&change?) {
                break;
            }
        }
    }
    let took = started.elapsed();
    profiler("disable");
    tracing::info!("measured run took {took:?}");
    // Taken before the controllers' pool closes: a closed connection's backend takes its
    // CPU time with it.
    let cpu = minus(cpu_seconds(), before);
    controllers.shutdown().await;
    ctx.db.close().await;
    let with_job: i64 =
        sqlx::query_scalar("SELECT count(*) FROM workloads WHERE status ? 'backend_ref'").fetch_one(db).await?;
    if with_job as usize != n {
        return Err(format!("only {with_job} of {n} workloads got a Slurm job").into());
    }
    scratch.drop().await?;
    Ok((took, cpu))
}

/// Cancels the `sleep` jobs, and waits until Slurm has no pending or running job left.
async fn empty_queue(dev: &DevCluster, job: Job) -> Result<(), String> {
    if job == Job::Sleep {
        dev.output("scancel", &["--user", &dev.user]);
    }
    wait_queue(dev, str::is_empty).await
}

/// Waits until the states of Slurm's unfinished jobs, a line each, satisfy `done`.
async fn wait_queue(dev: &DevCluster, done: impl Fn(&str) -> bool) -> Result<(), String> {
    let settled = || async {
        done(dev.output("squeue", &["-h", "-t", "pending,configuring,running,completing", "-o", "%T"]).trim())
    };
    wait_until("Slurm's queue to settle", Duration::from_secs(600), settled).await
}

/// Checks every 100 ms until `check` holds; an error naming `what` after `limit`.
async fn wait_until<F: Future<Output = bool>>(
    what: &str,
    limit: Duration,
    check: impl Fn() -> F,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    while !check().await {
        if Instant::now() > deadline {
            return Err(format!("waited {limit:?} for {what}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
