//! Tests of real berthd processes: crashes at random points (on sim, Slurm and Kubernetes
//! clusters), two replicas on one database, the leader's database connection killed, and
//! a Postgres server of the test's own restarted and stopped. Each fault test prints a
//! `FAULT |` row of the fault table. They need Postgres (DATABASE_URL, as scripts/test sets
//! up, and its server binaries for the restart test).

mod support;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use berth_adapters::slurm::dev::DevCluster;
use berth_k8s_test_server::{Config, FakeNode, TestApiServer};
use berth_store::PgPool;
use serde_json::{Value, json};
use support::{Berthd, Lcg};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn killing_berthd_during_a_burst_loses_and_duplicates_nothing(db: PgPool) {
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-crash-{}", uuid::Uuid::now_v7()));
    let world = support::seed(&db).await;
    let mut berthd = Berthd::start(&url, "crash-0", &dir);
    let submitter = {
        let db = db.clone();
        tokio::spawn(async move {
            let mut rng = Lcg(42);
            for i in 0..500 {
                support::submit(&db, &mut rng, i).await;
                // Paced, so the burst spans the kills below.
                tokio::time::sleep(Duration::from_millis(8)).await;
            }
        })
    };
    let mut rng = Lcg(7);
    for restart in 1..=6 {
        // A random point in the burst: the kill itself is what is under test.
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1200))).await;
        berthd.kill();
        berthd = Berthd::start(&url, &format!("crash-{restart}"), &dir);
    }
    submitter.await.unwrap();
    support::wait_all_final(&db, Duration::from_secs(240)).await;

    let admissions = support::check_history(&db, &world).await;
    let jobs = support::check_jobs(&db, &dir).await;
    let phases: Vec<(String, i64)> =
        sqlx::query_as("SELECT phase, count(*) FROM workloads GROUP BY phase ORDER BY 1").fetch_all(&db).await.unwrap();
    println!("after 6 kills: {phases:?}, {admissions} admissions, {jobs} backend jobs");
    assert_eq!(phases.iter().map(|(_, n)| n).sum::<i64>(), 500, "no workload lost");
    assert!(admissions >= 500 && jobs >= 500);
    // The accounting ledger holds exactly one record per admitted attempt, kills or not.
    let (attempts, recorded): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT (object_uid, (details ->> 'attempt')::int)) FROM events WHERE reason = 'Admitted'),
                (SELECT count(*) FROM usage_ledger)",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(recorded, attempts, "one ledger record per admitted attempt");
    support::FaultRow {
        fault: "berthd killed -9 ×6 during a burst",
        acknowledged: 500,
        ..support::FaultRow::default()
    }
    .print();
    berthd.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn killing_berthd_mid_submit_to_slurm_leaves_exactly_one_slurm_job_per_attempt(db: PgPool) {
    let dev = DevCluster::get("alpha");
    let dir = std::env::temp_dir().join(format!("berth-slurm-crash-{}", uuid::Uuid::now_v7()));
    let a = support::actor();
    let flavor = serde_json::from_value(json!({"spec": {}})).unwrap();
    berth_app::flavor::flavor_apply(&db, &a, "h100", &flavor, None).await.unwrap();
    let team = serde_json::from_value(json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 16}]}})).unwrap();
    berth_app::team::team_apply(&db, &a, "nlp", &team, None).await.unwrap();
    let cluster_body = dev.apply_body("h100", "BERTH_CREDENTIAL_TEST_SLURM");
    let cluster = serde_json::from_value(cluster_body.clone()).unwrap();
    berth_app::cluster::cluster_apply(&db, &a, "alpha", &cluster, None).await.unwrap();
    let env = [("BERTH_CREDENTIAL_TEST_SLURM", dev.token.as_str())];
    let spec = json!({"spec": {"kind": "batch", "run": {"command": ["true"]},
        "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 0}}}});
    const WORKLOADS: usize = 300;
    let adopted = support::kill_during_burst(&db, "slurm-crash", &dir, &env, WORKLOADS, &spec, 11).await;

    // Every Slurm job Berth made for this database's workloads, by key.
    let spec: berth_core::cluster::ClusterSpec = serde_json::from_value(cluster_body["spec"].clone()).unwrap();
    let slurm = berth_adapters::slurm::SlurmCluster::new(&spec, dev.token.clone()).unwrap();
    use berth_adapters::ClusterBackend;
    let jobs = slurm.jobs().await.unwrap();
    let workloads: Vec<(uuid::Uuid, String, i64)> =
        sqlx::query_as("SELECT uid, phase, coalesce((status ->> 'attempt')::bigint, 0) FROM workloads")
            .fetch_all(&db)
            .await
            .unwrap();
    let mut per_key: std::collections::HashMap<(uuid::Uuid, u32), usize> = std::collections::HashMap::new();
    for j in jobs.iter().filter(|j| workloads.iter().any(|(uid, ..)| *uid == j.key.workload)) {
        *per_key.entry((j.key.workload, j.key.attempt)).or_default() += 1;
    }
    assert_eq!(workloads.len(), WORKLOADS, "no workload lost");
    for (uid, phase, attempt) in &workloads {
        assert_eq!(phase, "Succeeded", "{uid}");
        assert_eq!(per_key.get(&(*uid, *attempt as u32)), Some(&1), "{uid} attempt {attempt} has one Slurm job");
    }
    assert!(per_key.values().all(|n| *n == 1), "a (workload, attempt) with several Slurm jobs");
    println!(
        "after 5 kills: {WORKLOADS} workloads succeeded, {} Slurm jobs, {adopted} adopted after a crash",
        per_key.len()
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn killing_berthd_mid_submit_to_kubernetes_leaves_exactly_one_job_per_attempt(db: PgPool) {
    let nodes = (0..4).map(|i| FakeNode::gpu(&format!("node-{i}"), 8, "H100")).collect();
    let config = Config { nodes, default_run_seconds: 0.2, ..Config::default() };
    let server = TestApiServer::start(config).await.expect("the test API server starts");
    let dir = std::env::temp_dir().join(format!("berth-kube-crash-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let a = support::actor();
    let flavor = serde_json::from_value(json!({"spec": {}})).unwrap();
    berth_app::flavor::flavor_apply(&db, &a, "h100", &flavor, None).await.unwrap();
    let team = serde_json::from_value(json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 32}]}})).unwrap();
    berth_app::team::team_apply(&db, &a, "nlp", &team, None).await.unwrap();
    let cluster = serde_json::from_value(json!({"spec": {
        "kind": "kubernetes", "endpoint": server.url(), "credentials_ref": "BERTH_CREDENTIAL_TEST_KUBE",
        "kubernetes": {"flavors": [{"flavor": "h100", "product": "H100"}]},
    }}))
    .unwrap();
    berth_app::cluster::cluster_apply(&db, &a, "kube", &cluster, None).await.unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    let env = [("BERTH_CREDENTIAL_TEST_KUBE_FILE", kubeconfig.as_str())];
    let spec = json!({"spec": {"kind": "batch", "run": {"command": ["true"], "image": "busybox"},
        "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}}}});
    const WORKLOADS: usize = 200;
    let adopted = support::kill_during_burst(&db, "kube-crash", &dir, &env, WORKLOADS, &spec, 13).await;

    // Every Job on the cluster, by the workload and attempt its name carries.
    let mut per_key: HashMap<(uuid::Uuid, u32), usize> = HashMap::new();
    for job in server.objects("jobs") {
        let key = berth_adapters::JobKey::parse(job["metadata"]["name"].as_str().unwrap()).expect("only Berth's Jobs");
        *per_key.entry((key.workload, key.attempt)).or_default() += 1;
    }
    let workloads: Vec<(uuid::Uuid, String, i64, Option<String>)> = sqlx::query_as(
        "SELECT uid, phase, coalesce((status ->> 'attempt')::bigint, 0), status ->> 'message' FROM workloads",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(workloads.len(), WORKLOADS, "no workload lost");
    for (uid, phase, attempt, message) in &workloads {
        assert_eq!(phase, "Succeeded", "{uid}: {message:?}");
        assert_eq!(per_key.get(&(*uid, *attempt as u32)), Some(&1), "{uid} attempt {attempt} has one Job");
    }
    assert_eq!(per_key.len(), WORKLOADS, "no Job for an attempt that did not run: {per_key:?}");
    let applies = server.requests("PATCH", "jobs", false);
    println!(
        "after 5 kills: {WORKLOADS} workloads succeeded, {} Jobs, {applies} applies of a Job, {adopted} adopted after a crash",
        per_key.len()
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn one_of_two_replicas_leads_and_the_other_takes_over_when_it_dies(db: PgPool) {
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-replicas-{}", uuid::Uuid::now_v7()));
    let world = support::seed(&db).await;
    let first = Berthd::start(&url, "replica-1", &dir);
    let leader = wait_for_leader(&first, Duration::from_secs(30)).await;
    assert_eq!(leader, "replica-1");
    let second = Berthd::start(&url, "replica-2", &dir);
    let mut rng = Lcg(3);
    for i in 0..150 {
        support::submit(&db, &mut rng, i).await;
    }
    // Work flows under the first replica before the second's view is checked.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let started: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads WHERE phase IN ('Running', 'Succeeded')")
            .fetch_one(&db)
            .await
            .unwrap();
        let reports = second.controllers().await["controllers"].as_array().map_or(0, Vec::len);
        if started > 0 && reports > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no work started under the first replica");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let overview = second.controllers().await;
    assert_eq!(overview["leader"]["holder"], "replica-1", "the first replica still leads");
    let holders: Vec<&str> =
        overview["controllers"].as_array().unwrap().iter().map(|c| c["holder"].as_str().unwrap()).collect();
    assert!(
        !holders.is_empty() && holders.iter().all(|h| *h == "replica-1"),
        "only the leader runs controllers: {holders:?}"
    );

    let killed = Instant::now();
    first.kill();
    let leader = wait_for_leader_other_than(&second, "replica-1", Duration::from_secs(30)).await;
    println!("replica-2 took over {:.1} s after replica-1 was killed", killed.elapsed().as_secs_f64());
    assert_eq!(leader, "replica-2");
    for i in 150..200 {
        support::submit(&db, &mut rng, i).await;
    }
    support::wait_all_final(&db, Duration::from_secs(240)).await;
    let dispatched_twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT object_uid, details ->> 'attempt' FROM events
         WHERE reason IN ('Dispatched', 'Running') AND details ->> 'from' = 'Admitted'
         GROUP BY 1, 2 HAVING count(*) > 1) twice",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(dispatched_twice, 0, "an attempt left Admitted twice");
    support::check_jobs(&db, &dir).await;
    support::check_history(&db, &world).await;
    let workloads: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads").fetch_one(&db).await.unwrap();
    assert_eq!(workloads, 200, "no workload lost");
    support::FaultRow {
        fault: "leader killed -9, standby takes over",
        acknowledged: 200,
        ..support::FaultRow::default()
    }
    .print();
    second.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Two replicas serve GETs from memory; a write through one is read at once through the
/// other, while readers hammer the same name there (so the reads of the change feed are
/// shared), and so are a delete and a re-create under the same name.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_write_through_one_replica_is_read_at_once_through_the_other(db: PgPool) {
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-reads-{}", uuid::Uuid::now_v7()));
    let replicas = [Berthd::start(&url, "replica-1", &dir), Berthd::start(&url, "replica-2", &dir)];
    let put = |i: usize| {
        json!({"metadata": {"labels": {"n": i.to_string()}},
               "spec": {"kind": "batch", "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}}}})
    };
    let (status, _) = replicas[0].call(reqwest::Method::PUT, "/api/v1/flavors/h100", Some(&json!({"spec": {}}))).await;
    assert_eq!(status, 201);
    let team = json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 8}]}});
    assert_eq!(replicas[1].call(reqwest::Method::PUT, "/api/v1/teams/t", Some(&team)).await.0, 201);
    let path = "/api/v1/teams/t/workloads/w";
    let (status, created) = replicas[0].call(reqwest::Method::PUT, path, Some(&put(0))).await;
    assert_eq!(status, 201, "{created}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer = {
        let (address, token, stop) = (replicas[1].address.clone(), replicas[1].admin_token(), stop.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut reads = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let reply = client.get(format!("http://{address}{path}")).bearer_auth(&token).send().await.unwrap();
                assert!(matches!(reply.status().as_u16(), 200 | 404), "{}", reply.status());
                reads += 1;
            }
            reads
        })
    };
    for i in 1..=40 {
        let (writer, reader) = (&replicas[i % 2], &replicas[(i + 1) % 2]);
        let (status, written) = writer.call(reqwest::Method::PUT, path, Some(&put(i))).await;
        assert_eq!(status, 200, "{written}");
        let (status, read) = reader.call(reqwest::Method::GET, path, None).await;
        assert_eq!(status, 200);
        assert_eq!(read["metadata"]["labels"]["n"], i.to_string(), "write {i} not seen through the other replica");
        // The scheduler (on the leader) may have written the status since: never older.
        let version = |w: &Value| w["metadata"]["resource_version"].as_str().unwrap().parse::<u64>().unwrap();
        assert!(version(&read) >= version(&written), "{read} is older than {written}");
    }
    assert_eq!(replicas[0].call(reqwest::Method::DELETE, path, None).await.0, 202);
    assert_eq!(
        replicas[1].call(reqwest::Method::GET, path, None).await.0,
        404,
        "a Pending workload is removed at once"
    );
    let (status, again) = replicas[1].call(reqwest::Method::PUT, path, Some(&put(99))).await;
    assert_eq!(status, 201);
    assert_ne!(again["metadata"]["uid"], created["metadata"]["uid"]);
    let (_, read) = replicas[0].call(reqwest::Method::GET, path, None).await;
    assert_eq!(read["metadata"]["uid"], again["metadata"]["uid"], "the old workload is not served");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = hammer.await.unwrap();
    println!("{reads} GETs through replica-2 meanwhile");
    assert!(reads > 0);
    for replica in replicas {
        replica.kill();
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// The leader's controllers run on threads of their own, not on the workers that serve
/// HTTP: a long stretch of CPU in a pass (a scheduling cycle over 150,000 pending) held the
/// requests queued on its worker behind it.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_controllers_run_on_threads_of_their_own(db: PgPool) {
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-threads-{}", uuid::Uuid::now_v7()));
    support::seed(&db).await;
    let berthd = Berthd::start(&url, "threads-1", &dir);
    assert_eq!(wait_for_leader(&berthd, Duration::from_secs(30)).await, "threads-1");
    let tasks = std::fs::read_dir(format!("/proc/{}/task", berthd.pid())).unwrap();
    let names: Vec<String> =
        tasks.map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).unwrap().trim().to_owned()).collect();
    // The thread that runs the runtime and its workers ("berth-controllers", cut to 15).
    let controllers = names.iter().filter(|n| n.as_str() == "berth-controlle").count();
    assert!(controllers >= 2, "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("tokio-")), "the API's workers: {names:?}");
    berthd.kill();
    let _ = std::fs::remove_dir_all(dir);
}

async fn wait_for_leader(b: &Berthd, timeout: std::time::Duration) -> String {
    wait_for_leader_other_than(b, "", timeout).await
}

/// Polls until a leader other than `not` renews its lease.
async fn wait_for_leader_other_than(b: &Berthd, not: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let o = b.controllers().await;
        if let Some(holder) = o["leader"]["holder"].as_str()
            && holder != not
        {
            return holder.to_owned();
        }
        assert!(Instant::now() < deadline, "no new leader within {timeout:?}: {o}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The scheduler's promises, tried through the HTTP API as a new site would set it up: a
/// department whose limit equals its guarantee, two children of 4 each, a simulated
/// cluster and a Kubernetes one. Everything goes through `berthd`'s API and its own
/// controllers (cancel grace 1 s).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn through_the_api_a_department_at_its_limit_reclaims_impossible_work_is_refused_and_fractions_run_where_they_can(
    db: PgPool,
) {
    use reqwest::Method;
    let nodes = vec![FakeNode::gpu("kube-0", 8, "H100")];
    let (server, b, dir) = with_kubernetes(&db, "promises", nodes).await;
    let put = |path: String, body: serde_json::Value| {
        let b = &b;
        async move { b.call(Method::PUT, &path, Some(&body)).await }
    };
    let created = |(status, body): (u16, serde_json::Value)| assert!(status == 201, "{status}: {body}");
    created(put("/api/v1/flavors/h100".into(), json!({"spec": {}})).await);
    for (team, parent, guaranteed, limit) in [
        ("mini", None, 8, Some(8)),
        ("ma", Some("mini"), 4, None),
        ("mb", Some("mini"), 4, None),
        ("infer", None, 1, None),
    ] {
        let quota = json!({"flavor": "h100", "guaranteed": guaranteed, "limit": limit});
        created(put(format!("/api/v1/teams/{team}"), json!({"spec": {"parent": parent, "quotas": [quota]}})).await);
    }
    let sim = json!({"spec": {"kind": "sim", "sim": {"time_scale": 1,
        "node_groups": [{"name": "n", "count": 2, "flavor": "h100", "gpus_per_node": 8}]}}});
    created(put("/api/v1/clusters/sim-a".into(), sim).await);
    let kube = json!({"spec": {"kind": "kubernetes", "endpoint": server.url(),
        "credentials_ref": "BERTH_CREDENTIAL_TEST_KUBE", "kubernetes": {"flavors": [{"flavor": "h100", "product": "H100"}]}}});
    created(put("/api/v1/clusters/kube".into(), kube).await);
    let training = |count: u32, gpus: f64, preemptible: bool| {
        json!({"spec": {"kind": "training", "preemptible": preemptible, "sim": {"duration_seconds": 3600},
            "tasks": {"count": count, "resources": {"flavors": ["h100"], "gpus": gpus}}}})
    };
    // mb borrows the whole department: 8 × 1 GPU, all running.
    for i in 0..8 {
        created(put(format!("/api/v1/teams/mb/workloads/mb{i}"), training(1, 1.0, true)).await);
    }
    for i in 0..8 {
        b.wait_for_phase("mb", &format!("mb{i}"), "Running").await;
    }
    // ma's non-preemptible 6 GPUs could only ever run within its guarantee of 4: refused.
    let (status, problem) = put("/api/v1/teams/ma/workloads/firm".into(), training(1, 6.0, false)).await;
    assert_eq!(status, 422, "{problem}");
    assert_eq!(problem["errors"][0]["field"], "/spec/preemptible", "{problem}");
    // ma's 4 GPUs within its guarantee: the department is at its limit, so mb's borrowed
    // work is reclaimed and ma runs after one cycle and the grace period.
    let asked = Instant::now();
    created(put("/api/v1/teams/ma/workloads/ma1".into(), training(1, 4.0, true)).await);
    b.wait_for_phase("ma", "ma1", "Running").await;
    let took = asked.elapsed();
    let (_, running) = b.call(Method::GET, "/api/v1/teams/mb/workloads?phase=Running", None).await;
    assert_eq!(running["items"].as_array().map(Vec::len), Some(4), "mb keeps its own guarantee: {running}");
    // Half a GPU of inference: Kubernetes would suit the kind, but cannot share a GPU, so
    // it runs on the simulated cluster.
    let half = json!({"spec": {"kind": "inference", "run": {"image": "busybox"}, "sim": {"duration_seconds": 3600},
        "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 0.5}}}});
    created(put("/api/v1/teams/infer/workloads/half".into(), half).await);
    let w = b.wait_for_phase("infer", "half", "Running").await;
    assert_eq!(w["status"]["admission"]["cluster"], "sim-a", "{}", w["status"]);
    println!("ma ran {took:?} after it was submitted (cancel grace 1 s); mb kept 4 running; half a GPU ran on sim-a");

    // /metrics says what the API says.
    let budget = json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 1}],
        "budgets": [{"gpu_hours": 1000, "period": "month", "action": "warn"}]}});
    assert_eq!(put("/api/v1/teams/infer".into(), budget).await.0, 200);
    let infer =
        b.wait_for("/api/v1/teams/infer", "infer's budget status", |t| t["status"]["budgets"][0].is_object()).await;
    let text = b.text("/metrics").await.2;
    // They name teams: without a token that reads everything, only the process's own.
    let anonymous = reqwest::get(format!("http://{}/metrics", b.address)).await.unwrap().text().await.unwrap();
    assert!(anonymous.contains("http_requests_total"), "{anonymous}");
    assert!(!anonymous.contains("berth_") && !anonymous.contains("team=\""), "{anonymous}");
    let used = infer["status"]["budgets"][0]["used_gpu_hours"].as_f64().unwrap();
    let scraped =
        metric(&text, "berth_budget_used_gpu_hours", &[("team", "infer"), ("period", "month"), ("action", "warn")]);
    // The budget pass may have run again between the two reads: half a GPU for a second.
    assert!(scraped.is_some_and(|m| (m - used).abs() < 0.01), "{scraped:?} vs {used}");
    assert_eq!(metric(&text, "berth_budget_gpu_hours", &[("team", "infer")]), Some(1000.0));
    for team in ["mini", "ma", "mb", "infer"] {
        let (_, t) = b.call(Method::GET, &format!("/api/v1/teams/{team}"), None).await;
        let usage = &t["status"]["usage"][0];
        let labels = [("team", team), ("flavor", "h100")];
        assert_eq!(metric(&text, "berth_team_gpus_allocated", &labels), usage["allocated"].as_f64(), "{team}");
        assert_eq!(metric(&text, "berth_team_gpus_borrowed", &labels), usage["borrowed"].as_f64(), "{team}");
        assert_eq!(metric(&text, "berth_team_fair_share_gpus", &labels), usage["fair_share"].as_f64(), "{team}");
        let guaranteed = t["spec"]["quotas"][0]["guaranteed"].as_f64();
        assert_eq!(metric(&text, "berth_team_gpus_guaranteed", &labels), guaranteed, "{team}");
        // Live workloads per phase, as the API lists them (nothing changes now: all run an
        // hour).
        let (_, list) = b.call(Method::GET, &format!("/api/v1/teams/{team}/workloads"), None).await;
        let mut phases = BTreeMap::<String, f64>::new();
        for w in list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| !["Succeeded", "Failed", "Cancelled"].contains(&w["status"]["phase"].as_str().unwrap()))
        {
            *phases.entry(w["status"]["phase"].as_str().unwrap().to_owned()).or_default() += 1.0;
        }
        for (phase, n) in &phases {
            let m = metric(&text, "berth_workloads", &[("team", team), ("phase", phase)]);
            assert_eq!(m, Some(*n), "{team} {phase}");
        }
    }
    assert_eq!(metric(&text, "berth_team_gpus_limit", &[("team", "mini")]), Some(8.0));
    let (_, cluster) = b.call(Method::GET, "/api/v1/clusters/sim-a", None).await;
    let total = cluster["status"]["inventory"][0]["gpus_total"].as_f64();
    assert_eq!(metric(&text, "berth_cluster_gpus", &[("cluster", "sim-a"), ("flavor", "h100")]), total);
    assert_eq!(metric(&text, "berth_cluster_healthy", &[("cluster", "sim-a")]), Some(1.0));
    // Admissions, preemptions by cause and the admission wait, as the events tell them.
    let mut preempted = 0.0;
    for i in 0..8 {
        let (_, events) = b.call(Method::GET, &format!("/api/v1/teams/mb/workloads/mb{i}/events"), None).await;
        preempted += events["items"].as_array().unwrap().iter().filter(|e| e["reason"] == "Preempted").count() as f64;
    }
    assert!(preempted >= 4.0);
    let preemptions = [("team", "mb"), ("flavor", "h100"), ("cause", "reclaim")];
    assert_eq!(metric(&text, "berth_preemptions_total", &preemptions), Some(preempted));
    assert_eq!(metric(&text, "berth_admissions_total", &[("team", "ma"), ("flavor", "h100")]), Some(1.0));
    assert_eq!(metric(&text, "berth_admission_wait_seconds_count", &[("team", "ma")]), Some(1.0));
    let waited = metric(&text, "berth_admission_wait_seconds_sum", &[("team", "ma")]).unwrap();
    assert!(waited > 0.0 && waited <= took.as_secs_f64(), "ma waited {waited} s by the metric, {took:?} by the clock");
    assert!(
        metric(&text, "berth_controller_pass_seconds_count", &[("controller", "scheduler")]).is_some_and(|n| n > 0.0)
    );
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

/// Kills the leader's database connection 10 times while 400 workloads flow through
/// `replicas` berthds sharing one database and one set of simulated clusters, then checks
/// from the event history and the clusters' journals that no limit or capacity was ever
/// exceeded, that every attempt reached a backend at most once, and that no two attempts
/// of a workload ran at the same time.
async fn connection_kills(db: PgPool, replicas: usize, fault: &'static str) {
    const WORKLOADS: usize = 400;
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-conn-kill-{}", uuid::Uuid::now_v7()));
    let world = support::seed(&db).await;
    let berthds: Vec<Berthd> = (1..=replicas).map(|i| Berthd::start(&url, &format!("conn-{i}"), &dir)).collect();
    wait_for_leader(&berthds[0], Duration::from_secs(30)).await;
    let submitter = {
        let db = db.clone();
        tokio::spawn(async move {
            let mut rng = Lcg(11);
            for i in 0..WORKLOADS {
                support::submit(&db, &mut rng, i).await;
                // Paced, so the work spans the kills below.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let mut rng = Lcg(5);
    for _ in 0..10 {
        // A random point in the flow (the kill itself is what is under test), once there
        // is a leader again.
        tokio::time::sleep(Duration::from_millis(300 + rng.below(600))).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !support::kill_leader_connection(&db).await {
            assert!(Instant::now() < deadline, "no leader 30 s after the last kill");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    submitter.await.unwrap();
    support::wait_all_final(&db, Duration::from_secs(300)).await;

    support::check_history(&db, &world).await;
    let jobs = support::check_jobs(&db, &dir).await;
    let workloads: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads").fetch_one(&db).await.unwrap();
    assert_eq!(workloads, WORKLOADS as i64, "no workload lost");
    let preempted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE reason = 'Preempted'").fetch_one(&db).await.unwrap();
    // Seen from outside: each hand-over took the lease with a new epoch.
    let leaders = wait_for_leader(&berthds[0], Duration::from_secs(30)).await;
    let epoch = berthds[0].controllers().await["leader"]["epoch"].as_i64().expect("the lease's epoch");
    assert!(epoch > 5, "the lease changed hands: epoch {epoch}, leader {leaders}");
    println!(
        "{replicas} replica(s): 10 leader connections killed, lease epoch {epoch} (held by {leaders}), {jobs} backend jobs, {preempted} preemptions"
    );
    support::FaultRow { fault, acknowledged: WORKLOADS, ..support::FaultRow::default() }.print();
    drop(berthds);
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn killing_the_leaders_database_connection_with_two_replicas_breaks_no_promise(db: PgPool) {
    connection_kills(db, 2, "leader's database connection killed ×10, two replicas").await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn killing_the_leaders_database_connection_with_one_replica_breaks_no_promise(db: PgPool) {
    connection_kills(db, 1, "leader's database connection killed ×10, one replica").await;
}

/// A PUT of a workload as a platform admin, retried while the answer is 503: the statuses
/// seen, whether every 503 carried Retry-After, and whether it was acknowledged at last.
async fn put_until_acknowledged(
    client: &reqwest::Client,
    b: &str,
    token: &str,
    name: &str,
    body: &Value,
) -> Vec<(u16, bool)> {
    let mut seen = Vec::new();
    loop {
        let reply = client
            .put(format!("http://{b}/api/v1/teams/a/workloads/{name}"))
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .expect("berthd answers during the outage");
        let status = reply.status().as_u16();
        let retry_after =
            reply.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        seen.push((status, retry_after.is_some()));
        if status != 503 {
            return seen;
        }
        // As the server asks.
        tokio::time::sleep(Duration::from_secs(retry_after.unwrap_or(1))).await;
    }
}

/// Waits (a minute at most) until the clients have had `n` workloads acknowledged.
async fn wait_for_acknowledged(acknowledged: &std::sync::atomic::AtomicUsize, n: usize, when: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while acknowledged.load(std::sync::atomic::Ordering::Relaxed) < n {
        assert!(Instant::now() < deadline, "fewer than {n} workloads acknowledged {when}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_postgres_restart_and_a_10_s_stop_under_load_cost_only_503s() {
    let pg = support::PgServer::start();
    let db = berth_store::connect(&pg.url, 4).await.unwrap();
    berth_store::migrate(&db).await.unwrap();
    let world = support::seed(&db).await;
    let dir = std::env::temp_dir().join(format!("berth-pg-outage-{}", uuid::Uuid::now_v7()));
    let berthd = Berthd::start(&pg.url, "pg-outage", &dir);
    let address = berthd.address.clone();
    let token = berthd.admin_token();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (address, token, stop, acked) = (address.clone(), token.clone(), stop.clone(), acked.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::new();
                let body = json!({"spec": {"kind": "training", "resumable": true,
                    "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 2}},
                    "sim": {"duration_seconds": 60}}});
                let mut seen = Vec::new();
                let mut acknowledged = Vec::new();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("c{c}-{i}");
                    let statuses = put_until_acknowledged(&client, &address, &token, &name, &body).await;
                    if statuses.last().is_some_and(|(s, _)| (200..300).contains(s)) {
                        acknowledged.push(name);
                        acked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    seen.extend(statuses);
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (seen, acknowledged)
            })
        })
        .collect();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
    let ready = |client: reqwest::Client, address: String| async move {
        let started = Instant::now();
        let status = client.get(format!("http://{address}/readyz")).send().await.map(|r| r.status().as_u16());
        (status.unwrap_or(0), started.elapsed())
    };

    // Load first, then a restart: every session is terminated, the server is back at once.
    wait_for_acknowledged(&acked, 20, "before the restart").await;
    pg.down();
    pg.up();
    let before = acked.load(std::sync::atomic::Ordering::Relaxed);
    wait_for_acknowledged(&acked, before + 20, "after the restart").await;
    // A 10 s stop: readiness says so within a second, every time it is asked.
    pg.down();
    let stopped = Instant::now();
    let mut slowest = Duration::ZERO;
    while stopped.elapsed() < Duration::from_secs(10) {
        let (status, took) = ready(client.clone(), address.clone()).await;
        assert_eq!(status, 503, "readyz during the outage");
        assert!(took < Duration::from_secs(1), "readyz took {took:?} during the outage");
        slowest = slowest.max(took);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pg.up();
    let deadline = Instant::now() + Duration::from_secs(30);
    while ready(client.clone(), address.clone()).await.0 != 200 {
        assert!(Instant::now() < deadline, "not ready again 30 s after Postgres came back");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let recovered = stopped.elapsed() - Duration::from_secs(10);
    let before = acked.load(std::sync::atomic::Ordering::Relaxed);
    wait_for_acknowledged(&acked, before + 20, "after Postgres came back").await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut seen = Vec::new();
    let mut acknowledged = Vec::new();
    for c in clients {
        let (s, a) = c.await.unwrap();
        seen.extend(s);
        acknowledged.extend(a);
    }
    let unavailable = seen.iter().filter(|(s, _)| *s == 503).count();
    let server_errors = seen.iter().filter(|(s, _)| *s >= 500 && *s != 503).count();
    let unexpected: Vec<&(u16, bool)> = seen.iter().filter(|(s, _)| !matches!(s, 200 | 201 | 503)).collect();
    assert!(unexpected.is_empty(), "clients saw {unexpected:?}");
    assert!(seen.iter().all(|(s, retry_after)| *s != 503 || *retry_after), "a 503 without Retry-After");
    assert!(unavailable > 0, "the outage was seen by the clients");

    support::wait_all_final(&db, Duration::from_secs(240)).await;
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM workloads").fetch_all(&db).await.unwrap();
    let lost = acknowledged.iter().filter(|n| !names.contains(n)).count();
    assert_eq!(lost, 0, "acknowledged workloads are all there");
    support::check_history(&db, &world).await;
    let jobs = support::check_jobs(&db, &dir).await;
    println!(
        "{} PUTs, {} acknowledged, {unavailable} answered 503; readyz at most {slowest:?} during the stop; ready again {recovered:?} after Postgres; {jobs} backend jobs",
        seen.len(),
        acknowledged.len()
    );
    support::FaultRow {
        fault: "Postgres restart, then stopped for 10 s",
        acknowledged: acknowledged.len(),
        lost,
        server_errors,
        unavailable,
        ..support::FaultRow::default()
    }
    .print();
    drop(berthd);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Postgres high availability as a site runs it: a primary with a synchronous streaming
/// standby, and `DATABASE_URL` listing both (the standby first, so berthd must pass over a
/// read-only host to start). Two berthds take PUTs from four clients; the primary is
/// stopped and the standby promoted. Every acknowledged write must be on the new primary,
/// the controllers must lead again from it, no attempt may reach a cluster twice, and the
/// clients may see nothing but successes and 503s with Retry-After.
#[tokio::test]
async fn a_primary_failover_under_load_loses_no_acknowledged_write_and_dispatches_nothing_twice() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
    let primary = support::PgServer::start_with("-c synchronous_standby_names=standby -c synchronous_commit=on");
    let standby = support::PgServer::standby_of(&primary, "standby");
    let url = format!(
        "postgres://berth@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        standby.port, primary.port
    );
    // The test's own pool follows the primary as berthd's do.
    let db = berth_store::connect(&url, 4).await.unwrap();
    berth_store::migrate(&db).await.unwrap();
    let world = support::seed(&db).await;
    let dir = std::env::temp_dir().join(format!("berth-failover-{}", uuid::Uuid::now_v7()));
    let berthds = [Berthd::start(&url, "failover-1", &dir), Berthd::start(&url, "failover-2", &dir)];
    wait_for_leader(&berthds[0], Duration::from_secs(30)).await;
    let epoch = berthds[0].controllers().await["leader"]["epoch"].as_i64().expect("the lease's epoch");
    let token = berthds[0].admin_token();
    let (stop, acked) = (std::sync::Arc::new(AtomicBool::new(false)), std::sync::Arc::new(AtomicUsize::new(0)));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let address = berthds[c % 2].address.clone();
            let (token, stop, acked) = (token.clone(), stop.clone(), acked.clone());
            tokio::spawn(async move {
                let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
                let body = json!({"spec": {"kind": "training", "resumable": true,
                    "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 2}},
                    "sim": {"duration_seconds": 60}}});
                // (when answered, status, Retry-After present) per request; names acknowledged.
                let (mut seen, mut acknowledged) = (Vec::new(), Vec::new());
                let mut i = 0;
                while !stop.load(Relaxed) {
                    let name = format!("c{c}-{i}");
                    loop {
                        let reply = client
                            .put(format!("http://{address}/api/v1/teams/a/workloads/{name}"))
                            .bearer_auth(&token)
                            .json(&body)
                            .send()
                            .await
                            .expect("berthd answers during the failover");
                        let status = reply.status().as_u16();
                        seen.push((Instant::now(), status, reply.headers().contains_key("retry-after")));
                        if status != 503 {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    if matches!(seen.last(), Some((_, 200 | 201, _))) {
                        acknowledged.push(name);
                        acked.fetch_add(1, Relaxed);
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (seen, acknowledged)
            })
        })
        .collect();

    wait_for_acknowledged(&acked, 40, "before the failover").await;
    // From the moment the primary is told to stop (its sessions end at once; pg_ctl returns
    // once it has shut down).
    let failed = Instant::now();
    primary.down();
    let stopped = failed.elapsed();
    standby.promote();
    let promoted = failed.elapsed();
    let before = acked.load(Relaxed);
    wait_for_acknowledged(&acked, before + 40, "after the failover").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let led = loop {
        let o = berthds[0].controllers().await;
        if o["leader"]["epoch"].as_i64().is_some_and(|e| e > epoch) {
            break failed.elapsed();
        }
        assert!(Instant::now() < deadline, "no leader on the new primary a minute after the failover: {o}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    stop.store(true, Relaxed);
    let (mut seen, mut acknowledged) = (Vec::new(), Vec::new());
    for c in clients {
        let (s, a) = c.await.unwrap();
        seen.extend(s);
        acknowledged.extend(a);
    }
    let unexpected: Vec<u16> = seen.iter().map(|(_, s, _)| *s).filter(|s| !matches!(s, 200 | 201 | 503)).collect();
    assert!(unexpected.is_empty(), "clients saw {unexpected:?}");
    assert!(seen.iter().all(|(_, s, retry_after)| *s != 503 || *retry_after), "a 503 without Retry-After");
    // The outage as the clients saw it: from the last success before the primary stopped
    // to the first one after, and how many requests failed in between.
    let last_before = seen.iter().filter(|(t, s, _)| *t < failed && *s != 503).map(|(t, ..)| *t).max().unwrap();
    let first_after = seen.iter().filter(|(t, s, _)| *t > failed && *s != 503).map(|(t, ..)| *t).min().unwrap();
    let unavailable = seen.iter().filter(|(_, s, _)| *s == 503).count();

    support::wait_all_final(&db, Duration::from_secs(240)).await;
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM workloads").fetch_all(&db).await.unwrap();
    let lost = acknowledged.iter().filter(|n| !names.contains(n)).count();
    assert_eq!(lost, 0, "every acknowledged workload is on the new primary");
    support::check_history(&db, &world).await;
    let jobs = support::check_jobs(&db, &dir).await;
    for b in &berthds {
        assert_eq!(b.primary_moves.load(Relaxed), 1, "each berthd followed the primary once (its log)");
    }
    println!(
        "failover: the primary stopped in {stopped:?} and the standby was promoted {promoted:?} after the stop began; clients went {:?} without a success \
         (first success {:?} after the stop, {unavailable} answers 503); controllers led again {led:?} after the stop; \
         {} PUTs, {} acknowledged, {lost} lost; {jobs} backend jobs",
        first_after - last_before,
        first_after - failed,
        seen.len(),
        acknowledged.len()
    );
    support::FaultRow {
        fault: "Postgres primary stopped, synchronous standby promoted",
        acknowledged: acknowledged.len(),
        lost,
        unavailable,
        ..support::FaultRow::default()
    }
    .print();
    drop(berthds);
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_cluster_outage_under_load_breaks_no_promise(db: PgPool) {
    // Cluster west stops answering while 300 workloads flow: its pending work moves
    // to east, its running work is Unknown until it answers again, and work being preempted
    // there stays Preempting (its GPUs held) and ends as the preemption would.
    const WORKLOADS: usize = 300;
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-outage-{}", uuid::Uuid::now_v7()));
    let world = support::seed(&db).await;
    let berthd = Berthd::start(&url, "outage", &dir);
    let submitter = {
        let db = db.clone();
        tokio::spawn(async move {
            let mut rng = Lcg(23);
            for i in 0..WORKLOADS {
                support::submit(&db, &mut rng, i).await;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let west = |unreachable: bool| {
        json!({"spec": {"kind": "sim", "sim": {"time_scale": 1000, "job_failure_probability": 0.05, "seed": 7,
            "unreachable": unreachable,
            "node_groups": [{"name": "n", "count": 2, "flavor": "h100", "gpus_per_node": 8}]}}})
    };
    let apply = |body: Value| {
        let db = db.clone();
        async move {
            let input = serde_json::from_value(body).unwrap();
            berth_app::cluster::cluster_apply(&db, &support::actor(), "west", &input, None).await.unwrap();
        }
    };
    // West goes down once work runs there, and comes back once that work went Unknown
    // (the cluster was seen unreachable and its running work is in doubt).
    let until = |what: &'static str, sql: &'static str| {
        let db = db.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while sqlx::query_scalar::<_, i64>(sql).fetch_one(&db).await.unwrap() == 0 {
                assert!(Instant::now() < deadline, "no {what} within a minute");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    until(
        "work running on west",
        "SELECT count(*) FROM workloads WHERE phase = 'Running' AND status -> 'admission' ->> 'cluster' = 'west'",
    )
    .await;
    apply(west(true)).await;
    let down = Instant::now();
    until("work of west's Unknown", "SELECT count(*) FROM events WHERE reason = 'Unknown'").await;
    apply(west(false)).await;
    let outage = down.elapsed();
    submitter.await.unwrap();
    support::wait_all_final(&db, Duration::from_secs(300)).await;

    support::check_history(&db, &world).await;
    support::check_jobs(&db, &dir).await;
    let workloads: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads").fetch_one(&db).await.unwrap();
    assert_eq!(workloads, WORKLOADS as i64, "no workload lost");
    let outcomes: Vec<(String, i64)> =
        sqlx::query_as("SELECT coalesce(status ->> 'reason', phase), count(*) FROM workloads GROUP BY 1 ORDER BY 1")
            .fetch_all(&db)
            .await
            .unwrap();
    let unknown: i64 =
        sqlx::query_scalar("SELECT count(*) FROM events WHERE reason = 'Unknown'").fetch_one(&db).await.unwrap();
    println!("after a {outage:?} outage of west: {outcomes:?}; {unknown} went Unknown");
    assert!(
        outcomes.iter().all(|(reason, _)| reason != "CancelledOnBackend"),
        "Berth's own cancels read as cancelled outside Berth: {outcomes:?}"
    );
    support::FaultRow {
        fault: "cluster west unreachable until its running work went Unknown",
        acknowledged: WORKLOADS,
        ..support::FaultRow::default()
    }
    .print();
    drop(berthd);
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_new_user_runs_two_gpus_and_half_a_gpu_on_slurm_of_every_release_and_reads_the_output_through_the_api(
    db: PgPool,
) {
    use reqwest::Method;
    // The dev clusters of the three releases: Debian bookworm's 22.05, 24.11 and 26.05.
    let releases = [("s2205", "22.05", "v0.0.38"), ("s2411", "24.11", "v0.0.42"), ("alpha", "26.05", "v0.0.45")];
    let devs: Vec<DevCluster> = releases.iter().map(|(name, ..)| DevCluster::get(name)).collect();
    let secrets: Vec<(String, String)> =
        devs.iter().map(|d| (format!("BERTH_CREDENTIAL_{}", d.name.to_uppercase()), d.token.clone())).collect();
    let env: Vec<(&str, &str)> = secrets.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let dir = std::env::temp_dir().join(format!("berth-releases-{}", uuid::Uuid::now_v7()));
    let b = Berthd::start_with(&support::database_url(&db), "releases", &dir, &env);
    let created = |(status, body): (u16, Value)| assert!(status == 201, "{status}: {body}");

    let mut quotas = Vec::new();
    for (dev, (name, release, api)) in devs.iter().zip(releases) {
        let flavor = format!("slurm-{}", release.replace('.', ""));
        created(b.call(Method::PUT, &format!("/api/v1/flavors/{flavor}"), Some(&json!({"spec": {}}))).await);
        let body = dev.apply_body(&flavor, &format!("BERTH_CREDENTIAL_{}", name.to_uppercase()));
        created(b.call(Method::PUT, &format!("/api/v1/clusters/{name}"), Some(&body)).await);
        quotas.push(json!({"flavor": flavor, "guaranteed": 2}));
        // The cluster's status says which API Berth found.
        let c = b
            .wait_for(&format!("/api/v1/clusters/{name}"), &format!("{name} is healthy"), |c| {
                c["status"]["health"] == "Healthy" && c["status"]["api"].is_string()
            })
            .await;
        let found = c["status"]["api"].as_str().unwrap();
        assert!(found.starts_with(&format!("slurmrestd {api}, Slurm {release}.")), "{name}: {found}");
    }
    created(b.call(Method::PUT, "/api/v1/teams/research", Some(&json!({"spec": {"quotas": quotas}}))).await);

    let script = "#!/bin/bash\necho \"hello from $BERTH_WORKLOAD with GPUs $CUDA_VISIBLE_DEVICES\"\necho done\n";
    for (_, release, _) in releases {
        let flavor = format!("slurm-{}", release.replace('.', ""));
        let name = format!("hello-{}", release.replace('.', ""));
        let workload = json!({"spec": {"kind": "batch", "run": {"script": script},
            "tasks": {"count": 1, "resources": {"flavors": [flavor], "gpus": 2}}}});
        created(b.call(Method::PUT, &format!("/api/v1/teams/research/workloads/{name}"), Some(&workload)).await);
    }
    for (name, release, _) in releases {
        let workload = format!("hello-{}", release.replace('.', ""));
        let done = b.wait_for_phase("research", &workload, "Succeeded").await;
        assert_eq!(done["status"]["backend_ref"]["cluster"], name, "{done}");
        let path = format!("/api/v1/teams/research/workloads/{workload}/logs");
        let (status, content_type, text) = b.text(&path).await;
        assert_eq!(status, 200);
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        assert_eq!(text, format!("hello from {workload} with GPUs 0,1\ndone\n"), "{name}");
        assert_eq!(b.text(&format!("{path}?tail=1")).await.2, "done\n");
    }

    // Half a GPU runs on GPU shards, on every release.
    for (name, release, _) in releases {
        let flavor = format!("slurm-{}", release.replace('.', ""));
        let workload = format!("half-{}", release.replace('.', ""));
        let half = json!({"spec": {"kind": "batch", "run": {"script": "#!/bin/bash\necho shards $SLURM_SHARDS_ON_NODE\n"},
            "tasks": {"count": 1, "resources": {"flavors": [flavor], "gpus": 0.5}}}});
        created(b.call(Method::PUT, &format!("/api/v1/teams/research/workloads/{workload}"), Some(&half)).await);
        let done = b.wait_for_phase("research", &workload, "Succeeded").await;
        assert_eq!(done["status"]["backend_ref"]["cluster"], name, "{done}");
        let logs = b.text(&format!("/api/v1/teams/research/workloads/{workload}/logs")).await;
        assert_eq!(logs.2, "shards 2\n", "{name}: 4 shards per GPU");
    }

    // Followed (`berth logs -f`): what the job prints as it prints it, until it ends (it
    // answered at once with what the file held then).
    let printing = json!({"spec": {"kind": "batch",
        "run": {"script": "#!/bin/bash\necho one\nsleep 3\necho two\nsleep 1\necho done\n"},
        "tasks": {"count": 1, "resources": {"flavors": ["slurm-2605"], "gpus": 1}}}});
    created(b.call(Method::PUT, "/api/v1/teams/research/workloads/printing", Some(&printing)).await);
    b.wait_for_phase("research", "printing", "Running").await;
    let chunks = follow(&b, "/api/v1/teams/research/workloads/printing/logs?follow=true").await;
    let text: String = chunks.iter().map(|(_, c)| c.as_str()).collect();
    assert_eq!(text, "one\ntwo\ndone\n", "{chunks:?}");
    let (first, last) = (chunks[0].0, chunks[chunks.len() - 1].0);
    assert!(last - first >= Duration::from_secs(2), "read over the run, not at its end: {chunks:?}");

    // A cluster pinned to a version its slurmrestd does not serve is unreachable at once,
    // and says what it offers.
    let mut pinned = devs[0].apply_body("slurm-2205", "BERTH_CREDENTIAL_S2205");
    pinned["spec"]["slurm"]["api_version"] = json!("v0.0.45");
    created(b.call(Method::PUT, "/api/v1/clusters/pinned", Some(&pinned)).await);
    let pinned = b
        .wait_for("/api/v1/clusters/pinned", "pinned is unreachable", |c| c["status"]["health"] == "Unreachable")
        .await;
    let message = pinned["status"]["message"].as_str().unwrap();
    assert!(message.contains("it offers v0.0.38") && message.contains("pins v0.0.45"), "{message}");
    assert_eq!(b.call(Method::DELETE, "/api/v1/clusters/pinned", None).await.0, 200);

    // A hostile job swaps its output file for a link to a file of berthd's machine: Berth
    // does not follow it, and says where the output was.
    let sneaky = json!({"spec": {"kind": "batch",
        "run": {"script": "#!/bin/bash\nrm -f slurm-$SLURM_JOB_ID.out\nln -s /etc/hostname slurm-$SLURM_JOB_ID.out\n"},
        "tasks": {"count": 1, "resources": {"flavors": ["slurm-2605"], "gpus": 1}}}});
    created(b.call(Method::PUT, "/api/v1/teams/research/workloads/sneaky", Some(&sneaky)).await);
    b.wait_for_phase("research", "sneaky", "Succeeded").await;
    let (status, problem) = b.call(Method::GET, "/api/v1/teams/research/workloads/sneaky/logs", None).await;
    assert_eq!(status, 409, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("symbolic link") && detail.contains(&devs[2].work_dir), "{detail}");
    b.kill();
    let _ = std::fs::remove_dir_all(dir);
}

/// A test Kubernetes API server with `nodes`, and a berthd (`id`) holding its kubeconfig
/// as the credential `BERTH_CREDENTIAL_TEST_KUBE`; and the berthd's directory.
async fn with_kubernetes(db: &PgPool, id: &str, nodes: Vec<FakeNode>) -> (TestApiServer, Berthd, std::path::PathBuf) {
    let server = TestApiServer::start(Config { nodes, ..Config::default() }).await.expect("the test API server starts");
    let dir = std::env::temp_dir().join(format!("berth-{id}-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let kubeconfig = kubeconfig.display().to_string();
    let env = [("BERTH_CREDENTIAL_TEST_KUBE_FILE", kubeconfig.as_str())];
    let b = Berthd::start_with(&support::database_url(db), id, &dir, &env);
    (server, b, dir)
}

/// berthd deployed as `deploy/kubernetes` deploys it: in a pod running as the manifests'
/// service account, with that account's token mounted where Kubernetes mounts it (here a
/// directory, `BERTH_KUBERNETES_SERVICE_ACCOUNT_DIR`). It registers the cluster it runs in
/// with no credential of its own, and its access ends when the account is deleted.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn berthd_in_a_pod_registers_its_own_cluster_with_its_service_account(db: PgPool) {
    use reqwest::Method;
    let nodes = vec![FakeNode::gpu("kube-0", 8, "H100"), FakeNode::gpu("kube-1", 8, "H100")];
    let config = Config { nodes, token: Some("cluster-admin".into()), ..Config::default() };
    let server = TestApiServer::start(config).await.expect("the test API server starts");
    let manifest =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/base/serviceaccount.yaml");
    let account: Value = serde_norway::from_str(&std::fs::read_to_string(manifest).unwrap()).unwrap();
    let (namespace, name) =
        (account["metadata"]["namespace"].as_str().unwrap(), account["metadata"]["name"].as_str().unwrap());
    let admin = |path: &str, body: Value| {
        let request = reqwest::Client::new().post(format!("{}{path}", server.url())).bearer_auth("cluster-admin");
        let path = path.to_owned();
        async move {
            let reply = request.json(&body).send().await.unwrap();
            assert_eq!(reply.status(), 201, "{path}");
            reply.json::<Value>().await.unwrap()
        }
    };
    admin("/api/v1/namespaces", json!({"metadata": {"name": namespace}})).await;
    admin(&format!("/api/v1/namespaces/{namespace}/serviceaccounts"), account.clone()).await;
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}});
    let issued = admin(&format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"), request).await;
    let dir = std::env::temp_dir().join(format!("berth-in-cluster-{}", uuid::Uuid::now_v7()));
    let mounted = dir.join("serviceaccount");
    std::fs::create_dir_all(&mounted).unwrap();
    std::fs::write(mounted.join("token"), issued["status"]["token"].as_str().unwrap()).unwrap();
    std::fs::write(mounted.join("namespace"), namespace).unwrap();
    let env = [("BERTH_KUBERNETES_SERVICE_ACCOUNT_DIR", mounted.to_str().unwrap())];
    let b = Berthd::start_with(&support::database_url(&db), "in-cluster", &dir, &env);

    let (status, body) = b.call(Method::PUT, "/api/v1/flavors/h100", Some(&json!({"spec": {}}))).await;
    assert_eq!(status, 201, "{body}");
    let cluster = json!({"spec": {"kind": "kubernetes", "endpoint": server.url(),
        "kubernetes": {"flavors": [{"flavor": "h100", "product": "H100"}]}}});
    let (status, body) = b.call(Method::PUT, "/api/v1/clusters/home", Some(&cluster)).await;
    assert_eq!(status, 201, "{body}");
    let home = b.wait_for("/api/v1/clusters/home", "home is healthy", |c| c["status"]["health"] == "Healthy").await;
    let inventory = &home["status"]["inventory"][0];
    assert_eq!((inventory["flavor"].as_str(), inventory["gpus_total"].as_f64()), (Some("h100"), Some(16.0)), "{home}");

    // The account is what grants access: without it the cluster is unreachable.
    let gone = reqwest::Client::new()
        .delete(format!("{}/api/v1/namespaces/{namespace}/serviceaccounts/{name}", server.url()))
        .bearer_auth("cluster-admin")
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 200);
    // Open watches outlive a credential, as on a real server, until they end.
    server.drop_watches();
    let home = b.wait_for("/api/v1/clusters/home", "home is refused", |c| c["status"]["health"] != "Healthy").await;
    let message = home["status"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("401") || message.to_lowercase().contains("unauthorized"), "{home}");
    drop(b);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Reads a followed log to its end: each chunk as it arrived, with when.
async fn follow(b: &Berthd, path: &str) -> Vec<(Instant, String)> {
    let mut reply = reqwest::Client::new()
        .get(format!("http://{}{path}", b.address))
        .bearer_auth(b.admin_token())
        .send()
        .await
        .expect("the log answers");
    assert_eq!(reply.status(), 200, "{path}");
    let mut chunks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(chunk) =
        tokio::time::timeout_at(deadline.into(), reply.chunk()).await.expect("the log ends").unwrap()
    {
        chunks.push((Instant::now(), String::from_utf8(chunk.to_vec()).unwrap()));
    }
    chunks
}

/// A user follows what a simulated and a Kubernetes job print, through the API, as they
/// print it (`?follow=true`), and reads the last lines afterwards.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_user_follows_the_logs_of_a_simulated_and_a_kubernetes_job_as_they_print(db: PgPool) {
    use reqwest::Method;
    let nodes = vec![FakeNode::gpu("kube-0", 8, "H100")];
    let (server, b, dir) = with_kubernetes(&db, "logs", nodes).await;
    let put = |path: &str, body: Value| {
        let (b, path) = (&b, path.to_owned());
        async move {
            let (status, body) = b.call(Method::PUT, &path, Some(&body)).await;
            assert!(status == 201, "{path}: {status}: {body}");
        }
    };
    put("/api/v1/flavors/h100", json!({"spec": {}})).await;
    put("/api/v1/teams/t", json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 8}]}})).await;
    put(
        "/api/v1/clusters/sim",
        json!({"spec": {"kind": "sim", "sim": {"time_scale": 10,
        "node_groups": [{"name": "n", "count": 1, "flavor": "h100", "gpus_per_node": 8}]}}}),
    )
    .await;
    put("/api/v1/clusters/kube", json!({"spec": {"kind": "kubernetes", "endpoint": server.url(),
        "credentials_ref": "BERTH_CREDENTIAL_TEST_KUBE", "kubernetes": {"flavors": [{"flavor": "h100", "product": "H100"}]}}}))
    .await;
    b.wait_for("/api/v1/clusters/kube", "kube is healthy", |c| c["status"]["health"] == "Healthy").await;
    let tasks = json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}});
    let epochs: Vec<String> = (1..=6).map(|i| format!("epoch {i}")).collect();
    let log = epochs.join("\n");
    // 60 simulated seconds at 10× are 6 s; the container runs 6 s too.
    let jobs = [
        (
            "sim-job",
            json!({"spec": {"kind": "training", "tasks": tasks, "placement": {"backend_kinds": ["sim"]},
                "sim": {"duration_seconds": 60}}}),
            vec!["[sim] task 0 of 1 started on n-0 with 1 GPU"],
        ),
        (
            "kube-job",
            json!({"spec": {"kind": "training", "tasks": tasks, "placement": {"backend_kinds": ["kubernetes"]},
                "run": {"image": "busybox", "env": {"FAKE_RUN_SECONDS": "6", "FAKE_LOG": log}}}}),
            epochs.iter().map(String::as_str).collect(),
        ),
    ];
    for (name, body, expected) in jobs {
        let path = format!("/api/v1/teams/t/workloads/{name}");
        put(&path, body).await;
        b.wait_for_phase("t", name, "Running").await;
        let chunks = follow(&b, &format!("{path}/logs?follow=true")).await;
        let text: String = chunks.iter().map(|(_, c)| c.as_str()).collect();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.starts_with(&expected[..1]), "{name}: {text}");
        assert!(expected.iter().all(|l| lines.contains(l)), "{name}: {text}");
        if name == "sim-job" {
            assert_eq!(lines.len(), 11, "start, 9 steps, the end: {text}");
            assert_eq!(lines[10], "[sim] done: exit code 0", "{text}");
        }
        // Followed, not read at the end: the lines came over the run, not in one piece.
        let (first, last) = (chunks[0].0, chunks[chunks.len() - 1].0);
        assert!(last - first >= Duration::from_secs(1), "{name}: all within {:?}: {chunks:?}", last - first);
        b.wait_for_phase("t", name, "Succeeded").await;
        let (status, _, tail) = b.text(&format!("{path}/logs?tail=2")).await;
        assert_eq!(status, 200);
        assert_eq!(tail.lines().collect::<Vec<_>>(), lines[lines.len() - 2..], "{name}");
        let (status, _, problem) = b.text(&format!("{path}/logs?task=1")).await;
        assert!(status == 422 && problem.contains("\"task\""), "{status}: {problem}");
        let (status, _, problem) = b.text(&format!("{path}/logs?attempt=1")).await;
        assert!(status == 422 && problem.contains("\"attempt\""), "{status}: {problem}");
    }
    drop(b);
    let _ = std::fs::remove_dir_all(dir);
}

/// The value of the first sample of `name` in a Prometheus text whose labels include
/// `labels`.
fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, rest) = series.split_once('{').unwrap_or((series, "}"));
        let has = |(k, v): &(&str, &str)| rest.contains(&format!("{k}=\"{v}\""));
        (n == name && labels.iter().all(has)).then(|| value.parse().ok()).flatten()
    })
}

/// `berthd token create` mints only what the server accepts: a subject the server would
/// refuse as malformed (a newline in it, too long) is refused here, naming `--subject`,
/// and nothing is printed; a good one gives a token.
#[test]
fn token_create_refuses_a_subject_the_server_would_refuse() {
    let mint = |subject: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_berthd"))
            .args(["token", "create", "--subject", subject, "--role", "platform-admin", "--ttl", "1h"])
            .env("BERTH_JWT_SECRET", "a-secret-of-at-least-thirty-two-bytes-0123456789")
            .env_remove("BERTH_JWT_SECRET_FILE")
            .output()
            .unwrap()
    };
    for bad in ["ada\nlovelace", &"a".repeat(berth_auth::MAX_SUBJECT_CHARS + 1), " "] {
        let out = mint(bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && out.stdout.is_empty(), "{bad:?}: {out:?}");
        assert!(stderr.contains("--subject"), "{bad:?}: {stderr}");
    }
    let out = mint("ada");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim().split('.').count(), 3, "a JWT");
}
