//! berthd: Berth's HTTP layer. Routes, extractors, the problem+json mapping, telemetry
//! and the OpenAPI document. No SQL and no business rules live here: handlers call
//! `berth_app`.

pub mod extract;
pub mod openapi;
pub mod problem;
pub mod routes;
pub mod state;
pub mod telemetry;

mod ops;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware::from_fn;
use axum::response::IntoResponse;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::TraceLayer;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::problem::Problem;
use crate::state::AppState;

/// The routes and the OpenAPI document they make.
fn router_parts() -> (Router<AppState>, utoipa::openapi::OpenApi) {
    let (router, mut document) = OpenApiRouter::with_openapi(<openapi::ApiDoc as utoipa::OpenApi>::openapi())
        .merge(routes::router())
        .merge(ops::router())
        .split_for_parts();
    // After the merge: modifiers declared on ApiDoc run before any path exists.
    utoipa::Modify::modify(&openapi::ProblemResponses, &mut document);
    (router, document)
}

/// The whole HTTP application.
pub fn app(state: AppState) -> Router {
    let (api, document) = router_parts();
    api.merge(SwaggerUi::new("/docs").url("/openapi.json", document))
        .merge(ops::web_router())
        .fallback(|| async { Problem::for_status(StatusCode::NOT_FOUND).into_response() })
        .method_not_allowed_fallback(|| async { Problem::for_status(StatusCode::METHOD_NOT_ALLOWED).into_response() })
        .route_layer(from_fn(telemetry::track_metrics))
        .layer(DefaultBodyLimit::max(extract::BODY_LIMIT))
        .layer(from_fn(telemetry::problem_responses))
        .layer(CatchPanicLayer::custom(telemetry::panic_response))
        .layer(TraceLayer::new_for_http().make_span_with(telemetry::request_span))
        .layer(PropagateRequestIdLayer::new(telemetry::REQUEST_ID))
        .layer(SetRequestIdLayer::new(telemetry::REQUEST_ID, MakeRequestUuid))
        .with_state(state)
}
