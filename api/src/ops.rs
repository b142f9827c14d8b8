//! Operational endpoints (`/healthz`, `/readyz`, `/metrics`) and the dashboard's files.

use std::path::Path;

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use tower_http::services::{ServeDir, ServeFile};
use tower_http::set_header::SetResponseHeaderLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::problem::ApiError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(auth_config))
}

/// How clients sign in: what `berth login` asks before it has a token.
#[derive(Debug, Clone, Default, serde::Serialize, utoipa::ToSchema)]
pub struct LoginConfig {
    /// The organisation's identity provider, when Berth accepts its tokens and a client is
    /// registered there for the CLI (`BERTH_OIDC_CLI_CLIENT_ID`) or the dashboard
    /// (`BERTH_OIDC_WEB_CLIENT_ID`); absent: sign in with a token from an administrator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oidc: Option<OidcLogin>,
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct OidcLogin {
    /// The issuer (`iss`); its `/.well-known/openid-configuration` names the endpoints.
    pub issuer: String,
    /// The public client the CLI authenticates as (device-code flow), if one is registered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The public client the dashboard authenticates as (authorization code with PKCE,
    /// redirected back to the dashboard's own address), if one is registered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub web_client_id: Option<String>,
    /// The audience (`aud`) Berth requires of the provider's tokens.
    pub audience: String,
}

/// How to sign in (public): the identity provider and its clients for the CLI and the
/// dashboard, when one is configured.
#[utoipa::path(get, path = "/auth/config", tag = "operations",
    responses((status = 200, description = "How to sign in", body = LoginConfig)))]
async fn auth_config(State(s): State<AppState>) -> axum::Json<LoginConfig> {
    axum::Json(s.http.login.clone())
}

/// The dashboard: the build in `web_dir` (`index.html` at `/`, its files under
/// `/assets/`), or a page saying how to build it; with headers that keep it from being
/// framed, sniffed or leaking referrers. Its scripts may reach Berth and, where the
/// dashboard signs in with an identity provider, that provider's `issuer` origin (its
/// discovery document and token endpoint), nothing else.
pub fn web_router(web_dir: Option<&Path>, issuer: Option<&str>) -> axum::Router<AppState> {
    let provider = issuer.and_then(|i| i.parse::<axum::http::Uri>().ok()).and_then(|u| {
        let (scheme, authority) = (u.scheme_str()?, u.authority()?);
        Some(format!("{scheme}://{authority}"))
    });
    let policy = match provider {
        Some(origin) => {
            format!("default-src 'self'; connect-src 'self' {origin}; frame-ancestors 'none'; base-uri 'none'")
        }
        None => "default-src 'self'; frame-ancestors 'none'; base-uri 'none'".to_owned(),
    };
    let headers = [
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_str(&policy).expect("an origin is a header value")),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
    ];
    let mut router = match web_dir.filter(|d| d.join("index.html").is_file()) {
        Some(dir) => axum::Router::new()
            .route_service("/", ServeFile::new(dir.join("index.html")))
            .nest_service("/assets", ServeDir::new(dir.join("assets"))),
        None => axum::Router::new().route("/", get(|| async { Html(include_str!("web_missing.html")) })),
    };
    for (name, value) in headers {
        router = router.layer(SetResponseHeaderLayer::overriding(name, value));
    }
    router
}

/// `/metrics` alone, for a separate metrics address.
pub fn metrics_router(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(|State(s): State<AppState>| async move { render(&s, true).await }))
        .with_state(state)
}

/// Whether a line of the text format belongs to a `berth_…` metric.
fn is_named(line: &str) -> bool {
    let name = line.strip_prefix("# HELP ").or_else(|| line.strip_prefix("# TYPE ")).unwrap_or(line);
    name.starts_with("berth_")
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations", responses((status = 200, description = "Up", body = String)))]
async fn healthz() -> &'static str {
    "ok"
}

/// How long readiness waits for the database: a load balancer must hear "not ready"
/// promptly, not after the pool's connect retries (5 s).
const READY_WITHIN: std::time::Duration = std::time::Duration::from_millis(500);

/// The process can serve: the database answers (within half a second).
#[utoipa::path(get, path = "/readyz", tag = "operations", responses(
    (status = 200, description = "Ready", body = String),
    (status = 503, description = "Database unreachable", body = crate::problem::Problem, content_type = "application/problem+json")))]
async fn readyz(State(s): State<AppState>) -> Result<&'static str, ApiError> {
    match tokio::time::timeout(READY_WITHIN, berth_store::ping(&s.db)).await {
        Ok(answer) => answer?,
        Err(_) => return Err(berth_core::Error::Unavailable("the database did not answer in time".into()).into()),
    }
    Ok("ready")
}

/// Prometheus metrics: `http_requests_total` and `http_request_duration_seconds` by
/// method, route and status; the scheduler's and quotas' `berth_…` metrics (workloads per
/// team, flavor and phase, GPUs allocated, borrowed, guaranteed and fair share, budgets,
/// clusters' capacity and health, read from the store at each scrape; admissions,
/// preemptions by cause, admission wait and controller pass durations, from the replica
/// leading the controllers). The `berth_…` metrics name teams: here they are served only
/// to a platform admin's or global viewer's token (on a metrics address of its own, to
/// all). Answers 404 when metrics are turned off or served on their own address.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text format", body = String)))]
async fn metrics(State(s): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    if s.http.metrics_here {
        let named = crate::auth::reads_all(&s, &headers).await;
        render(&s, named).await
    } else {
        crate::problem::Problem::for_status(StatusCode::NOT_FOUND).into_response()
    }
}

/// The metrics; with `named`, the `berth_…` ones too (they name teams and clusters).
async fn render(s: &AppState, named: bool) -> Response {
    let mut text = s.metrics.render();
    if named {
        match berth_app::metrics::state_metrics(&s.db).await {
            Ok(state) => text.push_str(&state),
            // The process's own metrics still answer when the database does not.
            Err(e) => tracing::warn!(error = %e, "state metrics unavailable"),
        }
    } else {
        text = text.lines().filter(|l| !is_named(l)).map(|l| format!("{l}\n")).collect();
    }
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
