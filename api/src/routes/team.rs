//! `/api/v1/teams`

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::response::Response;
use berth_app::team as app;
use berth_core::page::PageRequest;
use berth_core::team::{QuotaPreview, Team, TeamApply, TeamSpec};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{applied, list, list_type, object};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OpCtx, Preconditions};
use crate::problem::ApiError;
use crate::state::AppState;

list_type!(TeamList, Team);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_teams))
        .routes(routes!(get_team, put_team, delete_team))
        .routes(routes!(preview_team))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TeamListParams {
    /// Only the children of this team.
    pub parent: Option<String>,
    /// Items per page, 1 to 500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `next` value of the previous page.
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    pub cursor: Option<String>,
}

/// List the teams the caller can see, by name.
#[utoipa::path(get, path = "/api/v1/teams", tag = "teams", params(TeamListParams),
    responses((status = 200, description = "A page of teams", body = TeamList)))]
async fn list_teams(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<TeamListParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    Ok(list::<_, TeamList>(app::team_list(&s.db, &opctx, q.parent.as_deref(), &page).await?))
}

/// Get a team.
#[utoipa::path(get, path = "/api/v1/teams/{name}", tag = "teams",
    params(("name" = String, Path, description = "Team name")),
    responses((status = 200, description = "The team", body = Team, headers(("ETag" = String)))))]
async fn get_team(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    let team = app::team_get(&s.db, &opctx, &name).await?;
    Ok(object(StatusCode::OK, &team.metadata, &team))
}

/// Create or replace a team and its quotas.
///
/// Rejected (422, naming the field): an unknown flavor or parent, limit below guaranteed,
/// a cycle, children's guarantees above the parent's. Platform admins manage every team;
/// a team admin manages the teams below its own (under a parent in its subtree), so never
/// its own team's quota.
#[utoipa::path(put, path = "/api/v1/teams/{name}", tag = "teams",
    params(("name" = String, Path, description = "Team name (DNS-1123 label)"), super::WriteParams, crate::openapi::IfMatchHeader),
    request_body = TeamApply,
    responses(
        (status = 200, description = "Replaced, or unchanged; with `dry_run`, the team as it would be (nothing written, no ETag)", body = Team, headers(("ETag" = String))),
        (status = 201, description = "Created", body = Team, headers(("ETag" = String), ("Location" = String)))))]
async fn put_team(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<super::WriteParams>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<TeamApply>,
) -> Result<Response, ApiError> {
    if q.dry_run {
        let (team, _) = app::team_apply_dry_run(&s.db, &opctx, &name, &body, if_match.as_ref()).await?;
        return Ok((StatusCode::OK, Json(team)).into_response());
    }
    let (team, outcome) = app::team_apply(&s.db, &opctx, &name, &body, if_match.as_ref()).await?;
    Ok(applied(outcome, &format!("/api/v1/teams/{name}"), &team.metadata, &team))
}

/// Preview a change of a team's quotas or fair sharing: what the scheduler would do
/// differently with the body applied — workloads admitted or preempted, fair shares —
/// without saving it.
///
/// The body is a replacement of the team as for `PUT`, checked by the same rules (422
/// naming the field) and allowed to the same callers. Workloads of teams the caller may
/// not read are counted but not named.
#[utoipa::path(post, path = "/api/v1/teams/{name}/preview", tag = "teams",
    params(("name" = String, Path, description = "Team name")),
    request_body = TeamApply,
    responses((status = 200, description = "What the change would do", body = QuotaPreview)))]
async fn preview_team(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<TeamApply>,
) -> Result<Response, ApiError> {
    let what_if = async |spec: &TeamSpec| {
        berth_controllers::preview::quota_preview(&s.db, &s.scheduling, &name, spec, s.clock.now()).await
    };
    Ok(Json(app::team_preview(&s.db, &opctx, &name, &body, what_if).await?).into_response())
}

/// Delete a team with no child teams and no live workloads.
#[utoipa::path(delete, path = "/api/v1/teams/{name}", tag = "teams",
    params(("name" = String, Path, description = "Team name"), crate::openapi::IfMatchHeader),
    responses((status = 200, description = "Deleted; the team as it was", body = Team)))]
async fn delete_team(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
) -> Result<Response, ApiError> {
    let team = app::team_delete(&s.db, &opctx, &name, if_match.as_ref()).await?;
    Ok(object(StatusCode::OK, &team.metadata, &team))
}
