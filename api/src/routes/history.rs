//! `/api/v1/teams/{team}/workloads/{name}/events`, `/api/v1/teams/{name}/events`,
//! `/api/v1/audit` and
//! `/api/v1/usage/history`

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use berth_app::history as app;
use berth_core::event::{AuditRecord, Event};
use berth_core::page::PageRequest;
use berth_core::team::UsageHistory;
use berth_store::audit::AuditFilter;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{PageParams, list, list_type};
use crate::extract::{ApiPath, ApiQuery, OpCtx};
use crate::problem::ApiError;
use crate::state::AppState;

list_type!(EventList, Event);
list_type!(AuditList, AuditRecord);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_workload_events))
        .routes(routes!(list_team_events))
        .routes(routes!(list_audit))
        .routes(routes!(get_usage_history))
}

/// A workload's events, oldest first.
#[utoipa::path(get, path = "/api/v1/teams/{team}/workloads/{name}/events", tag = "workloads",
    params(("team" = String, Path, description = "Team name"), ("name" = String, Path, description = "Workload name"), PageParams),
    responses((status = 200, description = "A page of events", body = EventList)))]
async fn list_workload_events(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath((team, name)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    Ok(list::<_, EventList>(app::workload_events(&s.db, &opctx, &team, &name, &page).await?))
}

/// A team's events (budgets crossing 80 % and 100 %), oldest first.
#[utoipa::path(get, path = "/api/v1/teams/{name}/events", tag = "teams",
    params(("name" = String, Path, description = "Team name"), PageParams),
    responses((status = 200, description = "A page of events", body = EventList)))]
async fn list_team_events(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    Ok(list::<_, EventList>(app::team_events(&s.db, &opctx, &name, &page).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditParams {
    /// Only records about this kind of object (`flavor`, `team`, `cluster`, `workload`).
    pub kind: Option<String>,
    /// Only records about objects of this name.
    pub name: Option<String>,
    /// Only records of this actor.
    pub actor: Option<String>,
    /// Only changes made at or after this time (RFC 3339).
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only changes made before this time (RFC 3339).
    pub until: Option<chrono::DateTime<chrono::Utc>>,
    /// Items per page, 1 to 500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `next` value of the previous page.
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    pub cursor: Option<String>,
}

/// The audit log: every mutation with its actor, newest first. Platform admins and global
/// viewers only.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditParams),
    responses(
        (status = 200, description = "A page of audit records", body = AuditList),
        (status = 403, description = "The caller is neither a platform admin nor a global viewer",
            content_type = "application/problem+json", body = crate::problem::Problem)))]
async fn list_audit(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<AuditParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    if let (Some(since), Some(until)) = (q.since, q.until)
        && until <= since
    {
        return Err(berth_core::Error::invalid("until", "must be after since").into());
    }
    let filter = AuditFilter { kind: q.kind, name: q.name, actor: q.actor, since: q.since, until: q.until };
    Ok(list::<_, AuditList>(app::audit_list(&s.db, &opctx, &filter, &page).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct UsageHistoryParams {
    /// Start of the history (RFC 3339); default 24 hours ago. History is kept 30 days:
    /// an earlier start reads from the oldest kept, a future one from now.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only this flavor.
    pub flavor: Option<String>,
}

/// GPUs allocated to each team the caller can see, per flavor, over time: a series of
/// changes per team and flavor, for charts of who held what.
#[utoipa::path(get, path = "/api/v1/usage/history", tag = "teams", params(UsageHistoryParams),
    responses((status = 200, description = "The history", body = UsageHistory)))]
async fn get_usage_history(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<UsageHistoryParams>,
) -> Result<Json<UsageHistory>, ApiError> {
    let since = q.since.unwrap_or_else(|| chrono::Utc::now() - chrono::TimeDelta::hours(24));
    Ok(Json(app::usage_history(&s.db, &opctx, since, q.flavor.as_deref()).await?))
}
