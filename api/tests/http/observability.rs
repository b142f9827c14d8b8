//! Request ids, metrics, health, the OpenAPI document; and, against the real `berthd`
//! binary, JSON logs carrying the request id and traces exported over OTLP.

use std::time::Duration;

use axum::body::Bytes;
use axum::routing::post;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::sync::mpsc;

use crate::common::{self, LoggedBerthd, Server};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn every_response_carries_a_request_id_and_honours_the_callers(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let own = s.get("/api/v1/flavors").await;
    assert!(own.headers.get("x-request-id").is_some());
    let reply = s.send(reqwest::Method::GET, "/api/v1/flavors/none", None, &[("x-request-id", "req-123")]).await;
    assert_eq!(reply.headers.get("x-request-id").unwrap(), "req-123");
    assert_eq!(reply.body["request_id"], "req-123");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn metrics_count_requests_by_route_and_status(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.get("/api/v1/teams/ghost").await;
    let metrics = s.http.get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let line = metrics
        .lines()
        .find(|l| {
            l.starts_with("http_requests_total")
                && l.contains("route=\"/api/v1/teams/{name}\"")
                && l.contains("status=\"404\"")
        })
        .unwrap_or_else(|| panic!("no counter for the 404 in:\n{metrics}"));
    assert!(line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() >= 1.0);
    assert!(metrics.contains("http_request_duration_seconds_bucket"));
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn health_readiness_docs_and_the_document_are_served(db: berth_store::PgPool) {
    let s = Server::start(db.clone()).await;
    assert_eq!(s.http.get(s.url("/healthz")).send().await.unwrap().status(), 200);
    assert_eq!(s.http.get(s.url("/readyz")).send().await.unwrap().status(), 200);
    let docs = s.http.get(s.url("/docs/")).send().await.unwrap();
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("swagger"), "the offline API reference UI is served");
    let doc: serde_json::Value = s.http.get(s.url("/openapi.json")).send().await.unwrap().json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    db.close().await;
    let not_ready = s.http.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(not_ready.status(), 503, "readiness follows the database");
}

fn collect_refs(value: &serde_json::Value, refs: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(o) => {
            if let Some(serde_json::Value::String(r)) = o.get("$ref") {
                refs.push(r.clone());
            }
            o.values().for_each(|v| collect_refs(v, refs));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_refs(v, refs)),
        _ => {}
    }
}

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../openapi/openapi.json");
    let generated = berthd::openapi::document_json();
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is out of date: run scripts/openapi (cargo run -p berthd -- openapi > openapi/openapi.json)"
    );
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    // Every reference resolves (the dashboard's types are generated from the document).
    let mut refs = Vec::new();
    collect_refs(&doc, &mut refs);
    assert!(refs.len() > 100, "{} references", refs.len());
    for r in refs {
        let pointer = r.strip_prefix('#').unwrap_or_else(|| panic!("{r} points outside the document"));
        assert!(doc.pointer(pointer).is_some(), "{r} names nothing in the document");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if path.starts_with("/api/") && ["get", "put", "delete"].contains(&method.as_str()) {
                assert!(
                    op["responses"]["400"].is_object() && op["responses"]["422"].is_object(),
                    "{method} {path} declares its problems"
                );
            }
        }
    }
}

#[sqlx::test(migrations = false)]
async fn berthd_migrates_logs_json_with_request_ids_and_exports_traces(
    _pool: PgPoolOptions,
    options: PgConnectOptions,
) {
    // A stand-in OTLP collector that hands over every export it receives.
    let (tx, mut exports) = mpsc::unbounded_channel::<Bytes>();
    let collector = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(body);
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let otlp = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, collector).await.unwrap() });

    let mut berthd = LoggedBerthd::start(
        &options,
        &[
            ("BERTH_CONTROLLERS", "true"),
            ("RUST_LOG", "info,tower_http=debug"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &otlp),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ],
    );
    let address = berthd.address.clone();

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let reply = reqwest::Client::new()
        .get(format!("http://{address}/api/v1/teams/ghost"))
        .bearer_auth(common::token("admin", &[(berth_core::auth::Role::PlatformAdmin, None)]))
        .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01"))
        .header("x-request-id", "trace-me")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 404);

    // The request's log lines are JSON and carry its request id.
    berthd.wait_for(|l| l["span"]["request_id"] == "trace-me");
    // The span was exported over OTLP inside the caller's trace.
    let wanted: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).unwrap()).collect();
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(body) = exports.recv().await {
            if body.windows(16).any(|w| w == wanted.as_slice()) {
                return true;
            }
        }
        false
    })
    .await;
    berthd.stop();
    assert_eq!(found, Ok(true), "an OTLP export carried the caller's trace id");
    // Migrations ran at start-up.
    let db = PgPoolOptions::new().connect_with(options).await.unwrap();
    let tables: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE tablename IN ('workloads', 'teams', 'audit_log')")
            .fetch_one(&db)
            .await
            .unwrap();
    assert_eq!(tables, 3);
}
