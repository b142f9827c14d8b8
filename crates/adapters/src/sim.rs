//! The simulated cluster: nodes and GPUs from a cluster's `spec.sim`, jobs that run for
//! their simulated duration on an accelerated clock, and injected faults (failed nodes,
//! jobs that fail with a given probability, a backend that stops answering).
//!
//! It behaves like a real batch backend: a job starts when its nodes have room (jobs wait
//! in submission order, and any that fits may start), runs, and ends `Succeeded`, `Failed`
//! or `Cancelled`. Time is derived from the wall clock (`time_scale` simulated seconds per
//! real second), so the cluster advances on its own between calls.
//!
//! # Guarantees
//! - Deterministic: what happens to a job depends only on the calls made, their times and
//!   `seed`.
//! - With a journal file, every submission, cancel and node fault is appended before the
//!   call returns, and reopening the journal rebuilds the same cluster: a simulated
//!   cluster outlives the berthd process that drives it, as a real one would.
//! - One cluster for every process that opens its journal: each call takes an exclusive
//!   lock on the file, first replays what other processes appended, then acts and appends,
//!   so two berthd replicas sharing a sim state directory see one cluster (as they would
//!   see one Slurm). Entry times never go backwards in the file (each is at least the
//!   last one), and every process reads the same clock (one host).
//! - `submit` of a key that exists returns the existing job.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use berth_core::cluster::{ClusterKind, SimSpec};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use futures_util::StreamExt;

use crate::backend::{
    BackendError, ClusterBackend, Inventory, InventoryNode, JobKey, JobRequest, JobState, JobStatus, LogRequest,
    LogStream, last_lines,
};

/// How often a followed log looks for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Where the simulator reads the time, in milliseconds since the Unix epoch.
#[derive(Debug, Clone)]
pub enum Clock {
    System,
    /// Set by the caller (tests).
    Manual(Arc<AtomicI64>),
}

impl Clock {
    fn now_ms(&self) -> i64 {
        match self {
            Self::System => Utc::now().timestamp_millis(),
            Self::Manual(ms) => ms.load(Ordering::SeqCst),
        }
    }
}

/// A simulated cluster.
pub struct SimCluster {
    clock: Clock,
    state: Mutex<State>,
}

struct State {
    config: SimSpec,
    nodes: Vec<Node>,
    node_ix: HashMap<String, usize>,
    jobs: Vec<Job>,
    by_key: HashMap<JobKey, usize>,
    /// Queued jobs, in submission order.
    queue: Vec<usize>,
    /// Candidate end times of running jobs; stale entries are skipped.
    ends: BinaryHeap<Reverse<(i64, usize)>>,
    journal: Option<Journal>,
    /// The latest time the state was advanced to (an entry's, or a call's).
    time: i64,
}

/// The journal file and how much of it this process has replayed.
struct Journal {
    file: File,
    path: PathBuf,
    replayed: u64,
}

impl Journal {
    /// The complete entries appended since the last read. A line without its newline at
    /// the end is a write torn by a killed process (no one else writes while the caller
    /// holds the lock): it is ended with a newline so it stays one skipped line.
    fn read_new(&mut self) -> std::io::Result<Vec<Entry>> {
        let mut bytes = Vec::new();
        self.file.seek(SeekFrom::Start(self.replayed))?;
        self.file.read_to_end(&mut bytes)?;
        if bytes.last().is_some_and(|&b| b != b'\n') {
            self.file.write_all(b"\n")?;
            bytes.push(b'\n');
        }
        self.replayed += bytes.len() as u64;
        Ok(bytes.split(|&b| b == b'\n').filter_map(|l| serde_json::from_slice::<Entry>(l).ok()).collect())
    }

    fn append(&mut self, entry: &Entry) -> std::io::Result<()> {
        let mut line = serde_json::to_string(entry).expect("journal entry serializes");
        line.push('\n');
        // One write per entry (the file is opened to append): a killed process leaves
        // whole lines, or a torn last one.
        self.file.write_all(line.as_bytes())?;
        self.replayed += line.len() as u64;
        Ok(())
    }
}

struct Node {
    name: String,
    flavor: String,
    gpus: u32,
    cpus: u32,
    memory_mib: u64,
    block: Option<String>,
    /// Hundredths of a GPU in use.
    used: u32,
    failed: bool,
}

struct Job {
    request: JobRequest,
    /// Real milliseconds the job runs (its simulated duration over the time scale), or
    /// until it fails when `fails_after_ms` is set.
    run_ms: i64,
    fails_after_ms: Option<i64>,
    max_runtime_ms: Option<i64>,
    cancel_deadline_ms: Option<i64>,
    state: JobState,
    submitted_ms: i64,
    started_ms: Option<i64>,
    finished_ms: Option<i64>,
    exit_code: Option<i32>,
    reason: Option<String>,
    /// Node of each task, once started.
    placed: Vec<usize>,
}

/// One journal line.
#[derive(Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Entry {
    Submit { at: i64, job: Box<JobRequest>, run_ms: i64, fails_after_ms: Option<i64>, max_runtime_ms: Option<i64> },
    Cancel { at: i64, key: JobKey, grace_ms: i64 },
    FailNode { at: i64, node: String },
    RecoverNode { at: i64, node: String },
}

impl SimCluster {
    /// Builds the cluster from its spec, replaying `journal` when it exists (and appending
    /// to it from then on).
    ///
    /// # Errors
    /// [`BackendError::Rejected`] when the journal cannot be opened.
    pub fn open(spec: &SimSpec, journal: Option<PathBuf>, clock: Clock) -> Result<Self, BackendError> {
        let mut state = State::new(spec);
        if let Some(path) = journal {
            let io = |e: std::io::Error| BackendError::Rejected(format!("sim journal {}: {e}", path.display()));
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(io)?;
            }
            let file = OpenOptions::new().create(true).read(true).append(true).open(&path).map_err(io)?;
            state.journal = Some(Journal { file, path: path.clone(), replayed: 0 });
        }
        let sim = Self { clock, state: Mutex::new(state) };
        sim.configure(spec);
        Ok(sim)
    }

    /// Applies a changed spec: node faults and recoveries take effect now; time scale,
    /// failure probability and seed apply to jobs submitted from now on.
    pub fn configure(&self, spec: &SimSpec) {
        let (mut s, now) = self.lock();
        s.config = spec.clone();
        let failed: BTreeSet<&String> = spec.failed_nodes.iter().collect();
        let changes: Vec<Entry> = s
            .nodes
            .iter()
            .filter(|n| n.failed != failed.contains(&n.name))
            .map(|n| {
                if n.failed {
                    Entry::RecoverNode { at: now, node: n.name.clone() }
                } else {
                    Entry::FailNode { at: now, node: n.name.clone() }
                }
            })
            .collect();
        for entry in changes {
            s.record(&entry);
            s.replay(entry);
        }
    }

    /// The state, caught up with the journal (other processes' entries replayed) and
    /// advanced to now, with the journal locked until the guard is dropped; and now.
    fn lock(&self) -> (Locked<'_>, i64) {
        let mut s = self.state.lock().expect("sim state lock");
        let mut new = Vec::new();
        if let Some(j) = &mut s.journal {
            if let Err(e) = j.file.lock() {
                tracing::error!(error = %e, path = %j.path.display(), "sim journal lock failed");
            }
            new = j.read_new().unwrap_or_else(|e| {
                tracing::error!(error = %e, path = %j.path.display(), "sim journal read failed");
                Vec::new()
            });
        }
        for entry in new {
            s.replay(entry);
        }
        let now = self.clock.now_ms().max(s.time);
        s.advance(now);
        (Locked(s), now)
    }

    /// What task `task` of the job printed so far, and whether the job has ended.
    fn printed(&self, key: JobKey, task: u32) -> Result<(Vec<String>, bool), BackendError> {
        let (s, now) = self.reach()?;
        let &j = s.by_key.get(&key).ok_or_else(|| BackendError::Rejected(format!("no job {key}")))?;
        let tasks = s.jobs[j].request.tasks;
        if task >= tasks {
            let tasks =
                if tasks == 1 { "1 task (0)".to_owned() } else { format!("{tasks} tasks (0 to {})", tasks - 1) };
            return Err(BackendError::Rejected(format!("job {key} has {tasks}")));
        }
        Ok(s.printed(j, task, now))
    }

    /// The state now, or an error when the simulated backend is down.
    fn reach(&self) -> Result<(Locked<'_>, i64), BackendError> {
        let (s, now) = self.lock();
        if s.config.unreachable {
            return Err(BackendError::Unreachable("simulated outage (spec.sim.unreachable)".into()));
        }
        Ok((s, now))
    }

    /// The environment the job's tasks run with ([`JobRequest::environment`]), as a job's
    /// process would read it; `None` for a job it never accepted. (A job replayed from the
    /// journal has no token: the journal keeps none.)
    pub fn environment(&self, key: JobKey) -> Option<std::collections::BTreeMap<String, String>> {
        let (s, _) = self.lock();
        Some(s.jobs[*s.by_key.get(&key)?].request.environment())
    }

    /// Every job the cluster ever accepted, whatever its state (for tests and benchmarks).
    pub fn all_jobs(&self) -> Vec<JobStatus> {
        let (s, _) = self.lock();
        (0..s.jobs.len()).map(|j| s.status(j)).collect()
    }
}

/// The state, with its journal file locked until drop.
struct Locked<'a>(std::sync::MutexGuard<'a, State>);

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.0
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.0
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        if let Some(j) = &self.0.journal {
            let _ = j.file.unlock();
        }
    }
}

impl State {
    fn new(spec: &SimSpec) -> Self {
        let mut nodes = Vec::new();
        for g in &spec.node_groups {
            for i in 0..g.count {
                nodes.push(Node {
                    name: g.node_name(i),
                    flavor: g.flavor.clone(),
                    gpus: g.gpus_per_node,
                    cpus: g.cpus_per_node,
                    memory_mib: g.memory_mib_per_node,
                    block: g.topology_block.clone(),
                    used: 0,
                    failed: false,
                });
            }
        }
        let node_ix = nodes.iter().enumerate().map(|(i, n)| (n.name.clone(), i)).collect();
        Self {
            config: spec.clone(),
            nodes,
            node_ix,
            jobs: Vec::new(),
            by_key: HashMap::new(),
            queue: Vec::new(),
            ends: BinaryHeap::new(),
            journal: None,
            time: i64::MIN,
        }
    }

    fn record(&mut self, entry: &Entry) {
        if let Some(j) = &mut self.journal
            && let Err(e) = j.append(entry)
        {
            tracing::error!(error = %e, path = %j.path.display(), "sim journal write failed");
        }
    }

    fn replay(&mut self, entry: Entry) {
        match entry {
            Entry::Submit { at, job, run_ms, fails_after_ms, max_runtime_ms } => {
                self.advance(at);
                let j = self.jobs.len();
                self.by_key.insert(job.key, j);
                self.jobs.push(Job {
                    request: *job,
                    run_ms,
                    fails_after_ms,
                    max_runtime_ms,
                    cancel_deadline_ms: None,
                    state: JobState::Queued,
                    submitted_ms: at,
                    started_ms: None,
                    finished_ms: None,
                    exit_code: None,
                    reason: None,
                    placed: Vec::new(),
                });
                self.queue.push(j);
                self.start_queued(at);
            }
            Entry::Cancel { at, key, grace_ms } => {
                self.advance(at);
                let Some(&j) = self.by_key.get(&key) else { return };
                match self.jobs[j].state {
                    JobState::Queued => {
                        self.queue.retain(|&q| q != j);
                        self.end(j, at, JobState::Cancelled, None, "cancelled before it started");
                    }
                    JobState::Running => {
                        let job = &mut self.jobs[j];
                        let deadline = at + grace_ms;
                        if job.cancel_deadline_ms.is_none_or(|d| deadline < d) {
                            job.cancel_deadline_ms = Some(deadline);
                            self.ends.push(Reverse((deadline, j)));
                        }
                    }
                    _ => {}
                }
            }
            Entry::FailNode { at, node } => {
                self.advance(at);
                let Some(&n) = self.node_ix.get(&node) else { return };
                self.nodes[n].failed = true;
                let victims: Vec<usize> = (0..self.jobs.len())
                    .filter(|&j| self.jobs[j].state == JobState::Running && self.jobs[j].placed.contains(&n))
                    .collect();
                for j in victims {
                    self.end(j, at, JobState::Failed, None, &format!("node {node} failed"));
                }
                self.start_queued(at);
            }
            Entry::RecoverNode { at, node } => {
                self.advance(at);
                if let Some(&n) = self.node_ix.get(&node) {
                    self.nodes[n].failed = false;
                }
                self.start_queued(at);
            }
        }
    }

    /// Ends every job whose time has come, in time order, starting queued jobs as room
    /// frees up.
    fn advance(&mut self, now: i64) {
        self.time = self.time.max(now);
        while let Some(&Reverse((t, j))) = self.ends.peek() {
            if t > now {
                break;
            }
            self.ends.pop();
            if self.jobs[j].state != JobState::Running {
                continue;
            }
            let (end, state, exit, reason) = self.jobs[j].planned_end();
            if end != t {
                continue;
            }
            self.end(j, t, state, exit, reason);
            self.start_queued(t);
        }
    }

    fn end(&mut self, j: usize, at: i64, state: JobState, exit_code: Option<i32>, reason: &str) {
        let job = &mut self.jobs[j];
        let per_task = job.request.gpus_per_task;
        for &n in &job.placed {
            self.nodes[n].used -= per_task;
        }
        job.state = state;
        job.finished_ms = Some(at);
        job.exit_code = exit_code;
        job.reason = (!reason.is_empty()).then(|| reason.to_owned());
    }

    fn start_queued(&mut self, at: i64) {
        let mut i = 0;
        while i < self.queue.len() {
            let j = self.queue[i];
            match self.place(&self.jobs[j].request) {
                Some(placed) => {
                    self.queue.remove(i);
                    let per_task = self.jobs[j].request.gpus_per_task;
                    for &n in &placed {
                        self.nodes[n].used += per_task;
                    }
                    let job = &mut self.jobs[j];
                    job.placed = placed;
                    job.state = JobState::Running;
                    job.started_ms = Some(at);
                    let (end, ..) = job.planned_end();
                    self.ends.push(Reverse((end, j)));
                }
                None => i += 1,
            }
        }
    }

    /// Nodes for each task: the requested ones when they have room, else the first that do.
    fn place(&self, r: &JobRequest) -> Option<Vec<usize>> {
        let mut extra: HashMap<usize, u32> = HashMap::new();
        let fits = |n: usize, extra: &mut HashMap<usize, u32>| {
            let node = &self.nodes[n];
            let used = node.used + extra.get(&n).copied().unwrap_or(0);
            let ok = !node.failed && node.flavor == r.flavor && used + r.gpus_per_task <= node.gpus * 100;
            if ok {
                *extra.entry(n).or_default() += r.gpus_per_task;
            }
            ok
        };
        if r.nodes.len() == r.tasks as usize {
            let hinted: Option<Vec<usize>> = r.nodes.iter().map(|name| self.node_ix.get(name).copied()).collect();
            if let Some(hinted) = hinted
                && hinted.iter().all(|&n| fits(n, &mut extra))
            {
                return Some(hinted);
            }
            extra.clear();
        }
        let mut placed = Vec::with_capacity(r.tasks as usize);
        for _ in 0..r.tasks {
            placed.push((0..self.nodes.len()).find(|&n| fits(n, &mut extra))?);
        }
        Some(placed)
    }

    /// What task `task` of job `j` printed by `now`: a line when it started, one at each
    /// tenth of its run, one when it ended; and whether the job has ended.
    fn printed(&self, j: usize, task: u32, now: i64) -> (Vec<String>, bool) {
        let job = &self.jobs[j];
        let ended = job.state.is_final();
        let Some(started) = job.started_ms else { return (Vec::new(), ended) };
        let node = job.placed.get(task as usize).map_or("?", |&n| self.nodes[n].name.as_str());
        let gpus = f64::from(job.request.gpus_per_task) / 100.0;
        let simulated = job.run_ms as f64 * self.config.time_scale / 1000.0;
        let mut lines = vec![format!("[sim] task {task} of {} started on {node} with {gpus} GPU\n", job.request.tasks)];
        let until = job.finished_ms.unwrap_or(now).min(now);
        for step in 1..10 {
            if started + job.run_ms * step / 10 > until {
                break;
            }
            lines.push(format!(
                "[sim] step {step}/10: {:.0} of {simulated:.0} simulated seconds\n",
                simulated * step as f64 / 10.0
            ));
        }
        if ended {
            let why = job.reason.as_deref().unwrap_or("");
            lines.push(match (job.state, job.exit_code) {
                (JobState::Succeeded, _) => "[sim] done: exit code 0\n".to_owned(),
                (_, Some(code)) => format!("[sim] ended ({:?}): exit code {code} {why}\n", job.state),
                _ => format!("[sim] ended ({:?}): {why}\n", job.state),
            });
        }
        (lines, ended)
    }

    fn status(&self, j: usize) -> JobStatus {
        let job = &self.jobs[j];
        JobStatus {
            key: job.request.key,
            job_id: format!("sim-{}", j + 1),
            state: job.state,
            exit_code: job.exit_code,
            reason: job.reason.clone(),
            submitted_at: time(job.submitted_ms),
            started_at: job.started_ms.map(time),
            finished_at: job.finished_ms.map(time),
            cancelling: job.cancel_deadline_ms.is_some() && !job.state.is_final(),
            output: None,
            // A simulated service answers nowhere: a placeholder in the reserved `.invalid`.
            url: matches!(
                job.request.kind,
                berth_core::workload::WorkloadKind::Inference | berth_core::workload::WorkloadKind::Notebook
            )
            .then(|| format!("http://sim-{}.sim.invalid", j + 1)),
        }
    }
}

impl Job {
    /// When a running job ends, how and why: the earliest of its natural end (success or
    /// an injected failure), its max runtime and its cancel deadline.
    fn planned_end(&self) -> (i64, JobState, Option<i32>, &'static str) {
        let start = self.started_ms.expect("running jobs have started");
        let mut end = match self.fails_after_ms {
            Some(f) => (start + f, JobState::Failed, Some(1), "the job failed (simulated failure)"),
            None => (start + self.run_ms, JobState::Succeeded, Some(0), ""),
        };
        if let Some(max) = self.max_runtime_ms
            && start + max < end.0
        {
            end = (start + max, JobState::TimedOut, None, "it reached its max_runtime_seconds");
        }
        if let Some(d) = self.cancel_deadline_ms
            && d < end.0
        {
            end = (d, JobState::Cancelled, None, "cancelled");
        }
        end
    }
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// A well-mixed 64-bit hash (SplitMix64's finalizer).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn to_real_ms(simulated_seconds: f64, time_scale: f64) -> i64 {
    (simulated_seconds * 1000.0 / time_scale).round() as i64
}

#[async_trait]
impl ClusterBackend for SimCluster {
    fn kind(&self) -> ClusterKind {
        ClusterKind::Sim
    }

    async fn health(&self) -> Result<(), BackendError> {
        self.reach().map(|_| ())
    }

    async fn inventory(&self) -> Result<Inventory, BackendError> {
        let (s, _) = self.reach()?;
        let nodes = s
            .nodes
            .iter()
            .map(|n| InventoryNode {
                name: n.name.clone(),
                flavor: Some(n.flavor.clone()),
                gpus: n.gpus,
                gpus_used: n.used,
                gpus_used_outside_berth: 0,
                cpus: n.cpus,
                memory_mib: n.memory_mib,
                block: n.block.clone(),
                schedulable: !n.failed,
            })
            .collect();
        Ok(Inventory { nodes })
    }

    async fn submit(&self, job: &JobRequest) -> Result<JobStatus, BackendError> {
        let (mut s, now) = self.reach()?;
        if let Some(&j) = s.by_key.get(&job.key) {
            return Ok(s.status(j));
        }
        if job.gpus_per_task > 100 && !job.gpus_per_task.is_multiple_of(100) {
            return Err(BackendError::Rejected("a task takes whole GPUs or a fraction of one".into()));
        }
        let c = &s.config;
        let run_ms = to_real_ms(job.sim_duration_seconds.unwrap_or(c.default_duration_seconds), c.time_scale).max(1);
        let roll = mix(c.seed ^ mix(job.key.workload.as_u128() as u64) ^ u64::from(job.key.attempt));
        let fails = (roll % 1_000_000) as f64 / 1e6 < c.job_failure_probability;
        let fails_after_ms = fails.then(|| run_ms * ((roll >> 20) % 1000) as i64 / 1000);
        let max_runtime_ms = job.max_runtime_seconds.map(|m| to_real_ms(m as f64, c.time_scale));
        let entry = Entry::Submit { at: now, job: Box::new(job.clone()), run_ms, fails_after_ms, max_runtime_ms };
        s.record(&entry);
        s.replay(entry);
        let j = s.by_key[&job.key];
        Ok(s.status(j))
    }

    async fn jobs(&self) -> Result<Vec<JobStatus>, BackendError> {
        let (s, _) = self.reach()?;
        Ok((0..s.jobs.len()).map(|j| s.status(j)).collect())
    }

    async fn job(&self, key: JobKey) -> Result<Option<JobStatus>, BackendError> {
        let (s, _) = self.reach()?;
        Ok(s.by_key.get(&key).map(|&j| s.status(j)))
    }

    async fn logs(self: Arc<Self>, key: JobKey, request: LogRequest) -> Result<LogStream, BackendError> {
        let (lines, ended) = self.printed(key, request.task)?;
        let first = last_lines(&lines, request.tail);
        if !request.follow || ended {
            return Ok(futures_util::stream::once(async move { Ok(first) }).boxed());
        }
        let start = (self, (!first.is_empty()).then_some(first), lines.len());
        let stream = futures_util::stream::unfold(start, move |(sim, first, sent)| async move {
            if let Some(first) = first {
                return Some((Ok(first), (sim, None, sent)));
            }
            loop {
                tokio::time::sleep(FOLLOW_POLL).await;
                let (lines, ended) = match sim.printed(key, request.task) {
                    Ok(now) => now,
                    Err(e) => return Some((Err(e), (sim, None, usize::MAX))),
                };
                if lines.len() > sent {
                    let chunk = lines[sent..].concat();
                    return Some((Ok(chunk), (sim, None, lines.len())));
                }
                if ended || sent == usize::MAX {
                    return None;
                }
            }
        });
        Ok(stream.boxed())
    }

    async fn load(&self, key: JobKey, _query: Option<&str>) -> Result<Option<f64>, BackendError> {
        let (s, now) = self.reach()?;
        let Some(&j) = s.by_key.get(&key) else { return Ok(None) };
        let job = &s.jobs[j];
        let Some(started) = job.started_ms.filter(|_| job.state == JobState::Running) else { return Ok(None) };
        let elapsed = (now - started) as f64 * s.config.time_scale / 1000.0;
        let began = job.request.sim_load.iter().filter(|step| step.after_seconds <= elapsed);
        Ok(began.max_by(|a, b| a.after_seconds.total_cmp(&b.after_seconds)).map(|step| step.value))
    }

    async fn cancel(&self, key: JobKey, grace: Duration) -> Result<(), BackendError> {
        let (mut s, now) = self.reach()?;
        if s.config.refuse_cancels {
            return Err(BackendError::Rejected(format!("cancelling job {key} refused (spec.sim.refuse_cancels)")));
        }
        let Some(&j) = s.by_key.get(&key) else { return Ok(()) };
        if s.jobs[j].state.is_final() || (s.jobs[j].cancel_deadline_ms.is_some() && !grace.is_zero()) {
            return Ok(());
        }
        let grace_ms = to_real_ms(grace.as_secs_f64(), s.config.time_scale);
        let entry = Entry::Cancel { at: now, key, grace_ms };
        s.record(&entry);
        s.replay(entry);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use berth_core::cluster::NodeGroup;
    use berth_core::workload::{Run, WorkloadKind};
    use uuid::Uuid;

    use super::*;

    fn spec(nodes: u32) -> SimSpec {
        let mut spec = SimSpec::new(vec![NodeGroup {
            name: "n".into(),
            count: nodes,
            flavor: "h100".into(),
            gpus_per_node: 8,
            cpus_per_node: 64,
            memory_mib_per_node: 1024,
            topology_block: None,
        }]);
        spec.time_scale = 10.0;
        spec
    }

    fn job(tasks: u32, gpus: u32, seconds: f64) -> JobRequest {
        JobRequest {
            key: JobKey { workload: Uuid::now_v7(), attempt: 0 },
            team: "t".into(),
            workload: "w".into(),
            kind: WorkloadKind::Training,
            flavor: "h100".into(),
            tasks,
            gpus_per_task: gpus * 100,
            cpus_per_task: None,
            memory_mib_per_task: None,
            nodes: Vec::new(),
            run: Run::default(),
            max_runtime_seconds: None,
            sim_duration_seconds: Some(seconds),
            resume: false,
            grace_seconds: 30,
            api: None,
            notebook_token: None,
            service: None,
            sim_load: Vec::new(),
        }
    }

    struct Fixture {
        clock: Arc<AtomicI64>,
        sim: SimCluster,
    }

    impl Fixture {
        fn new(spec: &SimSpec, journal: Option<PathBuf>) -> Self {
            let clock = Arc::new(AtomicI64::new(1_000_000));
            let sim = SimCluster::open(spec, journal, Clock::Manual(clock.clone())).unwrap();
            Self { clock, sim }
        }

        fn at(&self, ms: i64) {
            self.clock.store(1_000_000 + ms, Ordering::SeqCst);
        }

        async fn state(&self, key: JobKey) -> JobState {
            self.sim.job(key).await.unwrap().unwrap().state
        }
    }

    #[tokio::test]
    async fn a_job_runs_for_its_duration_on_the_scaled_clock() {
        let f = Fixture::new(&spec(1), None);
        let j = job(1, 8, 60.0);
        assert_eq!(f.sim.submit(&j).await.unwrap().state, JobState::Running);
        f.at(5_999);
        assert_eq!(f.state(j.key).await, JobState::Running);
        f.at(6_000);
        let done = f.sim.job(j.key).await.unwrap().unwrap();
        assert_eq!((done.state, done.exit_code), (JobState::Succeeded, Some(0)));
    }

    #[tokio::test]
    async fn submitting_a_key_twice_makes_one_job() {
        let f = Fixture::new(&spec(1), None);
        let j = job(1, 1, 60.0);
        let first = f.sim.submit(&j).await.unwrap();
        let second = f.sim.submit(&j).await.unwrap();
        assert_eq!(first.job_id, second.job_id);
        assert_eq!(f.sim.jobs().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_job_waits_until_its_nodes_have_room() {
        let f = Fixture::new(&spec(1), None);
        let (a, b) = (job(1, 6, 10.0), job(1, 4, 10.0));
        f.sim.submit(&a).await.unwrap();
        assert_eq!(f.sim.submit(&b).await.unwrap().state, JobState::Queued);
        assert_eq!(f.sim.inventory().await.unwrap().nodes[0].gpus_used, 600);
        f.at(1_000);
        assert_eq!(f.state(a.key).await, JobState::Succeeded);
        assert_eq!(f.state(b.key).await, JobState::Running);
    }

    #[tokio::test]
    async fn cancel_gives_the_grace_period_then_stops_the_job_and_is_idempotent() {
        let f = Fixture::new(&spec(1), None);
        let j = job(1, 8, 600.0);
        f.sim.submit(&j).await.unwrap();
        f.sim.cancel(j.key, Duration::from_secs(30)).await.unwrap();
        f.at(2_000);
        f.sim.cancel(j.key, Duration::from_secs(30)).await.unwrap();
        let s = f.sim.job(j.key).await.unwrap().unwrap();
        assert!(s.cancelling && s.state == JobState::Running);
        f.at(3_000);
        assert_eq!(f.state(j.key).await, JobState::Cancelled);
        f.sim.cancel(JobKey { workload: Uuid::nil(), attempt: 0 }, Duration::ZERO).await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_node_fails_its_jobs_and_takes_no_more_until_it_recovers() {
        let mut s = spec(1);
        let f = Fixture::new(&s, None);
        let j = job(1, 8, 600.0);
        f.sim.submit(&j).await.unwrap();
        s.failed_nodes = vec!["n-0".into()];
        f.sim.configure(&s);
        let failed = f.sim.job(j.key).await.unwrap().unwrap();
        assert_eq!((failed.state, failed.reason.as_deref()), (JobState::Failed, Some("node n-0 failed")));
        let next = job(1, 1, 10.0);
        assert_eq!(f.sim.submit(&next).await.unwrap().state, JobState::Queued);
        assert!(!f.sim.inventory().await.unwrap().nodes[0].schedulable);
        s.failed_nodes.clear();
        f.sim.configure(&s);
        assert_eq!(f.state(next.key).await, JobState::Running);
    }

    #[tokio::test]
    async fn an_unreachable_cluster_answers_nothing_but_keeps_running_its_jobs() {
        let mut s = spec(1);
        let f = Fixture::new(&s, None);
        let j = job(1, 8, 10.0);
        f.sim.submit(&j).await.unwrap();
        s.unreachable = true;
        f.sim.configure(&s);
        assert!(matches!(f.sim.jobs().await, Err(BackendError::Unreachable(_))));
        assert!(matches!(f.sim.submit(&job(1, 1, 1.0)).await, Err(BackendError::Unreachable(_))));
        f.at(1_000);
        s.unreachable = false;
        f.sim.configure(&s);
        assert_eq!(f.state(j.key).await, JobState::Succeeded);
    }

    #[tokio::test]
    async fn failures_follow_the_probability_and_the_seed() {
        let mut s = spec(100);
        s.job_failure_probability = 0.3;
        let run = |seed: u64| {
            let mut s = s.clone();
            s.seed = seed;
            async move {
                let f = Fixture::new(&s, None);
                let keys: Vec<JobKey> =
                    (0..400u128).map(|i| JobKey { workload: Uuid::from_u128(i), attempt: 0 }).collect();
                for key in &keys {
                    f.sim.submit(&JobRequest { key: *key, ..job(1, 1, 10.0) }).await.unwrap();
                }
                f.at(10_000);
                let mut failed = Vec::new();
                for key in &keys {
                    failed.push(f.state(*key).await == JobState::Failed);
                }
                failed
            }
        };
        let a = run(7).await;
        assert_eq!(a, run(7).await, "same seed, same failures");
        assert_ne!(a, run(8).await, "another seed, other failures");
        let rate = a.iter().filter(|&&x| x).count() as f64 / a.len() as f64;
        assert!((0.2..0.4).contains(&rate), "failure rate {rate}");
    }

    #[tokio::test]
    async fn two_processes_on_one_journal_see_one_cluster() {
        // Two berthd replicas share a sim state directory: what one submits or cancels the
        // other sees, a key submitted by both is one job, and the node room is shared.
        let dir = std::env::temp_dir().join(format!("berth-sim-{}", Uuid::now_v7()));
        let path = dir.join("c.jsonl");
        let s = spec(1);
        let clock = Arc::new(AtomicI64::new(1_000_000));
        let one = SimCluster::open(&s, Some(path.clone()), Clock::Manual(clock.clone())).unwrap();
        let two = SimCluster::open(&s, Some(path.clone()), Clock::Manual(clock.clone())).unwrap();
        let (a, b) = (job(1, 6, 10.0), job(1, 4, 10.0));
        assert_eq!(one.submit(&a).await.unwrap().state, JobState::Running);
        assert_eq!(two.job(a.key).await.unwrap().map(|j| j.state), Some(JobState::Running), "seen by the other");
        assert_eq!(two.submit(&a).await.unwrap().job_id, "sim-1", "one job per key across processes");
        assert_eq!(two.submit(&b).await.unwrap().state, JobState::Queued, "the node's room is shared");
        assert_eq!(two.inventory().await.unwrap().nodes[0].gpus_used, 600);
        two.cancel(a.key, Duration::ZERO).await.unwrap();
        assert_eq!(one.job(a.key).await.unwrap().unwrap().state, JobState::Cancelled);
        assert_eq!(one.job(b.key).await.unwrap().unwrap().state, JobState::Running);
        assert_eq!(one.jobs().await.unwrap(), two.jobs().await.unwrap());
        // A torn line (a process killed mid-write) is skipped, and what follows is read.
        std::fs::OpenOptions::new().append(true).open(&path).unwrap().write_all(b"{\"op\":\"subm").unwrap();
        let c = job(1, 2, 10.0);
        one.submit(&c).await.unwrap();
        assert!(two.job(c.key).await.unwrap().is_some());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn reopening_the_journal_rebuilds_the_same_cluster() {
        let dir = std::env::temp_dir().join(format!("berth-sim-{}", Uuid::now_v7()));
        let path = dir.join("c.jsonl");
        let s = spec(1);
        let (a, b) = (job(1, 8, 10.0), job(1, 8, 10.0));
        let before = {
            let f = Fixture::new(&s, Some(path.clone()));
            f.sim.submit(&a).await.unwrap();
            f.sim.submit(&b).await.unwrap();
            f.sim.cancel(b.key, Duration::ZERO).await.unwrap();
            f.at(500);
            f.sim.jobs().await.unwrap()
        };
        let f = Fixture::new(&s, Some(path));
        f.at(500);
        assert_eq!(f.sim.jobs().await.unwrap(), before);
        assert_eq!(f.sim.submit(&a).await.unwrap().job_id, "sim-1", "the journal remembers the key");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
