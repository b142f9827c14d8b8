//! Real berthd processes on a test database, simulated clusters journaled to a temporary
//! directory (so they outlive the processes), and the checks the history must pass.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use berth_adapters::JobStatus;
use berth_adapters::sim::{Clock, SimCluster};
use berth_app::context::OpContext;
use berth_core::cluster::Cluster;
use berth_store::PgPool;
use serde_json::{Value, json};
use uuid::Uuid;

pub fn database_url(db: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (prefix, _) = base.rsplit_once('/').expect("a database in DATABASE_URL");
    format!("{prefix}/{}", db.connect_options().get_database().expect("a test database"))
}

/// A berthd process.
/// The secret berthd signs its own tokens with in these tests.
const SECRET: &str = "process-test-secret-of-32-bytes-or-more";

pub struct Berthd {
    pub address: String,
    child: Child,
    /// Jobs the dispatcher found already on a backend (submitted before a crash), as logged.
    pub adopted: Arc<AtomicUsize>,
    /// Times it followed the database primary to another host, as logged.
    pub primary_moves: Arc<AtomicUsize>,
}

impl Berthd {
    pub fn start(url: &str, id: &str, sim_dir: &Path) -> Self {
        Self::start_with(url, id, sim_dir, &[])
    }

    /// A berthd with extra environment (cluster secrets).
    pub fn start_with(url: &str, id: &str, sim_dir: &Path, env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_berthd"))
            .env("DATABASE_URL", url)
            .env("BERTH_LISTEN", "127.0.0.1:0")
            .env("BERTH_REPLICA_ID", id)
            .env("BERTH_SIM_STATE_DIR", sim_dir)
            .env("BERTH_CANCEL_GRACE_SECONDS", "1")
            .env("BERTH_ORPHAN_GRACE_SECONDS", "2")
            .env("BERTH_LOG_FORMAT", "json")
            .env("BERTH_JWT_SECRET", SECRET)
            .env("RUST_LOG", "warn,berthd=info,berth_controllers=info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("berthd starts");
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let stdout = child.stdout.take().unwrap();
        let adopted = Arc::new(AtomicUsize::new(0));
        let primary_moves = Arc::new(AtomicUsize::new(0));
        let (counter, moves) = (adopted.clone(), primary_moves.clone());
        // Keeps draining the log so the process never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).unwrap_or_default();
                if v["message"] == "berthd listening" {
                    let _ = tx.send(v["address"].as_str().unwrap_or_default().to_owned());
                }
                if v["message"] == berth_controllers::dispatcher::ADOPTED {
                    counter.fetch_add(1, Ordering::Relaxed);
                }
                if v["message"] == berth_store::PRIMARY_MOVED {
                    moves.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        let address = rx.recv_timeout(Duration::from_secs(60)).expect("berthd listens");
        Self { address, child, adopted, primary_moves }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no shutdown, no cleanup.
    pub fn kill(mut self) {
        self.child.kill().expect("kill");
        self.child.wait().expect("reaped");
    }

    /// A platform admin's token for this berthd (ten minutes).
    pub fn admin_token(&self) -> String {
        let issuer = berth_auth::BerthIssuer::new("berth", "berth", SECRET.as_bytes()).expect("secret");
        let grant = berth_core::auth::Grant { role: berth_core::auth::Role::PlatformAdmin, team: None };
        issuer.mint("admin", vec![grant], Duration::from_secs(600), None).token
    }

    /// A request as a platform admin: the status and the JSON body (`null` if none).
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("http://{}{path}", self.address))
            .bearer_auth(self.admin_token());
        if let Some(body) = body {
            req = req.json(body);
        }
        let reply = req.send().await.expect("request");
        let status = reply.status().as_u16();
        (status, reply.json().await.unwrap_or_default())
    }

    /// Waits (a minute at most, asking every 100 ms) until the workload is in `phase`;
    /// gives it back then.
    pub async fn wait_for_phase(&self, team: &str, name: &str, phase: &str) -> Value {
        let path = format!("/api/v1/teams/{team}/workloads/{name}");
        self.wait_for(&path, &format!("{team}/{name} is {phase}"), |w| w["status"]["phase"] == phase).await
    }

    /// Waits (a minute at most, asking every 100 ms) until the object at `path` (GET as
    /// a platform admin) satisfies `done`; gives it back then.
    pub async fn wait_for(&self, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, object) = self.call(reqwest::Method::GET, path, None).await;
            if done(&object) {
                return object;
            }
            assert!(Instant::now() < deadline, "not within a minute: {what}: {}", object["status"]);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A GET as a platform admin of a plain-text answer: its status, content type and text.
    pub async fn text(&self, path: &str) -> (u16, String, String) {
        let reply = reqwest::Client::new()
            .get(format!("http://{}{path}", self.address))
            .bearer_auth(self.admin_token())
            .send()
            .await
            .expect("request");
        let status = reply.status().as_u16();
        let content_type = reply.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        (status, content_type, reply.text().await.expect("text"))
    }

    pub async fn controllers(&self) -> Value {
        let url = format!("http://{}/api/v1/controllers", self.address);
        let issuer = berth_auth::BerthIssuer::new("berth", "berth", SECRET.as_bytes()).expect("secret");
        let grant = berth_core::auth::Grant { role: berth_core::auth::Role::Viewer, team: None };
        let token = issuer.mint("test", vec![grant], Duration::from_secs(600), None).token;
        let reply = reqwest::Client::new().get(url).bearer_auth(token).send().await.expect("GET controllers");
        reply.json().await.expect("JSON")
    }
}

impl Drop for Berthd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn actor() -> OpContext {
    OpContext::system("test")
}

/// Capacity per cluster in GPUs, and team limits with parents, for the invariant check.
pub struct World {
    pub capacity: HashMap<String, f64>,
    pub limits: HashMap<String, (Option<String>, f64)>,
}

/// Flavor h100; teams dept (guarantee 32, limit 40) > a, b (16 each, limit 24), and c
/// (nothing guaranteed, limit 16); clusters east (4 × 8) and west (2 × 8, 5 % of jobs fail),
/// both on a 1000× clock.
pub async fn seed(db: &PgPool) -> World {
    let a = actor();
    let flavor = serde_json::from_value(json!({"spec": {}})).unwrap();
    berth_app::flavor::flavor_apply(db, &a, "h100", &flavor, None).await.unwrap();
    let teams = [("dept", None, 32, 40), ("a", Some("dept"), 16, 24), ("b", Some("dept"), 16, 24), ("c", None, 0, 16)];
    let mut limits = HashMap::new();
    for (name, parent, guaranteed, limit) in teams {
        let body = json!({"spec": {"parent": parent, "quotas": [{"flavor": "h100", "guaranteed": guaranteed, "limit": limit}]}});
        berth_app::team::team_apply(db, &a, name, &serde_json::from_value(body).unwrap(), None).await.unwrap();
        limits.insert(name.to_owned(), (parent.map(str::to_owned), f64::from(limit)));
    }
    let mut capacity = HashMap::new();
    for (name, nodes, failures) in [("east", 4, 0.0), ("west", 2, 0.05)] {
        let body = json!({"spec": {"kind": "sim", "sim": {"time_scale": 1000, "job_failure_probability": failures, "seed": 7,
            "node_groups": [{"name": "n", "count": nodes, "flavor": "h100", "gpus_per_node": 8}]}}});
        berth_app::cluster::cluster_apply(db, &a, name, &serde_json::from_value(body).unwrap(), None).await.unwrap();
        capacity.insert(name.to_owned(), f64::from(nodes * 8));
    }
    World { capacity, limits }
}

/// A small deterministic generator.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Submits workload `i`: mixed teams, gangs, priorities, resumability and durations.
pub async fn submit(db: &PgPool, rng: &mut Lcg, i: usize) {
    let team = ["a", "b", "c"][rng.below(3) as usize];
    let gpus = [1, 2, 4, 8][rng.below(4) as usize];
    let count = if gpus == 8 { 1 + rng.below(2) } else { 1 + rng.below(3) };
    let body = json!({"spec": {
        "kind": "training",
        "priority": rng.below(3) * 10,
        "resumable": rng.below(2) == 0,
        "tasks": {"count": count, "resources": {"flavors": ["h100"], "gpus": gpus}},
        "sim": {"duration_seconds": 40 + rng.below(200)},
    }});
    let input = serde_json::from_value(body).unwrap();
    berth_app::workload::workload_apply(db, &actor(), team, &format!("w{i}"), &input, None).await.unwrap();
}

/// Waits until no workload is left unfinished.
pub async fn wait_all_final(db: &PgPool, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM workloads WHERE phase NOT IN ('Succeeded', 'Failed', 'Cancelled')",
        )
        .fetch_one(db)
        .await
        .unwrap();
        if open == 0 {
            return;
        }
        let phases: Vec<(String, i64)> =
            sqlx::query_as("SELECT phase, count(*) FROM workloads GROUP BY phase").fetch_all(db).await.unwrap();
        assert!(Instant::now() < deadline, "{open} workloads are still not final: {phases:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every job each simulated cluster ever accepted, rebuilt from its journal, and how many
/// times each key was submitted.
pub async fn sim_jobs(db: &PgPool, dir: &Path) -> (Vec<JobStatus>, BTreeMap<(Uuid, u32), usize>) {
    let clusters: Vec<Cluster> = berth_store::cluster::cluster_list_all(db).await.unwrap();
    let mut jobs = Vec::new();
    let mut submits = BTreeMap::new();
    for c in clusters {
        let path: PathBuf = dir.join(format!("{}.jsonl", c.metadata.uid));
        for line in std::fs::read_to_string(&path).unwrap_or_default().lines() {
            let v: Value = serde_json::from_str(line).unwrap_or_default();
            if v["op"] == "submit" {
                let key = &v["job"]["key"];
                let uid: Uuid = key["workload"].as_str().unwrap().parse().unwrap();
                *submits.entry((uid, key["attempt"].as_u64().unwrap() as u32)).or_default() += 1;
            }
        }
        let sim = SimCluster::open(c.spec.sim.as_ref().unwrap(), Some(path), Clock::System).unwrap();
        jobs.extend(sim.all_jobs());
    }
    (jobs, submits)
}

/// Replays the event history in order and checks that at no moment a team (or any of its
/// ancestors) held more than its limit, or a cluster more GPUs than it has. Returns how
/// many admissions it replayed.
pub async fn check_history(db: &PgPool, world: &World) -> usize {
    let events: Vec<(Uuid, String, Option<Value>)> =
        sqlx::query_as("SELECT object_uid, reason, details FROM events WHERE object_kind = 'workload' ORDER BY id")
            .fetch_all(db)
            .await
            .unwrap();
    let mut holding: HashMap<Uuid, (String, String, f64)> = HashMap::new();
    let mut team_use: HashMap<String, f64> = HashMap::new();
    let mut cluster_use: HashMap<String, f64> = HashMap::new();
    let mut admissions = 0;
    for (uid, reason, details) in events {
        let details = details.unwrap_or_default();
        if reason == "Admitted" {
            admissions += 1;
            let team = details["team"].as_str().unwrap().to_owned();
            let cluster = details["cluster"].as_str().unwrap().to_owned();
            let gpus = details["gpus"].as_f64().unwrap();
            assert!(
                holding.insert(uid, (team.clone(), cluster.clone(), gpus)).is_none(),
                "{uid} admitted twice at once"
            );
            let used = cluster_use.entry(cluster.clone()).or_default();
            *used += gpus;
            assert!(*used <= world.capacity[&cluster], "cluster {cluster} over capacity: {used}");
            let mut at = Some(team);
            while let Some(t) = at {
                let used = team_use.entry(t.clone()).or_default();
                *used += gpus;
                let (parent, limit) = &world.limits[&t];
                assert!(*used <= *limit, "team {t} over its limit: {used} > {limit}");
                at = parent.clone();
            }
        } else if holding.contains_key(&uid)
            && (reason == "Deleted"
                || ["Pending", "Succeeded", "Failed", "Cancelled"].contains(&details["to"].as_str().unwrap_or("")))
        {
            let (team, cluster, gpus) = holding.remove(&uid).unwrap();
            *cluster_use.get_mut(&cluster).unwrap() -= gpus;
            let mut at = Some(team);
            while let Some(t) = at {
                *team_use.get_mut(&t).unwrap() -= gpus;
                at = world.limits[&t].0.clone();
            }
        }
    }
    admissions
}

/// Checks that every (workload, attempt) that reached a backend has exactly one job, that
/// no job exists for an attempt never admitted, and that one workload's attempts never ran
/// at the same time. Returns the number of jobs.
pub async fn check_jobs(db: &PgPool, dir: &Path) -> usize {
    let (jobs, submits) = sim_jobs(db, dir).await;
    for (key, n) in &submits {
        assert_eq!(*n, 1, "{key:?} was submitted {n} times");
    }
    let admitted: Vec<(Uuid, i64)> =
        sqlx::query_as("SELECT object_uid, (details ->> 'attempt')::bigint FROM events WHERE reason = 'Admitted'")
            .fetch_all(db)
            .await
            .unwrap();
    let admitted: std::collections::HashSet<(Uuid, u32)> = admitted.into_iter().map(|(u, a)| (u, a as u32)).collect();
    let mut by_workload: BTreeMap<Uuid, Vec<&JobStatus>> = BTreeMap::new();
    for j in &jobs {
        assert!(admitted.contains(&(j.key.workload, j.key.attempt)), "job {} of an attempt never admitted", j.key);
        by_workload.entry(j.key.workload).or_default().push(j);
    }
    for attempts in by_workload.values_mut() {
        attempts.sort_by_key(|j| j.key.attempt);
        for pair in attempts.windows(2) {
            if let (Some(end), Some(start)) = (pair[0].finished_at, pair[1].started_at) {
                assert!(end <= start, "{} started before {} ended", pair[1].key, pair[0].key);
            }
        }
    }
    jobs.len()
}

/// Submits `count` workloads of team nlp (`w0`, `w1`, …, with `spec`), paced so that
/// dispatching spans five SIGKILLs of berthd at random points (from `seed`), each followed
/// by a fresh berthd (`{name}-{n}`, with `env`); waits until every workload is final.
/// Returns how many jobs the dispatchers found already on the backend after a crash.
pub async fn kill_during_burst(
    db: &PgPool,
    name: &str,
    dir: &Path,
    env: &[(&str, &str)],
    count: usize,
    spec: &Value,
    seed: u64,
) -> usize {
    let url = database_url(db);
    let mut berthd = Berthd::start_with(&url, &format!("{name}-0"), dir, env);
    let submitter = {
        let (db, input) =
            (db.clone(), serde_json::from_value::<berth_core::workload::WorkloadApply>(spec.clone()).unwrap());
        tokio::spawn(async move {
            for i in 0..count {
                berth_app::workload::workload_apply(&db, &actor(), "nlp", &format!("w{i}"), &input, None)
                    .await
                    .unwrap();
                // Paced, so dispatching spans the kills below.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut rng = Lcg(seed);
    let mut adopted = 0;
    for restart in 1..=5 {
        // A random point in the burst: the kill itself is what is under test.
        tokio::time::sleep(Duration::from_millis(200 + rng.below(700))).await;
        adopted += berthd.adopted.load(Ordering::Relaxed);
        berthd.kill();
        berthd = Berthd::start_with(&url, &format!("{name}-{restart}"), dir, env);
    }
    submitter.await.unwrap();
    wait_all_final(db, Duration::from_secs(240)).await;
    adopted += berthd.adopted.load(Ordering::Relaxed);
    berthd.kill();
    adopted
}

/// The leader's lock connection is terminated (`pg_terminate_backend`), as a network fault
/// or an operator would; returns whether there was one to kill. Only this test database's
/// lock is looked at (other tests run beside it on the same server).
pub async fn kill_leader_connection(db: &PgPool) -> bool {
    let key = berth_store::controller::LEADER_LOCK_KEY;
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND objsubid = 1
           AND classid = $1::bigint::oid AND objid = $2::bigint::oid
           AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .bind(key >> 32)
    .bind(key & 0xFFFF_FFFF)
    .fetch_all(db)
    .await
    .unwrap();
    killed.contains(&true)
}

/// One row of the fault table: what was acknowledged, and what broke (all zero, or the
/// test has failed before it prints).
#[derive(Default)]
pub struct FaultRow {
    pub fault: &'static str,
    pub acknowledged: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub overlapping: usize,
    pub limit_violations: usize,
    pub server_errors: usize,
    pub unavailable: usize,
}

impl FaultRow {
    pub fn print(&self) {
        println!(
            "FAULT | {} | acknowledged {} | lost {} | duplicated {} | overlapping attempts {} | limit violations {} | 5xx {} | 503 {}",
            self.fault,
            self.acknowledged,
            self.lost,
            self.duplicated,
            self.overlapping,
            self.limit_violations,
            self.server_errors,
            self.unavailable
        );
    }
}

/// A Postgres server of the test's own (so it can be stopped and restarted without
/// disturbing the tests beside it): initdb into a temporary directory, trust auth for
/// role `berth`, a free port on 127.0.0.1. As root, it runs as the `postgres` user.
pub struct PgServer {
    dir: PathBuf,
    bin: PathBuf,
    pub port: u16,
    pub url: String,
    /// More server settings (`-c name=value …`).
    settings: String,
}

impl PgServer {
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// A server started with more `settings` (`-c name=value …`).
    pub fn start_with(settings: &str) -> Self {
        let (dir, bin) = Self::directory();
        let data = dir.join("data");
        let out = as_postgres(Command::new(bin.join("initdb")).arg("-D").arg(&data).args([
            "-A",
            "trust",
            "-U",
            "berth",
            "--no-sync",
        ]));
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let server = Self::at(dir, bin, settings);
        server.up();
        server
    }

    /// A streaming standby of `primary`, copied from it with `pg_basebackup`, that
    /// connects as `application_name` (the name `synchronous_standby_names` gives it).
    pub fn standby_of(primary: &Self, application_name: &str) -> Self {
        let (dir, bin) = Self::directory();
        let data = dir.join("data");
        let port = primary.port.to_string();
        let out = as_postgres(Command::new(bin.join("pg_basebackup")).arg("-D").arg(&data).args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-U",
            "berth",
            "-X",
            "stream",
            "--no-sync",
        ]));
        assert!(out.status.success(), "pg_basebackup: {}", String::from_utf8_lossy(&out.stderr));
        let conninfo = format!("host=127.0.0.1 port={port} user=berth application_name={application_name}");
        let settings = format!("-c hot_standby=on -c primary_conninfo='{conninfo}'");
        let out = as_postgres(Command::new("touch").arg(data.join("standby.signal")));
        assert!(out.status.success(), "standby.signal: {}", String::from_utf8_lossy(&out.stderr));
        let server = Self::at(dir, bin, &settings);
        server.up();
        server
    }

    /// Promotes a standby to a primary (`pg_ctl promote`, waiting until it accepts writes).
    pub fn promote(&self) {
        let out = as_postgres(
            Command::new(self.bin.join("pg_ctl")).arg("-D").arg(self.dir.join("data")).args(["-w", "promote"]),
        );
        assert!(out.status.success(), "pg_ctl promote: {}", String::from_utf8_lossy(&out.stdout));
    }

    fn at(dir: PathBuf, bin: PathBuf, settings: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let url = format!("postgres://berth@127.0.0.1:{port}/postgres");
        Self { dir, bin, port, url, settings: settings.to_owned() }
    }

    /// A new directory the server may write, and the newest server binaries.
    fn directory() -> (PathBuf, PathBuf) {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries in /usr/lib/postgresql (scripts/local-postgres installs them)")
            .filter_map(Result::ok)
            .map(|e| e.path().join("bin"))
            .filter(|b| b.join("pg_ctl").exists())
            .max()
            .expect("pg_ctl");
        let dir = std::env::temp_dir().join(format!("berth-pg-{}", Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        if is_root() {
            let status = Command::new("chown").args(["postgres:postgres"]).arg(&dir).status().unwrap();
            assert!(status.success());
        }
        (dir, bin)
    }

    /// Starts the server and waits until it accepts connections.
    pub fn up(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections=200 {}",
            self.port,
            self.dir.display(),
            self.settings
        );
        let out = as_postgres(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .arg("-l")
                .arg(self.dir.join("log"))
                .args(["-w", "-o", &options, "start"]),
        );
        assert!(out.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&out.stdout));
    }

    /// Stops the server (`-m fast`: sessions are terminated, as in a restart or failover).
    pub fn down(&self) {
        let out = as_postgres(
            Command::new(self.bin.join("pg_ctl"))
                .arg("-D")
                .arg(self.dir.join("data"))
                .args(["-w", "-m", "fast", "stop"]),
        );
        assert!(out.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&out.stdout));
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = as_postgres(Command::new(self.bin.join("pg_ctl")).arg("-D").arg(self.dir.join("data")).args([
            "-w",
            "-m",
            "immediate",
            "stop",
        ]));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid() == 0).unwrap_or(false)
}

/// Runs `command` (as the `postgres` user when this process is root: the server refuses
/// to run as root).
fn as_postgres(command: &mut Command) -> std::process::Output {
    let command = if is_root() {
        let mut wrapped = Command::new("runuser");
        wrapped.args(["-u", "postgres", "--"]).arg(command.get_program()).args(command.get_args());
        wrapped
    } else {
        std::mem::replace(command, Command::new("true"))
    };
    let mut command = command;
    command.stdin(Stdio::null()).output().expect("runs")
}
