//! The built `berth` binary against a real berthd (the workspace's binary), Postgres and
//! simulated clusters, as a platform engineer and a researcher use it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sqlx::PgPool;

const SECRET: &str = "cli-test-secret-of-32-bytes-or-more!";

fn berthd_binary() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_berth")).with_file_name("berthd");
    assert!(path.exists(), "{} is missing: build the workspace (cargo build) first", path.display());
    path
}

fn database_url(db: &PgPool) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (prefix, _) = base.rsplit_once('/').expect("a database in DATABASE_URL");
    format!("{prefix}/{}", db.connect_options().get_database().expect("a test database"))
}

/// berthd on a test database, and a directory for the CLI's files.
struct World {
    child: Child,
    url: String,
    dir: PathBuf,
    admin: String,
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl World {
    fn start(db: &PgPool) -> Self {
        Self::start_with(db, &[])
    }

    fn start_with(db: &PgPool, env: &[(&str, &str)]) -> Self {
        let dir = std::env::temp_dir().join(format!("berth-cli-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(berthd_binary())
            .args(["serve"])
            .env("DATABASE_URL", database_url(db))
            .env("BERTH_LISTEN", "127.0.0.1:0")
            .env("BERTH_JWT_SECRET", SECRET)
            .env("BERTH_CANCEL_GRACE_SECONDS", "1")
            .env("BERTH_LOG_FORMAT", "json")
            .env("RUST_LOG", "warn,berthd=info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("berthd starts");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line).unwrap_or_default();
                if v["message"] == "berthd listening" {
                    let _ = tx.send(v["address"].as_str().unwrap_or_default().to_owned());
                }
            }
        });
        let address: String = rx.recv_timeout(Duration::from_secs(60)).expect("berthd listens");
        let mut world = Self { child, url: format!("http://{address}"), dir, admin: String::new() };
        world.admin = world.token("admin", "platform-admin", None);
        world
    }

    fn token(&self, subject: &str, role: &str, team: Option<&str>) -> String {
        let mut args = vec!["token", "create", "--subject", subject, "--role", role];
        if let Some(t) = team {
            args.extend(["--team", t]);
        }
        let out = Command::new(berthd_binary()).args(&args).env("BERTH_JWT_SECRET", SECRET).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }

    /// Runs `berth ARGS` as `token` (the admin's when `None`).
    fn berth_as(&self, token: &str, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args)
            .env("BERTH_SERVER", &self.url)
            .env("BERTH_TOKEN", token)
            .env("BERTH_CONFIG", self.dir.join("config.toml"))
            .env_remove("BERTH_CONTEXT")
            .output()
            .expect("berth runs")
    }

    fn berth(&self, args: &[&str]) -> Output {
        self.berth_as(&self.admin, args)
    }

    /// Runs `berth ARGS` and expects success.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.berth(args);
        assert!(out.status.success(), "berth {}: {}{}", args.join(" "), text(&out.stdout), text(&out.stderr));
        text(&out.stdout)
    }

    /// Runs `berth ARGS -o json` and parses what it printed.
    fn json(&self, args: &[&str]) -> Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.ok(&all);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("berth {}: not JSON ({e}): {out}", all.join(" ")))
    }

    fn write(&self, name: &str, text: &str) -> String {
        let path = self.dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    fn wait_for(&self, what: &str, args: &[&str], done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.json(args);
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "not within a minute: {what}: {v}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const ORG: &str = "
kind: Flavor
metadata: {name: h100, labels: {managed-by: gitops}}
spec: {description: NVIDIA H100, slurm: {gres_type: h100}}
---
kind: Team
metadata: {name: research, labels: {managed-by: gitops}}
spec: {quotas: [{flavor: h100, guaranteed: 16}]}
---
kind: Team
metadata: {name: nlp, labels: {managed-by: gitops}}
spec: {parent: research, quotas: [{flavor: h100, guaranteed: 8}]}
---
kind: Team
metadata: {name: vision, labels: {managed-by: gitops}}
spec: {parent: research, quotas: [{flavor: h100, guaranteed: 4}]}
";

const CLUSTER: &str = r#"{"kind": "Cluster", "metadata": {"name": "sim-a", "labels": {"managed-by": "gitops"}},
 "spec": {"kind": "sim", "sim": {"time_scale": 60, "node_groups": [{"name": "n", "count": 2, "flavor": "h100", "gpus_per_node": 8}]}}}"#;

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_platform_engineer_keeps_the_org_in_files_plans_applies_and_prunes(db: PgPool) {
    let w = World::start(&db);
    // A child (old.yaml) is read before its parent (teams.yaml): apply orders them.
    w.write("org/teams.yaml", ORG);
    w.write(
        "org/old.yaml",
        "kind: Team\nmetadata: {name: old, labels: {managed-by: gitops}}\nspec: {parent: research, quotas: []}\n",
    );
    w.write("org/clusters/sim.json", CLUSTER);
    let org = w.dir.join("org").display().to_string();

    // The plan: everything to create, and nothing written.
    let plan = w.json(&["apply", "-f", &org, "--dry-run"]);
    assert_eq!(plan["counts"], serde_json::json!({"create": 6}), "{plan}");
    let order: Vec<&str> = plan["steps"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(order, ["flavor/h100", "team/research", "team/nlp", "team/old", "team/vision", "cluster/sim-a"]);
    assert!(w.json(&["get", "teams"])["items"].as_array().unwrap().is_empty());
    assert!(w.json(&["get", "flavors"])["items"].as_array().unwrap().is_empty(), "the flavor was only checked");
    let noted =
        |id: &str| {
            plan["steps"].as_array().unwrap().iter().any(|s| {
                s["id"] == id && s["preview"][0] == "not checked by the server: the plan changes flavors first"
            })
        };
    assert!(noted("team/nlp") && noted("cluster/sim-a") && !noted("flavor/h100"), "{plan}");

    let applied = w.ok(&["apply", "-f", &org]);
    assert!(applied.contains("+ team/nlp created") && applied.contains("Applied: 6 to create"), "{applied}");
    // Again: nothing to do, nothing written.
    let again = w.json(&["apply", "-f", &org]);
    assert_eq!(again["counts"], serde_json::json!({"unchanged": 6}), "{again}");
    assert_eq!(w.berth(&["diff", "-f", &org]).status.code(), Some(0));

    // One quota changes in the file: diff names the field, the plan adds what the
    // scheduler would do. nlp and vision both want the whole 16 GPUs: nlp's fair share is
    // 8 + 2 of research's other 4 now, 12 with the change.
    for team in ["nlp", "vision"] {
        let all = w.write(&format!("{team}.sh"), "#!/bin/sh\n#SBATCH -N 2 --gpus-per-node=8\nsleep 1000\n");
        w.ok(&["submit", "--team", team, "--sim-seconds", "36000", &all]);
    }
    w.wait_for("one runs", &["get", "workloads", "--team", "nlp"], |l| l["items"][0]["status"]["phase"] == "Running");
    // top gives the department its subtree's fair share (its own, 0, before: it runs nothing
    // itself).
    let top = w.wait_for("research has its fair share", &["top"], |t| {
        t["items"].as_array().unwrap().iter().any(|i| i["team"] == "research" && i["subtree_fair_share"] == 16.0)
    });
    assert!(top.to_string().contains("subtree_borrowed"), "{top}");
    let table = w.ok(&["top"]);
    let research = table.lines().find(|l| l.starts_with("research ")).unwrap_or_else(|| panic!("{table}"));
    assert_eq!(research.split_whitespace().last(), Some("16"), "{table}");
    let teams = w.dir.join("org/teams.yaml");
    let changed = std::fs::read_to_string(&teams).unwrap().replace("guaranteed: 8}", "guaranteed: 12}");
    std::fs::write(&teams, changed).unwrap();
    let diff = w.berth(&["diff", "-f", &org]);
    assert_eq!(diff.status.code(), Some(1), "diff exits 1 when something differs");
    assert!(text(&diff.stdout).contains("~ team/nlp\n    spec.quotas[0].guaranteed: 8 → 12"), "{}", text(&diff.stdout));
    let dry = w.ok(&["apply", "-f", &org, "--dry-run"]);
    assert!(dry.contains("~ team/nlp would change") && dry.contains("    preview: "), "{dry}");
    assert!(dry.contains("fair share of nlp on h100: 10 → 12 GPUs"), "{dry}");
    let mut lines: Vec<&str> = dry.lines().collect();
    lines.sort_unstable();
    assert!(lines.windows(2).all(|l| l[0] != l[1]), "each line once: {dry}");
    assert_eq!(w.json(&["get", "team", "nlp"])["spec"]["quotas"][0]["guaranteed"], 8, "a dry run writes nothing");
    w.ok(&["apply", "-f", &org]);
    assert_eq!(w.json(&["get", "team", "nlp"])["spec"]["quotas"][0]["guaranteed"], 12);

    // A team leaves the files: --prune deletes what carries the label and is in no file.
    std::fs::remove_file(w.dir.join("org/old.yaml")).unwrap();
    let pruned = w.ok(&["apply", "-f", &org, "--prune", "-l", "managed-by=gitops"]);
    assert!(pruned.contains("- team/old deleted (pruned)"), "{pruned}");
    let gone = w.berth(&["get", "team", "old"]);
    assert_eq!(gone.status.code(), Some(3), "{}", text(&gone.stderr));
    // An empty selector (a pipeline's unset variable) would prune everything in no file,
    // labelled or not: refused, nothing deleted (a team without labels went).
    w.ok(&["apply", "-f", &w.write("loose.yaml", "kind: Team\nmetadata: {name: loose}\nspec: {}\n")]);
    for empty in ["", " ", ","] {
        let out = w.berth(&["apply", "-f", &org, "--prune", "-l", empty]);
        assert_eq!(out.status.code(), Some(2), "{empty:?}: {}{}", text(&out.stdout), text(&out.stderr));
        assert!(
            text(&out.stderr).contains("--prune needs labels to choose what it may delete"),
            "{}",
            text(&out.stderr)
        );
    }
    w.ok(&["get", "team", "loose"]);

    // A workload the server would refuse (more GPUs than nlp may ever hold) is found by the
    // dry run, which checks each workload with the server, writing nothing: exit 3.
    let jobs = w.write(
        "jobs.yaml",
        "kind: Workload\nmetadata: {name: huge, team: nlp}\nspec: {kind: batch, tasks: {count: 1, resources: {flavors: [h100], gpus: 64}}}\n---\n\
         kind: Workload\nmetadata: {name: fine, team: nlp}\nspec: {kind: batch, tasks: {count: 1, resources: {flavors: [h100], gpus: 1}}}\n",
    );
    let dry = w.berth(&["apply", "-f", &jobs, "--dry-run"]);
    assert_eq!(dry.status.code(), Some(3), "{}{}", text(&dry.stdout), text(&dry.stderr));
    assert!(
        text(&dry.stdout)
            .contains("+ workload/nlp/fine would be created\n! workload/nlp/huge would be refused (below)"),
        "{}",
        text(&dry.stdout)
    );
    assert!(
        text(&dry.stderr).contains("workload/nlp/huge (")
            && text(&dry.stderr).contains("/spec/tasks/resources/gpus: can never run"),
        "{}",
        text(&dry.stderr)
    );
    assert_eq!(w.berth(&["get", "workload", "fine", "--team", "nlp"]).status.code(), Some(3), "nothing written");
    // So are a new team and a cluster the server would refuse (found from outside: only
    // workloads were checked, and apply then stopped partway): research's 16 GPUs are all
    // its teams' already, and no flavor a100 exists. Nothing is written.
    let more = w.write(
        "more.yaml",
        "kind: Team\nmetadata: {name: audio}\nspec: {parent: research, quotas: [{flavor: h100, guaranteed: 8}]}\n---\n\
         kind: Cluster\nmetadata: {name: sim-b}\nspec: {kind: sim, sim: {node_groups: [{name: n, count: 1, flavor: a100, \
         gpus_per_node: 8}]}}\n",
    );
    let dry = w.berth(&["apply", "-f", &more, "--dry-run"]);
    let (out, err) = (text(&dry.stdout), text(&dry.stderr));
    assert_eq!(dry.status.code(), Some(3), "{out}{err}");
    assert!(out.contains("! team/audio would be refused (below)"), "{out}");
    assert!(out.contains("! cluster/sim-b would be refused (below)"), "{out}");
    assert!(err.contains("team/audio (") && err.contains("guarantee"), "{err}");
    assert!(err.contains("cluster/sim-b (") && err.contains("a100"), "{err}");
    for (kind, name) in [("team", "audio"), ("cluster", "sim-b")] {
        assert_eq!(w.berth(&["get", kind, name]).status.code(), Some(3), "{kind}/{name} was written");
    }
    // Two teams at once: each check would see the tree without the other (two new siblings
    // of 3 where 4 are left each pass alone), so neither is checked, and each says so.
    let two = w.write(
        "two.yaml",
        "kind: Team\nmetadata: {name: a1}\nspec: {parent: research, quotas: [{flavor: h100, guaranteed: 8}]}\n---\n\
         kind: Team\nmetadata: {name: a2}\nspec: {parent: research, quotas: []}\n",
    );
    let dry = w.json(&["apply", "-f", &two, "--dry-run"]);
    for step in dry["steps"].as_array().unwrap() {
        assert_eq!(
            step["preview"][0], "not checked by the server: the plan changes other teams too, which it would not see",
            "{dry}"
        );
        assert!(step.get("refused").is_none(), "{dry}");
    }
    // A field the server refuses is not dropped: metadata.parent would have made a top-level team.
    let parent = w.write("parent.yaml", "kind: Team\nmetadata: {name: speech, parent: research}\nspec: {quotas: []}\n");
    let out = w.berth(&["apply", "-f", &parent]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("unknown field `parent`") && text(&out.stderr).contains("spec.parent"),
        "{}",
        text(&out.stderr)
    );
    // A file the server's types refuse: nothing is sent, the field is named, exit 2.
    let bad = w.write("bad.yaml", "kind: Team\nmetadata: {name: x}\nspec: {quota: []}\n");
    let out = w.berth(&["apply", "-f", &bad]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bad.yaml#1: spec"), "{}", text(&out.stderr));
    // A syntax error is named once, exit 2 (it looped, taking 500 MB a second).
    let broken = w.write("broken.yaml", "a: [\n");
    let out = w.berth(&["apply", "-f", &broken]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("broken.yaml#1: ") && text(&out.stderr).contains("not read"));
    // A server that is no URL, a context that is not there: usage, exit 2, said so.
    let out = w.berth(&["--server", "notaurl", "get", "teams"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--server \"notaurl\": not an http(s) URL"), "{}", text(&out.stderr));
    let out = w.berth(&["--context", "nope", "get", "teams"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("no context \"nope\""), "{}", text(&out.stderr));
    // Something that is not Berth answering 404 is not Berth refusing (exit 3): exit 4.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other_url = format!("http://{}", other.local_addr().unwrap());
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for mut stream in other.incoming().flatten() {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    let out = w.berth(&["--server", &other_url, "get", "teams"]);
    assert_eq!(out.status.code(), Some(4), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("answered 404 Not Found without a problem body"), "{}", text(&out.stderr));
    // A rule of the API (a child's guarantee above its parent's): its field message, exit 3.
    let greedy = w.write(
        "greedy.yaml",
        "kind: Team\nmetadata: {name: greedy}\nspec: {parent: research, quotas: [{flavor: h100, guaranteed: 100}]}\n",
    );
    let out = w.berth(&["apply", "-f", &greedy]);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    assert_eq!(text(&out.stderr).matches("\n  /spec/quotas/0/guaranteed: ").count(), 1, "{}", text(&out.stderr));
    assert!(!text(&out.stderr).contains("what is above"), "nothing was applied: {}", text(&out.stderr));
    // What was applied before a refusal is said (a new flavor was created, then the team
    // refused, and only the refusal was printed).
    let l40 = w.write("l40.yaml", "kind: Flavor\nmetadata: {name: l40}\nspec: {}\n");
    let out = w.berth(&["apply", "-f", &l40, "-f", &greedy]);
    assert_eq!(out.status.code(), Some(3), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stderr).starts_with("+ flavor/l40 created\n"), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("(what is above was applied, the rest not)"), "{}", text(&out.stderr));

    for args in [["get", "flavors"], ["get", "teams"], ["get", "clusters"], ["get", "rolebindings"]] {
        w.json(&args);
    }
    let table = w.ok(&["get", "teams"]);
    assert!(table.starts_with("NAME") && table.contains("research"), "{table}");

    // `berth login` stores the server and token as a context (a file only its owner reads);
    // later commands need neither.
    let config = w.dir.join("config.toml");
    let plain = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args)
            .env("BERTH_CONFIG", &config)
            .env_remove("BERTH_SERVER")
            .env_remove("BERTH_TOKEN")
            .output()
            .unwrap()
    };
    let login = plain(&["login", "--server", &w.url, "--with-token", &w.admin, "--team", "nlp", "--context", "test"]);
    assert!(login.status.success(), "{}", text(&login.stderr));
    assert!(text(&login.stderr).contains("as admin"), "{}", text(&login.stderr));
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&config).unwrap().permissions().mode() & 0o777, 0o600);
    let listed = plain(&["get", "clusters", "-o", "json"]);
    assert!(listed.status.success(), "{}", text(&listed.stderr));
    let refused = plain(&["login", "--server", &w.url, "--with-token", "not-a-token"]);
    assert_eq!(refused.status.code(), Some(3), "a bad token is refused: {}", text(&refused.stderr));
}

/// Found from outside: `berth cancel` of an array larger than the caller's rate stopped
/// at the first 429 with no word of what it had done (four tries to cancel 1,000); `berth
/// logs -f` of queued work (the README's submit, then logs -f) was a 409; and a reader that
/// goes away (`berth get workloads | head`) made the CLI panic.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn an_array_beyond_the_rate_limit_is_cancelled_whole_logs_wait_and_a_closed_pipe_ends_quietly(db: PgPool) {
    let w = World::start_with(&db, &[("BERTH_RATE_LIMIT_PER_SECOND", "20"), ("BERTH_RATE_LIMIT_BURST", "5")]);
    w.write("org.yaml", ORG);
    w.write("cluster.json", CLUSTER);
    w.ok(&["apply", "-f", &w.dir.join("org.yaml").display().to_string()]);
    w.ok(&["apply", "-f", &w.dir.join("cluster.json").display().to_string()]);
    let script = w.write(
        "wide.sbatch",
        "#!/bin/bash\n#SBATCH -J wide --gres=gpu:h100:1 --array=0-29\n#BERTH --sim-seconds 36000\nhostname\n",
    );
    w.ok(&["submit", "--team", "nlp", &script]);
    let out = w.ok(&["cancel", "wide", "--team", "nlp"]);
    assert!(out.starts_with("array nlp/wide: 30 of its 30 workloads cancelled"), "{out}");
    let listed = w.json(&["get", "workloads", "--team", "nlp", "--selector", "berth.dev/array=wide"]);
    let items = listed["items"].as_array().unwrap();
    assert!(items.len() == 30 && items.iter().all(|i| i["status"]["cancellation"].is_object()), "{listed}");

    // `berth logs -f` of work that waits follows it once it starts (it was a 409, exit 3).
    let big = w.write(
        "big.sbatch",
        "#!/bin/bash\n#SBATCH -J big -N2 --gres=gpu:h100:8\n#BERTH --sim-seconds 36000\nhostname\n",
    );
    let small =
        w.write("small.sbatch", "#!/bin/bash\n#SBATCH -J small --gres=gpu:h100:1\n#BERTH --sim-seconds 60\nhostname\n");
    w.ok(&["submit", "--team", "nlp", &big]);
    w.wait_for("big runs", &["get", "workload", "big", "--team", "nlp"], |v| v["status"]["phase"] == "Running");
    w.ok(&["submit", "--team", "nlp", &small]);
    let mut follow = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["logs", "-f", "small", "--team", "nlp"])
        .env("BERTH_SERVER", &w.url)
        .env("BERTH_TOKEN", &w.admin)
        .env("BERTH_CONFIG", w.dir.join("config.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Its word that it waits, read as it comes.
    let (said, lines) = std::sync::mpsc::channel();
    let stderr = follow.stderr.take().unwrap();
    std::thread::spawn(move || BufReader::new(stderr).lines().map_while(Result::ok).for_each(|l| drop(said.send(l))));
    let waits = lines.recv_timeout(Duration::from_secs(60)).expect("berth logs -f says why it waits");
    assert!(waits.contains("nlp/small is Pending"), "{waits}");
    assert!(follow.try_wait().unwrap().is_none(), "it waits for small to start");
    w.ok(&["cancel", "big", "--team", "nlp"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while follow.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "small's logs did not end within a minute");
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = follow.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", lines.try_iter().collect::<Vec<_>>());
    assert!(!out.stdout.is_empty(), "its logs once it ran");

    // The reader is gone before the CLI writes: SIGPIPE ends it, as any Unix tool.
    use std::os::unix::process::ExitStatusExt as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["completion", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.signal(), Some(13), "{:?}: {}", out.status, text(&out.stderr));
}

/// `#SBATCH --array` makes a workload per index, each told its index as Slurm tells it.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_job_array_is_a_workload_per_index_told_its_index(db: PgPool) {
    let w = World::start(&db);
    w.write("org.yaml", ORG);
    w.write("cluster.json", CLUSTER);
    let files = ["org.yaml", "cluster.json"].map(|f| w.dir.join(f).display().to_string());
    w.ok(&["apply", "-f", &files[0], "-f", &files[1]]);
    let alice = w.token("alice", "member", Some("nlp"));
    let script = w.write(
        "sweep.sbatch",
        "#!/bin/bash\n#SBATCH -J sweep --gres=gpu:h100:1\n#SBATCH --array=1-5:2,8%2\n#BERTH --sim-seconds 36000\n\npython sweep.py --seed $SLURM_ARRAY_TASK_ID\n",
    );
    let out = w.berth_as(&alice, &["submit", &script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("array nlp/sweep: 4 workloads submitted (sweep-1 … sweep-8, 1 GPU of h100 each)"),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).contains("berth get workloads --team nlp -l berth.dev/array=sweep"), "how to list them");
    assert!(text(&out.stderr).contains("--array %2 is not kept"), "the limit left out is named: {}", text(&out.stderr));
    let listed = w.json(&["get", "workloads", "--team", "nlp", "--selector", "berth.dev/array=sweep"]);
    let mut names: Vec<&str> =
        listed["items"].as_array().unwrap().iter().map(|w| w["metadata"]["name"].as_str().unwrap()).collect();
    names.sort_unstable();
    assert_eq!(names, ["sweep-1", "sweep-3", "sweep-5", "sweep-8"]);
    let three = w.json(&["get", "workload", "sweep-3", "--team", "nlp"]);
    let env = &three["spec"]["run"]["env"];
    assert_eq!(
        [
            &env["SLURM_ARRAY_TASK_ID"],
            &env["SLURM_ARRAY_TASK_MIN"],
            &env["SLURM_ARRAY_TASK_MAX"],
            &env["SLURM_ARRAY_TASK_COUNT"],
            &env["SLURM_ARRAY_TASK_STEP"]
        ],
        ["3", "1", "8", "4", "1"],
        "{env}"
    );
    assert!(three["spec"]["run"]["script"].as_str().unwrap().contains("--seed $SLURM_ARRAY_TASK_ID"));
    assert_eq!(three["metadata"]["owner"]["subject"], "alice");
    // Run again, as sbatch runs a script again: the names are taken, so the array gets a
    // name of its own.
    let again = w.berth_as(&alice, &["submit", "-o", "json", "--array", "0-2", &script]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let items: Value = serde_json::from_slice(&again.stdout).unwrap();
    let names: Vec<&str> = items.as_array().unwrap().iter().map(|w| w["metadata"]["name"].as_str().unwrap()).collect();
    assert!(
        text(&again.stderr).contains("nlp/sweep (an array, or sweep-INDEX) exists: this array is named sweep-"),
        "{}",
        text(&again.stderr)
    );
    assert_eq!(names.len(), 3, "the command line's --array wins over the script's");
    let base = names[0].strip_suffix("-0").unwrap();
    assert!(base.starts_with("sweep-") && base.len() == "sweep-".len() + 5, "{base}");
    assert_eq!(names, [0, 1, 2].map(|i| format!("{base}-{i}")));
    assert_eq!(items[2]["spec"]["run"]["env"]["SLURM_ARRAY_TASK_ID"], "2");
    assert_eq!(items[2]["metadata"]["labels"]["berth.dev/array"], base);
    // Other indices under the same name are a new run too: one label, one run.
    let third = w.berth_as(&alice, &["submit", "-o", "json", "--array", "20", &script]);
    assert!(third.status.success(), "{}", text(&third.stderr));
    assert!(text(&third.stderr).contains("nlp/sweep (an array, or sweep-INDEX) exists"), "{}", text(&third.stderr));
    let items: Value = serde_json::from_slice(&third.stdout).unwrap();
    let name = items[0]["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("sweep-") && name.ends_with("-20") && name != "sweep-20", "{name}");
    // A name longer than a DNS label is shortened to leave room for the index.
    let long = "x".repeat(70);
    let out = w.berth_as(&alice, &["submit", "-o", "json", "--name", &long, "-a", "7", &script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let items: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(items[0]["metadata"]["name"], format!("{}-7", "x".repeat(61)));
    // What sbatch refuses is refused, naming the option; nothing is submitted.
    for (array, says) in [
        ("5-1", "the range ends before it starts"),
        ("0-2000", "more than 1000 indices"),
        ("1-4:0", "not a positive step"),
        ("x", "is not an index"),
    ] {
        let refused = w.berth_as(&alice, &["submit", "--array", array, &script]);
        assert_eq!(refused.status.code(), Some(2), "{array}: {}", text(&refused.stderr));
        assert!(
            text(&refused.stderr).contains(&format!("--array {array}: ")) && text(&refused.stderr).contains(says),
            "{}",
            text(&refused.stderr)
        );
    }
    // So is a script sbatch refuses whole: empty, no interpreter, DOS line breaks.
    for (name, body, says) in [
        ("empty.sh", "\n", "the batch script is empty"),
        ("bare.sh", "#SBATCH --gres=gpu:h100:1\nhostname\n", "the first line must start with #!"),
        ("dos.sh", "#!/bin/bash\r\n#SBATCH --gres=gpu:h100:1\r\nhostname\r\n", "DOS line breaks"),
        (
            "after.sh",
            "#!/bin/bash\n#SBATCH --gres=gpu:h100:1\n#SBATCH --dependency=afterok:sweep-1\nhostname\n",
            "#SBATCH --dependency=afterok:sweep-1: Berth does not hold a job until others end",
        ),
        (
            "part.sh",
            "#!/bin/bash\n#SBATCH --gres=gpu:h100:1 --partition=nowhere\nhostname\n",
            "no cluster has a Slurm partition \"nowhere\" (sbatch: invalid partition specified)",
        ),
    ] {
        let bad = w.write(name, body);
        let refused = w.berth_as(&alice, &["submit", &bad]);
        assert_eq!(refused.status.code(), Some(2), "{name}: {}", text(&refused.stderr));
        assert!(text(&refused.stderr).contains(says), "{name}: {}", text(&refused.stderr));
    }
    // A workload named as the array would be is left its name (`berth cancel` takes it).
    let plain = w.write("plain.sh", "#!/bin/bash\n#SBATCH --gres=gpu:h100:1\n#BERTH --sim-seconds 36000\nhostname\n");
    w.berth_as(&alice, &["submit", "--name", "solo", &plain]);
    let out = w.berth_as(&alice, &["submit", "-o", "json", "--name", "solo", "-a", "0-1", &plain]);
    let items: Value = serde_json::from_slice(&out.stdout).unwrap();
    let base = items[0]["metadata"]["labels"]["berth.dev/array"].as_str().unwrap();
    assert!(base.starts_with("solo-") && base.len() == "solo-".len() + 5, "{base}");
    // An array too large for one request is refused before it is sent, naming the option.
    let long =
        w.write("long.sh", &format!("#!/bin/bash\n#SBATCH --gres=gpu:h100:1\n# {}\nhostname\n", "x".repeat(2000)));
    let refused = w.berth_as(&alice, &["submit", "-a", "0-999", &long]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("--array: 1000 workloads with this script make a request of"));
    // A refusal of every index is said once.
    let refused = w.berth_as(&alice, &["submit", "--array", "0-99", "--priority", "5000", &script]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert!(
        text(&refused.stderr).contains("/items/0/spec/priority (and 99 more items alike): must be"),
        "{}",
        text(&refused.stderr)
    );
    assert_eq!(text(&refused.stderr).matches("/items/").count(), 1, "{}", text(&refused.stderr));
    // One script is one workload: its fields are the workload's.
    let refused = w.berth_as(&alice, &["submit", "--priority", "5000", &plain]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("\n  /spec/priority: must be"), "{}", text(&refused.stderr));
    let listed = w.json(&["get", "workloads", "--team", "nlp"]);
    assert_eq!(listed["items"].as_array().unwrap().len(), 12);
    // Each index runs as a workload of its own.
    w.wait_for("the array runs", &["get", "workloads", "--team", "nlp", "--selector", "berth.dev/array=sweep"], |l| {
        l["items"].as_array().is_some_and(|items| items.iter().all(|w| w["status"]["phase"] == "Running"))
    });
    // An array's name answers why for each member, and for logs names the members.
    let why = w.berth_as(&alice, &["why", "sweep"]);
    assert!(why.status.success(), "{}", text(&why.stderr));
    assert!(text(&why.stdout).starts_with("array nlp/sweep: 4 workloads: 4 Running\n"), "{}", text(&why.stdout));
    let logs = w.berth_as(&alice, &["logs", "sweep"]);
    assert_eq!(logs.status.code(), Some(2), "{}", text(&logs.stderr));
    assert!(
        text(&logs.stderr)
            .contains("nlp/sweep is an array of 4 workloads (sweep-1 … sweep-8), each with logs of its own"),
        "{}",
        text(&logs.stderr)
    );
    // What is not a name is not made a selector (`=sweep` would select the array sweep).
    let odd = w.berth_as(&alice, &["cancel", "=sweep"]);
    assert_eq!(odd.status.code(), Some(3), "{}", text(&odd.stderr));
    // One index is cancelled by its name; the array's name cancels the rest, as scancel
    // cancels an array by its job id.
    let one = w.berth_as(&alice, &["cancel", "sweep-5"]);
    assert!(one.status.success(), "{}", text(&one.stderr));
    w.wait_for("sweep-5 ends", &["get", "workload", "sweep-5", "--team", "nlp"], |w| {
        w["status"]["phase"] == "Cancelled"
    });
    // Anyone may label a workload of their own as a member: the array's owner still
    // cancels the rest of it, and is told which one was not hers.
    let bob = w.token("bob", "member", Some("nlp"));
    let joined = w.berth_as(&bob, &["submit", "--name", "bobs", "--label", "berth.dev/array=sweep", &plain]);
    assert!(joined.status.success(), "{}", text(&joined.stderr));
    // A job named as an array is given a name of its own by berth submit (`berth cancel
    // sweep` would take it); through the API anyone may still take the array's name.
    let renamed = w.berth_as(&bob, &["submit", "--name", "sweep", &plain]);
    assert!(
        text(&renamed.stderr).contains("nlp/sweep is an array's name: this one gets a name of its own"),
        "{}",
        text(&renamed.stderr)
    );
    let hostile = w.write(
        "hostile.json",
        r#"{"kind": "Workload", "metadata": {"name": "sweep", "team": "nlp"}, "spec": {"kind": "batch",
            "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}}, "sim": {"duration_seconds": 36000}}}"#,
    );
    let taken = w.berth_as(&bob, &["apply", "-f", &hostile]);
    assert!(taken.status.success(), "{}", text(&taken.stderr));
    // why says whose workload of that name it shows, and how to name the array's.
    let why = w.berth_as(&alice, &["why", "sweep"]);
    assert!(
        text(&why.stderr).contains("note: this is bob's workload nlp/sweep; an array is named sweep too"),
        "{}",
        text(&why.stderr)
    );
    // The owner's cancel is still the array's; a labelled workload of another's is named, and
    // left alone (exit 0: hers were cancelled).
    let all = w.berth_as(&alice, &["cancel", "sweep"]);
    assert!(all.status.success(), "{}", text(&all.stderr));
    assert!(
        text(&all.stderr).contains("the workload nlp/sweep is not yours to cancel: this cancels the array sweep"),
        "{}",
        text(&all.stderr)
    );
    assert!(
        text(&all.stdout)
            .contains("array nlp/sweep: 3 of its 5 workloads cancelled, 1 had ended, 1 not yours to cancel"),
        "{}",
        text(&all.stdout)
    );
    assert!(text(&all.stderr).contains("note: nlp/bobs was not cancelled"), "{}", text(&all.stderr));
    w.wait_for("the array ends", &["get", "workloads", "--team", "nlp", "--selector", "berth.dev/array=sweep"], |l| {
        l["items"].as_array().is_some_and(|items| {
            items.iter().all(|w| (w["status"]["phase"] == "Cancelled") == (w["metadata"]["name"] != "bobs"))
        })
    });
    let other = w.json(&["get", "workload", names[0], "--team", "nlp"]);
    assert_ne!(other["status"]["phase"], "Cancelled", "another run's array is left alone");
    assert_ne!(w.json(&["get", "workload", "sweep", "--team", "nlp"])["status"]["phase"], "Cancelled", "bob's");
    w.ok(&["delete", "sweep", "--team", "nlp"]);
    w.wait_for("bob's sweep is gone", &["get", "workloads", "--team", "nlp"], |l| {
        l["items"].as_array().is_some_and(|items| items.iter().all(|w| w["metadata"]["name"] != "sweep"))
    });
    // Deleting the array deletes what of it the caller may.
    let why = w.berth_as(&alice, &["why", "sweep"]);
    assert!(text(&why.stdout).starts_with("array nlp/sweep: 5 workloads: 4 Cancelled, 1 "), "{}", text(&why.stdout));
    let taken = w.berth_as(&bob, &["apply", "-f", &hostile]);
    assert!(taken.status.success(), "{}", text(&taken.stderr));
    let deleted = w.berth_as(&alice, &["delete", "sweep"]);
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    assert!(
        text(&deleted.stderr).contains("not yours to delete: this deletes the array sweep"),
        "{}",
        text(&deleted.stderr)
    );
    assert!(
        text(&deleted.stdout).contains("array nlp/sweep: 4 of its 5 workloads deleted, 1 not yours to delete"),
        "{}",
        text(&deleted.stdout)
    );
    assert!(text(&deleted.stderr).contains("note: nlp/bobs was not deleted"), "{}", text(&deleted.stderr));
    // Another's array by its name: none of it hers, refused.
    let theirs = w.berth_as(&bob, &["delete", names[0].strip_suffix("-0").unwrap()]);
    assert_eq!(theirs.status.code(), Some(3), "{}", text(&theirs.stderr));
    let left = w.json(&["get", "workloads", "--team", "nlp", "--selector", "berth.dev/array=sweep"]);
    let left: Vec<&str> =
        left["items"].as_array().unwrap().iter().map(|w| w["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(left, ["bobs"]);
    let none = w.berth_as(&alice, &["cancel", "nothing"]);
    assert_eq!(none.status.code(), Some(3), "{}", text(&none.stderr));
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_researcher_submits_an_unmodified_sbatch_script_follows_it_and_cancels_work(db: PgPool) {
    let w = World::start(&db);
    w.write("org.yaml", ORG);
    w.write("cluster.json", CLUSTER);
    w.ok(&[
        "apply",
        "-f",
        &w.dir.join("org.yaml").display().to_string(),
        "-f",
        &w.dir.join("cluster.json").display().to_string(),
    ]);
    w.wait_for("the cluster reports its nodes", &["get", "cluster", "sim-a"], |c| c["status"]["health"] == "Healthy");
    let alice = w.token("alice", "member", Some("nlp"));

    // An sbatch script as it is: 2 nodes × 2 GPUs of type h100, an hour.
    let script = w.write(
        "train.sbatch",
        "#!/bin/bash\n#SBATCH --job-name=train\n#SBATCH --gres=gpu:h100:2 --nodes=2 --time=01:00:00\n#SBATCH --mail-type=END\n#BERTH --sim-seconds 300\n\nsrun python train.py\n",
    );
    let out = w.berth_as(&alice, &["submit", &script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("workload nlp/train submitted (4 GPUs of h100)"), "{}", text(&out.stdout));
    assert!(text(&out.stderr).contains("--mail-type=END"), "the option left out is named");
    // sbatch's options on the command line win over the script's, as sbatch's do; one
    // Berth does not use is named; --test-only submits nothing.
    let probe = ["-J", "probe", "-N", "1", "-G", "1", "-t", "10", "--account", "proj"];
    let tested = w.berth_as(&alice, &[&["submit", "-o", "json", "--test-only"][..], &probe, &[&script]].concat());
    assert!(tested.status.success(), "{}", text(&tested.stderr));
    assert!(
        text(&tested.stderr).contains("sbatch options Berth does not use: --account proj"),
        "{}",
        text(&tested.stderr)
    );
    let tested: Value = serde_json::from_slice(&tested.stdout).unwrap();
    assert_eq!(
        (tested["metadata"]["name"].as_str(), tested["spec"]["max_runtime_seconds"].as_u64()),
        (Some("probe"), Some(600))
    );
    assert_eq!(
        (tested["spec"]["tasks"]["count"].as_u64(), tested["spec"]["tasks"]["resources"]["gpus"].as_f64()),
        (Some(1), Some(1.0))
    );
    let none = w.berth_as(&alice, &["get", "workload", "probe", "--team", "nlp"]);
    assert!(
        none.status.code() == Some(3) && text(&none.stderr).contains("404"),
        "not submitted: {}",
        text(&none.stderr)
    );
    // --parsable prints the name alone, for a pipeline.
    let parsed = w.berth_as(&alice, &[&["submit", "--parsable"][..], &probe, &[&script]].concat());
    assert_eq!(text(&parsed.stdout), "probe\n", "{}", text(&parsed.stderr));
    w.ok(&["delete", "probe", "--team", "nlp"]);
    w.wait_for("probe is gone", &["get", "workloads", "--team", "nlp"], |l| {
        l["items"].as_array().is_some_and(|items| items.iter().all(|w| w["metadata"]["name"] != "probe"))
    });
    // After sbatch's options, -o is sbatch's --output: a format of Berth's there is refused.
    let format = w.berth_as(&alice, &["submit", "-J", "late", "-o", "json", &script]);
    assert_eq!(format.status.code(), Some(2), "{}", text(&format.stderr));
    assert!(text(&format.stderr).contains("give Berth's -o json before them"), "{}", text(&format.stderr));
    // Given first, -o is Berth's: a file there is refused, saying what each -o is.
    let file = w.berth_as(&alice, &["submit", "-o", "slurm-%j.out", &script]);
    assert_eq!(file.status.code(), Some(2), "{}", text(&file.stderr));
    assert!(
        text(&file.stderr).contains("sbatch's -o (the job's output file) is not Berth's"),
        "{}",
        text(&file.stderr)
    );
    // After the script, -o is Berth's again: a file there is refused, saying where sbatch's goes.
    let after = w.berth_as(&alice, &["submit", &script, "-o", "slurm-%j.out"]);
    assert_eq!(after.status.code(), Some(2), "{}", text(&after.stderr));
    assert!(text(&after.stderr).contains("(berth submit -J NAME -o slurm-%j.out SCRIPT)"), "{}", text(&after.stderr));
    // What follows the script sbatch would pass to it: refused, not dropped.
    let args = w.berth_as(&alice, &["submit", &script, "--epochs", "3"]);
    assert_eq!(args.status.code(), Some(2), "{}", text(&args.stderr));
    assert!(text(&args.stderr).contains("--epochs 3 after the script"), "{}", text(&args.stderr));
    let train =
        w.wait_for("train runs", &["get", "workload", "train", "--team", "nlp"], |w| w["status"]["phase"] == "Running");
    assert_eq!(train["metadata"]["owner"]["subject"], "alice");
    assert_eq!(train["spec"]["tasks"]["count"], 2);
    assert_eq!(train["spec"]["max_runtime_seconds"], 3600);
    // Its logs, followed to the end (300 simulated seconds at 60× are 5 s).
    let logs = w.berth_as(&alice, &["logs", "-f", "train"]);
    assert!(logs.status.success(), "{}", text(&logs.stderr));
    let printed = text(&logs.stdout);
    assert!(
        printed.starts_with("[sim] task 0 of 2 started on n-") && printed.ends_with("[sim] done: exit code 0\n"),
        "{printed}"
    );

    // The same script again, as sbatch runs it: the name is taken by the first run, so this
    // one gets a name of its own; `delete` removes it and frees its name.
    w.wait_for("train ends", &["get", "workload", "train", "--team", "nlp"], |w| w["status"]["phase"] == "Succeeded");
    let again = w.berth_as(&alice, &["submit", "-o", "json", &script]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(text(&again.stderr).contains("nlp/train exists (Succeeded): this one gets a name of its own"));
    let again: Value = serde_json::from_slice(&again.stdout).unwrap();
    let name = again["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("train-") && name.len() == "train-".len() + 5, "{name}");
    let deleted = w.berth_as(&alice, &["delete", &name]);
    assert!(deleted.status.success(), "{}", text(&deleted.stderr));
    w.wait_for("its record is gone", &["get", "workloads", "--team", "nlp"], |l| {
        l["items"].as_array().is_some_and(|items| items.iter().all(|w| w["metadata"]["name"] != name.as_str()))
    });
    // GPUs that do not split over the tasks are refused, naming what was asked.
    let uneven =
        w.write("uneven.sbatch", "#!/bin/bash\n#SBATCH --ntasks=3 --gres=gpu:h100:8 --time=UNLIMITED\nhostname\n");
    let refused = w.berth_as(&alice, &["submit", &uneven]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("8 GPUs a node over 3 tasks a node is 2.67 GPUs a task"));

    // A notebook: `endpoint` shows its owner where it answers and the token that opens
    // it; a teammate is refused.
    let nb = w.berth_as(
        &alice,
        &["run", "--kind", "notebook", "--name", "nb", "--gpus", "1", "--sim-seconds", "600"]
            .into_iter()
            .chain(["--image", "quay.io/jupyter/base-notebook", "--", "start-notebook.py"])
            .collect::<Vec<_>>(),
    );
    assert!(nb.status.success(), "{}", text(&nb.stderr));
    w.wait_for("nb runs", &["get", "workload", "nb", "--team", "nlp"], |w| w["status"]["phase"] == "Running");
    let shown = w.berth_as(&alice, &["endpoint", "nb"]);
    let shown = text(&shown.stdout);
    assert!(shown.starts_with("URL:    http://sim-") && shown.contains("\nToken:  "), "{shown}");
    assert!(shown.contains(".sim.invalid/?token="), "{shown}");
    let bob = w.token("bob", "member", Some("nlp"));
    assert_eq!(w.berth_as(&bob, &["endpoint", "nb", "--team", "nlp"]).status.code(), Some(3));
    w.ok(&["cancel", "nb", "--team", "nlp"]);

    // Work that waits: the cluster is full, so `why` explains it; cancel keeps it. The
    // waiter asks for more than nlp's guarantee (2 × 5 GPUs against 8), so it cannot
    // reclaim vision's hog, and the hog runs for the rest of the test (10 real minutes):
    // with 2 × 4 it reclaimed the hog a grace period later, and a loaded machine saw it
    // admitted before it was cancelled (a CI failure).
    let big = w.write("big.sh", "#!/bin/sh\n#SBATCH -J hog -N 2 --gpus-per-node=8\nsleep 1000\n");
    w.ok(&["submit", "--team", "vision", "--sim-seconds", "36000", &big]);
    w.wait_for("hog runs", &["get", "workload", "hog", "--team", "vision"], |w| w["status"]["phase"] == "Running");
    let out = w.berth_as(&alice, &["submit", "--name", "waiter", "--gpus", "5", "--sim-seconds", "60", &script]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    w.wait_for("waiter has a reason", &["get", "workload", "waiter", "--team", "nlp"], |w| {
        w["status"]["pending_reason"].is_object()
    });
    let why = w.berth_as(&alice, &["why", "waiter"]);
    let why = text(&why.stdout);
    assert!(why.starts_with("nlp/waiter waits: ") && why.contains("What would let it run: "), "{why}");
    let cancelled = w.berth_as(&alice, &["cancel", "waiter"]);
    assert!(text(&cancelled.stdout).contains("nlp/waiter cancelled"), "{}", text(&cancelled.stderr));
    assert_eq!(w.json(&["get", "workload", "waiter", "--team", "nlp"])["status"]["phase"], "Cancelled");
    // Alice may not cancel vision's work.
    let refused = w.berth_as(&alice, &["cancel", "hog", "--team", "vision"]);
    assert_eq!(refused.status.code(), Some(3), "{}", text(&refused.stderr));
    // Inside a job, `berth checkpointed` finds its workload, team, Berth and token in the
    // job's environment (here a token of alice's, and an ended workload: refused).
    let ack = Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("checkpointed")
        .envs([("BERTH_WORKLOAD", "waiter"), ("BERTH_TEAM", "nlp"), ("BERTH_API_URL", &w.url)])
        .env("BERTH_JOB_TOKEN", &alice)
        .env("BERTH_SERVER", "http://127.0.0.1:9")
        .env("BERTH_CONFIG", w.dir.join("config.toml"))
        .env_remove("BERTH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(ack.status.code(), Some(3), "{}", text(&ack.stderr));
    assert!(
        text(&ack.stderr).contains("409") && text(&ack.stderr).contains("has already ended"),
        "{}",
        text(&ack.stderr)
    );

    // Every command's -o json parses.
    for args in [
        vec!["get", "workloads"],
        vec!["get", "workloads", "--owner", "me"],
        vec!["describe", "workload", "train", "--team", "nlp"],
        vec!["why", "waiter", "--team", "nlp"],
        vec!["queue"],
        vec!["top"],
        vec!["diff", "-f", &script.replace("train.sbatch", "org.yaml")],
    ] {
        w.json(&args);
    }
    let mine = w.berth_as(&alice, &["get", "workloads", "--owner", "me", "-o", "json"]);
    let names: Vec<String> = serde_json::from_slice::<Value>(&mine.stdout).unwrap()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["nb", "train", "waiter"]);
    let searched = w.berth_as(&alice, &["get", "workloads", "--owner", "me", "--name-contains", "ai", "-o", "json"]);
    let searched: Value = serde_json::from_slice(&searched.stdout).unwrap();
    let names: Vec<&str> =
        searched["items"].as_array().unwrap().iter().map(|w| w["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["train", "waiter"]);
    let described = w.ok(&["describe", "workload", "train", "--team", "nlp"]);
    assert!(
        described.contains("Owner") && described.contains("Events:") && described.contains("Admitted"),
        "{described}"
    );
    // And the commands that change things, in JSON too.
    w.ok(&["submit", "--team", "nlp", "--name", "spare", "--gpus", "1", "--sim-seconds", "600", &script]);
    let spare = w.json(&["cancel", "spare", "--team", "nlp"]);
    assert_eq!(spare["status"]["cancellation"]["by"], "admin", "{spare}");
    let org = script.replace("train.sbatch", "org.yaml");
    let summary = w.json(&["preview", "team", "nlp", "-f", &org])["summary"].clone();
    let said = w.ok(&["preview", "team", "nlp", "-f", &org]);
    match summary.as_array().expect("summary").as_slice() {
        [] => assert_eq!(said.trim(), "nothing would change now"),
        lines => assert!(lines.iter().all(|l| said.contains(l.as_str().unwrap())), "{said}"),
    }
    // After `--` everything is the command, `-o json` too: it goes before.
    let run = w.ok(&[
        "run",
        "-o",
        "json",
        "--dry-run",
        "--team",
        "nlp",
        "--image",
        "busybox",
        "--gpus",
        "1",
        "--",
        "python",
        "-c",
        "print(1)",
    ]);
    let run: Value = serde_json::from_str(&run).unwrap();
    assert_eq!(
        run["spec"]["run"],
        serde_json::json!({"command": ["python", "-c", "print(1)"], "image": "busybox", "env": {}})
    );
    // What the work used, from the accounting ledger and what runs now: alice's train (4
    // GPUs, ended) and vision's hog (16, running).
    let usage = w.json(&["usage", "--by", "team,owner"]);
    let row = |team: &str, owner: &str| {
        let rows = usage["rows"].as_array().unwrap();
        rows.iter().find(|r| r["team"] == team && r["owner"] == owner).map(|r| r["gpu_hours"].as_f64().unwrap())
    };
    assert!(row("nlp", "alice").is_some_and(|h| h > 0.0), "{usage}");
    assert!(row("vision", "admin").is_some_and(|h| h > 0.0), "{usage}");
    let csv = w.ok(&["usage", "--from", "2026-01-01", "--by", "owner", "--bucket", "month", "--csv"]);
    assert!(
        csv.starts_with("bucket,owner,gpu_hours,in_quota_gpu_hours,borrowed_gpu_hours,cost,unpriced_gpu_hours\n"),
        "{csv}"
    );
    let table = w.ok(&["usage", "--by", "team"]);
    assert!(table.contains("GPU-HOURS") && table.contains("nlp") && table.contains("GPU-hours ("), "{table}");
    // h100 has no price here: its hours are not said to cost 0.00.
    let nlp = table.lines().find(|l| l.starts_with("nlp ")).unwrap_or_else(|| panic!("{table}"));
    assert_eq!(nlp.split_whitespace().last(), Some("-"), "{table}");
    assert!(
        table.contains("cost 0.00 (* without ") && table.contains(" GPU-hours of flavors that have no price)"),
        "{table}"
    );
    assert!(!table.contains("WITH SUBTEAMS"), "{table}");
    // Wide: each team's own and department figures (-o wide printed the same table).
    let wide = w.ok(&["usage", "--by", "team", "-o", "wide"]);
    let parent = |team: &str| {
        let line = wide.lines().rfind(|l| l.starts_with(&format!("{team} ")));
        line.unwrap_or_else(|| panic!("{wide}")).split_whitespace().nth(1).unwrap().to_owned()
    };
    assert!(wide.contains("WITH SUBTEAMS") && wide.contains("IDLE GUARANTEE"), "{wide}");
    assert_eq!((parent("research"), parent("nlp")), ("-".to_owned(), "research".to_owned()), "{wide}");
    let bad = w.berth(&["usage", "--from", "last tuesday"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad.stderr));
    assert!(text(&bad.stderr).contains("--from"), "{}", text(&bad.stderr));
    let completion = w.ok(&["completion", "bash"]);
    assert!(completion.contains("berth"), "a completion script");
}

/// `examples/demo` is the demo world `scripts/run` seeds: applied to it, nothing differs;
/// and `examples/train.sbatch` submits as it is.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_shipped_examples_are_the_demo_world_and_submit_as_they_are(db: PgPool) {
    let w = World::start_with(&db, &[("BERTH_DEMO", "true"), ("BERTH_DEMO_INTERVAL_SECONDS", "3600")]);
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let demo = examples.join("demo").display().to_string();
    w.wait_for("the demo world is seeded", &["get", "teams"], |t| t["items"].as_array().is_some_and(|i| i.len() == 4));
    let diff = w.berth(&["diff", "-f", &demo]);
    assert_eq!(diff.status.code(), Some(0), "{}{}", text(&diff.stdout), text(&diff.stderr));
    let script = examples.join("train.sbatch").display().to_string();
    let dry = w.json(&["submit", "--dry-run", &script]);
    assert_eq!(dry["metadata"]["team"], "nlp");
    assert_eq!(dry["spec"]["tasks"]["count"], 2);
    assert_eq!(dry["spec"]["tasks"]["resources"]["gpus"], 4.0);
    assert_eq!(dry["spec"]["tasks"]["resources"]["cpus"], 16.0);
    assert!(
        w.json(&["get", "workloads", "--team", "nlp"])["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|x| x["metadata"]["name"] != dry["metadata"]["name"])
    );
}

/// A stand-in identity provider for the device-code flow: discovery, the device
/// endpoint, a token endpoint that says "pending" once and then issues an RS256 token for
/// `carol`, and its JWKS.
async fn identity_provider() -> String {
    use axum::routing::{get, post};
    use jsonwebtoken::jwk::{Jwk, JwkSet};
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    const KEY: &[u8] = include_bytes!("../../../api/tests/http/keys/a.pem");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (b1, b2) = (base.clone(), base.clone());
    let app = axum::Router::new()
        .route(
            "/.well-known/openid-configuration",
            get(move || {
                let b = b1.clone();
                async move {
                    axum::Json(serde_json::json!({"issuer": b, "jwks_uri": format!("{b}/jwks"),
                        "device_authorization_endpoint": format!("{b}/device"), "token_endpoint": format!("{b}/token")}))
                }
            }),
        )
        .route(
            "/device",
            post(|| async {
                axum::Json(serde_json::json!({"device_code": "dc-1", "user_code": "WDJB-MJHT",
                    "verification_uri": "https://idp.example/activate", "expires_in": 60, "interval": 1}))
            }),
        )
        .route(
            "/token",
            post(move |body: String| {
                let (polls, b) = (polls.clone(), b2.clone());
                async move {
                    assert!(body.contains("device_code=dc-1") && body.contains("client_id=berth-cli"), "{body}");
                    if polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                        return (axum::http::StatusCode::BAD_REQUEST, axum::Json(serde_json::json!({"error": "authorization_pending"})));
                    }
                    let now = chrono::Utc::now().timestamp();
                    let claims = |aud: &str| serde_json::json!({"iss": b, "sub": "carol", "aud": aud, "iat": now, "exp": now + 600});
                    let header = Header { kid: Some("a".into()), ..Header::new(Algorithm::RS256) };
                    let sign = |c: serde_json::Value| jsonwebtoken::encode(&header, &c, &EncodingKey::from_rsa_pem(KEY).unwrap()).unwrap();
                    // The ID token is for the CLI's client; the access token for Berth.
                    (axum::http::StatusCode::OK, axum::Json(serde_json::json!({"token_type": "Bearer",
                        "id_token": sign(claims("berth-cli")), "access_token": sign(claims("berth"))})))
                }
            }),
        )
        .route(
            "/jwks",
            get(|| async {
                let mut jwk = Jwk::from_encoding_key(&EncodingKey::from_rsa_pem(KEY).unwrap(), Algorithm::RS256).unwrap();
                jwk.common.key_id = Some("a".into());
                axum::Json(JwkSet { keys: vec![jwk] })
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// `berth login` against a server whose users sign in with the organisation's identity
/// provider: the device-code flow, the token Berth accepts stored, and a role binding
/// applied from a file giving the user a team.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_user_logs_in_through_the_identity_providers_device_flow(db: PgPool) {
    let idp = identity_provider().await;
    let w = World::start_with(&db, &[("BERTH_OIDC_ISSUER", idp.as_str()), ("BERTH_OIDC_CLI_CLIENT_ID", "berth-cli")]);
    w.write("org.yaml", ORG);
    w.write("carol.yaml", "kind: RoleBinding\nspec: {subject: carol, role: member, team: nlp}\n");
    let org = w.dir.display().to_string();
    w.ok(&["apply", "-f", &org]);
    assert_eq!(
        w.json(&["apply", "-f", &org])["counts"],
        serde_json::json!({"unchanged": 5}),
        "the binding is not made twice"
    );
    let config = w.dir.join("config.toml");
    let server = w.url.clone();
    let login = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["login", "--server", &server])
            .env("BERTH_CONFIG", &config)
            .env_remove("BERTH_TOKEN")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let said = text(&login.stderr);
    assert!(login.status.success(), "{said}");
    assert!(said.contains("open https://idp.example/activate and enter the code WDJB-MJHT"), "{said}");
    assert!(said.contains("as carol"), "{said}");
    let me = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(["get", "teams", "-o", "json"])
        .env("BERTH_CONFIG", w.dir.join("config.toml"))
        .env_remove("BERTH_TOKEN")
        .env_remove("BERTH_SERVER")
        .output()
        .unwrap();
    let teams: Value = serde_json::from_slice(&me.stdout).unwrap_or_else(|_| panic!("{}", text(&me.stderr)));
    let names: Vec<&str> =
        teams["items"].as_array().unwrap().iter().map(|t| t["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["nlp"], "carol, a member of nlp, sees nlp only");
}

/// A site that registers a client for the dashboard only (`BERTH_OIDC_WEB_CLIENT_ID`, no CLI
/// client): `berth login` does not start a device flow it has no client for, and signs in
/// with a pasted token instead.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn login_takes_a_pasted_token_when_only_the_dashboard_has_a_client(db: PgPool) {
    let w = World::start_with(
        &db,
        &[("BERTH_OIDC_ISSUER", "https://idp.example"), ("BERTH_OIDC_WEB_CLIENT_ID", "berth-dashboard")],
    );
    let token = w.admin.clone();
    let config = w.dir.join("config.toml");
    let server = w.url.clone();
    let login = tokio::task::spawn_blocking(move || {
        let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(["login", "--server", &server])
            .env("BERTH_CONFIG", &config)
            .env_remove("BERTH_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::io::Write::write_all(child.stdin.as_mut().unwrap(), format!("{token}\n").as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap();
    let said = text(&login.stderr);
    assert!(login.status.success(), "{said}");
    assert!(said.contains("Paste a token") && said.contains("as admin"), "{said}");
    assert!(!said.contains("device"), "{said}");
}
