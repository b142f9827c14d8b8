//! `submit_to_running N scale [RUNNING] [TEAMS]`: the controllers at a large site's size.
//!
//! 1. RUNNING workloads (default 100,000) of TEAMS teams (default 1,000) are submitted in
//!    batches before the controllers start, and run.
//! 2. N more are submitted one at a time while the controllers run, with room for all:
//!    submit→Admitted percentiles in stream mode.
//! 3. N 4-GPU workloads more than the GPUs left can take are submitted at the lowest
//!    priority (so they preempt nothing: every team is above its guarantee): N stay pending
//!    behind the running ones, and the scheduler's cycles over them are timed.
//!
//! Prints the scheduler's cycle times (sampled from its stored status: at most one a second)
//! in each phase, those of the cycles that swapped in a background full read, the process's
//! peak RSS (the controllers keep their world in memory) and the database's size.

use std::time::{Duration, Instant};

use berth_app::context::OpContext;
use berth_store::PgPool;
use serde_json::json;

use super::{CLUSTERS, Result, SUBMITTERS, nodes_for, parse, percentiles, spec, world};

/// Workloads per batch: one team's share of the prefill, at most a batch's limit.
const BATCH: usize = 1000;

pub async fn run(db: &PgPool, stream: usize, running: usize, teams: usize) -> Result<()> {
    let actor = OpContext::system("bench");
    let nodes_per_cluster = nodes_for(running + stream);
    let ctx = world(db, nodes_per_cluster, teams).await?;
    let gpus = nodes_per_cluster * 8 * CLUSTERS;
    println!(
        "{running} running + {stream} streamed + {stream} pending workloads, {teams} teams, \
         {CLUSTERS} clusters × {nodes_per_cluster} nodes × 8 GPUs ({gpus} GPUs)"
    );

    let started = Instant::now();
    submit_batches(db, &actor, 0..running, teams, |i| [1, 2, 4][i % 3], None).await?;
    println!("prefill: {running} submitted in batches in {:.1} s", started.elapsed().as_secs_f64());
    let started = Instant::now();
    let mut cycles = Cycles::default();
    let mut controllers = berth_controllers::runner::start(&ctx, "bench");
    cycles.wait(db, running, 0).await?;
    let took = started.elapsed().as_secs_f64();
    println!(
        "prefill: all {running} running {took:.1} s after the controllers started ({:.0}/s)",
        running as f64 / took
    );
    println!("prefill: scheduler cycles {}", cycles.report());

    let mut cycles = cycles.after();
    let stream_start: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT now()").fetch_one(db).await?;
    let submitters: Vec<_> = (0..SUBMITTERS)
        .map(|s| {
            let (db, actor) = (db.clone(), actor.clone());
            tokio::spawn(async move {
                for i in (running + s..running + stream).step_by(SUBMITTERS) {
                    let input = parse(json!({"spec": spec(i, [1, 2, 4][i % 3])}));
                    let team = format!("team-{}", i % teams);
                    berth_app::workload::workload_apply(&db, &actor, &team, &format!("w{i}"), &input, None)
                        .await
                        .expect("submitted");
                }
            })
        })
        .collect();
    let stream_started = Instant::now();
    while !submitters.iter().all(tokio::task::JoinHandle::is_finished) {
        cycles.sample(db).await?;
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    for s in submitters {
        s.await?;
    }
    println!("stream: {stream} submitted one at a time in {:.1} s", stream_started.elapsed().as_secs_f64());
    cycles.wait(db, running + stream, 0).await?;
    let latencies: Vec<(f64, f64)> = sqlx::query_as(
        "SELECT extract(epoch FROM a.created_at - w.created_at)::float8,
                extract(epoch FROM r.created_at - w.created_at)::float8
         FROM workloads w,
              LATERAL (SELECT created_at FROM events WHERE object_uid = w.uid AND reason = 'Admitted' ORDER BY id LIMIT 1) a,
              LATERAL (SELECT created_at FROM events WHERE object_uid = w.uid AND details ->> 'to' = 'Running' ORDER BY id LIMIT 1) r
         WHERE w.created_at >= $1",
    )
    .bind(stream_start)
    .fetch_all(db)
    .await?;
    println!("stream: submit→Admitted {}", percentiles(latencies.iter().map(|l| l.0).collect()));
    println!("stream: submit→Running  {}", percentiles(latencies.iter().map(|l| l.1).collect()));
    println!("stream: scheduler cycles {}", cycles.report());
    // Every cycle that admitted, not one a second: a cycle writes its admissions' events in
    // one statement, within a millisecond or two; cycles are farther apart.
    let gaps: Vec<f64> = sqlx::query_scalar::<_, Option<f64>>(
        "SELECT gap FROM (
             SELECT extract(epoch FROM created_at - lag(created_at) OVER (ORDER BY created_at))::float8 AS gap
             FROM events WHERE reason = 'Admitted' AND created_at >= $1) g
         WHERE gap > 0.02",
    )
    .bind(stream_start)
    .fetch_all(db)
    .await?
    .into_iter()
    .flatten()
    .collect();
    println!("stream: {} cycles admitted; time between them {}", gaps.len() + 1, percentiles(gaps));

    // What is left takes a quarter as many 4-GPU workloads (fewer where it is fragmented).
    let used: i64 =
        sqlx::query_scalar("SELECT sum((spec #>> '{tasks,count}')::int)::int8 FROM workloads").fetch_one(db).await?;
    let fitting = (gpus - used as usize) / 4;
    let first = running + stream;
    submit_batches(db, &actor, first..first + fitting + stream, teams, |_| 4, 0).await?;
    let mut cycles = cycles.after();
    let (settled, (running, pending)) = cycles.settle(db, first + fitting + stream).await?;
    println!("pending: {running} running, {pending} pending; scheduler cycles {}", settled.report());
    println!("pending: every cycle sampled since the submission (admitting, first reasons) {}", cycles.report());
    controllers.abort_all();

    let size: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())").fetch_one(db).await?;
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field =
        |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).map(|v| v.trim().to_owned()).unwrap_or_default();
    println!(
        "memory: peak RSS {} (controllers and submitters in this process), RSS now {}; database {} MB",
        field("VmHWM:"),
        field("VmRSS:"),
        size / 1_000_000
    );
    Ok(())
}

/// Creates workloads `indices` in batches of one team's (`w{i}` of team `i % teams`), at
/// `priority` where given.
async fn submit_batches(
    db: &PgPool,
    actor: &OpContext,
    indices: std::ops::Range<usize>,
    teams: usize,
    count: impl Fn(usize) -> usize,
    priority: impl Into<Option<i32>>,
) -> Result<()> {
    let priority = priority.into();
    let mut by_team: Vec<Vec<usize>> = vec![Vec::new(); teams];
    for i in indices {
        by_team[i % teams].push(i);
    }
    let mut batches = tokio::task::JoinSet::new();
    for (team, members) in by_team.into_iter().enumerate() {
        for chunk in members.chunks(BATCH) {
            let item = |i: usize| {
                let mut spec = spec(i, count(i));
                if let Some(p) = priority {
                    spec["priority"] = json!(p);
                }
                json!({"metadata": {"name": format!("w{i}")}, "spec": spec})
            };
            let items: Vec<_> = chunk.iter().map(|&i| item(i)).collect();
            let (db, actor, batch) = (db.clone(), actor.clone(), parse(json!({"items": items})));
            batches.spawn(async move {
                berth_app::workload::workload_create_batch(&db, &actor, &format!("team-{team}"), &batch, None).await
            });
            // Two batches at a time, as a bulk importer would.
            if batches.len() >= 2 {
                batches.join_next().await.expect("spawned")??;
            }
        }
    }
    while let Some(done) = batches.join_next().await {
        done??;
    }
    Ok(())
}

/// The scheduler's cycles from some point on, as its stored status shows them: at most one
/// a second while cycles change things, one every 10 s otherwise.
#[derive(Default)]
struct Cycles {
    runs: Option<i64>,
    seconds: Vec<f64>,
    /// Per cycle: milliseconds in each of [`PHASES`].
    phases: Vec<[f64; PHASES.len()]>,
    /// Per cycle: workloads its snapshot derived anew.
    derived: Vec<f64>,
    /// Per cycle: whether its world was read in full (the background full read swapped in).
    full: Vec<bool>,
}

/// The parts of a cycle its status times.
const PHASES: [&str; 6] = ["read", "build", "plan", "explain", "write", "kept"];

/// Cycles timed once nothing more can be admitted (one every `resync` then, 10 s): enough
/// that one of them comes after a background full read (every `FULL_READ_EVERY`, 120 s).
const SETTLED: usize = 13;
/// How often the scheduler's stored status is sampled, and the phases counted.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const COUNT_EVERY: Duration = Duration::from_secs(1);
/// How long a phase may take before the benchmark gives up.
const PHASE_LIMIT: Duration = Duration::from_secs(1200);

impl Cycles {
    /// The cycles after those sampled so far (the last of which would otherwise be sampled
    /// again: the prefill's cycle that admitted 100,000 counted as the stream's slowest).
    fn after(&self) -> Self {
        Self { runs: self.runs, ..Self::default() }
    }

    /// Records the stored cycle if it is new and returns it.
    async fn sample(&mut self, db: &PgPool) -> Result<Option<serde_json::Value>> {
        let status: Option<serde_json::Value> =
            sqlx::query_scalar("SELECT status FROM controller_status WHERE name = 'scheduler'")
                .fetch_optional(db)
                .await?;
        let Some(status) = status else { return Ok(None) };
        let last = status["last"]["ok"].clone();
        if self.runs == status["runs"].as_i64() || last.is_null() {
            return Ok(None);
        }
        self.runs = status["runs"].as_i64();
        self.seconds.push(last["cycle_ms"].as_f64().unwrap_or_default() / 1000.0);
        self.phases.push(PHASES.map(|p| last[format!("{p}_ms")].as_f64().unwrap_or_default()));
        self.derived.push(last["derived"].as_f64().unwrap_or_default());
        self.full.push(last["full_read"].as_bool().unwrap_or_default());
        Ok(Some(last))
    }

    /// Waits until `running` workloads run and at most `pending` wait.
    async fn wait(&mut self, db: &PgPool, running: usize, pending: usize) -> Result<()> {
        let started = Instant::now();
        // The phases are counted once a second: a count reads the whole table, and would
        // take from the controllers what is being measured.
        let mut counted = Instant::now() - COUNT_EVERY;
        loop {
            self.sample(db).await?;
            if counted.elapsed() >= COUNT_EVERY {
                counted = Instant::now();
                let (p, r): (i64, i64) = sqlx::query_as(
                    "SELECT count(*) FILTER (WHERE phase = 'Pending'), count(*) FILTER (WHERE phase = 'Running') \
                     FROM workloads",
                )
                .fetch_one(db)
                .await?;
                if r as usize >= running && p as usize <= pending {
                    return Ok(());
                }
                if started.elapsed() > PHASE_LIMIT {
                    return Err(format!("{r} running and {p} pending after {PHASE_LIMIT:?}").into());
                }
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
    }

    /// Waits for [`SETTLED`] cycles that see all `total` workloads and admit none. Returns
    /// those, and the running (or admitted) and pending workloads the last one saw; keeps
    /// every cycle sampled.
    async fn settle(&mut self, db: &PgPool, total: usize) -> Result<(Self, (i64, i64))> {
        let started = Instant::now();
        let mut settled = Vec::new();
        let mut seen = (0, 0);
        while settled.len() < SETTLED {
            if let Some(last) = self.sample(db).await? {
                let n = |k: &str| last[k].as_i64().unwrap_or_default();
                if (n("pending") + n("running")) as usize >= total && n("admitted") == 0 {
                    let last = self.seconds.len() - 1;
                    settled.push((self.seconds[last], self.phases[last], self.derived[last], self.full[last]));
                    seen = (n("running"), n("pending"));
                }
            }
            if started.elapsed() > PHASE_LIMIT {
                return Err(format!("the scheduler did not settle in {PHASE_LIMIT:?}").into());
            }
            tokio::time::sleep(SAMPLE_EVERY).await;
        }
        let settled = Self {
            runs: self.runs,
            seconds: settled.iter().map(|c| c.0).collect(),
            phases: settled.iter().map(|c| c.1).collect(),
            derived: settled.iter().map(|c| c.2).collect(),
            full: settled.iter().map(|c| c.3).collect(),
        };
        Ok((settled, seen))
    }

    /// The cycles' percentiles, the median of each phase and of the workloads derived anew.
    fn report(&self) -> String {
        let mut derived = self.derived.clone();
        derived.sort_by(f64::total_cmp);
        let phases: Vec<String> = PHASES
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let mut ms: Vec<f64> = self.phases.iter().map(|p| p[i]).collect();
                ms.sort_by(f64::total_cmp);
                format!("{name} {:.0}", ms.get(ms.len() / 2).copied().unwrap_or_default())
            })
            .collect();
        let slowest = (0..self.seconds.len()).max_by(|&a, &b| self.seconds[a].total_cmp(&self.seconds[b]));
        let slowest = slowest.map_or_else(String::new, |i| {
            let phases: Vec<String> = PHASES.iter().zip(self.phases[i]).map(|(p, ms)| format!("{p} {ms:.0}")).collect();
            format!("; the slowest: {}, {:.0} derived anew", phases.join(", "), self.derived[i])
        });
        // The cycles that swapped a background full read in (every `FULL_READ_EVERY`).
        let full: Vec<String> = (0..self.seconds.len())
            .filter(|&i| self.full[i])
            .map(|i| format!("{:.0} ms, {:.0} derived anew", self.seconds[i] * 1000.0, self.derived[i]))
            .collect();
        let full = if full.is_empty() { String::new() } else { format!("; after a full read: {}", full.join(", ")) };
        format!(
            "{} sampled: {}; median ms per phase: {}; median workloads derived anew {:.0}{slowest}{full}",
            self.seconds.len(),
            percentiles(self.seconds.clone()),
            phases.join(", "),
            derived.get(derived.len() / 2).copied().unwrap_or_default()
        )
    }
}
