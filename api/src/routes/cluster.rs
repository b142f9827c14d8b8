//! `/api/v1/clusters`

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_app::cluster as app;
use berth_core::cluster::{Cluster, ClusterApply, ClusterKind, NodeView};
use berth_core::page::PageRequest;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{applied, list, list_type, object};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OpCtx, Preconditions};
use crate::problem::ApiError;
use crate::state::AppState;

list_type!(ClusterList, Cluster);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_clusters))
        .routes(routes!(get_cluster, put_cluster, delete_cluster))
        .routes(routes!(list_cluster_nodes))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ClusterListParams {
    /// Only clusters of this kind.
    pub kind: Option<ClusterKind>,
    /// Items per page, 1 to 500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `next` value of the previous page.
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    pub cursor: Option<String>,
}

/// List clusters, by name.
#[utoipa::path(get, path = "/api/v1/clusters", tag = "clusters", params(ClusterListParams),
    responses((status = 200, description = "A page of clusters", body = ClusterList)))]
async fn list_clusters(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<ClusterListParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    Ok(list::<_, ClusterList>(app::cluster_list(&s.db, &opctx, q.kind, &page).await?))
}

/// Get a cluster.
#[utoipa::path(get, path = "/api/v1/clusters/{name}", tag = "clusters",
    params(("name" = String, Path, description = "Cluster name")),
    responses((status = 200, description = "The cluster", body = Cluster, headers(("ETag" = String)))))]
async fn get_cluster(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    let cluster = app::cluster_get(&s.db, &opctx, &name).await?;
    Ok(object(StatusCode::OK, &cluster.metadata, &cluster))
}

/// A cluster's nodes as last inventoried, by name, each with the GPUs Berth's active
/// workloads are placed on.
#[utoipa::path(get, path = "/api/v1/clusters/{name}/nodes", tag = "clusters",
    params(("name" = String, Path, description = "Cluster name")),
    responses((status = 200, description = "The nodes", body = NodeList)))]
async fn list_cluster_nodes(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<NodeList>, ApiError> {
    Ok(Json(NodeList { items: app::cluster_nodes(&s.db, &opctx, &name).await? }))
}

/// A cluster's nodes.
#[derive(Serialize, ToSchema)]
pub struct NodeList {
    pub items: Vec<NodeView>,
}

/// Register or replace a cluster.
///
/// `credentials_ref` names a secret in berthd's environment; never send the secret itself.
/// `kind` cannot change once the cluster exists.
#[utoipa::path(put, path = "/api/v1/clusters/{name}", tag = "clusters",
    params(("name" = String, Path, description = "Cluster name (DNS-1123 label)"), super::WriteParams, crate::openapi::IfMatchHeader),
    request_body = ClusterApply,
    responses(
        (status = 200, description = "Replaced, or unchanged; with `dry_run`, the cluster as it would be (nothing written, no ETag)", body = Cluster, headers(("ETag" = String))),
        (status = 201, description = "Created", body = Cluster, headers(("ETag" = String), ("Location" = String)))))]
async fn put_cluster(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiQuery(q): ApiQuery<super::WriteParams>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<ClusterApply>,
) -> Result<Response, ApiError> {
    if q.dry_run {
        let (cluster, _) = app::cluster_apply_dry_run(&s.db, &opctx, &name, &body, if_match.as_ref()).await?;
        return Ok((StatusCode::OK, Json(cluster)).into_response());
    }
    let (cluster, outcome) = app::cluster_apply(&s.db, &opctx, &name, &body, if_match.as_ref()).await?;
    Ok(applied(outcome, &format!("/api/v1/clusters/{name}"), &cluster.metadata, &cluster))
}

/// Remove a cluster that holds no live workload.
#[utoipa::path(delete, path = "/api/v1/clusters/{name}", tag = "clusters",
    params(("name" = String, Path, description = "Cluster name"), crate::openapi::IfMatchHeader),
    responses((status = 200, description = "Deleted; the cluster as it was", body = Cluster)))]
async fn delete_cluster(
    State(s): State<AppState>,
    ApiPath(name): ApiPath<String>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
) -> Result<Response, ApiError> {
    let cluster = app::cluster_delete(&s.db, &opctx, &name, if_match.as_ref()).await?;
    Ok(object(StatusCode::OK, &cluster.metadata, &cluster))
}
