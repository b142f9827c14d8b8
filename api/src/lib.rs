//! berthd: Berth's HTTP layer. Routes, extractors, the problem+json mapping, telemetry
//! and the OpenAPI document. No SQL and no business rules live here: handlers call
//! `berth_app`.

pub mod auth;
pub mod extract;
pub mod openapi;
pub mod problem;
pub mod routes;
pub mod server;
pub mod state;
mod strict;
pub mod telemetry;

pub mod ops;

pub use ops::metrics_router;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::IntoResponse;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::set_header::SetResponseHeaderLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::problem::Problem;
use crate::state::AppState;

/// The authenticated `/api/v1` routes, the public operational ones, and the OpenAPI
/// document they make.
fn router_parts() -> (Router<AppState>, Router<AppState>, utoipa::openapi::OpenApi) {
    let (api, mut document) = OpenApiRouter::with_openapi(<openapi::ApiDoc as utoipa::OpenApi>::openapi())
        .merge(routes::router())
        .split_for_parts();
    let (public, public_document) = OpenApiRouter::new().merge(ops::router()).split_for_parts();
    document.merge(public_document);
    // After the merge: modifiers declared on ApiDoc run before any path exists.
    utoipa::Modify::modify(&openapi::ProblemResponses, &mut document);
    (api, public, document)
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    let (api, public, document) = router_parts();
    let declared = extract::DeclaredQuery::of(&document);
    let cors = state.http.cors();
    let timeout = state.http.limits.request;
    // API answers carry tenants' data and tokens: no cache may keep them.
    let no_store = SetResponseHeaderLayer::if_not_present(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // One budget shared by every API route (a clone of the layer shares its semaphore).
    let concurrency = tower::limit::GlobalConcurrencyLimitLayer::new(state.http.limits.concurrent.max(1));
    let routed = api
        .route_layer(from_fn_with_state(declared, extract::refuse_undeclared_query))
        .route_layer(from_fn_with_state(state.clone(), auth::authenticate))
        .route_layer(no_store)
        .route_layer(concurrency)
        .merge(public)
        .merge(SwaggerUi::new("/docs").url("/openapi.json", document))
        .merge(ops::web_router(
            state.http.web_dir.as_deref(),
            state.http.login.oidc.as_ref().filter(|o| o.web_client_id.is_some()).map(|o| o.issuer.as_str()),
        ))
        .fallback(|| async { Problem::for_status(StatusCode::NOT_FOUND).into_response() })
        .method_not_allowed_fallback(|| async { Problem::for_status(StatusCode::METHOD_NOT_ALLOWED).into_response() })
        .route_layer(from_fn(telemetry::track_metrics))
        .with_state(state);
    // Around the whole router once, not around each route: `Router::layer` wraps every
    // route in a boxed service of its own per layer, and each request cloned those boxes,
    // 13 deep. The first layer here is the outermost.
    let around = tower::ServiceBuilder::new()
        // No page of Berth's (the dashboard, /docs) may be framed by another site, nor load
        // plugins or rebase its links.
        .layer(security_header(
            header::CONTENT_SECURITY_POLICY,
            "frame-ancestors 'none'; object-src 'none'; base-uri 'none'",
        ))
        .layer(security_header(header::REFERRER_POLICY, "no-referrer"))
        .layer(security_header(header::X_FRAME_OPTIONS, "DENY"))
        .layer(security_header(header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .layer(tower::util::option_layer(cors))
        // CORS answers preflights itself, with an empty body of the type of those below.
        .map_response(IntoResponse::into_response)
        .layer(SetRequestIdLayer::new(telemetry::REQUEST_ID, MakeRequestUuid))
        .layer(PropagateRequestIdLayer::new(telemetry::REQUEST_ID))
        .layer(TraceLayer::new_for_http().make_span_with(telemetry::request_span))
        .layer(CatchPanicLayer::custom(telemetry::panic_response))
        .layer(from_fn(telemetry::problem_responses))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout))
        .layer(DefaultBodyLimit::max(extract::BODY_LIMIT))
        .service(routed);
    Router::new().fallback_service(around)
}

fn security_header(name: HeaderName, value: &'static str) -> SetResponseHeaderLayer<HeaderValue> {
    SetResponseHeaderLayer::if_not_present(name, HeaderValue::from_static(value))
}
