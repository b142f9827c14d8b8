//! Replays the Microsoft Philly trace through the scheduler in virtual time, next to a FIFO
//! baseline run by the same harness, and prints job completion time, queueing delay, GPU
//! utilization and each team's share of the GPUs against its fair share. Every plan is run
//! through `check::violations`; the process exits non-zero if any plan breaks an invariant.
//!
//! ```text
//! cargo run --release -p berth-sched --example replay -- \
//!     [--trace ../shared/traces/philly/philly-2017-09-10.csv] [--nodes 64] [--jobs N] [--tick 60]
//! ```
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

use berth_core::cluster::ClusterKind;
use berth_core::workload::{TopologyPolicy, WorkloadKind};
use berth_sched::check::violations;
use berth_sched::nodes::{NodeState, place};
use berth_sched::schedule;
use berth_sched::snapshot::{
    Cluster, Node, ONE_GPU, Pending, Quota, Resources, Running, Snapshot, TaskPlacement, Team,
};

struct Job {
    submit: i64,
    duration: i64,
    team: usize,
    tasks: u32,
    gpus_per_task: u32,
}

struct Options {
    trace: String,
    nodes: usize,
    jobs: usize,
    tick: i64,
}

fn main() -> ExitCode {
    let options = options();
    let (jobs, teams, gpu_time) = load(&options.trace, options.jobs);
    let capacity = options.nodes as u32 * 8;
    let total: f64 = gpu_time.iter().sum();
    println!(
        "Philly replay: {} jobs, {} teams, {} nodes × 8 GPUs = {capacity} GPUs, tick {} s; offered load {:.0} % of capacity",
        jobs.len(),
        teams.len(),
        options.nodes,
        options.tick,
        100.0 * total / (f64::from(capacity) * (span(&jobs) as f64))
    );
    // Guarantees proportional to GPU time, rounded down, the rest to the biggest teams.
    let mut guaranteed: Vec<u32> = gpu_time.iter().map(|g| (f64::from(capacity) * g / total) as u32).collect();
    let mut by_size: Vec<usize> = (0..teams.len()).collect();
    by_size.sort_by(|&a, &b| gpu_time[b].total_cmp(&gpu_time[a]));
    for &t in by_size.iter().cycle().take((capacity - guaranteed.iter().sum::<u32>()) as usize) {
        guaranteed[t] += 1;
    }
    let berth = simulate(&options, &jobs, &teams, &guaranteed, Policy::Berth);
    let fifo = simulate(&options, &jobs, &teams, &guaranteed, Policy::Fifo);
    println!();
    println!(
        "{:<8} {:>7} {:>10} {:>10} {:>10} {:>10} {:>6} {:>11} {:>7} {:>10}",
        "policy",
        "jobs",
        "avg JCT h",
        "p99 JCT h",
        "avg wait h",
        "p99 wait h",
        "util",
        "preemptions",
        "cycles",
        "violations"
    );
    for (name, r) in [("berth", &berth), ("fifo", &fifo)] {
        println!(
            "{:<8} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>5.1}% {:>11} {:>7} {:>10}",
            name,
            r.jct.len(),
            mean(&r.jct) / 3600.0,
            p99(&r.jct) / 3600.0,
            mean(&r.wait) / 3600.0,
            p99(&r.wait) / 3600.0,
            100.0 * r.busy_gpu_seconds / (f64::from(capacity) * r.makespan as f64),
            r.preemptions,
            r.cycles,
            r.violations
        );
    }
    println!();
    println!("per team: GPUs held on average while it had work waiting, against its fair share then (berth);");
    println!("average wait under berth and under fifo");
    for (t, name) in teams.iter().enumerate() {
        let waiting = berth.waiting_seconds[t].max(1.0);
        println!(
            "  {name:<8} guaranteed {:>4}  held {:>6.1}  fair share {:>6.1}  wait {:>7.2} h (fifo {:>7.2} h)",
            guaranteed[t],
            berth.team_gpu_seconds[t] / waiting,
            berth.fair_gpu_seconds[t] / waiting,
            mean(&berth.team_wait[t]) / 3600.0,
            mean(&fifo.team_wait[t]) / 3600.0,
        );
    }
    if berth.violations + fifo.violations > 0 {
        eprintln!("invariant violations: {}", berth.violations);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn options() -> Options {
    let mut o = Options {
        trace: "../shared/traces/philly/philly-2017-09-10.csv".into(),
        nodes: 64,
        jobs: usize::MAX,
        tick: 60,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value = pair.get(1).expect("every option takes a value");
        match pair[0].as_str() {
            "--trace" => o.trace.clone_from(value),
            "--nodes" => o.nodes = value.parse().expect("--nodes N"),
            "--jobs" => o.jobs = value.parse().expect("--jobs N"),
            "--tick" => o.tick = value.parse().expect("--tick SECONDS"),
            other => panic!("unknown option {other}"),
        }
    }
    o
}

/// Jobs, team names, and GPU time per team.
fn load(path: &str, limit: usize) -> (Vec<Job>, Vec<String>, Vec<f64>) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut teams: BTreeMap<String, usize> = BTreeMap::new();
    let mut jobs = Vec::new();
    for line in text.lines().skip(1).take(limit) {
        let f: Vec<&str> = line.split(',').collect();
        let gpus: u32 = f[2].parse().expect("num_gpus");
        let next = teams.len();
        let team = *teams.entry(f[4].to_string()).or_insert(next);
        let tasks = gpus.div_ceil(8);
        jobs.push(Job {
            submit: seconds(f[0]),
            duration: (f[1].parse::<f64>().expect("duration") as i64).max(1),
            team,
            tasks,
            gpus_per_task: gpus.div_ceil(tasks),
        });
    }
    let mut names = vec![String::new(); teams.len()];
    for (name, i) in teams {
        names[i] = name;
    }
    let mut gpu_time = vec![0.0; names.len()];
    for j in &jobs {
        gpu_time[j.team] += (j.duration * i64::from(j.tasks * j.gpus_per_task)) as f64;
    }
    (jobs, names, gpu_time)
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
}

#[derive(Default)]
struct Outcome {
    jct: Vec<f64>,
    wait: Vec<f64>,
    busy_gpu_seconds: f64,
    /// GPU-seconds each team held while it had work waiting…
    team_gpu_seconds: Vec<f64>,
    /// …its fair share over the same time…
    fair_gpu_seconds: Vec<f64>,
    /// …and that time.
    waiting_seconds: Vec<f64>,
    team_wait: Vec<Vec<f64>>,
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

fn simulate(o: &Options, jobs: &[Job], teams: &[String], guaranteed: &[u32], policy: Policy) -> Outcome {
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
                min_runtime_seconds: None,
            })
            .collect(),
        clusters: vec![Cluster {
            name: "philly".into(),
            kind: ClusterKind::Sim,
            labels: BTreeMap::new(),
            cordoned: false,
            fractional_gpus: None,
        }],
        nodes: (0..o.nodes)
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
        waiting_seconds: vec![0.0; teams.len()],
        team_wait: vec![Vec::new(); teams.len()],
        ..Outcome::default()
    };
    let mut remaining: Vec<i64> = jobs.iter().map(|j| j.duration).collect();
    let mut first_start: Vec<Option<i64>> = vec![None; jobs.len()];
    let mut queue: Vec<usize> = Vec::new();
    let mut active: Vec<Active> = Vec::new();
    let mut ends: BinaryHeap<Reverse<(i64, usize)>> = BinaryHeap::new();
    let origin = jobs.first().map_or(0, |j| j.submit);
    let mut next_arrival = 0;
    let mut now = origin;
    let mut last = origin;
    let mut fair: Vec<f64> = vec![0.0; teams.len()];
    let mut preemptor_of = HashMap::new();
    let mut changed;
    while next_arrival < jobs.len() || !queue.is_empty() || !active.is_empty() {
        // Time passes: account for what ran, and who should have had what.
        let dt = (now - last) as f64;
        let mut has_waiting = vec![false; teams.len()];
        queue.iter().for_each(|&q| has_waiting[jobs[q].team] = true);
        for a in &active {
            let gpus = f64::from(jobs[a.job].tasks * jobs[a.job].gpus_per_task);
            out.busy_gpu_seconds += gpus * dt;
            if has_waiting[jobs[a.job].team] {
                out.team_gpu_seconds[jobs[a.job].team] += gpus * dt;
            }
        }
        for (t, f) in fair.iter().enumerate().filter(|&(t, _)| has_waiting[t]) {
            out.fair_gpu_seconds[t] += f * dt;
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
                has_image: true,
                has_command: true,
                preempted_for: None,
            }
        })
        .collect();
    s.link_preemptors(preemptor_of);
    let plan = schedule(s).expect("a valid snapshot");
    let broken = violations(s, &plan);
    if !broken.is_empty() && out.violations == 0 {
        eprintln!("first violations at t={now}: {broken:?}");
    }
    out.violations += broken.len();
    for share in &plan.shares {
        fair[share.team] = share.fair_share;
    }
    // Preempted jobs stop now and wait again with the run time they have left.
    let mut stopped: Vec<usize> = plan.preemptions.iter().map(|p| p.victim).collect();
    stopped.sort_unstable();
    out.preemptions += stopped.len();
    for p in &plan.preemptions {
        preemptor_of.insert(active[p.victim].job.to_string(), queue[p.cause.workload()].to_string());
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
        let Some(placed) = place(&mut states, &all, &resources(&jobs[job])) else { break };
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
