//! A control plane in a test: a fresh database, simulated clusters on a clock the test
//! moves by hand, and the reconcilers run one pass at a time in a fixed order.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use berth_adapters::sim::Clock;
use berth_adapters::{JobStatus, Registry};
use berth_app::context::OpContext;
use berth_controllers::{
    Config, Context, autoscaler, budgets, cluster_health, deletion, dispatcher, fair_sharing, idle, orphans,
    preemption, scheduler, snapshot, status_sync,
};
use berth_core::workload::{Phase, Workload};
use berth_store::PgPool;
use serde_json::{Value, json};

pub struct Plane {
    pub ctx: Context,
    clock: Arc<AtomicI64>,
    pub actor: OpContext,
}

impl Plane {
    pub async fn new(db: PgPool) -> Self {
        let clock = Arc::new(AtomicI64::new(chrono::Utc::now().timestamp_millis()));
        let backends = Arc::new(Registry::with_sim_clock(None, Clock::Manual(clock.clone())));
        let config = Config { unreachable_after_failures: 2, unknown_timeout: Duration::ZERO, ..Config::default() };
        let plane = Self {
            ctx: Context {
                db,
                backends,
                config,
                epoch: None,
                clock: Default::default(),
                world: Default::default(),
                dispatch: Default::default(),
                followed: Default::default(),
                job_api: Some(berth_controllers::JobApiConfig { url: "http://berth.test".into(), issuer: issuer() }),
            },
            clock,
            actor: OpContext::system("test"),
        };
        plane.flavor("h100").await;
        plane
    }

    /// The simulated clusters' clock, which moves only by [`Plane::advance`] (the
    /// controllers' runs on from the wall clock as well).
    pub fn sim_now(&self) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp_millis(self.clock.load(Ordering::SeqCst)).unwrap()
    }

    /// Moves the simulated clusters' clock, and the controllers', forward.
    pub fn advance(&self, seconds: i64) {
        self.clock.fetch_add(seconds * 1000, Ordering::SeqCst);
        self.ctx.clock.advance(Duration::from_secs(seconds.unsigned_abs()));
    }

    pub async fn flavor(&self, name: &str) {
        let input = serde_json::from_value(json!({"spec": {"description": name}})).unwrap();
        berth_app::flavor::flavor_apply(&self.ctx.db, &self.actor, name, &input, None).await.unwrap();
    }

    /// A team with a guarantee (and optional limit) of h100.
    pub async fn team(&self, name: &str, parent: Option<&str>, guaranteed: u32, limit: Option<u32>) {
        let mut quota = json!({"flavor": "h100", "guaranteed": guaranteed});
        if let Some(l) = limit {
            quota["limit"] = json!(l);
        }
        let input = serde_json::from_value(json!({"spec": {"parent": parent, "quotas": [quota]}})).unwrap();
        berth_app::team::team_apply(&self.ctx.db, &self.actor, name, &input, None).await.unwrap();
    }

    /// A sim cluster of `nodes` × 8 h100 GPUs, with extra `spec.sim` fields.
    pub async fn cluster(&self, name: &str, nodes: u32, sim: Value) {
        let mut spec = json!({"node_groups": [{"name": "n", "count": nodes, "flavor": "h100", "gpus_per_node": 8}]});
        spec.as_object_mut().unwrap().extend(sim.as_object().cloned().unwrap_or_default());
        self.apply_cluster(name, json!({"spec": {"kind": "sim", "sim": spec}})).await;
    }

    pub async fn apply_cluster(&self, name: &str, body: Value) {
        let input = serde_json::from_value(body).unwrap();
        berth_app::cluster::cluster_apply(&self.ctx.db, &self.actor, name, &input, None).await.unwrap();
    }

    /// Submits a workload of `count` tasks × `gpus` h100, with extra spec fields.
    pub async fn submit(&self, team: &str, name: &str, count: u32, gpus: f64, extra: Value) -> Workload {
        let mut spec = json!({
            "kind": "training",
            "tasks": {"count": count, "resources": {"flavors": ["h100"], "gpus": gpus}},
            "sim": {"duration_seconds": 600},
        });
        spec.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
        let input = serde_json::from_value(json!({"spec": spec})).unwrap();
        berth_app::workload::workload_apply(&self.ctx.db, &self.actor, team, name, &input, None).await.unwrap().0
    }

    pub async fn workload(&self, team: &str, name: &str) -> Workload {
        berth_app::workload::workload_get(&self.ctx.db, &self.actor, team, name).await.unwrap()
    }

    pub async fn phase(&self, team: &str, name: &str) -> Phase {
        self.workload(team, name).await.status.phase
    }

    /// One pass of every controller, in the order work flows. Before the scheduler's, the
    /// world it keeps (brought up to date from the change feed) is checked against a full
    /// read.
    pub async fn step(&self) {
        let c = &self.ctx;
        cluster_health::reconcile(c).await.unwrap();
        budgets::reconcile(c).await.unwrap();
        fair_sharing::reconcile(c).await.unwrap();
        autoscaler::reconcile(c).await.unwrap();
        self.assert_kept_world_is_current().await;
        scheduler::reconcile(c).await.unwrap();
        dispatcher::reconcile(c).await.unwrap();
        self.assert_followed_is_current().await;
        status_sync::reconcile(c).await.unwrap();
        preemption::reconcile(c).await.unwrap();
        idle::reconcile(c).await.unwrap();
        deletion::reconcile(c).await.unwrap();
        orphans::reconcile(c).await.unwrap();
    }

    /// What status sync keeps of the work on backends (brought up to date from the change
    /// feed) is what a full read finds.
    pub async fn assert_followed_is_current(&self) {
        let db = &self.ctx.db;
        let mut kept: Vec<_> = self.ctx.followed.load(db).await.unwrap().values().cloned().collect();
        let mut full = berth_store::workload::workload_list_backend_work(db, &status_sync::FOLLOWED).await.unwrap();
        kept.sort_by_key(|w| w.uid);
        full.sort_by_key(|w| w.uid);
        assert_eq!(kept, full, "status sync follows what a full read finds");
    }

    /// The world the scheduler keeps equals a full read of the store, and gives the same
    /// plan.
    pub async fn assert_kept_world_is_current(&self) {
        let (kept, _) = self.ctx.world.load(&self.ctx.db, self.ctx.clock.now()).await.unwrap();
        let full = berth_controllers::world::read_full(&self.ctx.db, self.ctx.clock.now()).await.unwrap();
        assert_eq!(kept.workloads, full.workloads, "the kept workloads are those a full read finds");
        assert_eq!(kept.nodes, full.nodes, "the kept nodes are those a full read finds");
        // The kept world's build reuses what the scheduler's last one derived, and gives it
        // back for the scheduler's next to reuse.
        let (kept_built, full_built) = (snapshot::build(&kept, 3600), snapshot::build(&full, 3600));
        let zero = |s: &berth_sched::Snapshot| berth_sched::Snapshot { now: 0, ..s.clone() };
        let (kept_snapshot, full_snapshot) = (zero(&kept_built.snapshot), zero(&full_built.snapshot));
        assert_eq!(kept_snapshot, full_snapshot, "the kept world builds the snapshot a full read does");
        let plan = |s: &berth_sched::Snapshot| berth_sched::schedule(s).unwrap();
        assert_eq!(plan(&kept_snapshot), plan(&full_snapshot), "the kept world plans as a full read does");
        snapshot::give_back(&kept, kept_built);
    }

    /// Steps until nothing changes (at most 10 passes).
    pub async fn settle(&self) {
        for _ in 0..10 {
            let before = self.fingerprint().await;
            self.step().await;
            if self.fingerprint().await == before {
                return;
            }
        }
        panic!("the controllers did not settle in 10 passes");
    }

    /// Every row the controllers write, to compare states.
    pub async fn fingerprint(&self) -> Vec<String> {
        let q = "SELECT 'w ' || uid || ' ' || resource_version FROM workloads
                 UNION ALL SELECT 't ' || uid || ' ' || status::text FROM teams
                 UNION ALL SELECT 'c ' || uid || ' ' || (status - 'last_sync')::text FROM clusters
                 UNION ALL SELECT 'n ' || cluster_uid || name || gpus || schedulable FROM cluster_nodes
                 UNION ALL SELECT 'e ' || count(*) FROM events ORDER BY 1";
        sqlx::query_scalar(q).fetch_all(&self.ctx.db).await.unwrap()
    }

    /// The jobs a sim cluster holds, every one it ever accepted.
    pub async fn jobs(&self, cluster: &str) -> Vec<JobStatus> {
        let c = berth_store::cluster::cluster_fetch(&self.ctx.db, cluster).await.unwrap().unwrap();
        self.ctx.backends.sim(c.metadata.uid).map(|s| s.all_jobs()).unwrap_or_default()
    }

    /// The environment the job of the workload's current attempt runs with, on a sim
    /// cluster.
    pub async fn environment(&self, cluster: &str, w: &Workload) -> std::collections::HashMap<String, String> {
        let c = berth_store::cluster::cluster_fetch(&self.ctx.db, cluster).await.unwrap().unwrap();
        let sim = self.ctx.backends.sim(c.metadata.uid).unwrap();
        sim.environment(berth_controllers::job_key(w)).unwrap().into_iter().collect()
    }

    /// The caller a job is when it calls the API with `token`, authenticated as berthd
    /// does it.
    pub async fn caller(&self, token: &str) -> OpContext {
        let verifier = berth_auth::Verifier { berth: Some(issuer()), oidc: None, leeway: Duration::from_secs(5) };
        let verified = verifier.verify(token).await.unwrap();
        let principal = berth_app::identity::principal(&self.ctx.db, token, verified).await.unwrap().unwrap();
        OpContext::for_request(&self.ctx.db, principal, None, "berth").await.unwrap()
    }

    /// The reasons of a workload's events, oldest first.
    pub async fn events(&self, w: &Workload) -> Vec<String> {
        sqlx::query_scalar("SELECT reason FROM events WHERE object_uid = $1 ORDER BY id")
            .bind(w.metadata.uid)
            .fetch_all(&self.ctx.db)
            .await
            .unwrap()
    }
}

/// The issuer of the tokens jobs get here.
pub fn issuer() -> berth_auth::BerthIssuer {
    berth_auth::BerthIssuer::new("berth", "berth", &[7; 32]).unwrap()
}
