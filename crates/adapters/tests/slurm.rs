//! The Slurm adapter's conformance suite, against real Slurm of every release Berth
//! supports (`scripts/slurm-dev` clusters: slurmctld, two slurmd with placeholder GPUs,
//! slurmrestd with JWT auth): s2205 (Debian bookworm's 22.05), s2411 (24.11, a trixie
//! chroot) and alpha (26.05, a forky chroot). Every test runs once per release; they fail
//! when a cluster is not running, and scripts/test starts them.

mod common;

/// Each test below, once per release: `slurm_22_05::name`, `slurm_24_11::name`,
/// `slurm_26_05::name`.
macro_rules! on_every_release {
    ($($test:ident),* $(,)?) => {
        mod slurm_22_05 { $( #[tokio::test] async fn $test() { super::$test("s2205").await } )* }
        mod slurm_24_11 { $( #[tokio::test] async fn $test() { super::$test("s2411").await } )* }
        mod slurm_26_05 { $( #[tokio::test] async fn $test() { super::$test("alpha").await } )* }
    };
}

on_every_release!(
    the_inventory_matches_sinfo_and_the_newest_api_is_found,
    a_job_runs_to_completed_with_its_gpus_and_output_and_a_failing_script_reports_its_exit_code,
    cancel_sends_sigterm_first_and_cancels_for_good_after_the_grace_period,
    a_cancel_with_no_grace_stops_a_job_within_its_grace_period,
    a_two_node_gang_runs_on_both_nodes,
    refusals_and_outages_are_told_apart,
    gpus_held_by_jobs_berth_did_not_start_are_reported,
    jobs_are_listed_by_a_new_backend_and_across_a_slurmctld_restart,
    a_pinned_version_is_spoken_or_the_versions_on_offer_are_named,
    tasks_of_a_fraction_of_a_gpu_run_on_gpu_shards,
    a_job_without_a_runtime_limit_gets_the_longest_its_partition_allows,
);

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth_adapters::slurm::SlurmCluster;
use berth_adapters::slurm::dev::DevCluster;
use berth_adapters::{BackendError, ClusterBackend, JobKey, JobRequest, JobState, JobStatus};
use berth_core::cluster::ClusterSpec;
use berth_core::workload::{Run, WorkloadKind};
use common::eventually;
use uuid::Uuid;

fn backend(dev: &DevCluster, token: &str) -> SlurmCluster {
    let spec: ClusterSpec = serde_json::from_value(dev.apply_body("h100", "T")["spec"].clone()).unwrap();
    SlurmCluster::new(&spec, token.to_owned()).unwrap()
}

fn job(tasks: u32, gpus: u32, nodes: &[&str], script: &str) -> JobRequest {
    JobRequest {
        key: JobKey { workload: Uuid::now_v7(), attempt: 0 },
        team: "nlp".into(),
        workload: "test".into(),
        kind: WorkloadKind::Batch,
        flavor: "h100".into(),
        tasks,
        gpus_per_task: gpus * 100,
        cpus_per_task: None,
        memory_mib_per_task: Some(1024),
        nodes: nodes.iter().map(|n| (*n).to_owned()).collect(),
        run: Run { command: vec![], script: Some(script.into()), image: None, env: BTreeMap::new() },
        max_runtime_seconds: Some(600),
        sim_duration_seconds: None,
        resume: false,
        grace_seconds: 30,
        api: None,
        notebook_token: None,
        service: None,
        sim_load: Vec::new(),
    }
}

/// Polls the job until `done` holds.
async fn wait_for(b: &SlurmCluster, key: JobKey, what: &str, done: impl Fn(&JobStatus) -> bool) -> JobStatus {
    eventually(&format!("job {key} becomes {what}"), Duration::from_secs(90), || async {
        let job = b.job(key).await.unwrap().expect("the job exists");
        done(&job).then_some(job)
    })
    .await
}

async fn the_inventory_matches_sinfo_and_the_newest_api_is_found(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    assert_eq!(b.api_in_use(), None, "nothing asked yet");
    let inventory = b.inventory().await.unwrap();
    let api = b.api_in_use().unwrap();
    assert!(api.starts_with(&format!("slurmrestd {}, Slurm {}.", dev.api, dev.release)), "{api}");
    // One line per node: name, GRES, CPUs, memory, state.
    let sinfo = dev.output("sinfo", &["-N", "-h", "-o", "%N %G %c %m %t"]);
    let mut lines: Vec<&str> = sinfo.lines().collect();
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(inventory.nodes.len(), lines.len(), "{sinfo}");
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        let node = inventory.nodes.iter().find(|n| n.name == f[0]).unwrap_or_else(|| panic!("no node {}", f[0]));
        // gpu:h100:8 (and shard:h100:32 beside it).
        let gpu = f[1].split(',').find(|g| g.starts_with("gpu:")).unwrap();
        let gres_count: u32 = gpu.rsplit(':').next().unwrap().split('(').next().unwrap().parse().unwrap();
        assert_eq!(gpu.split(':').nth(1), Some(dev.gpu_type.as_str()));
        assert_eq!(node.gpus, gres_count, "{line}");
        assert_eq!(node.gpus, dev.gpus_per_node);
        assert_eq!(node.cpus.to_string(), f[2], "{line}");
        assert_eq!(node.memory_mib.to_string(), f[3], "{line}");
        // A node still completing an earlier test's job is up: COMPLETING is a flag.
        let up = ["idle", "mix", "alloc", "comp"].contains(&f[4]);
        assert_eq!(node.schedulable, up, "{line}");
        assert_eq!(node.flavor.as_deref(), Some("h100"));
    }
}

async fn a_job_runs_to_completed_with_its_gpus_and_output_and_a_failing_script_reports_its_exit_code(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    let ok = job(1, 2, &["x"], "#!/bin/bash\necho \"hello from $BERTH_WORKLOAD on $CUDA_VISIBLE_DEVICES\"\nsleep 2\n");
    let failing = job(1, 1, &["x"], "#!/bin/bash\nexit 3\n");
    b.jobs_recent().await.unwrap();
    let submitted = b.submit(&ok).await.unwrap();
    assert_eq!(b.submit(&ok).await.unwrap().job_id, submitted.job_id, "a second submit of the key returns the job");
    // A listing made before the submit may be reused, but never hides the job.
    assert!(b.jobs_recent().await.unwrap().iter().any(|j| j.key == ok.key));
    let running = wait_for(&b, ok.key, "running", |j| j.state == JobState::Running).await;
    assert!(running.started_at.is_some());
    // squeue shows it under its key, with the GPUs asked for.
    let squeue = dev.output("squeue", &["-h", "-j", &submitted.job_id, "-O", "Name:60,State:12,tres-per-task:30"]);
    assert!(squeue.contains(&ok.key.name()) && squeue.contains("RUNNING"), "{squeue}");
    assert!(squeue.contains(&format!("gpu:{}:2", dev.gpu_type)), "{squeue}");

    b.submit(&failing).await.unwrap();
    let done = wait_for(&b, ok.key, "final", |j| j.state.is_final()).await;
    assert_eq!((done.state, done.exit_code), (JobState::Succeeded, Some(0)));
    assert!(done.finished_at.is_some());
    // Its output, where the submit said it would be, in the cluster's working directory.
    let output = done.output.clone().expect("where the output is");
    assert_eq!(Some(&output), submitted.output.as_ref());
    assert_eq!(output, format!("{}/slurm-{}.out", dev.work_dir, submitted.job_id));
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "hello from test on 0,1\n");
    // A resumed attempt (attempt 2 of resumable work) is told so, with the one before; and
    // the workload's own variables reach it, Slurm's names included (an index of an array
    // `berth submit` made: Slurm sets no SLURM_ARRAY_* of its own for a job not an array).
    let mut resumed = job(
        1,
        1,
        &["x"],
        "#!/bin/bash\necho \"$BERTH_ATTEMPT $BERTH_RESUME $BERTH_PREVIOUS_ATTEMPT $SLURM_ARRAY_TASK_ID $SLURM_ARRAY_TASK_COUNT\"\n",
    );
    resumed.key.attempt = 2;
    resumed.resume = true;
    resumed.run.env = [("SLURM_ARRAY_TASK_ID", "7"), ("SLURM_ARRAY_TASK_COUNT", "9")]
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .into();
    b.submit(&resumed).await.unwrap();
    let done = wait_for(&b, resumed.key, "final", |j| j.state.is_final()).await;
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    assert_eq!(std::fs::read_to_string(done.output.expect("where the output is")).unwrap(), "2 1 1 7 9\n");
    let failed = wait_for(&b, failing.key, "final", |j| j.state.is_final()).await;
    assert_eq!((failed.state, failed.exit_code), (JobState::Failed, Some(3)), "{failed:?}");
    assert!(failed.reason.as_deref().unwrap_or_default().starts_with("FAILED"), "{failed:?}");
    let listed = b.jobs().await.unwrap();
    assert!(listed.iter().any(|j| j.key == ok.key) && listed.iter().any(|j| j.key == failing.key));
}

/// Starts a job whose script writes `started` to `marker` once it runs, and traps SIGTERM
/// (writing `got SIGTERM`) and keeps going; returns once the script has started.
async fn start_a_job_that_ignores_sigterm(b: &SlurmCluster, marker: &std::path::Path) -> JobRequest {
    let script = format!(
        "#!/bin/bash\ntrap 'echo got SIGTERM > {m}' TERM\necho started > {m}\nwhile true; do sleep 0.2; done\n",
        m = marker.display()
    );
    let j = job(1, 1, &["x"], &script);
    b.submit(&j).await.unwrap();
    wait_for(b, j.key, "running", |s| s.state == JobState::Running).await;
    marked(marker, "started\n", "the script starts").await;
    j
}

/// Waits until `marker` holds `text`.
async fn marked(marker: &std::path::Path, text: &str, what: &str) {
    eventually(what, Duration::from_secs(30), || async {
        (std::fs::read_to_string(marker).unwrap_or_default() == text).then_some(())
    })
    .await;
}

async fn cancel_sends_sigterm_first_and_cancels_for_good_after_the_grace_period(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    let marker = std::env::temp_dir().join(format!("berth-sigterm-{}", Uuid::now_v7()));
    let j = start_a_job_that_ignores_sigterm(&b, &marker).await;
    let grace = Duration::from_secs(3);
    b.cancel(j.key, grace).await.unwrap();
    let signalled = Instant::now();
    marked(&marker, "got SIGTERM\n", "the script sees SIGTERM").await;
    // The script traps SIGTERM and keeps going: until the grace period is over it runs,
    // however often the cancel is repeated; the first cancel after it ends the job.
    let (done, after) = eventually("the job ends", Duration::from_secs(60), || async {
        b.cancel(j.key, grace).await.unwrap();
        let now = b.job(j.key).await.unwrap().unwrap();
        if !now.state.is_final() {
            assert!(now.state == JobState::Running && now.cancelling, "{now:?}");
            return None;
        }
        Some((now, signalled.elapsed()))
    })
    .await;
    // The deadline is kept in whole seconds, so it may fall up to a second early.
    assert!(after + Duration::from_secs(1) >= grace, "ended {after:?} after SIGTERM, before the grace period");
    assert_eq!(done.state, JobState::Cancelled, "{done:?}");
    assert!(!done.cancelling);
    // Final for Berth only once Slurm is done with it too (not still COMPLETING, with its
    // GPUs held while its processes are killed).
    let shown = dev.output("scontrol", &["show", "job", &done.job_id]);
    assert!(shown.contains("JobState=CANCELLED"), "{shown}");
    // A cancel of a finished job, or of a key Slurm never saw, does nothing.
    b.cancel(j.key, grace).await.unwrap();
    b.cancel(JobKey { workload: Uuid::now_v7(), attempt: 0 }, grace).await.unwrap();
    std::fs::remove_file(marker).unwrap();
}

/// A job that acknowledged its checkpoint: a cancel with no grace stops it now, though
/// the grace period of the cancel before (10 minutes) still runs.
async fn a_cancel_with_no_grace_stops_a_job_within_its_grace_period(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    let marker = std::env::temp_dir().join(format!("berth-stop-now-{}", Uuid::now_v7()));
    let j = start_a_job_that_ignores_sigterm(&b, &marker).await;
    let grace = Duration::from_secs(600);
    b.cancel(j.key, grace).await.unwrap();
    marked(&marker, "got SIGTERM\n", "the script sees SIGTERM").await;
    b.cancel(j.key, grace).await.unwrap();
    assert!(b.job(j.key).await.unwrap().unwrap().cancelling, "a repeated cancel waits out the grace");
    let asked = Instant::now();
    b.cancel(j.key, Duration::ZERO).await.unwrap();
    let done = wait_for(&b, j.key, "cancelled", |s| s.state.is_final()).await;
    // The script ignores SIGTERM: Slurm kills it after its KillWait (5 s on the dev clusters).
    assert!(asked.elapsed() < Duration::from_secs(60), "stopped {:?} after, not at once", asked.elapsed());
    assert_eq!(done.state, JobState::Cancelled, "{done:?}");
    println!("{cluster}: stopped {:.1} s after a cancel with no grace", asked.elapsed().as_secs_f64());
    std::fs::remove_file(marker).unwrap();
}

async fn a_two_node_gang_runs_on_both_nodes(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    let gpus = dev.gpus_per_node;
    let nodes: Vec<&str> = dev.nodes.iter().map(String::as_str).collect();
    let gang = job(2, gpus, &nodes, "#!/bin/bash\nsrun hostname\n");
    let submitted = b.submit(&gang).await.unwrap();
    let done = wait_for(&b, gang.key, "final", |j| j.state.is_final()).await;
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    let shown = dev.output("scontrol", &["show", "job", &submitted.job_id]);
    assert!(shown.contains("NumNodes=2"), "{shown}");
}

async fn refusals_and_outages_are_told_apart(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    // More GPUs per task than a node has: Slurm refuses the job.
    let Err(BackendError::Rejected(why)) =
        b.submit(&job(1, dev.gpus_per_node + 1, &["x"], "#!/bin/bash\ntrue\n")).await
    else {
        panic!("an impossible job must be refused")
    };
    assert!(why.contains("Requested node configuration is not available"), "{why}");
    // A wrong token: slurmrestd answers like an outage, and the token is in no message.
    let forged = "eyJhbGciOiJIUzI1NiJ9.eyJzdW4iOiJyb290In0.forged-signature";
    let Err(BackendError::Unreachable(why)) = backend(&dev, forged).inventory().await else { panic!() };
    assert!(!why.contains(forged) && !why.contains(&dev.token), "{why}");
    // Nobody listening.
    let mut spec: ClusterSpec = serde_json::from_value(dev.apply_body("h100", "T")["spec"].clone()).unwrap();
    spec.endpoint = Some("http://127.0.0.1:9".into());
    let down = SlurmCluster::new(&spec, dev.token.clone()).unwrap();
    assert!(matches!(down.health().await, Err(BackendError::Unreachable(_))));
}

async fn gpus_held_by_jobs_berth_did_not_start_are_reported(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    let name = format!("outside-{}", Uuid::now_v7());
    let gres = format!("--gpus-per-node={}:1", dev.gpu_type);
    let id = dev
        .output(
            "sbatch",
            &[
                "--parsable",
                "-J",
                &name,
                &gres,
                "-w",
                &dev.nodes[1],
                "--uid",
                &dev.user,
                "-D",
                "/tmp",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 60",
            ],
        )
        .trim()
        .to_owned();
    eventually("the outside job's GPU shows", Duration::from_secs(60), || async {
        let inventory = b.inventory().await.unwrap();
        let node = inventory.nodes.into_iter().find(|n| n.name == dev.nodes[1]).unwrap();
        (node.gpus_used_outside_berth >= 100).then(|| assert!(node.gpus_used >= node.gpus_used_outside_berth))
    })
    .await;
    assert!(!b.jobs().await.unwrap().iter().any(|j| j.job_id == id), "only Berth's jobs are listed");
    dev.output("scancel", &[&id]);
}

async fn jobs_are_listed_by_a_new_backend_and_across_a_slurmctld_restart(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let first = backend(&dev, &dev.token);
    let long = job(1, 1, &["x"], "#!/bin/bash\nsleep 300\n");
    let submitted = first.submit(&long).await.unwrap();
    wait_for(&first, long.key, "running", |j| j.state == JobState::Running).await;
    // A new process (berthd restarted) knows nothing of the job, and finds it.
    let second = backend(&dev, &dev.token);
    let listed = second.jobs().await.unwrap();
    let found = listed.iter().find(|j| j.key == long.key).expect("listed by a new backend");
    assert_eq!((found.job_id.as_str(), found.state), (submitted.job_id.as_str(), JobState::Running));
    assert_eq!(second.job(long.key).await.unwrap().unwrap().job_id, submitted.job_id);

    dev.control("stop-ctld");
    let down = second.jobs().await;
    let Err(BackendError::Unreachable(why)) = &down else { panic!("slurmctld is down: {down:?}") };
    assert!(!why.contains(&dev.token), "{why}");
    dev.control("start-ctld");
    // The job survived; a third backend lists it, running, and cancels it.
    let third = backend(&dev, &dev.token);
    let after = eventually("slurmrestd answers again", Duration::from_secs(60), || async {
        third.jobs().await.ok()?.into_iter().find(|j| j.key == long.key)
    })
    .await;
    assert_eq!((after.job_id, after.state), (submitted.job_id, JobState::Running));
    third.cancel(long.key, Duration::ZERO).await.unwrap();
    let done = wait_for(&third, long.key, "final", |j| j.state.is_final()).await;
    assert_eq!(done.state, JobState::Cancelled, "{done:?}");
}

async fn a_pinned_version_is_spoken_or_the_versions_on_offer_are_named(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let pinned = |version: &str| {
        let mut body = dev.apply_body("h100", "T");
        body["spec"]["slurm"]["api_version"] = version.into();
        let spec: ClusterSpec = serde_json::from_value(body["spec"].clone()).unwrap();
        SlurmCluster::new(&spec, dev.token.clone()).unwrap()
    };
    // The oldest version each release still serves works as well as the newest.
    let oldest = match dev.release.as_str() {
        "22.05" => "v0.0.38",
        "24.11" => "v0.0.40",
        _ => "v0.0.42",
    };
    let old = pinned(oldest);
    let j = job(1, 1, &["x"], "#!/bin/bash\nexit 4\n");
    old.submit(&j).await.unwrap();
    let done = wait_for(&old, j.key, "final", |s| s.state.is_final()).await;
    assert_eq!((done.state, done.exit_code), (JobState::Failed, Some(4)), "{done:?}");
    assert!(old.api_in_use().unwrap().starts_with(&format!("slurmrestd {oldest},")));
    // A version the release does not serve: Berth says what it offers.
    let absent = if dev.release == "22.05" { "v0.0.45" } else { "v0.0.38" };
    let Err(BackendError::Unsupported(why)) = pinned(absent).inventory().await else {
        panic!("{absent} is not served")
    };
    assert!(why.contains(&format!("pins {absent}")) && why.contains(&dev.api), "{why}");
}

async fn tasks_of_a_fraction_of_a_gpu_run_on_gpu_shards(cluster: &str) {
    let dev = DevCluster::get(cluster);
    assert_eq!(dev.shards_per_gpu, 4, "the dev clusters have 4 shards per GPU");
    let b = backend(&dev, &dev.token);
    // An earlier test's cancelled job may still hold its GPU while it completes.
    eventually("no GPU is in use before the test", Duration::from_secs(60), || async {
        b.inventory().await.unwrap().nodes.iter().all(|n| n.gpus_used == 0).then_some(())
    })
    .await;
    // Two tasks of a quarter GPU on one node: one shard each. The job holds its shards
    // until the test lets it end.
    let go = std::env::temp_dir().join(format!("berth-go-{}", Uuid::now_v7()));
    let script = format!(
        "#!/bin/bash\nsrun bash -c 'echo $SLURM_SHARDS_ON_NODE'\nwhile [ ! -e {} ]; do sleep 0.2; done\n",
        go.display()
    );
    let mut quarter = job(2, 0, &["x", "x"], &script);
    quarter.gpus_per_task = 25;
    let submitted = b.submit(&quarter).await.unwrap();
    wait_for(&b, quarter.key, "running", |j| j.state == JobState::Running).await;
    let shown = dev.output("scontrol", &["show", "job", &submitted.job_id]);
    assert!(shown.contains("shard"), "{shown}");
    // The inventory counts the two shards as half a GPU in use (on the node Slurm chose).
    let used = eventually("the shards show as used", Duration::from_secs(30), || async {
        let used: u32 = b.inventory().await.unwrap().nodes.iter().map(|n| n.gpus_used).sum();
        (used > 0).then_some(used)
    })
    .await;
    assert_eq!(used, 50);
    std::fs::write(&go, "").unwrap();
    let done = wait_for(&b, quarter.key, "final", |j| j.state.is_final()).await;
    std::fs::remove_file(go).unwrap();
    assert_eq!(done.state, JobState::Succeeded, "{done:?}");
    let output = std::fs::read_to_string(done.output.unwrap()).unwrap();
    assert_eq!(output.lines().collect::<Vec<_>>(), ["2", "2"], "each task sees the node's shards: {output}");
    // 0.3 GPU is not a whole number of shards: refused with the reason.
    let mut odd = job(1, 0, &["x"], "#!/bin/bash\ntrue\n");
    odd.gpus_per_task = 30;
    let Err(BackendError::Rejected(why)) = b.submit(&odd).await else { panic!("0.3 GPU cannot be shards") };
    assert!(why.contains("whole number of shards"), "{why}");
}

/// Work without `max_runtime_seconds` asks for its partition's MaxTime: left out, Slurm
/// gives the partition's DefaultTime (an hour here) and kills it then.
async fn a_job_without_a_runtime_limit_gets_the_longest_its_partition_allows(cluster: &str) {
    let dev = DevCluster::get(cluster);
    let b = backend(&dev, &dev.token);
    let unlimited = JobRequest { max_runtime_seconds: None, ..job(1, 1, &["x"], "#!/bin/bash\nsleep 1\n") };
    let submitted = b.submit(&unlimited).await.unwrap();
    let field = |text: &str, key: &str| {
        text.split_whitespace().find_map(|f| f.strip_prefix(key)).map(str::to_owned).unwrap_or_default()
    };
    let partition = dev.output("scontrol", &["show", "partition", &dev.partition]);
    let (max, default) = (field(&partition, "MaxTime="), field(&partition, "DefaultTime="));
    assert!(!max.is_empty() && max != default, "the dev partitions have both: {partition}");
    let shown = dev.output("scontrol", &["show", "job", &submitted.job_id]);
    assert_eq!(field(&shown, "TimeLimit="), max, "{shown}");
    wait_for(&b, unlimited.key, "final", |j| j.state.is_final()).await;
}
