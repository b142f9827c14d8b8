//! Berth driving real Slurm clusters (`scripts/slurm-dev` alpha: 2 nodes × 8 h100, beta:
//! 2 × 4 a100, gamma: 2 × 2 l40s) and Kubernetes clusters served by the test API server
//! (alone, and beside alpha), with every controller running in-process on a fresh
//! database. They fail when a Slurm cluster is not running; scripts/test starts them.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use berth_adapters::kubernetes::{KEY_LABEL, SERVICE_LABEL};
use berth_core::cluster::ClusterHealth;
use berth_core::usage::{GroupBy, ReportRequest, Visibility};
use berth_core::workload::Phase;
use berth_k8s_test_server::FakeNode;
use serde_json::json;
use support::{Plane, command};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_workload_runs_on_slurm_to_succeeded_and_a_failing_one_reports_its_exit_code(db: berth_store::PgPool) {
    let p = Plane::start(db, &["alpha"]).await;
    p.team("nlp", &[("h100", 16)]).await;
    // The job runs until the test lets it finish, so it is seen running however often
    // Berth looks.
    let go = std::env::temp_dir().join(format!("berth-go-{}", uuid::Uuid::now_v7()));
    let wait_for_go = format!("while [ ! -e {} ]; do sleep 0.2; done", go.display());
    let two_gpus = json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 2}});
    let ok = p.submit("nlp", "ok", json!({"tasks": two_gpus, "run": command(&wait_for_go)})).await;
    let bad = p
        .submit(
            "nlp",
            "bad",
            json!({"tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}},
        "run": {"script": "#!/bin/bash\nexit 3\n"}}),
        )
        .await;

    let running = p.wait("nlp", "ok", "running", |w| w.status.phase == Phase::Running).await;
    let job_id = &running.status.backend_ref.as_ref().unwrap().job_id;
    let squeue = p.dev("alpha").output("squeue", &["-h", "-j", job_id, "-O", "Name:60,State:12,tres-per-task:30"]);
    assert!(squeue.contains(&format!("berth-{}-0", ok.metadata.uid)) && squeue.contains("RUNNING"), "{squeue}");
    assert!(squeue.contains("gpu:h100:2"), "squeue shows the GPUs asked for: {squeue}");

    std::fs::write(&go, "").unwrap();
    let done = p.wait("nlp", "ok", "final", |w| w.status.phase.is_final()).await;
    assert_eq!((done.status.phase, done.status.exit_code), (Phase::Succeeded, Some(0)), "{:?}", done.status);
    assert!(done.status.started_at.is_some() && done.status.finished_at.is_some(), "{:?}", done.status);
    std::fs::remove_file(go).unwrap();
    let failed = p.wait("nlp", "bad", "final", |w| w.status.phase.is_final()).await;
    assert_eq!((failed.status.phase, failed.status.exit_code), (Phase::Failed, Some(3)), "{:?}", failed.status);
    assert_eq!(failed.status.reason.as_deref(), Some("JobFailed"));
    let events = p.events(&bad).await;
    assert_eq!(events[..3], ["Created", "Admitted", "Dispatched"]);
    assert_eq!(events.last().unwrap(), "Failed");
    p.stop().await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn federated_slurm_clusters_each_get_the_work_that_fits_them(db: berth_store::PgPool) {
    let p = Plane::start(db, &["alpha", "beta"]).await;
    p.team("nlp", &[("h100", 16), ("a100", 8)]).await;
    // Only beta has a100; only alpha has nodes with 8 GPUs for a task that needs 8.
    p.submit(
        "nlp",
        "on-a100",
        json!({"tasks": {"count": 1, "resources": {"flavors": ["a100"], "gpus": 4}},
        "run": command("sleep 2")}),
    )
    .await;
    p.submit(
        "nlp",
        "big",
        json!({"tasks": {"count": 1, "resources": {"flavors": ["a100", "h100"], "gpus": 8}},
        "run": command("sleep 2")}),
    )
    .await;
    for (name, cluster) in [("on-a100", "beta"), ("big", "alpha")] {
        let w = p.wait("nlp", name, "dispatched", |w| w.status.backend_ref.is_some()).await;
        assert_eq!(w.status.admission.as_ref().unwrap().cluster, cluster, "{name}");
        let job = &w.status.backend_ref.as_ref().unwrap().job_id;
        let shown = p.dev(cluster).output("scontrol", &["show", "job", job]);
        assert!(shown.contains(&format!("JobName=berth-{}-0", w.metadata.uid)), "{name} runs on {cluster}: {shown}");
    }
    for name in ["on-a100", "big"] {
        let w = p.wait("nlp", name, "final", |w| w.status.phase.is_final()).await;
        assert_eq!(w.status.phase, Phase::Succeeded, "{name}: {:?}", w.status);
    }
    p.stop().await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn reclaimed_slurm_work_sees_sigterm_then_is_cancelled_and_requeued(db: berth_store::PgPool) {
    let p = Plane::start(db, &["alpha"]).await;
    p.team("a", &[("h100", 8)]).await;
    p.team("b", &[("h100", 8)]).await;
    let marker = std::env::temp_dir().join(format!("berth-reclaim-{}", uuid::Uuid::now_v7()));
    let trapping = format!(
        "#!/bin/bash\necho start $BERTH_ATTEMPT ${{BERTH_RESUME:-0}} ${{BERTH_PREVIOUS_ATTEMPT:--}} >> {m}\n\
         trap 'echo $BERTH_ATTEMPT $(date +%s.%N) >> {m}' TERM\nwhile true; do sleep 0.2; done\n",
        m = marker.display()
    );
    let eight = json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 8}});
    p.submit("b", "b1", json!({"tasks": eight, "resumable": true, "run": command("sleep 600")})).await;
    p.wait("b", "b1", "running", |w| w.status.phase == Phase::Running).await;
    let b2 = p.submit("b", "b2", json!({"tasks": eight, "resumable": true, "run": {"script": trapping}})).await;
    let borrowed = p.wait("b", "b2", "running", |w| w.status.phase == Phase::Running).await;
    assert!(borrowed.status.admission.as_ref().unwrap().borrowed);

    // Team a claims its guarantee: b2 (borrowed) is told to stop.
    p.submit("a", "a1", json!({"tasks": eight, "run": command("sleep 2")})).await;
    let requeued = p.wait("b", "b2", "requeued", |w| w.status.attempt == 1).await;
    assert_eq!(requeued.status.reason.as_deref(), Some("Preempted"), "{:?}", requeued.status);
    // The script trapped SIGTERM and kept running; once the grace period was over the job
    // was cancelled for good (Slurm's own SIGTERM, then SIGKILL).
    let signals: Vec<(String, f64)> = std::fs::read_to_string(&marker)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("start "))
        .map(|l| l.split_once(' ').map(|(a, t)| (a.to_owned(), t.parse().unwrap())).unwrap())
        .collect();
    assert!(signals.iter().all(|(attempt, _)| attempt == "0"), "{signals:?}");
    let [(_, first), (_, second), ..] = signals[..] else { panic!("Berth's SIGTERM, then Slurm's: {signals:?}") };
    assert!(second - first >= support::GRACE.as_secs_f64() - 0.5, "the grace period was cut short: {signals:?}");
    println!("SIGTERM from Berth, then the final cancel {:.1} s later", second - first);
    let old_job = &borrowed.status.backend_ref.as_ref().unwrap().job_id;
    let shown = p.dev("alpha").output("scontrol", &["show", "job", old_job]);
    assert!(shown.contains("JobState=CANCELLED"), "{shown}");
    let a1 = p.wait("a", "a1", "final", |w| w.status.phase.is_final()).await;
    assert_eq!(a1.status.phase, Phase::Succeeded);
    assert_eq!(
        p.events(&b2).await[..7],
        ["Created", "Admitted", "Dispatched", "Running", "Preempted", "StopRequested", "Requeued"]
    );
    // Once a1 is done, b2's next attempt runs (borrowed again) and is told to resume.
    p.wait("b", "b2", "running again", |w| w.status.attempt == 1 && w.status.phase == Phase::Running).await;
    let started = |marker: &std::path::Path| -> Vec<String> {
        let text = std::fs::read_to_string(marker).unwrap_or_default();
        text.lines().filter(|l| l.starts_with("start ")).map(str::to_owned).collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while started(&marker).len() < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert_eq!(started(&marker), ["start 0 0 -", "start 1 1 0"], "BERTH_RESUME and BERTH_PREVIOUS_ATTEMPT");
    p.delete_all().await;
    p.stop().await;
    std::fs::remove_file(marker).unwrap();
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn stopping_slurmctld_makes_the_cluster_unreachable_and_restarting_it_recovers_without_duplicates(
    db: berth_store::PgPool,
) {
    let p = Plane::start(db, &["gamma"]).await;
    p.team("nlp", &[("l40s", 4)]).await;
    let one = json!({"count": 1, "resources": {"flavors": ["l40s"], "gpus": 1}});
    let first = p.submit("nlp", "first", json!({"tasks": one, "run": command("sleep 40")})).await;
    p.wait("nlp", "first", "running", |w| w.status.phase == Phase::Running).await;

    let gamma = p.dev("gamma");
    gamma.control("stop-ctld");
    let down = p.wait_cluster("gamma", |c| c.status.health == ClusterHealth::Unreachable).await;
    assert!(down.status.message.is_some(), "{:?}", down.status);
    p.wait("nlp", "first", "unknown", |w| w.status.phase == Phase::Unknown).await;
    let second = p.submit("nlp", "second", json!({"tasks": one, "run": command("sleep 1")})).await;
    // The scheduler looks at it and keeps it waiting: nothing goes to a cluster that is down.
    let waiting = p.wait("nlp", "second", "explained", |w| w.status.pending_reason.is_some()).await;
    assert_eq!(waiting.status.phase, Phase::Pending, "{:?}", waiting.status);

    gamma.control("start-ctld");
    p.wait_cluster("gamma", |c| c.status.health == ClusterHealth::Healthy).await;
    for name in ["first", "second"] {
        let w = p.wait("nlp", name, "succeeded", |w| w.status.phase.is_final()).await;
        assert_eq!((w.status.phase, w.status.attempt), (Phase::Succeeded, 0), "{name}: {:?}", w.status);
    }
    // Exactly one Slurm job per workload: the running one survived, nothing was resubmitted.
    let names = gamma.output("squeue", &["-h", "-t", "all", "-O", "Name:60"]);
    for w in [&first, &second] {
        let key = format!("berth-{}-", w.metadata.uid);
        assert_eq!(names.lines().filter(|l| l.trim().starts_with(&key)).count(), 1, "{key}: {names}");
    }
    p.stop().await;
}

/// GPUs of `flavor` held per cluster by the team's workloads, as Berth records them.
async fn held_per_cluster(db: &berth_store::PgPool, team: &str, flavor: &str) -> BTreeMap<String, f64> {
    sqlx::query_as(
        "SELECT status->'admission'->>'cluster',
                sum((spec->'tasks'->>'count')::float8 * (spec->'tasks'->'resources'->>'gpus')::float8)
         FROM workloads
         WHERE team_name = $1 AND status->'admission'->>'flavor' = $2
           AND status->>'phase' IN ('Admitted', 'Dispatched', 'Running', 'Preempting', 'Unknown')
         GROUP BY 1",
    )
    .bind(team)
    .bind(flavor)
    .fetch_all(db)
    .await
    .unwrap()
    .into_iter()
    .collect()
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn slurm_and_kubernetes_run_side_by_side_under_one_quota(db: berth_store::PgPool) {
    let kube_nodes = vec![
        FakeNode::gpu("k8s-h100-0", 8, "H100"),
        FakeNode::gpu("k8s-h100-1", 8, "H100"),
        FakeNode::gpu("k8s-l4-0", 4, "L4"),
    ];
    let p = Plane::start_with_kubernetes(db, &["alpha"], Some(kube_nodes)).await;
    // At most 20 h100 for nlp, wherever they are: alpha has 16 and kube 16.
    let limit = 20.0;
    p.team_quotas(
        "nlp",
        vec![json!({"flavor": "h100", "guaranteed": 16, "limit": 20}), json!({"flavor": "l4", "guaranteed": 4})],
    )
    .await;
    // Watches what the team holds on both clusters for the whole test: the highest total,
    // and whether it ever held h100 on both at once.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn({
        let (db, stop) = (p.ctx.db.clone(), stop.clone());
        async move {
            let (mut peak, mut both) = (0.0_f64, false);
            while !stop.load(Ordering::Relaxed) {
                let held = held_per_cluster(&db, "nlp", "h100").await;
                peak = peak.max(held.values().sum());
                both |= held.get("alpha").is_some_and(|g| *g > 0.0) && held.get("kube").is_some_and(|g| *g > 0.0);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (peak, both)
        }
    });
    let image = "ghcr.io/acme/train:1";
    let h100 = |gpus: u32| json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": gpus}});
    let run = |seconds: u32| json!({"command": ["bash", "-c", format!("sleep {seconds}")], "image": image, "env": {"FAKE_RUN_SECONDS": seconds.to_string()}});
    // Inference goes to Kubernetes.
    p.submit(
        "nlp",
        "serve",
        json!({"kind": "inference", "tasks": h100(2), "inference": {"min_replicas": 1, "max_replicas": 1}, "run": run(0)}),
    )
    .await;
    let serve = p.wait("nlp", "serve", "running", |w| w.status.phase == Phase::Running).await;
    assert_eq!(serve.status.admission.as_ref().unwrap().cluster, "kube");
    // Training goes to Slurm, where policy sends it when a node fits it as well as on
    // Kubernetes (8 GPUs: a whole node on either).
    for name in ["t1", "t2"] {
        p.submit("nlp", name, json!({"kind": "training", "tasks": h100(8), "run": run(8)})).await;
    }
    for name in ["t1", "t2"] {
        let w = p.wait("nlp", name, "running", |w| w.status.phase == Phase::Running).await;
        assert_eq!(w.status.admission.as_ref().unwrap().cluster, "alpha", "{name}");
    }
    // Training on a flavor only Kubernetes has goes there.
    let l4 = json!({"count": 1, "resources": {"flavors": ["l4"], "gpus": 2}});
    p.submit("nlp", "on-l4", json!({"kind": "training", "tasks": l4, "run": run(1)})).await;
    // 8 + 8 on alpha and 2 on kube: another 4 would pass the limit of 20 though kube has
    // room for it, so it waits.
    p.submit("nlp", "t3", json!({"kind": "training", "tasks": h100(4), "run": run(1)})).await;
    let waiting = p.wait("nlp", "t3", "explained", |w| w.status.pending_reason.is_some()).await;
    assert_eq!(waiting.status.phase, Phase::Pending, "{:?}", waiting.status);
    // What the clusters themselves run at that moment: 16 h100 on alpha, 2 on kube.
    let kube = p.kube.as_ref().unwrap();
    let kube_h100: u64 = kube
        .objects("pods")
        .iter()
        .filter(|pod| {
            pod["status"]["phase"] == "Running"
                && pod["spec"]["nodeName"].as_str().unwrap_or("").starts_with("k8s-h100")
        })
        .map(|pod| {
            pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    let squeue = p.dev("alpha").output("squeue", &["-h", "-t", "running", "-O", "tres-per-task:30"]);
    let alpha_h100 = squeue.lines().filter(|l| l.contains("gpu:h100:8")).count() as u64 * 8;
    assert_eq!((alpha_h100, kube_h100), (16, 2), "{squeue}");

    for name in ["t1", "t2", "on-l4", "t3"] {
        let w = p.wait("nlp", name, "final", |w| w.status.phase.is_final()).await;
        assert_eq!(w.status.phase, Phase::Succeeded, "{name}: {:?}", w.status);
    }
    assert_eq!(p.workload("nlp", "on-l4").await.status.admission.unwrap().cluster, "kube");
    stop.store(true, Ordering::Relaxed);
    let (peak, both) = sampler.await.unwrap();
    assert!(both, "the team held h100 on both clusters at once");
    assert!(peak <= limit, "the team held {peak} h100 across both clusters, above its limit of {limit}");
    println!("nlp held at most {peak} of its {limit} h100 across alpha and kube");
    // One report over both backends: the team's GPU-hours on each, as their ledger records
    // (and the inference workload still running) add up.
    let now = chrono::Utc::now();
    let from = now - chrono::TimeDelta::hours(1);
    let intervals = berth_store::ledger::ledger_intervals(&p.ctx.db, from, now, now, None).await.unwrap();
    let req = ReportRequest { from, to: now, group_by: vec![GroupBy::Team, GroupBy::Backend], bucket: None };
    let report = berth_core::usage::report(&req, &intervals, &[], &Default::default(), &Visibility::All, now);
    let by: BTreeMap<&str, f64> = report.rows.iter().map(|r| (r.backend.as_deref().unwrap(), r.gpu_hours)).collect();
    assert!(report.rows.iter().all(|r| r.team.as_deref() == Some("nlp")), "{report:?}");
    assert_eq!(by.keys().copied().collect::<Vec<_>>(), ["kubernetes", "slurm"], "{report:?}");
    // t1 and t2 ran 8 GPUs for 8 s each on alpha.
    assert!(by["slurm"] >= 2.0 * 8.0 * 8.0 / 3600.0, "{by:?}");
    let expected: f64 = intervals.iter().map(|i| i.gpu_hours(from, now)).sum();
    assert!((by.values().sum::<f64>() - expected).abs() < 1e-9);
    p.delete_all().await;
    assert!(kube.objects("deployments").is_empty(), "deleting the inference workload removed its Deployment");
    p.stop().await;
}

/// The checkpoint handshake on a real Slurm and on the test Kubernetes API server: a
/// borrowed job with 60 s to checkpoint is reclaimed; its script's trap sees Slurm's
/// SIGTERM (its pod gets the `berth.dev/stop-by` annotation and SIGTERM), and once it
/// acknowledges with the token from its environment it is stopped within seconds, not at
/// the end of its 60.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_job_that_acknowledges_its_checkpoint_on_slurm_or_kubernetes_is_stopped_then(db: berth_store::PgPool) {
    let kube_nodes = vec![FakeNode::gpu("k8s-h100-0", 8, "H100")];
    let p = Plane::start_with_kubernetes(db, &["alpha"], Some(kube_nodes)).await;
    p.max_checkpoint_grace("alpha", 120).await;
    p.max_checkpoint_grace("kube", 120).await;
    p.team("a", &[("h100", 16)]).await;
    p.team("b", &[("h100", 8)]).await;
    let marker = std::env::temp_dir().join(format!("berth-checkpoint-{}", uuid::Uuid::now_v7()));
    let token_file = marker.with_extension("token");
    let trapping = format!(
        "#!/bin/bash\nprintf %s \"$BERTH_JOB_TOKEN\" > {t}\ntrap 'echo TERM $(date +%s.%N) >> {m}' TERM\n\
         while true; do sleep 0.2; done\n",
        m = marker.display(),
        t = token_file.display()
    );
    let eight = json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 8}});
    let checkpoint = json!({"grace_seconds": 60});
    let (slurm_only, kube_only) = (json!({"backend_kinds": ["slurm"]}), json!({"backend_kinds": ["kubernetes"]}));
    // b fills alpha (16) and the kube node (8): 8 guaranteed, 16 borrowed.
    let b1 = json!({"tasks": eight, "resumable": true, "placement": slurm_only, "run": command("sleep 600")});
    p.submit("b", "b1", b1).await;
    p.wait("b", "b1", "running", |w| w.status.phase == Phase::Running).await;
    let on_slurm = json!({"tasks": eight, "resumable": true, "checkpoint": checkpoint, "placement": slurm_only,
                          "run": {"script": trapping}});
    p.submit("b", "slurm", on_slurm).await;
    let slurm = p.wait("b", "slurm", "running", |w| w.status.phase == Phase::Running).await;
    assert_eq!(slurm.status.admission.as_ref().unwrap().cluster, "alpha");
    let env = json!({"FAKE_RUN_SECONDS": "3600", "FAKE_SIGTERM_SECONDS": "3600"});
    let on_kube = json!({"tasks": eight, "resumable": true, "checkpoint": checkpoint, "placement": kube_only,
                         "run": {"command": ["python", "train.py"], "image": "ghcr.io/acme/train:1", "env": env}});
    p.submit("b", "kube", on_kube).await;
    let kube = p.wait("b", "kube", "running", |w| w.status.phase == Phase::Running).await;
    assert_eq!(kube.status.admission.as_ref().unwrap().cluster, "kube");
    let token = support::eventually("the Slurm job wrote its token", || async {
        std::fs::read_to_string(&token_file).ok().filter(|t| !t.is_empty())
    })
    .await;
    let server = p.kube.as_ref().unwrap();
    let pod_env = |name: &str| -> Option<String> {
        let pods = server.objects("pods");
        let key = berth_controllers::job_key(&kube).name();
        let pod = pods.iter().find(|pod| pod["metadata"]["labels"][KEY_LABEL] == key.as_str())?;
        let env = pod["spec"]["containers"][0]["env"].as_array()?;
        env.iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str()).map(str::to_owned)
    };
    let kube_token = pod_env("BERTH_JOB_TOKEN").expect("the pod's environment carries its token");
    assert_eq!(
        pod_env("BERTH_CHECKPOINTED_URL").as_deref(),
        Some("http://127.0.0.1:9/api/v1/teams/b/workloads/kube/checkpointed")
    );

    // Team a claims 8 on each cluster: both borrowed jobs are told to stop, with 60 s to
    // checkpoint.
    p.submit("a", "a1", json!({"tasks": eight, "placement": slurm_only, "run": command("sleep 1")})).await;
    let a2_run =
        json!({"command": ["python", "eval.py"], "image": "ghcr.io/acme/eval:1", "env": {"FAKE_RUN_SECONDS": "1"}});
    p.submit("a", "a2", json!({"tasks": eight, "placement": kube_only, "run": a2_run})).await;
    p.wait("b", "slurm", "told to stop", |w| w.status.cancel_requested_at.is_some()).await;
    p.wait("b", "kube", "told to stop", |w| w.status.cancel_requested_at.is_some()).await;
    let trapped = support::eventually("the script's trap saw SIGTERM", || async {
        std::fs::read_to_string(&marker).ok().filter(|m| m.starts_with("TERM "))
    })
    .await;
    println!("the Slurm job's trap: {}", trapped.trim());
    let annotated = server.objects("pods").iter().any(|pod| {
        pod["metadata"]["labels"][KEY_LABEL] == berth_controllers::job_key(&kube).name().as_str()
            && pod["metadata"]["annotations"]["berth.dev/stop-by"].is_string()
    });
    assert!(annotated, "the pod was told when it will be stopped");

    for (name, token) in [("slurm", token.as_str()), ("kube", kube_token.as_str())] {
        let job = p.caller(token).await;
        let acknowledged = std::time::Instant::now();
        berth_app::workload::workload_checkpointed(&p.ctx.db, &job, "b", name).await.unwrap();
        let requeued = p.wait("b", name, "released", |w| w.status.attempt == 1).await;
        let took = acknowledged.elapsed();
        println!("{name}: released {:.1} s after its acknowledgement (grace 60 s)", took.as_secs_f64());
        assert!(took < std::time::Duration::from_secs(30), "{name}: released {took:?} after, not at once");
        let events = p.events(&requeued).await;
        assert_eq!(events[4..8], ["Preempted", "StopRequested", "Checkpointed", "Requeued"], "{name}: {events:?}");
    }
    let old_job = &slurm.status.backend_ref.as_ref().unwrap().job_id;
    let shown = p.dev("alpha").output("scontrol", &["show", "job", old_job]);
    assert!(shown.contains("JobState=CANCELLED"), "{shown}");
    p.delete_all().await;
    p.stop().await;
    std::fs::remove_file(marker).unwrap();
    std::fs::remove_file(token_file).unwrap();
}

/// A notebook on Kubernetes answers at its Service: `status.backend_ref.url` names a
/// Service that selects its running pod, whose container listens on the Service's target
/// port and opens with the token the endpoint call gives its owner. The notebook reports
/// activity with its own token; once cancelled, its Service goes with it.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_notebook_on_kubernetes_answers_at_its_service_and_opens_with_its_token(db: berth_store::PgPool) {
    let p = Plane::start_with_kubernetes(db, &[], Some(vec![FakeNode::gpu("k8s-0", 8, "H100")])).await;
    p.team("nlp", &[("h100", 8)]).await;
    let tasks = json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}});
    let run = json!({"image": "quay.io/jupyter/pytorch-notebook:2025-01-01",
                     "command": ["start-notebook.py", "--port", "8080"]});
    let spec = json!({"kind": "notebook", "tasks": tasks, "run": run, "notebook": {"idle_timeout_seconds": 3600}});
    p.submit("nlp", "nb", spec).await;
    let nb = p.wait("nlp", "nb", "running", |w| w.status.phase == Phase::Running).await;
    let url = nb.status.backend_ref.as_ref().unwrap().url.clone().expect("a notebook has a URL");
    let key = berth_controllers::job_key(&nb).name();
    let kube = p.kube.as_ref().unwrap();
    let services = kube.objects("services");
    let service = services.iter().find(|s| s["metadata"]["name"] == key.as_str()).expect("its Service");
    let namespace = service["metadata"]["namespace"].as_str().unwrap();
    assert_eq!(url, format!("http://{key}.{namespace}.svc"));
    let uid = nb.metadata.uid.to_string();
    assert_eq!(service["spec"]["selector"][SERVICE_LABEL], uid.as_str());
    assert_eq!(service["spec"]["ports"][0]["port"], 80);
    let target = service["spec"]["ports"][0]["targetPort"].clone();
    let pods = kube.objects("pods");
    let pod = pods.iter().find(|pod| pod["metadata"]["labels"][KEY_LABEL] == key.as_str()).expect("its pod");
    assert_eq!(pod["metadata"]["labels"][SERVICE_LABEL], uid.as_str(), "the Service selects it");
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(pod["metadata"]["namespace"], namespace);
    let container = &pod["spec"]["containers"][0];
    assert_eq!(container["ports"][0]["containerPort"], target, "the pod listens where the Service sends");
    let env = |name: &str| -> String {
        let vars = container["env"].as_array().unwrap();
        vars.iter().find(|e| e["name"] == name).and_then(|e| e["value"].as_str()).unwrap_or_default().to_owned()
    };
    let issuer = berth_auth::BerthIssuer::new("berth", "berth", &[7; 32]).unwrap();
    let endpoint =
        berth_app::workload::workload_endpoint(&p.ctx.db, &p.actor, Some(&issuer), "nlp", "nb").await.unwrap();
    assert_eq!(endpoint.url, url);
    assert_eq!(endpoint.token.as_deref(), Some(env("JUPYTER_TOKEN").as_str()), "the token opens this notebook");
    // The notebook says it is used, with the token in its environment.
    let job = p.caller(&env("BERTH_JOB_TOKEN")).await;
    berth_app::workload::workload_activity(&p.ctx.db, &job, "nlp", "nb", chrono::Utc::now()).await.unwrap();
    assert!(p.workload("nlp", "nb").await.status.last_activity_at.is_some());

    berth_app::workload::workload_cancel(&p.ctx.db, &p.actor, "nlp", "nb", None).await.unwrap();
    p.wait("nlp", "nb", "cancelled", |w| w.status.phase == Phase::Cancelled).await;
    support::eventually("its Service to go", || async {
        kube.objects("services").iter().all(|s| s["metadata"]["name"] != key.as_str()).then_some(())
    })
    .await;
    p.stop().await;
}

/// An inference service on the test Kubernetes API server scales with the load its
/// cluster's Prometheus reports: each replica above the first is a Deployment of its own,
/// pinned where Berth placed it, whose pods the service's one Service selects; the team's
/// limit binds the next replica, which waits with the reason; when the load falls the
/// replicas go after the stabilization window. The team holds what runs at every step.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn an_inference_service_on_kubernetes_scales_with_its_prometheus_load(db: berth_store::PgPool) {
    let nodes = vec![FakeNode::gpu("k8s-0", 8, "H100"), FakeNode::gpu("k8s-1", 8, "H100")];
    let p = Plane::start_with_kubernetes(db, &[], Some(nodes)).await;
    let prometheus = support::FakePrometheus::start(5.0);
    p.prometheus("kube", &prometheus.url).await;
    p.team_quotas("nlp", vec![json!({"flavor": "h100", "guaranteed": 3, "limit": 3})]).await;
    let tasks = json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}});
    let run = json!({"image": "vllm/vllm-openai:v0.9.0", "command": ["vllm", "serve", "--port", "8080"]});
    let inference = json!({"min_replicas": 1, "max_replicas": 4, "target_in_flight": 10,
                           "query": "sum(vllm:num_requests_running{service=\"chat\"})",
                           "scale_down_stabilization_seconds": 2});
    let svc =
        p.submit("nlp", "chat", json!({"kind": "inference", "tasks": tasks, "run": run, "inference": inference})).await;
    let uid = svc.metadata.uid.to_string();
    let kube = p.kube.as_ref().unwrap();
    let plane = &p;
    let serving = |want: usize| {
        let uid = uid.clone();
        async move {
            let p = plane;
            let w = p.workload("nlp", "chat").await;
            let r = w.status.replicas.clone().unwrap_or_default();
            let team = berth_app::team::team_get(&p.ctx.db, &p.actor, "nlp").await.unwrap();
            let held = team.status.usage.first().map_or(0.0, |u| u.allocated);
            let pods = kube.objects("pods");
            let running = pods
                .iter()
                .filter(|pod| {
                    pod["metadata"]["labels"][SERVICE_LABEL] == uid.as_str() && pod["status"]["phase"] == "Running"
                })
                .count();
            (r.current as usize == want && running == want && held == want as f64).then_some((r, held))
        }
    };
    support::eventually("one replica for load 5", || serving(1)).await;

    prometheus.set(25.0);
    support::eventually("three replicas for load 25", || serving(3)).await;
    let deployments = kube.objects("deployments");
    assert_eq!(deployments.len(), 3, "the service and two replicas");
    let services = kube.objects("services");
    assert_eq!(services.len(), 1, "one Service for the service");
    assert_eq!(services[0]["spec"]["selector"][SERVICE_LABEL], uid.as_str(), "it selects every replica's pods");
    assert!(prometheus.queries.lock().unwrap().iter().any(|q| q.contains("vllm%3Anum_requests_running")));

    prometheus.set(45.0);
    let (replicas, _) = support::eventually("the limit binds the fourth", || async {
        let w = p.workload("nlp", "chat").await;
        let r = w.status.replicas.clone().unwrap_or_default();
        (r.desired == 4 && r.waiting.as_deref().is_some_and(|why| why.contains("limit"))).then_some((r, ()))
    })
    .await;
    assert_eq!(replicas.current, 3, "{replicas:?}");
    println!("the fourth replica: {}", replicas.waiting.unwrap());

    prometheus.set(5.0);
    let started = std::time::Instant::now();
    support::eventually("back to one replica", || serving(1)).await;
    println!("scaled down to 1 replica {:.1} s after the load fell (window 2 s)", started.elapsed().as_secs_f64());
    support::eventually("the replicas' Deployments gone", || async {
        (kube.objects("deployments").len() == 1).then_some(())
    })
    .await;
    p.delete_all().await;
    p.stop().await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn kubernetes_pods_that_cannot_start_where_berth_placed_them_are_withdrawn_and_requeued(db: berth_store::PgPool) {
    let p = Plane::start_with_kubernetes(db, &[], Some(vec![FakeNode::gpu("k8s-0", 8, "H100")])).await;
    p.team("nlp", &[("h100", 8)]).await;
    // A pod Berth did not start takes 60 of the node's 64 CPUs but no GPU: Berth's
    // scheduler sees 8 free GPUs, Kubernetes' sees too few CPUs for Berth's pod.
    let kube = p.kube.as_ref().unwrap();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu-hog", "namespace": "default"},
        "spec": {"nodeName": "k8s-0", "containers": [{"name": "hog", "image": "busybox",
            "env": [{"name": "FAKE_RUN_SECONDS", "value": "3600"}], "resources": {"requests": {"cpu": "60"}}}]}});
    let created = reqwest::Client::new()
        .post(format!("{}/api/v1/namespaces/default/pods", kube.url()))
        .json(&pod)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let tasks = json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 8, "cpus": 8}});
    let run =
        json!({"command": ["python", "train.py"], "image": "ghcr.io/acme/train:1", "env": {"FAKE_RUN_SECONDS": "1"}});
    p.submit("nlp", "big", json!({"kind": "training", "tasks": tasks, "run": run})).await;
    let requeued = p.wait("nlp", "big", "requeued", |w| w.status.attempt >= 1).await;
    let events = p.events(&requeued).await;
    assert_eq!(events[..4], ["Created", "Admitted", "Dispatched", "Requeued"], "{events:?}");
    let (message,): (String,) =
        sqlx::query_as("SELECT message FROM events WHERE object_uid = $1 AND reason = 'Requeued' ORDER BY id LIMIT 1")
            .bind(requeued.metadata.uid)
            .fetch_one(&p.ctx.db)
            .await
            .unwrap();
    assert!(message.contains("did not start the job as placed") && message.contains("Insufficient cpu"), "{message}");
    // The first attempt's Job is withdrawn (an orphan now) ...
    let first = format!("berth-{}-0", requeued.metadata.uid);
    support::eventually(&format!("Job {first} withdrawn"), || async {
        kube.objects("jobs").iter().all(|j| j["metadata"]["name"] != first.as_str()).then_some(())
    })
    .await;
    // ... and once the node has room the workload runs.
    let deleted = reqwest::Client::new()
        .delete(format!("{}/api/v1/namespaces/default/pods/cpu-hog?gracePeriodSeconds=0", kube.url()))
        .send()
        .await
        .unwrap();
    assert!(deleted.status().is_success());
    let done = p.wait("nlp", "big", "final", |w| w.status.phase.is_final()).await;
    assert_eq!(done.status.phase, Phase::Succeeded, "{:?}", done.status);
    assert!(done.status.attempt >= 1);
    p.stop().await;
}
