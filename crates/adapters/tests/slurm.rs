//! The Slurm adapter against a real Slurm (`scripts/slurm-dev` cluster alpha: slurmctld,
//! two slurmd with fake GPUs, slurmrestd with JWT auth). They fail when the cluster is not
//! running; scripts/test starts it.

mod common;

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

#[tokio::test]
async fn the_inventory_matches_sinfo() {
    let dev = DevCluster::get("alpha");
    let inventory = backend(&dev, &dev.token).inventory().await.unwrap();
    // One line per node: name, GRES, CPUs, memory, state.
    let sinfo = dev.output("sinfo", &["-N", "-h", "-o", "%N %G %c %m %t"]);
    let mut lines: Vec<&str> = sinfo.lines().collect();
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(inventory.nodes.len(), lines.len(), "{sinfo}");
    for line in lines {
        let f: Vec<&str> = line.split_whitespace().collect();
        let node = inventory.nodes.iter().find(|n| n.name == f[0]).unwrap_or_else(|| panic!("no node {}", f[0]));
        let gres_count: u32 = f[1].rsplit(':').next().unwrap().split('(').next().unwrap().parse().unwrap();
        assert_eq!(f[1].split(':').nth(1), Some(dev.gpu_type.as_str()));
        assert_eq!(node.gpus, gres_count, "{line}");
        assert_eq!(node.gpus, dev.gpus_per_node);
        assert_eq!(node.cpus.to_string(), f[2], "{line}");
        assert_eq!(node.memory_mib.to_string(), f[3], "{line}");
        let up = ["idle", "mix", "alloc"].contains(&f[4]);
        assert_eq!(node.schedulable, up, "{line}");
        assert_eq!(node.flavor.as_deref(), Some("h100"));
    }
}

#[tokio::test]
async fn a_job_runs_to_completed_with_its_gpus_and_a_failing_script_reports_its_exit_code() {
    let dev = DevCluster::get("alpha");
    let b = backend(&dev, &dev.token);
    let ok = job(1, 2, &["x"], "#!/bin/bash\nsleep 2\n");
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
    let failed = wait_for(&b, failing.key, "final", |j| j.state.is_final()).await;
    assert_eq!((failed.state, failed.exit_code), (JobState::Failed, Some(3)), "{failed:?}");
    assert!(failed.reason.as_deref().unwrap_or_default().starts_with("FAILED"), "{failed:?}");
    let listed = b.jobs().await.unwrap();
    assert!(listed.iter().any(|j| j.key == ok.key) && listed.iter().any(|j| j.key == failing.key));
}

#[tokio::test]
async fn cancel_sends_sigterm_first_and_cancels_for_good_after_the_grace_period() {
    let dev = DevCluster::get("alpha");
    let b = backend(&dev, &dev.token);
    let marker = std::env::temp_dir().join(format!("berth-sigterm-{}", Uuid::now_v7()));
    let script = format!(
        "#!/bin/bash\ntrap 'echo got SIGTERM > {m}' TERM\necho started > {m}\nwhile true; do sleep 0.2; done\n",
        m = marker.display()
    );
    let j = job(1, 1, &["x"], &script);
    b.submit(&j).await.unwrap();
    wait_for(&b, j.key, "running", |s| s.state == JobState::Running).await;
    let marked = |text: &'static str| {
        let marker = &marker;
        move || async move { (std::fs::read_to_string(marker).unwrap_or_default() == text).then_some(()) }
    };
    eventually("the script starts", Duration::from_secs(30), marked("started\n")).await;
    let grace = Duration::from_secs(3);
    b.cancel(j.key, grace).await.unwrap();
    let signalled = Instant::now();
    eventually("the script sees SIGTERM", Duration::from_secs(30), marked("got SIGTERM\n")).await;
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
    // A cancel of a finished job, or of a key Slurm never saw, does nothing.
    b.cancel(j.key, grace).await.unwrap();
    b.cancel(JobKey { workload: Uuid::now_v7(), attempt: 0 }, grace).await.unwrap();
    std::fs::remove_file(marker).unwrap();
}

#[tokio::test]
async fn a_two_node_gang_runs_on_both_nodes() {
    let dev = DevCluster::get("alpha");
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

#[tokio::test]
async fn refusals_and_outages_are_told_apart() {
    let dev = DevCluster::get("alpha");
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

#[tokio::test]
async fn gpus_held_by_jobs_berth_did_not_start_are_reported() {
    let dev = DevCluster::get("alpha");
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
