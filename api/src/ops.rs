//! Operational endpoints (`/healthz`, `/readyz`, `/metrics`) and the web placeholder.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::problem::ApiError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(healthz)).routes(routes!(readyz)).routes(routes!(metrics))
}

pub fn web_router() -> axum::Router<AppState> {
    axum::Router::new().route("/", get(|| async { Html(include_str!("../../web/index.html")) }))
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Up", body = String)))]
async fn healthz() -> &'static str {
    "ok"
}

/// The process can serve: the database answers.
#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
    (status = 200, description = "Ready", body = String),
    (status = 503, description = "Database unreachable", body = crate::problem::Problem, content_type = "application/problem+json")))]
async fn readyz(State(s): State<AppState>) -> Result<&'static str, ApiError> {
    berth_store::ping(&s.db).await?;
    Ok("ready")
}

/// Prometheus metrics: `http_requests_total` and `http_request_duration_seconds` by
/// method, route and status.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text format", body = String)))]
async fn metrics(State(s): State<AppState>) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], s.metrics.render()).into_response()
}
