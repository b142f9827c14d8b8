//! `/api/v1/flavors`

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_app::flavor as app;
use berth_core::flavor::{Flavor, FlavorApply};
use berth_core::page::PageRequest;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{PageParams, applied, list, list_type, object};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OpCtx, Preconditions};
use crate::problem::ApiError;
use crate::state::AppState;

list_type!(FlavorList, Flavor);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list_flavors)).routes(routes!(get_flavor, put_flavor, delete_flavor))
}

/// List flavors, by name.
#[utoipa::path(get, path = "/api/v1/flavors", tag = "flavors", params(PageParams),
    responses((status = 200, description = "A page of flavors", body = FlavorList)))]
async fn list_flavors(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    Ok(list::<_, FlavorList>(app::flavor_list(&s.db, &opctx, &page).await?))
}

/// Get a flavor.
#[utoipa::path(get, path = "/api/v1/flavors/{name}", tag = "flavors",
    params(("name" = String, Path, description = "Flavor name")),
    responses((status = 200, description = "The flavor", body = Flavor, headers(("ETag" = String, description = "The resource version")))))]
async fn get_flavor(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    let flavor = app::flavor_get(&s.db, &opctx, &name).await?;
    Ok(object(StatusCode::OK, &flavor.metadata, &flavor))
}

/// Create or replace a flavor.
///
/// Idempotent: the same spec twice changes nothing. `status` and read-only metadata in the
/// body are ignored.
#[utoipa::path(put, path = "/api/v1/flavors/{name}", tag = "flavors",
    params(("name" = String, Path, description = "Flavor name (DNS-1123 label)"), super::WriteParams, crate::openapi::IfMatchHeader),
    request_body = FlavorApply,
    responses(
        (status = 200, description = "Replaced, or unchanged; with `dry_run`, the flavor as it would be (nothing written, no ETag)", body = Flavor, headers(("ETag" = String))),
        (status = 201, description = "Created", body = Flavor, headers(("ETag" = String), ("Location" = String)))))]
async fn put_flavor(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<super::WriteParams>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<FlavorApply>,
) -> Result<Response, ApiError> {
    if q.dry_run {
        let (flavor, _) = app::flavor_apply_dry_run(&s.db, &opctx, &name, &body, if_match.as_ref()).await?;
        return Ok((StatusCode::OK, Json(flavor)).into_response());
    }
    let (flavor, outcome) = app::flavor_apply(&s.db, &opctx, &name, &body, if_match.as_ref()).await?;
    Ok(applied(outcome, &format!("/api/v1/flavors/{name}"), &flavor.metadata, &flavor))
}

/// Delete a flavor that no team, cluster or live workload refers to.
#[utoipa::path(delete, path = "/api/v1/flavors/{name}", tag = "flavors",
    params(("name" = String, Path, description = "Flavor name"), crate::openapi::IfMatchHeader),
    responses((status = 200, description = "Deleted; the flavor as it was", body = Flavor)))]
async fn delete_flavor(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
) -> Result<Response, ApiError> {
    let flavor = app::flavor_delete(&s.db, &opctx, &name, if_match.as_ref()).await?;
    Ok(object(StatusCode::OK, &flavor.metadata, &flavor))
}
