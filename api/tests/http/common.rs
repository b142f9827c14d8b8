//! The test server and fixture builders.

use std::collections::BTreeMap;

use std::time::Duration;

use berth_auth::{BerthIssuer, Verifier};
use berth_core::auth::{Grant, Role};
use berth_store::PgPool;
use berthd::auth::{Auth, RateLimit};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// The secret signing the test server's own tokens.
pub const SECRET: &[u8] = b"test-only-secret-of-at-least-32-bytes";

/// Berth's own issuer, as the test server is configured.
pub fn issuer() -> BerthIssuer {
    BerthIssuer::new("berth", "berth", SECRET).expect("a long enough secret")
}

/// A token for `subject` carrying `grants`, valid for an hour.
pub fn token(subject: &str, grants: &[(Role, Option<&str>)]) -> String {
    let grants = grants.iter().map(|(role, team)| Grant { role: *role, team: team.map(str::to_owned) }).collect();
    issuer().mint(subject, grants, Duration::from_secs(3600), None).token
}

/// berthd's router served on an ephemeral loopback port. `http` sends a platform admin's
/// token with every request; [`Server::send_as`] sends another (or none).
pub struct Server {
    pub base: String,
    pub http: reqwest::Client,
    pub db: PgPool,
}

impl Server {
    pub async fn start(db: PgPool) -> Self {
        Self::start_with(db, verifier(None), None).await
    }

    pub async fn start_with(db: PgPool, verifier: Verifier, rate_limit: Option<RateLimit>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let app = berthd::app(berthd::state::AppState::new(db.clone(), Auth::new(verifier, rate_limit)));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        let admin = format!("Bearer {}", token("admin", &[(Role::PlatformAdmin, None)]));
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, admin.parse().expect("ascii"));
        let http = reqwest::Client::builder().default_headers(headers).build().expect("client");
        Self { base: format!("http://{addr}"), http, db }
    }

    /// Sends a request bearing `token` (none when `None`) instead of the admin's.
    pub async fn send_as(&self, token: Option<&str>, method: Method, path: &str, body: Option<&Value>) -> Reply {
        let mut req = reqwest::Client::new().request(method, self.url(path));
        if let Some(token) = token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        Reply::from(req.send().await.expect("request")).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> Reply {
        let mut req = self.http.request(method, self.url(path));
        if let Some(body) = body {
            req = req.json(body);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Reply::from(req.send().await.expect("request")).await
    }

    pub async fn put(&self, path: &str, body: &Value) -> Reply {
        self.send(Method::PUT, path, Some(body), &[]).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, None, &[]).await
    }

    pub async fn delete(&self, path: &str) -> Reply {
        self.send(Method::DELETE, path, None, &[]).await
    }

    /// The reasons of the events of the workload at `path`, oldest first.
    pub async fn event_reasons(&self, path: &str) -> Vec<String> {
        let events = self.get(&format!("{path}/events")).await.body;
        events["items"].as_array().unwrap().iter().map(|e| e["reason"].as_str().unwrap().to_owned()).collect()
    }

    /// PUTs and asserts the status.
    pub async fn put_ok(&self, path: &str, body: &Value, status: u16) -> Reply {
        let reply = self.put(path, body).await;
        assert_eq!(reply.status.as_u16(), status, "PUT {path}: {}", reply.body);
        reply
    }

    /// The standard fixture: flavors `h100` and `a100`, a root team `research` guaranteeing
    /// 16 h100, and its child `nlp` guaranteeing 8.
    pub async fn seed(&self) {
        for f in ["h100", "a100"] {
            self.put_ok(&format!("/api/v1/flavors/{f}"), &flavor(f), 201).await;
        }
        self.put_ok("/api/v1/teams/research", &TeamBody::new().quota("h100", 16, None, 1).json(), 201).await;
        self.put_ok("/api/v1/teams/nlp", &TeamBody::new().parent("research").quota("h100", 8, Some(16), 2).json(), 201)
            .await;
    }

    /// Counts rows in every table, to prove a request wrote nothing.
    pub async fn table_counts(&self) -> BTreeMap<&'static str, i64> {
        let mut counts = BTreeMap::new();
        for table in ["flavors", "teams", "clusters", "workloads", "events", "audit_log"] {
            let n: i64 =
                sqlx::query_scalar(&format!("SELECT count(*) FROM {table}")).fetch_one(&self.db).await.expect("count");
            counts.insert(table, n);
        }
        counts
    }
}

/// A response, read whole.
pub struct Reply {
    pub status: StatusCode,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Reply {
    async fn from(r: reqwest::Response) -> Self {
        let status = r.status();
        let headers = r.headers().clone();
        let text = r.text().await.expect("body");
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Self { status, headers, body }
    }

    pub fn etag(&self) -> String {
        self.headers.get("etag").expect("etag header").to_str().expect("ascii").to_owned()
    }

    pub fn content_type(&self) -> &str {
        self.headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("")
    }

    /// Asserts this is a problem+json with `status` whose errors name `field`.
    pub fn assert_problem(&self, status: u16, field: Option<&str>) {
        assert_eq!(self.status.as_u16(), status, "{}", self.body);
        assert_eq!(self.content_type(), "application/problem+json", "{}", self.body);
        assert_eq!(self.body["status"], status, "{}", self.body);
        assert!(self.body["type"].as_str().is_some_and(|t| !t.is_empty()), "{}", self.body);
        assert!(self.body["title"].is_string(), "{}", self.body);
        if let Some(field) = field {
            let fields: Vec<&str> = self.body["errors"]
                .as_array()
                .map(|e| e.iter().filter_map(|e| e["field"].as_str()).collect())
                .unwrap_or_default();
            assert!(fields.contains(&field), "expected an error naming {field}, got {}", self.body);
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.body["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| i["metadata"]["name"].as_str().expect("name").to_owned())
            .collect()
    }
}

pub fn flavor(gres: &str) -> Value {
    json!({"spec": {"slurm": {"gres_type": gres}, "kubernetes": {"node_label_value": format!("NVIDIA-{}", gres.to_uppercase())}}})
}

/// Builds a team body.
#[derive(Default)]
pub struct TeamBody {
    parent: Option<String>,
    quotas: Vec<Value>,
}

impl TeamBody {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn parent(mut self, parent: &str) -> Self {
        self.parent = Some(parent.into());
        self
    }

    pub fn quota(mut self, flavor: &str, guaranteed: u32, limit: Option<u32>, weight: u32) -> Self {
        let mut q = json!({"flavor": flavor, "guaranteed": guaranteed, "weight": weight});
        if let Some(limit) = limit {
            q["limit"] = json!(limit);
        }
        self.quotas.push(q);
        self
    }

    pub fn json(&self) -> Value {
        let mut spec = json!({"quotas": self.quotas});
        if let Some(p) = &self.parent {
            spec["parent"] = json!(p);
        }
        json!({"spec": spec})
    }
}

/// Builds a workload body.
pub struct WorkloadBody {
    spec: Value,
    labels: BTreeMap<String, String>,
}

impl WorkloadBody {
    pub fn new() -> Self {
        Self {
            spec: json!({
                "kind": "training",
                "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1}},
                "sim": {"duration_seconds": 60}
            }),
            labels: BTreeMap::new(),
        }
    }

    pub fn gpus(mut self, gpus: f64) -> Self {
        self.spec["tasks"]["resources"]["gpus"] = json!(gpus);
        self
    }

    pub fn count(mut self, count: u32) -> Self {
        self.spec["tasks"]["count"] = json!(count);
        self
    }

    pub fn kind(mut self, kind: &str) -> Self {
        self.spec["kind"] = json!(kind);
        self
    }

    pub fn flavors(mut self, flavors: &[&str]) -> Self {
        self.spec["tasks"]["resources"]["flavors"] = json!(flavors);
        self
    }

    pub fn preemptible(mut self, preemptible: bool) -> Self {
        self.spec["preemptible"] = json!(preemptible);
        self
    }

    pub fn priority(mut self, priority: i64) -> Self {
        self.spec["priority"] = json!(priority);
        self
    }

    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }

    pub fn json(&self) -> Value {
        json!({"metadata": {"labels": self.labels}, "spec": self.spec})
    }
}

pub fn sim_cluster(flavor: &str) -> Value {
    json!({
        "metadata": {"labels": {"tier": "on-demand", "region": "eu"}},
        "spec": {"kind": "sim", "sim": {"node_groups": [
            {"name": "g1", "count": 2, "flavor": flavor, "gpus_per_node": 8, "topology_block": "nvl-a"}
        ]}}
    })
}

/// The declarative contract every resource keeps: create, idempotent re-PUT, generation
/// only on spec change, ETag/If-Match (412), If-None-Match: * (create only), stale body
/// version (409), GET, delete. `v1` and `v2` differ in spec; `delete_status` is 200 (or
/// 202 for workloads).
pub async fn check_declarative_contract(s: &Server, path: &str, v1: &Value, v2: &Value, delete_status: u16) {
    let created = s.send(Method::PUT, path, Some(v1), &[("if-none-match", "*")]).await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.body["metadata"]["generation"], 1);
    // Create-only again: 412, and the object is not replaced; If-None-Match is `*` alone.
    s.send(Method::PUT, path, Some(v2), &[("if-none-match", "*")]).await.assert_problem(412, None);
    assert_eq!(s.get(path).await.body["metadata"]["generation"], 1);
    let rv = created.body["metadata"]["resource_version"].as_str().unwrap().to_owned();
    let tagged = s.send(Method::PUT, path, Some(v2), &[("if-none-match", &format!("\"{rv}\""))]).await;
    tagged.assert_problem(412, None);
    assert!(created.headers.get("location").is_some(), "201 carries Location");
    let etag1 = created.etag();
    assert_eq!(etag1, format!("\"{}\"", created.body["metadata"]["resource_version"].as_str().unwrap()));
    let audit_before = s.table_counts().await["audit_log"];

    // Same spec again: nothing changes, not even the resource version, and nothing is audited.
    let again = s.put_ok(path, v1, 200).await;
    assert_eq!(again.body["metadata"]["generation"], 1);
    assert_eq!(again.etag(), etag1);
    assert_eq!(s.table_counts().await["audit_log"], audit_before);

    // A fetched object can be sent back as is (status and read-only metadata are ignored).
    let fetched = s.get(path).await;
    assert_eq!(fetched.status, 200);
    assert_eq!(fetched.etag(), etag1);
    s.put_ok(path, &fetched.body, 200).await;
    assert_eq!(s.get(path).await.etag(), etag1);

    // A spec change bumps generation and resource version.
    let changed = s.put_ok(path, v2, 200).await;
    assert_eq!(changed.body["metadata"]["generation"], 2);
    let etag2 = changed.etag();
    assert_ne!(etag2, etag1);
    assert_eq!(s.table_counts().await["audit_log"], audit_before + 1);

    // A label change moves the resource version but not the generation.
    let mut relabelled = v2.clone();
    relabelled["metadata"]["labels"] = json!({"owner": "alice"});
    let labelled = s.put_ok(path, &relabelled, 200).await;
    assert_eq!(labelled.body["metadata"]["generation"], 2);
    assert_ne!(labelled.etag(), etag2);
    let etag3 = labelled.etag();

    // Stale If-Match: 412 and nothing written.
    let stale = s.send(Method::PUT, path, Some(v1), &[("if-match", &etag1)]).await;
    stale.assert_problem(412, None);
    assert_eq!(s.get(path).await.body["metadata"]["generation"], 2);
    // Stale resource_version in the body: 409 naming the field.
    let mut stale_body = v1.clone();
    stale_body["metadata"]["resource_version"] = json!(etag1.trim_matches('"'));
    s.put(path, &stale_body).await.assert_problem(409, Some("/metadata/resource_version"));
    // The current version in either place lets the write through.
    let ok = s.send(Method::PUT, path, Some(&relabelled), &[("if-match", &etag3)]).await;
    assert_eq!(ok.status, 200, "{}", ok.body);

    // Delete: a stale If-Match is refused, then the real delete goes through.
    s.send(Method::DELETE, path, None, &[("if-match", &etag1)]).await.assert_problem(412, None);
    let deleted = s.delete(path).await;
    assert_eq!(deleted.status.as_u16(), delete_status, "{}", deleted.body);
    s.get(path).await.assert_problem(404, None);
    s.delete(path).await.assert_problem(404, None);
    let verbs: Vec<String> = sqlx::query_scalar("SELECT verb FROM audit_log WHERE name = $1 ORDER BY id")
        .bind(path.rsplit('/').next().unwrap())
        .fetch_all(&s.db)
        .await
        .unwrap();
    assert_eq!(verbs.first().map(String::as_str), Some("create"));
    assert_eq!(verbs.last().map(String::as_str), Some("delete"));
}

/// Walks a list with `limit` per page and returns every name seen, in order.
pub async fn collect_pages(s: &Server, path: &str, limit: u32) -> Vec<String> {
    let sep = if path.contains('?') { '&' } else { '?' };
    let mut names = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let url = match &cursor {
            Some(c) => format!("{path}{sep}limit={limit}&cursor={c}"),
            None => format!("{path}{sep}limit={limit}"),
        };
        let page = s.get(&url).await;
        assert_eq!(page.status, 200, "{}", page.body);
        let items = page.names();
        assert!(items.len() <= limit as usize);
        names.extend(items);
        match page.body["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return names,
        }
    }
    panic!("pagination did not end");
}

/// The test server's verifier: Berth's own issuer, and an OIDC issuer when given.
pub fn verifier(oidc: Option<berth_auth::Jwks>) -> Verifier {
    Verifier { berth: Some(issuer()), oidc, leeway: Duration::from_secs(30) }
}

/// The URL of the test's own database, for a child process.
pub fn database_url(options: &sqlx::postgres::PgConnectOptions) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL");
    let (prefix, _) = base.rsplit_once('/').expect("a database in DATABASE_URL");
    format!("{prefix}/{}", options.get_database().expect("a test database"))
}

/// The real berthd binary on its own database, with every line it writes (stdout and
/// stderr) kept for the test to read.
pub struct LoggedBerthd {
    pub address: String,
    /// Every line read so far.
    pub lines: Vec<String>,
    incoming: std::sync::mpsc::Receiver<String>,
    child: std::process::Child,
}

impl LoggedBerthd {
    pub fn start(options: &sqlx::postgres::PgConnectOptions, env: &[(&str, &str)]) -> Self {
        use std::io::{BufRead, BufReader};
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_berthd"));
        command
            .env("DATABASE_URL", database_url(options))
            .env("BERTH_LISTEN", "127.0.0.1:0")
            .env("BERTH_CONTROLLERS", "false")
            .env("BERTH_JWT_SECRET", std::str::from_utf8(SECRET).expect("utf-8"))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("berthd starts");
        let (tx, incoming) = std::sync::mpsc::channel::<String>();
        for stream in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    let _ = tx.send(line);
                }
            });
        }
        let mut berthd = Self { address: String::new(), lines: Vec::new(), incoming, child };
        let listening = berthd.wait_for(|l| l["message"] == "berthd listening");
        berthd.address = listening["address"].as_str().expect("address").to_owned();
        berthd
    }

    /// Reads lines until a JSON one matches, and returns it.
    pub fn wait_for(&mut self, matches: impl Fn(&Value) -> bool) -> Value {
        loop {
            let line = self.incoming.recv_timeout(Duration::from_secs(30)).expect("berthd keeps logging");
            self.lines.push(line.clone());
            if let Ok(value) = serde_json::from_str::<Value>(&line)
                && matches(&value)
            {
                return value;
            }
        }
    }

    /// Stops the process and reads what is left of its output.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        while let Ok(line) = self.incoming.recv_timeout(Duration::from_millis(500)) {
            self.lines.push(line);
        }
    }
}

impl Drop for LoggedBerthd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Flavor h100, a sim cluster of 16 h100 GPUs with its inventory taken, and top-level teams
/// a and b guaranteed `guaranteed` each; the controllers' context (controllers not running).
pub async fn two_teams_on_one_cluster(s: &Server, guaranteed: u32) -> berth_controllers::Context {
    s.put_ok("/api/v1/flavors/h100", &flavor("h100"), 201).await;
    s.put_ok("/api/v1/clusters/c1", &sim_cluster("h100"), 201).await;
    for team in ["a", "b"] {
        let body = TeamBody::new().quota("h100", guaranteed, None, 1).json();
        s.put_ok(&format!("/api/v1/teams/{team}"), &body, 201).await;
    }
    let ctx = berth_controllers::Context {
        db: s.db.clone(),
        backends: std::sync::Arc::new(berth_adapters::Registry::new(None)),
        config: berth_controllers::Config::default(),
        epoch: None,
        clock: berth_controllers::Clock::default(),
        world: Default::default(),
        dispatch: Default::default(),
        followed: Default::default(),
        job_api: None,
    };
    berth_controllers::cluster_health::reconcile(&ctx).await.expect("inventory");
    ctx
}
