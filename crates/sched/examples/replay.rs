//! Replays the Microsoft Philly trace through the scheduler in virtual time, next to two
//! baselines run by the same harness — strict FIFO, and Tiresias-style discretized 2D-LAS
//! (least attained service first, no knowledge of durations) — and prints job completion
//! time, queueing delay, GPU utilization and each team's share of the GPUs against its
//! fair share. One row per cluster size, time window and policy. Every plan of Berth's is run
//! through `check::violations`; the process exits non-zero if any plan breaks an invariant.
//!
//! ```text
//! cargo run --release -p berth-sched --example replay -- \
//!     [--trace ../shared/traces/philly/philly-2017-09-10.csv] [--nodes 64[,96,...]]
//!     [--windows 2017-09-01..2017-10-01[,...]] [--jobs N] [--tick 60] [--teams]
//!     [--half-life HOURS]
//! ```
//!
//! A window takes the jobs submitted in it (UTC days, end exclusive; default the whole
//! trace), at most `--jobs` of them; `--teams` prints, per setting, each team's held GPUs
//! against its fair share while it had work waiting. `--half-life` has Berth share fairly
//! over time (every team's `spec.fair_sharing`), with recent use decayed by that
//! half-life.
//!
//! Model: each virtual cluster of the trace is a team; guarantees are proportional to each
//! team's share of the trace's GPU time (together 100 % of the cluster), weights equal, no
//! limits. One cluster of `--nodes` 8-GPU nodes in blocks of 8. A job of n GPUs is a gang of
//! ⌈n/8⌉ tasks of n/⌈n/8⌉ GPUs. The scheduler runs every `--tick` seconds when something
//! changed. Preempted jobs checkpoint: they are requeued with the run time they have left
//! (keeping their submission time). Trace: Jeon et al., USENIX ATC'19 (CC-BY-4.0).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::process::ExitCode;

use berth_core::cluster::{ClusterKind, Packing};
use berth_core::workload::{TopologyPolicy, WorkloadKind};
use berth_sched::check::violations;
use berth_sched::nodes::{NodeState, place};
use berth_sched::plan::Reason;
use berth_sched::schedule;
use berth_sched::snapshot::{
    Cluster, Node, ONE_GPU, Pending, Quota, Resources, Running, Snapshot, TaskPlacement, Team,
};

#[derive(Clone, Copy)]
struct Job {
    submit: i64,
    duration: i64,
    team: usize,
    tasks: u32,
    gpus_per_task: u32,
}

struct Options {
    trace: String,
    nodes: Vec<usize>,
    /// Submission windows, `[from, to)` in seconds since 1970 (`None`: the whole trace).
    windows: Vec<Option<(i64, i64)>>,
    jobs: usize,
    tick: i64,
    teams: bool,
    /// Fairness over time, in seconds (`None`: off).
    half_life: Option<f64>,
}

fn main() -> ExitCode {
    let options = options();
    let trace = load(&options.trace);
    println!(
        "Philly replay: tick {} s; policies berth{}, fifo (strict, no preemption) and las (Tiresias 2D-LAS, \
         queues at {} GPU-hours attained)",
        options.tick,
        options.half_life.map_or(String::new(), |h| format!(" (fair sharing over time, half-life {} h)", h / 3600.0)),
        LAS_THRESHOLDS.map(|s| format!("{}", s / 3600.0)).join(", ")
    );
    println!(
        "{:<6} {:<22} {:>6} {:>5} {:<6} {:>9} {:>9} {:>10} {:>10} {:>6} {:>8} {:>5}",
        "nodes",
        "window",
        "jobs",
        "load",
        "policy",
        "avg JCT h",
        "p99 JCT h",
        "avg wait h",
        "p99 wait h",
        "util",
        "preempt",
        "viol"
    );
    let mut violations = 0;
    for window in &options.windows {
        let (jobs, teams, gpu_time) = trace.window(*window, options.jobs);
        let label = window.map_or_else(|| "whole trace".to_owned(), |(a, b)| format!("{}..{}", day(a), day(b)));
        for &nodes in &options.nodes {
            let capacity = nodes as u32 * 8;
            let total: f64 = gpu_time.iter().sum();
            let load = 100.0 * total / (f64::from(capacity) * (span(&jobs) as f64));
            // Guarantees proportional to GPU time, rounded down, the rest to the biggest teams.
            let mut guaranteed: Vec<u32> = gpu_time.iter().map(|g| (f64::from(capacity) * g / total) as u32).collect();
            let mut by_size: Vec<usize> = (0..teams.len()).collect();
            by_size.sort_by(|&a, &b| gpu_time[b].total_cmp(&gpu_time[a]));
            for &t in by_size.iter().cycle().take((capacity - guaranteed.iter().sum::<u32>()) as usize) {
                guaranteed[t] += 1;
            }
            let run = |policy| simulate(&options, nodes, &jobs, &teams, &guaranteed, policy);
            let outcomes = [("berth", run(Policy::Berth)), ("fifo", run(Policy::Fifo)), ("las", run(Policy::Las))];
            for (name, r) in &outcomes {
                println!(
                    "{:<6} {:<22} {:>6} {:>4.0}% {:<6} {:>9.2} {:>9.2} {:>10.2} {:>10.2} {:>5.1}% {:>8} {:>5}",
                    nodes,
                    label,
                    r.jct.len(),
                    load,
                    name,
                    mean(&r.jct) / 3600.0,
                    p99(&r.jct) / 3600.0,
                    mean(&r.wait) / 3600.0,
                    p99(&r.wait) / 3600.0,
                    100.0 * r.busy_gpu_seconds / (f64::from(capacity) * r.makespan as f64),
                    r.preemptions,
                    r.violations
                );
                violations += r.violations;
            }
            let [(_, berth), (_, fifo), (_, las)] = &outcomes;
            println!(
                "{:<6} {:<22} berth/fifo: avg JCT {:.2}, p99 wait {:.2}; berth/las: avg JCT {:.2}, p99 wait {:.2}",
                "",
                "",
                mean(&berth.jct) / mean(&fifo.jct).max(1.0),
                p99(&berth.wait) / p99(&fifo.wait).max(1.0),
                mean(&berth.jct) / mean(&las.jct).max(1.0),
                p99(&berth.wait) / p99(&las.wait).max(1.0),
            );
            if options.teams {
                println!(
                    "  per team, while it had work waiting (berth): GPUs held, its fair share, what its waiting jobs' sizes let it hold within that share, the cluster's idle GPUs, its jobs preempted"
                );
                for (t, name) in teams.iter().enumerate() {
                    let waiting = berth.waiting_seconds[t].max(1.0);
                    println!(
                        "    {name:<8} guaranteed {:>4}  held {:>6.1}  fair share {:>6.1}  its shapes allow {:>6.1} ({:>3.0} % held)  idle {:>5.1}  preempted {:>5}  wait {:>7.2} h (fifo {:>7.2} h, las {:>7.2} h)",
                        guaranteed[t],
                        berth.team_gpu_seconds[t] / waiting,
                        berth.fair_gpu_seconds[t] / waiting,
                        berth.usable_gpu_seconds[t] / waiting,
                        100.0 * berth.team_gpu_seconds[t] / berth.usable_gpu_seconds[t].max(1.0),
                        berth.idle_gpu_seconds[t] / waiting,
                        berth.team_preempted[t],
                        mean(&berth.team_wait[t]) / 3600.0,
                        mean(&fifo.team_wait[t]) / 3600.0,
                        mean(&las.team_wait[t]) / 3600.0,
                    );
                    let reasons = &berth.team_reasons[t];
                    let total = reasons.values().sum::<usize>().max(1) as f64;
                    let mut top: Vec<(&String, &usize)> = reasons.iter().collect();
                    top.sort_by_key(|&(_, n)| std::cmp::Reverse(*n));
                    let top: Vec<String> =
                        top.iter().take(3).map(|(r, n)| format!("{r} {:.0} %", **n as f64 / total * 100.0)).collect();
                    println!("             waited because: {}", top.join(", "));
                }
            }
        }
    }
    if violations > 0 {
        eprintln!("invariant violations: {violations}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn options() -> Options {
    let mut o = Options {
        trace: "../shared/traces/philly/philly-2017-09-10.csv".into(),
        nodes: vec![64],
        windows: vec![None],
        jobs: usize::MAX,
        tick: 60,
        teams: false,
        half_life: None,
    };
    let mut args = std::env::args().skip(1).peekable();
    while let Some(option) = args.next() {
        if option == "--teams" {
            o.teams = true;
            continue;
        }
        let value = &args.next().expect("every option but --teams takes a value");
        match option.as_str() {
            "--trace" => o.trace.clone_from(value),
            "--nodes" => o.nodes = value.split(',').map(|n| n.parse().expect("--nodes N[,N...]")).collect(),
            "--windows" => {
                o.windows = value
                    .split(',')
                    .map(|w| {
                        let (a, b) = w.split_once("..").expect("--windows YYYY-MM-DD..YYYY-MM-DD[,...]");
                        Some((seconds(&format!("{a} 00:00:00")), seconds(&format!("{b} 00:00:00"))))
                    })
                    .collect();
            }
            "--jobs" => o.jobs = value.parse().expect("--jobs N"),
            "--tick" => o.tick = value.parse().expect("--tick SECONDS"),
            "--half-life" => o.half_life = Some(3600.0 * value.parse::<f64>().expect("--half-life HOURS")),
            other => panic!("unknown option {other}"),
        }
    }
    o
}

/// The trace's jobs, each with its team's name.
struct Trace(Vec<(Job, String)>);

fn load(path: &str) -> Trace {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Trace(
        text.lines()
            .skip(1)
            .map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                let gpus: u32 = f[2].parse().expect("num_gpus");
                let tasks = gpus.div_ceil(8);
                let job = Job {
                    submit: seconds(f[0]),
                    duration: (f[1].parse::<f64>().expect("duration") as i64).max(1),
                    team: 0,
                    tasks,
                    gpus_per_task: gpus.div_ceil(tasks),
                };
                (job, f[4].to_string())
            })
            .collect(),
    )
}

impl Trace {
    /// The jobs submitted in `window` (all: `None`), at most `limit`, with the names of
    /// their teams and the GPU time of each.
    fn window(&self, window: Option<(i64, i64)>, limit: usize) -> (Vec<Job>, Vec<String>, Vec<f64>) {
        let mut teams: BTreeMap<&str, usize> = BTreeMap::new();
        let mut jobs = Vec::new();
        for (j, team) in
            self.0.iter().filter(|(j, _)| window.is_none_or(|(a, b)| j.submit >= a && j.submit < b)).take(limit)
        {
            let next = teams.len();
            let team = *teams.entry(team).or_insert(next);
            jobs.push(Job { team, ..*j });
        }
        let mut names = vec![String::new(); teams.len()];
        for (name, i) in teams {
            names[i] = name.to_owned();
        }
        let mut gpu_time = vec![0.0; names.len()];
        for j in &jobs {
            gpu_time[j.team] += (j.duration * i64::from(j.tasks * j.gpus_per_task)) as f64;
        }
        (jobs, names, gpu_time)
    }
}

/// Seconds since 1970 as its UTC day, `YYYY-MM-DD`.
fn day(t: i64) -> String {
    let z = t.div_euclid(86_400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    format!("{}-{m:02}-{d:02}", yoe + era * 400 + i64::from(m <= 2))
}

/// `YYYY-MM-DD HH:MM:SS` as seconds since 1970 (days from the civil date, UTC).
fn seconds(stamp: &str) -> i64 {
    let n = |s: &str| s.parse::<i64>().expect("timestamp");
    let (date, time) = stamp.split_once(' ').expect("timestamp");
    let d: Vec<i64> = date.split('-').map(n).collect();
    let t: Vec<i64> = time.split(':').map(n).collect();
    let (y, m) = if d[1] <= 2 { (d[0] - 1, d[1] + 9) } else { (d[0], d[1] - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]
}

fn span(jobs: &[Job]) -> i64 {
    let first = jobs.iter().map(|j| j.submit).min().unwrap_or(0);
    let last = jobs.iter().map(|j| j.submit + j.duration).max().unwrap_or(1);
    (last - first).max(1)
}

#[derive(Clone, Copy, PartialEq)]
enum Policy {
    Berth,
    Fifo,
    Las,
}

/// The 2D-LAS queues' limits in attained GPU-seconds (Tiresias discretizes attained service
/// into a few queues, FIFO within each, so that jobs do not preempt each other for every
/// second of service): below 1 GPU-hour, below 10, and the rest.
const LAS_THRESHOLDS: [f64; 2] = [3_600.0, 36_000.0];

#[derive(Default)]
struct Outcome {
    jct: Vec<f64>,
    wait: Vec<f64>,
    busy_gpu_seconds: f64,
    /// GPU-seconds each team held while it had work waiting…
    team_gpu_seconds: Vec<f64>,
    /// …its fair share over the same time…
    fair_gpu_seconds: Vec<f64>,
    /// …what it could have held within its fair share, given the sizes of its waiting jobs
    /// (what it held, plus its smallest waiting jobs while they fit under the share)…
    usable_gpu_seconds: Vec<f64>,
    /// …and that time.
    waiting_seconds: Vec<f64>,
    team_wait: Vec<Vec<f64>>,
    /// Each team's jobs preempted.
    team_preempted: Vec<usize>,
    /// GPU-seconds idle in the cluster while each team had work waiting.
    idle_gpu_seconds: Vec<f64>,
    /// Per team, how often each reason was given for one of its jobs waiting after a cycle.
    team_reasons: Vec<BTreeMap<String, usize>>,
    makespan: i64,
    preemptions: usize,
    cycles: usize,
    violations: usize,
}

/// A job holding GPUs.
struct Active {
    job: usize,
    started: i64,
    ends: i64,
    borrowed: bool,
    placement: Vec<TaskPlacement>,
}

fn simulate(o: &Options, nodes: usize, jobs: &[Job], teams: &[String], guaranteed: &[u32], policy: Policy) -> Outcome {
    let mut s = Snapshot {
        now: 0,
        starvation_after_seconds: 6 * 3600,
        flavors: vec!["gpu".into()],
        teams: teams
            .iter()
            .zip(guaranteed)
            .map(|(name, &g)| Team {
                name: name.clone(),
                parent: None,
                quotas: vec![Quota { guaranteed: g, limit: None, weight: 1 }],
                budget_stops: Vec::new(),
                recent_usage: None,
                min_runtime_seconds: None,
            })
            .collect(),
        clusters: vec![Cluster {
            name: "philly".into(),
            kind: ClusterKind::Sim,
            labels: BTreeMap::new(),
            cordoned: false,
            fractional_gpus: None,
            packing: Packing::BestFit,
        }],
        nodes: (0..nodes)
            .map(|n| Node {
                name: format!("node-{n}"),
                cluster: 0,
                flavor: 0,
                gpus: 8,
                unavailable_gpus: 0,
                cpus_milli: 64_000,
                memory_mib: 1 << 19,
                block: Some(format!("block-{}", n / 8)),
                cordoned: false,
            })
            .collect(),
        ..Snapshot::default()
    };
    let mut out = Outcome {
        team_gpu_seconds: vec![0.0; teams.len()],
        fair_gpu_seconds: vec![0.0; teams.len()],
        usable_gpu_seconds: vec![0.0; teams.len()],
        team_preempted: vec![0; teams.len()],
        idle_gpu_seconds: vec![0.0; teams.len()],
        team_reasons: vec![BTreeMap::new(); teams.len()],
        waiting_seconds: vec![0.0; teams.len()],
        team_wait: vec![Vec::new(); teams.len()],
        ..Outcome::default()
    };
    let mut remaining: Vec<i64> = jobs.iter().map(|j| j.duration).collect();
    // GPU-seconds each job has run (2D-LAS orders by it).
    let mut attained: Vec<f64> = vec![0.0; jobs.len()];
    let mut first_start: Vec<Option<i64>> = vec![None; jobs.len()];
    let mut queue: Vec<usize> = Vec::new();
    let mut active: Vec<Active> = Vec::new();
    let mut ends: BinaryHeap<Reverse<(i64, usize)>> = BinaryHeap::new();
    let origin = jobs.first().map_or(0, |j| j.submit);
    let mut next_arrival = 0;
    let mut now = origin;
    let mut last = origin;
    let mut fair: Vec<f64> = vec![0.0; teams.len()];
    // Each team's recent GPU-hours, decayed by the half-life, when Berth shares over time.
    let mut recent: Vec<f64> = vec![0.0; teams.len()];
    let mut preemptor_of = HashMap::new();
    let mut changed;
    while next_arrival < jobs.len() || !queue.is_empty() || !active.is_empty() {
        // Time passes: account for what ran, and who should have had what.
        let dt = (now - last) as f64;
        let mut has_waiting = vec![false; teams.len()];
        queue.iter().for_each(|&q| has_waiting[jobs[q].team] = true);
        let mut held = vec![0.0; teams.len()];
        for a in &active {
            let gpus = f64::from(jobs[a.job].tasks * jobs[a.job].gpus_per_task);
            held[jobs[a.job].team] += gpus;
            out.busy_gpu_seconds += gpus * dt;
            attained[a.job] += gpus * dt;
            if has_waiting[jobs[a.job].team] {
                out.team_gpu_seconds[jobs[a.job].team] += gpus * dt;
            }
        }
        if o.teams && dt > 0.0 {
            let mut sizes: Vec<Vec<f64>> = vec![Vec::new(); teams.len()];
            queue.iter().for_each(|&q| sizes[jobs[q].team].push(f64::from(jobs[q].tasks * jobs[q].gpus_per_task)));
            for (t, sizes) in sizes.iter_mut().enumerate().filter(|(t, _)| has_waiting[*t]) {
                sizes.sort_by(f64::total_cmp);
                let mut usable = held[t];
                for s in sizes.iter() {
                    if usable + s > fair[t] + 1e-9 {
                        break;
                    }
                    usable += s;
                }
                out.usable_gpu_seconds[t] += usable.min(fair[t]).max(held[t].min(fair[t])) * dt;
            }
        }
        if let Some(h) = o.half_life.filter(|_| matches!(policy, Policy::Berth)) {
            // What was held through dt, each second counted 2^(−age / h), in GPU-hours.
            let kept = (-dt / h).exp2();
            for (r, held) in recent.iter_mut().zip(&held) {
                *r = *r * kept + held * h / std::f64::consts::LN_2 * (1.0 - kept) / 3600.0;
            }
            for (team, r) in s.teams.iter_mut().zip(&recent) {
                team.recent_usage = Some(vec![*r]);
            }
        }
        let idle = f64::from(nodes as u32 * 8) - held.iter().sum::<f64>();
        for (t, f) in fair.iter().enumerate().filter(|&(t, _)| has_waiting[t]) {
            out.fair_gpu_seconds[t] += f * dt;
            out.idle_gpu_seconds[t] += idle * dt;
            out.waiting_seconds[t] += dt;
        }
        last = now;
        changed = false;
        while next_arrival < jobs.len() && jobs[next_arrival].submit <= now {
            queue.push(next_arrival);
            next_arrival += 1;
            changed = true;
        }
        while let Some(&Reverse((end, job))) = ends.peek() {
            if end > now {
                break;
            }
            ends.pop();
            if let Some(i) = active.iter().position(|a| a.job == job && a.ends == end) {
                active.swap_remove(i);
                out.jct.push((end - jobs[job].submit) as f64);
                out.makespan = out.makespan.max(end - origin);
                changed = true;
            }
        }
        if changed {
            out.cycles += 1;
            let started = match policy {
                Policy::Berth => berth_cycle(
                    &mut s,
                    now,
                    jobs,
                    &mut queue,
                    &mut active,
                    &mut remaining,
                    &mut out,
                    &mut fair,
                    &mut preemptor_of,
                ),
                Policy::Fifo => fifo_cycle(&s, now, jobs, &mut queue, &active),
                Policy::Las => las_cycle(&s, now, jobs, &mut queue, &mut active, &mut remaining, &attained, &mut out),
            };
            for a in started {
                first_start[a.job].get_or_insert(now);
                ends.push(Reverse((a.ends, a.job)));
                active.push(a);
            }
        }
        // Next tick with something to do.
        let next_event = [jobs.get(next_arrival).map(|j| j.submit), ends.peek().map(|Reverse((e, _))| *e)]
            .into_iter()
            .flatten()
            .min();
        let Some(next_event) = next_event else { break };
        let tick = now + o.tick;
        now = if next_event <= tick { tick } else { next_event + (o.tick - (next_event - origin) % o.tick) % o.tick };
    }
    for (j, start) in first_start.iter().enumerate() {
        if let Some(start) = start {
            out.wait.push((start - jobs[j].submit) as f64);
            out.team_wait[jobs[j].team].push((start - jobs[j].submit) as f64);
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn berth_cycle(
    s: &mut Snapshot,
    now: i64,
    jobs: &[Job],
    queue: &mut Vec<usize>,
    active: &mut Vec<Active>,
    remaining: &mut [i64],
    out: &mut Outcome,
    fair: &mut [f64],
    preemptor_of: &mut HashMap<String, String>,
) -> Vec<Active> {
    s.now = now;
    s.running = active
        .iter()
        .map(|a| {
            let j = &jobs[a.job];
            Running {
                id: a.job.to_string(),
                team: j.team,
                priority: 0,
                preemptible: true,
                borrowed: a.borrowed,
                started_at: a.started,
                protected_until: 0,
                preempting: false,
                cluster: 0,
                flavor: 0,
                tasks: resources(j),
                placement: a.placement.clone(),
            }
        })
        .collect();
    s.pending = queue
        .iter()
        .map(|&q| {
            let j = &jobs[q];
            Pending {
                id: q.to_string(),
                team: j.team,
                kind: WorkloadKind::Training,
                priority: 0,
                preemptible: true,
                submitted_at: j.submit,
                flavors: vec![0],
                tasks: resources(j),
                topology: if j.tasks > 1 { TopologyPolicy::Preferred } else { TopologyPolicy::None },
                cluster_selector: BTreeMap::new(),
                backend_kinds: Vec::new(),
                flavor_policy: Default::default(),
                has_image: true,
                has_command: true,
                preempted_for: None,
            }
        })
        .collect();
    s.link_preemptors(preemptor_of);
    s.settle_borrowed();
    let plan = schedule(s).expect("a valid snapshot");
    let broken = violations(s, &plan);
    if !broken.is_empty() && out.violations == 0 {
        eprintln!("first violations at t={now}: {broken:?}");
    }
    out.violations += broken.len();
    for share in &plan.shares {
        fair[share.team] = share.fair_share;
    }
    for w in &plan.waiting {
        let reason = match &w.reason {
            Reason::NoClusterFits { attempts } => {
                let miss = attempts.first().and_then(|a| a.clusters.first()).map(|c| format!("{:?}", c.miss));
                format!("no cluster fits: {}", miss.unwrap_or_default().split([' ', '{']).next().unwrap_or_default())
            }
            other => other.code().to_owned(),
        };
        *out.team_reasons[jobs[queue[w.workload]].team].entry(reason).or_default() += 1;
    }
    // Preempted jobs stop now and wait again with the run time they have left.
    let mut stopped: Vec<usize> = plan.preemptions.iter().map(|p| p.victim).collect();
    stopped.sort_unstable();
    out.preemptions += stopped.len();
    for p in &plan.preemptions {
        preemptor_of.insert(active[p.victim].job.to_string(), queue[p.cause.workload()].to_string());
        out.team_preempted[jobs[active[p.victim].job].team] += 1;
    }
    for &v in stopped.iter().rev() {
        let a = active.remove(v);
        remaining[a.job] -= now - a.started;
        queue.push(a.job);
    }
    let mut admitted: Vec<usize> = plan.admissions.iter().map(|a| a.workload).collect();
    let started = plan
        .admissions
        .iter()
        .map(|a| {
            let job = queue[a.workload];
            Active {
                job,
                started: now,
                ends: now + remaining[job],
                borrowed: a.borrowed,
                placement: a.placement.clone(),
            }
        })
        .collect();
    admitted.sort_unstable();
    for &w in admitted.iter().rev() {
        preemptor_of.remove(&queue.remove(w).to_string());
    }
    started
}

fn resources(j: &Job) -> Resources {
    Resources { count: j.tasks, gpus: j.gpus_per_task * ONE_GPU, cpus_milli: 1000, memory_mib: 1024 }
}

/// Strict FIFO over all teams: the oldest job starts when its gang fits (the same best-fit
/// packing as Berth), and nothing passes it (head-of-line blocking); no preemption.
fn fifo_cycle(s: &Snapshot, now: i64, jobs: &[Job], queue: &mut Vec<usize>, active: &[Active]) -> Vec<Active> {
    let mut states: Vec<NodeState> = s.nodes.iter().map(NodeState::new).collect();
    for a in active {
        for t in &a.placement {
            states[t.node].take(&resources(&jobs[a.job]));
        }
    }
    let all: Vec<usize> = (0..s.nodes.len()).collect();
    let mut started = Vec::new();
    while let Some(&job) = queue.first() {
        let Some(placed) = place(&mut states, &all, &resources(&jobs[job]), None) else { break };
        queue.remove(0);
        let placement = placed.tasks.iter().map(|&(node, device)| TaskPlacement { node, device }).collect();
        started.push(Active { job, started: now, ends: now + jobs[job].duration, borrowed: false, placement });
    }
    started
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn p99(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get((v.len() as f64 * 0.99) as usize).or(v.last()).copied().unwrap_or(0.0)
}

/// Tiresias-style discretized 2D-LAS: every job, running or waiting, in the order of its
/// attained-service queue and then its submission; the GPUs go to that order's prefix that
/// fits the cluster's capacity. Running jobs outside it are preempted (they keep the run
/// time they have left); waiting jobs inside it start where best fit places them, a job
/// that fragmentation keeps out waits for the next cycle. Durations are never looked at.
#[allow(clippy::too_many_arguments)]
fn las_cycle(
    s: &Snapshot,
    now: i64,
    jobs: &[Job],
    queue: &mut Vec<usize>,
    active: &mut Vec<Active>,
    remaining: &mut [i64],
    attained: &[f64],
    out: &mut Outcome,
) -> Vec<Active> {
    let level = |j: usize| LAS_THRESHOLDS.iter().filter(|&&t| attained[j] >= t).count();
    let gpus = |j: usize| jobs[j].tasks * jobs[j].gpus_per_task;
    let mut order: Vec<usize> = active.iter().map(|a| a.job).chain(queue.iter().copied()).collect();
    order.sort_by_key(|&j| (level(j), jobs[j].submit, j));
    let capacity: u32 = s.nodes.iter().map(|n| n.gpus).sum();
    let mut used = 0;
    let mut chosen = vec![false; jobs.len()];
    for &j in &order {
        if used + gpus(j) <= capacity {
            used += gpus(j);
            chosen[j] = true;
        }
    }
    let (keep, stop): (Vec<Active>, Vec<Active>) = active.drain(..).partition(|a| chosen[a.job]);
    *active = keep;
    out.preemptions += stop.len();
    for a in stop {
        remaining[a.job] -= now - a.started;
        queue.push(a.job);
    }
    let mut states: Vec<NodeState> = s.nodes.iter().map(NodeState::new).collect();
    for a in active.iter() {
        for t in &a.placement {
            states[t.node].take(&resources(&jobs[a.job]));
        }
    }
    let all: Vec<usize> = (0..s.nodes.len()).collect();
    queue.sort_by_key(|&j| (level(j), jobs[j].submit, j));
    let mut started = Vec::new();
    queue.retain(|&job| {
        if !chosen[job] {
            return true;
        }
        let Some(placed) = place(&mut states, &all, &resources(&jobs[job]), None) else { return true };
        let placement = placed.tasks.iter().map(|&(node, device)| TaskPlacement { node, device }).collect();
        started.push(Active { job, started: now, ends: now + remaining[job], borrowed: false, placement });
        false
    });
    started
}
