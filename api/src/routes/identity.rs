//! `/api/v1/me`, `/api/v1/role-bindings` and `/api/v1/service-accounts`

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use berth_app::identity as app;
use berth_core::auth::{
    NewRoleBinding, NewServiceAccount, Principal, RoleBinding, ServiceAccount, ServiceAccountToken,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::extract::{ApiJson, ApiPath, ApiQuery, OpCtx};
use crate::problem::ApiError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_me))
        .routes(routes!(list_role_bindings, create_role_binding))
        .routes(routes!(delete_role_binding))
        .routes(routes!(list_service_accounts, create_service_account))
        .routes(routes!(get_service_account, delete_service_account))
        .routes(routes!(list_tokens, create_token))
        .routes(routes!(revoke_token))
}

/// The caller: subject, issuer, service account, and every grant (from a bootstrap token
/// and from role bindings).
#[utoipa::path(get, path = "/api/v1/me", tag = "identity",
    responses((status = 200, description = "The caller's identity and grants", body = Principal)))]
async fn get_me(OpCtx(opctx): OpCtx) -> Json<Principal> {
    Json(app::me(&opctx))
}

/// Role bindings.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct RoleBindingList {
    pub items: Vec<RoleBinding>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RoleBindingParams {
    /// Only the bindings of this subject.
    pub subject: Option<String>,
}

/// The role bindings the caller can see: those on teams it can read (global ones for
/// platform admins and global viewers), and its own.
#[utoipa::path(get, path = "/api/v1/role-bindings", tag = "identity", params(RoleBindingParams),
    responses((status = 200, description = "Role bindings", body = RoleBindingList)))]
async fn list_role_bindings(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<RoleBindingParams>,
) -> Result<Json<RoleBindingList>, ApiError> {
    Ok(Json(RoleBindingList { items: app::role_binding_list(&s.db, &opctx, q.subject.as_deref()).await? }))
}

/// Grant a role to a subject: a user (the `sub` of an issuer's tokens) or an existing
/// service account (`serviceaccount:{name}`).
///
/// Platform admins grant anything; a team admin grants team-admin, member or viewer within
/// its subtree. A service account's bindings go with the account: one created later under
/// the same name holds none of them.
#[utoipa::path(post, path = "/api/v1/role-bindings", tag = "identity", request_body = NewRoleBinding,
    responses((status = 201, description = "Created", body = RoleBinding)))]
async fn create_role_binding(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<NewRoleBinding>,
) -> Result<Response, ApiError> {
    let binding = app::role_binding_create(&s.db, &opctx, &body).await?;
    Ok((StatusCode::CREATED, Json(binding)).into_response())
}

/// Remove a role binding; it stops applying at the subject's next request.
#[utoipa::path(delete, path = "/api/v1/role-bindings/{id}", tag = "identity",
    params(("id" = Uuid, Path, description = "Binding id")),
    responses((status = 200, description = "Deleted; the binding as it was", body = RoleBinding)))]
async fn delete_role_binding(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(id): ApiPath<Uuid>,
) -> Result<Json<RoleBinding>, ApiError> {
    Ok(Json(app::role_binding_delete(&s.db, &opctx, id).await?))
}

/// Service accounts.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct ServiceAccountList {
    pub items: Vec<ServiceAccount>,
}

/// The service accounts the caller can see.
#[utoipa::path(get, path = "/api/v1/service-accounts", tag = "identity",
    responses((status = 200, description = "Service accounts", body = ServiceAccountList)))]
async fn list_service_accounts(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
) -> Result<Json<ServiceAccountList>, ApiError> {
    Ok(Json(ServiceAccountList { items: app::service_account_list(&s.db, &opctx).await? }))
}

/// Create a service account. Its rights come from role bindings on
/// `serviceaccount:{name}`; its tokens from `POST …/tokens`.
#[utoipa::path(post, path = "/api/v1/service-accounts", tag = "identity", request_body = NewServiceAccount,
    responses((status = 201, description = "Created", body = ServiceAccount)))]
async fn create_service_account(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<NewServiceAccount>,
) -> Result<Response, ApiError> {
    let account = app::service_account_create(&s.db, &opctx, &body).await?;
    Ok((StatusCode::CREATED, Json(account)).into_response())
}

/// Get a service account.
#[utoipa::path(get, path = "/api/v1/service-accounts/{name}", tag = "identity",
    params(("name" = String, Path, description = "Service account name")),
    responses((status = 200, description = "The service account", body = ServiceAccount)))]
async fn get_service_account(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ServiceAccount>, ApiError> {
    Ok(Json(app::service_account_get(&s.db, &opctx, &name).await?))
}

/// Delete a service account, its tokens and its role bindings.
#[utoipa::path(delete, path = "/api/v1/service-accounts/{name}", tag = "identity",
    params(("name" = String, Path, description = "Service account name")),
    responses((status = 200, description = "Deleted; the account as it was", body = ServiceAccount)))]
async fn delete_service_account(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<ServiceAccount>, ApiError> {
    Ok(Json(app::service_account_delete(&s.db, &opctx, &name).await?))
}

/// A service account's tokens, without their text.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub items: Vec<ServiceAccountToken>,
}

/// The account's tokens: creation, expiry, last use, revocation. Never their text.
#[utoipa::path(get, path = "/api/v1/service-accounts/{name}/tokens", tag = "identity",
    params(("name" = String, Path, description = "Service account name")),
    responses((status = 200, description = "Tokens", body = TokenList)))]
async fn list_tokens(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<TokenList>, ApiError> {
    Ok(Json(TokenList { items: app::sa_token_list(&s.db, &opctx, &name).await? }))
}

/// How long a new token lives.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewToken {
    /// Seconds, 1 to 31,622,400 (366 days).
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub ttl_seconds: u64,
}

/// A new token. `token` is shown this once; Berth keeps only its hash.
#[derive(Serialize, Deserialize, ToSchema)]
pub struct CreatedToken {
    pub token: String,
    #[serde(flatten)]
    pub record: ServiceAccountToken,
}

/// Mint a token for the account.
#[utoipa::path(post, path = "/api/v1/service-accounts/{name}/tokens", tag = "identity",
    params(("name" = String, Path, description = "Service account name")), request_body = NewToken,
    responses((status = 201, description = "Created; the only time the token is shown", body = CreatedToken)))]
async fn create_token(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<NewToken>,
) -> Result<Response, ApiError> {
    let issuer = s.auth.verifier.berth.as_ref().ok_or_else(|| berth_core::Error::Conflict {
        field: None,
        message: "this server has no token signing secret (BERTH_JWT_SECRET), so it cannot mint tokens".into(),
    })?;
    let ttl = std::time::Duration::from_secs(body.ttl_seconds);
    let created = app::sa_token_create(&s.db, &opctx, issuer, &name, ttl).await?;
    Ok((StatusCode::CREATED, Json(CreatedToken { token: created.token, record: created.record })).into_response())
}

/// Revoke a token: the next request bearing it is refused (401).
#[utoipa::path(delete, path = "/api/v1/service-accounts/{name}/tokens/{id}", tag = "identity",
    params(("name" = String, Path, description = "Service account name"), ("id" = Uuid, Path, description = "Token id")),
    responses((status = 200, description = "Revoked", body = ServiceAccountToken)))]
async fn revoke_token(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath((name, id)): ApiPath<(String, Uuid)>,
) -> Result<Json<ServiceAccountToken>, ApiError> {
    Ok(Json(app::sa_token_revoke(&s.db, &opctx, &name, id).await?))
}
