//! Garbage in: every malformed request gets a 4xx problem+json, never a 5xx, and the
//! database is exactly as it was.

use reqwest::Method;
use serde_json::json;

use crate::common::{Server, WorkloadBody};

struct Bad {
    method: Method,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
}

fn put(path: &str, body: impl Into<Vec<u8>>) -> Bad {
    Bad { method: Method::PUT, path: path.into(), content_type: Some("application/json"), body: body.into() }
}

fn put_json(path: &str, value: serde_json::Value) -> Bad {
    put(path, value.to_string())
}

fn with_spec(path: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Bad {
    let mut body = WorkloadBody::new().json();
    edit(&mut body);
    put_json(path, body)
}

fn requests() -> Vec<Bad> {
    let w = "/api/v1/teams/nlp/workloads/w";
    let mut v = vec![
        // Wrong types.
        with_spec(w, |b| b["spec"]["priority"] = json!("high")),
        with_spec(w, |b| b["spec"]["tasks"]["count"] = json!("two")),
        with_spec(w, |b| b["spec"]["tasks"]["count"] = json!(1.5)),
        with_spec(w, |b| b["spec"]["tasks"]["resources"]["gpus"] = json!("8")),
        with_spec(w, |b| b["spec"]["tasks"]["resources"]["flavors"] = json!("h100")),
        with_spec(w, |b| b["spec"]["gang"] = json!("yes")),
        with_spec(w, |b| b["spec"]["preemptible"] = json!(null)),
        with_spec(w, |b| b["spec"]["run"]["command"] = json!("python train.py")),
        with_spec(w, |b| b["spec"]["run"]["env"] = json!({"A": 1})),
        with_spec(w, |b| b["metadata"]["labels"] = json!(["a"])),
        with_spec(w, |b| b["spec"] = json!([])),
        put_json(w, json!([1, 2, 3])),
        put_json(w, json!("just a string")),
        put_json(w, json!(null)),
        put_json(w, json!({})),
        // Unknown fields at every level.
        with_spec(w, |b| b["spec"]["gpus"] = json!(8)),
        with_spec(w, |b| b["spec"]["tasks"]["resources"]["vram"] = json!(80)),
        with_spec(w, |b| b["metadata"]["namespace"] = json!("default")),
        with_spec(w, |b| b["kind"] = json!("Workload")),
        // Huge and negative numbers.
        with_spec(w, |b| b["spec"]["tasks"]["count"] = json!(-1)),
        with_spec(w, |b| b["spec"]["tasks"]["count"] = json!(u64::MAX)),
        with_spec(w, |b| b["spec"]["tasks"]["resources"]["gpus"] = json!(-8)),
        with_spec(w, |b| b["spec"]["tasks"]["resources"]["gpus"] = json!(1e300)),
        with_spec(w, |b| b["spec"]["priority"] = json!(i64::MAX)),
        with_spec(w, |b| b["spec"]["max_runtime_seconds"] = json!(-5)),
        with_spec(w, |b| b["spec"]["sim"]["duration_seconds"] = json!(-1)),
        put(
            w,
            r#"{"spec": {"kind": "training", "tasks": {"count": 1e999, "resources": {"flavors": ["h100"], "gpus": 1}}}}"#,
        ),
        put_json("/api/v1/teams/x", json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": -1}]}})),
        put_json("/api/v1/teams/x", json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 99_999_999_999u64}]}})),
        put_json(
            "/api/v1/teams/x",
            json!({"spec": {"quotas": [{"flavor": "h100", "guaranteed": 1, "weight": 1_000_000}]}}),
        ),
        put_json(
            "/api/v1/clusters/x",
            json!({"spec": {"kind": "sim", "sim": {"node_groups": [{"name": "g", "count": 4_294_967_296u64, "flavor": "h100", "gpus_per_node": 8}]}}}),
        ),
        // SQL-looking and unicode strings in names and labels.
        put_json("/api/v1/flavors/x'%3B%20DROP%20TABLE%20flavors%3B--", json!({"spec": {}})),
        put_json("/api/v1/teams/%E2%9C%93%E2%9C%93", json!({"spec": {}})),
        put_json("/api/v1/teams/nlp/workloads/%F0%9F%9A%80", WorkloadBody::new().json()),
        with_spec(w, |b| b["metadata"]["labels"] = json!({"a": "'; DELETE FROM workloads; --"})),
        with_spec(w, |b| b["metadata"]["labels"] = json!({"ключ": "значение"})),
        with_spec(w, |b| b["metadata"]["labels"] = json!({"a": "x".repeat(64)})),
        with_spec(w, |b| b["spec"]["tasks"]["resources"]["flavors"] = json!(["h100' OR '1'='1"])),
        with_spec(w, |b| b["spec"]["placement"]["cluster_selector"] = json!({"region": "eu\u{0000}"})),
        with_spec(w, |b| b["spec"]["run"]["image"] = json!("img with spaces")),
        put_json("/api/v1/teams/Robert'); DROP TABLE teams;--", json!({"spec": {}})),
        put_json(&format!("/api/v1/flavors/{}", "a".repeat(64)), json!({"spec": {}})),
        // Syntax errors and invalid UTF-8.
        put(w, "{"),
        put(w, "{\"spec\": }"),
        put(w, "not json at all"),
        put(w, ""),
        put(w, "{\"spec\": {}} trailing"),
        put(w, b"{\"metadata\": {\"labels\": {\"a\": \"\xff\xfe\"}}, \"spec\": {}}".to_vec()),
        put(w, b"\xc3\x28".to_vec()),
        put(w, "{\"spec\": {\"kind\": \"\\ud800\"}}"),
        // A 2 MiB body.
        put(w, format!("{{\"spec\": {{\"kind\": \"training\", \"pad\": \"{}\"}}}}", "x".repeat(2 * 1024 * 1024))),
        // Wrong or missing content types.
        Bad {
            method: Method::PUT,
            path: w.into(),
            content_type: Some("text/plain"),
            body: WorkloadBody::new().json().to_string().into(),
        },
        Bad {
            method: Method::PUT,
            path: w.into(),
            content_type: None,
            body: WorkloadBody::new().json().to_string().into(),
        },
        Bad {
            method: Method::PUT,
            path: w.into(),
            content_type: Some("application/x-www-form-urlencoded"),
            body: b"spec=1".to_vec(),
        },
        // Wrong methods and paths.
        Bad { method: Method::POST, path: w.into(), content_type: Some("application/json"), body: b"{}".to_vec() },
        Bad {
            method: Method::PATCH,
            path: "/api/v1/flavors/h100".into(),
            content_type: Some("application/json"),
            body: b"{}".to_vec(),
        },
        Bad {
            method: Method::POST,
            path: "/api/v1/flavors".into(),
            content_type: Some("application/json"),
            body: b"{}".to_vec(),
        },
        Bad { method: Method::DELETE, path: "/api/v1/workloads".into(), content_type: None, body: Vec::new() },
        Bad {
            method: Method::PUT,
            path: "/api/v1/teams".into(),
            content_type: Some("application/json"),
            body: b"{}".to_vec(),
        },
        Bad { method: Method::GET, path: "/api/v2/teams".into(), content_type: None, body: Vec::new() },
        // Bad query parameters and preconditions.
        Bad { method: Method::GET, path: "/api/v1/workloads?limit=-1".into(), content_type: None, body: Vec::new() },
        Bad {
            method: Method::GET,
            path: "/api/v1/workloads?limit=99999999999".into(),
            content_type: None,
            body: Vec::new(),
        },
        Bad {
            method: Method::GET,
            path: "/api/v1/workloads?phase=%27%3B--".into(),
            content_type: None,
            body: Vec::new(),
        },
        Bad { method: Method::GET, path: "/api/v1/audit?cursor=%00%01".into(), content_type: None, body: Vec::new() },
    ];
    // An If-Match that names no version of the object (412).
    v.push(put_json("/api/v1/flavors/h100", json!({"spec": {}})));
    v
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn malformed_requests_get_4xx_problems_and_change_nothing(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let before = s.table_counts().await;
    let requests = requests();
    assert!(requests.len() >= 50, "only {} requests", requests.len());
    let last = requests.len() - 1;
    for (i, bad) in requests.into_iter().enumerate() {
        let mut req = s.http.request(bad.method.clone(), s.url(&bad.path)).body(bad.body);
        if let Some(ct) = bad.content_type {
            req = req.header("content-type", ct);
        }
        if i == last {
            req = req.header("if-match", "not-a-tag");
        }
        let reply = req.send().await.expect("request");
        let status = reply.status();
        let content_type = reply.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
        let text = reply.text().await.unwrap();
        assert!(status.is_client_error(), "#{i} {} {}: got {status}: {text}", bad.method, bad.path);
        assert_eq!(content_type.as_deref(), Some("application/problem+json"), "#{i}: {text}");
        let problem: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("#{i}: not JSON: {text}"));
        assert_eq!(problem["status"], status.as_u16(), "#{i}");
        assert!(problem["request_id"].is_string(), "#{i}: {text}");
        assert!(!text.to_lowercase().contains("sqlx") && !text.contains("SELECT"), "#{i} leaks internals: {text}");
    }
    assert_eq!(s.table_counts().await, before, "the database is unchanged");
}

/// A well-formed document of the wrong shape is a 422 naming the field itself: a missing
/// field by its own name (not its parent's), a `null` where a value belongs (which serde's
/// reader reports as a syntax error) as such. Only a document that does not parse is a 400.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_well_formed_body_of_the_wrong_shape_names_the_field_at_fault(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let w = "/api/v1/teams/nlp/workloads/w";
    let spec = WorkloadBody::new().json();
    let edited = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut body = spec.clone();
        edit(&mut body);
        body
    };
    let cases = [
        (edited(&|b| b["spec"]["kind"] = json!(null)), "/spec/kind", "must not be null"),
        (edited(&|b| b["spec"]["priority"] = json!(null)), "/spec/priority", "null"),
        (edited(&|b| b["spec"]["kind"] = json!("gaming")), "/spec/kind", "unknown variant"),
        (edited(&|b| b["spec"].as_object_mut().unwrap().remove("tasks").map(drop).unwrap()), "/spec/tasks", "missing"),
        (
            edited(&|b| b["spec"]["tasks"]["resources"].as_object_mut().unwrap().remove("gpus").map(drop).unwrap()),
            "/spec/tasks/resources/gpus",
            "missing",
        ),
        (json!({}), "/spec", "missing field `spec`"),
        // Said as JSON's types, not Rust's ("expected u32", "expected struct TaskSpec").
        (
            edited(&|b| b["spec"]["tasks"]["count"] = json!("2")),
            "/spec/tasks/count",
            "expected a whole number from 0 to",
        ),
        (edited(&|b| b["spec"]["tasks"] = json!([1])), "/spec/tasks", "expected an object"),
    ];
    for (body, field, words) in cases {
        let reply = s.put(w, &body).await;
        reply.assert_problem(422, Some(field));
        assert!(reply.body.to_string().contains(words), "{field}: {}", reply.body);
    }
    let reply =
        s.http.put(s.url(w)).header("content-type", "application/json").body(r#"{"spec": nul}"#).send().await.unwrap();
    assert_eq!(reply.status().as_u16(), 400, "a document that does not parse");
    // A compressed body is refused as such, not read as malformed JSON.
    let reply = s
        .http
        .put(s.url(w))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(vec![0x1f, 0x8b, 8, 0])
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 415, "a content coding");
    assert!(reply.text().await.unwrap().contains("uncompressed"));
    assert_eq!(s.get(w).await.status.as_u16(), 404, "nothing written");
}

/// A query parameter the operation does not declare, or one given twice, is a 400 naming
/// it, and nothing is written: `?dry_run=true` on a team, cluster or flavor write (only
/// workload writes have a dry run) was ignored and the write done for real.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn an_undeclared_or_repeated_query_parameter_is_refused_and_nothing_is_written(db: berth_store::PgPool) {
    use crate::common::{TeamBody, flavor, sim_cluster};
    let s = Server::start(db).await;
    s.seed().await;
    let before = s.table_counts().await;
    let writes = [
        (Method::DELETE, "/api/v1/teams/nlp?dry_run=true", None),
        (Method::DELETE, "/api/v1/flavors/a100?force=true", None),
    ];
    for (method, path, body) in writes {
        let reply = s.send(method.clone(), path, body.as_ref(), &[]).await;
        let name = path.split(['?', '=']).nth(1).unwrap();
        reply.assert_problem(400, Some(name));
        assert!(reply.body["detail"].as_str().unwrap().contains("takes none"), "{method} {path}: {}", reply.body);
    }
    assert_eq!(s.table_counts().await, before, "nothing written");
    assert_eq!(s.get("/api/v1/teams/nlp").await.status, 200);
    // A declared one given twice; one of another operation is named with those it takes.
    s.get("/api/v1/teams?limit=1&limit=2").await.assert_problem(400, Some("limit"));
    let reply = s.get("/api/v1/teams?dry_run=true").await;
    reply.assert_problem(400, Some("dry_run"));
    assert!(reply.body["detail"].as_str().unwrap().contains("`limit`"), "{}", reply.body);
    // Declared ones still work, and a workload write's dry run still writes nothing.
    assert_eq!(s.get("/api/v1/teams?limit=1").await.status, 200);
    let body = crate::common::WorkloadBody::new().json();
    assert_eq!(s.put("/api/v1/teams/nlp/workloads/w?dry_run=true", &body).await.status, 200);
    // As do those of a team, a cluster and a flavor (new or changed): each is answered as
    // it would be.
    let dry_runs = [
        ("/api/v1/teams/vision?dry_run=true", TeamBody::new().quota("h100", 1, None, 1).json()),
        ("/api/v1/teams/speech?dry_run=true", TeamBody::new().quota("h100", 1, None, 1).json()),
        ("/api/v1/clusters/c1?dry_run=true", sim_cluster("h100")),
        ("/api/v1/flavors/l40s?dry_run=true", flavor("l40s")),
    ];
    for (path, body) in dry_runs {
        let reply = s.put(path, &body).await;
        assert_eq!(
            (reply.status, reply.headers.get("etag")),
            (reqwest::StatusCode::OK, None),
            "{path}: {}",
            reply.body
        );
        let name = path.rsplit('/').next().unwrap().split('?').next().unwrap();
        assert_eq!(reply.body["metadata"]["name"], name, "{path}: {}", reply.body);
    }
    s.put("/api/v1/flavors/l40s?dry_run=1", &flavor("l40s")).await.assert_problem(400, Some("dry_run"));
    assert_eq!(s.table_counts().await, before, "nothing written by the dry runs");
}
