//! `/api/v1/teams/{team}/workloads` and `/api/v1/workloads`

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use berth_app::logs::LogsQuery;
use berth_app::workload as app;
use berth_core::page::PageRequest;
use berth_core::selector::LabelSelector;
use berth_core::workload::{
    Phase, Queue, Workload, WorkloadApply, WorkloadBatch, WorkloadBatchCreated, WorkloadKind, WorkloadSummary,
};
use berth_store::workload::WorkloadFilter;
use futures_util::{StreamExt, TryStreamExt};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{WriteParams, applied, list, list_type, object};
use crate::extract::{ApiJson, ApiPath, ApiQuery, OpCtx, Preconditions};
use crate::problem::ApiError;
use crate::state::AppState;

list_type!(WorkloadList, Workload);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_all_workloads))
        .routes(routes!(list_team_workloads, create_workloads))
        .routes(routes!(get_workload, put_workload, delete_workload))
        .routes(routes!(get_workload_logs))
        .routes(routes!(cancel_workload))
        .routes(routes!(checkpointed_workload))
        .routes(routes!(workload_activity))
        .routes(routes!(get_workload_endpoint))
        .routes(routes!(get_queue))
        .routes(routes!(get_workload_summary))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WorkloadListParams {
    /// Only this team's workloads (on `/api/v1/workloads`; 404 for a team the caller cannot
    /// read, as its path answers).
    pub team: Option<String>,
    /// Only workloads in this phase.
    pub phase: Option<Phase>,
    /// Only workloads admitted to this cluster.
    pub cluster: Option<String>,
    /// Only workloads of this kind.
    pub kind: Option<WorkloadKind>,
    /// Label selector: `key=value`, `key!=value`, `key`, `!key`, comma-separated.
    pub label_selector: Option<String>,
    /// Only workloads submitted by this subject (`metadata.owner.subject`, e.g. `alice` or
    /// `serviceaccount:ci`); `me` for the caller's own.
    pub owner: Option<String>,
    /// Only workloads whose name contains this (names are lower case: so is the search).
    #[param(pattern = "^[a-z0-9-]{1,63}$", example = "bert")]
    pub name_contains: Option<String>,
    /// Items per page, 1 to 500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `next` value of the previous page.
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    pub cursor: Option<String>,
}

impl WorkloadListParams {
    fn filter(&self) -> Result<WorkloadFilter, berth_core::Error> {
        if self.owner.as_deref().is_some_and(|o| o.trim().is_empty()) {
            return Err(berth_core::Error::invalid("owner", "must name a subject, or be me"));
        }
        if self.team.as_deref().is_some_and(str::is_empty) {
            return Err(berth_core::Error::invalid("team", "must name a team"));
        }
        if let Some(part) = &self.name_contains {
            berth_core::validation::check_name_part(part)
                .map_err(|m| berth_core::Error::invalid("name_contains", m))?;
        }
        let labels = match &self.label_selector {
            Some(s) => LabelSelector::parse("label_selector", s)?,
            None => LabelSelector::default(),
        };
        Ok(WorkloadFilter {
            team: self.team.clone(),
            teams: None,
            phase: self.phase,
            cluster: self.cluster.clone(),
            kind: self.kind,
            labels,
            owner_subject: self.owner.clone(),
            name_contains: self.name_contains.clone(),
            owner_issuer: None,
        })
    }
}

/// List workloads across the teams the caller can see, ordered by team then name, with
/// filters.
#[utoipa::path(get, path = "/api/v1/workloads", tag = "workloads", params(WorkloadListParams),
    responses(
        (status = 200, description = "A page of workloads", body = WorkloadList),
        (status = 404, description = "`team` names no team the caller can see",
            content_type = "application/problem+json", body = crate::problem::Problem)))]
async fn list_all_workloads(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<WorkloadListParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    Ok(list::<_, WorkloadList>(app::workload_list(&s.db, &opctx, None, q.filter()?, &page).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct QueueParams {
    /// Only this team's pending workloads.
    pub team: Option<String>,
    /// How many of the first to return, 1 to 500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// The pending workloads of the teams the caller can see, in the order the scheduler will
/// consider them (each with its queue position and the reason it waits), and how many
/// wait in all.
#[utoipa::path(get, path = "/api/v1/queue", tag = "workloads", params(QueueParams),
    responses(
        (status = 200, description = "The head of the queue", body = Queue),
        (status = 404, description = "`team` names no team the caller can see",
            content_type = "application/problem+json", body = crate::problem::Problem)))]
async fn get_queue(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<QueueParams>,
) -> Result<Json<Queue>, ApiError> {
    let limit = PageRequest::<String>::new(q.limit, None)?.limit;
    Ok(Json(app::workload_queue(&s.db, &opctx, q.team.as_deref(), limit).await?))
}

/// How many workloads of the teams the caller can see are in each phase, and their GPUs.
#[utoipa::path(get, path = "/api/v1/workloads/summary", tag = "workloads",
    responses((status = 200, description = "Workloads per phase", body = WorkloadSummary)))]
async fn get_workload_summary(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
) -> Result<Json<WorkloadSummary>, ApiError> {
    Ok(Json(app::workload_summary(&s.db, &opctx).await?))
}

/// List a team's workloads, by name, with filters (`team` is taken from the path).
#[utoipa::path(get, path = "/api/v1/teams/{team}/workloads", tag = "workloads",
    params(("team" = String, Path, description = "Team name"), WorkloadListParams),
    responses((status = 200, description = "A page of workloads", body = WorkloadList)))]
async fn list_team_workloads(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath(team): ApiPath<String>,
    ApiQuery(q): ApiQuery<WorkloadListParams>,
) -> Result<Response, ApiError> {
    let page = PageRequest::new(q.limit, q.cursor.as_deref())?;
    Ok(list::<_, WorkloadList>(app::workload_list(&s.db, &opctx, Some(&team), q.filter()?, &page).await?))
}

/// Submit many new workloads of a team at once (up to 1,000, within the 1 MiB body limit),
/// all or none: one request and one transaction instead of one per workload, for sweeps
/// and pipelines. Each item is a workload as `PUT` takes it and names itself in
/// `metadata.name`, or gives `metadata.generate_name`, a prefix to which Berth adds 5
/// random characters (the answer has the names). An invalid item fails the whole batch (422, fields as
/// `/items/{i}/...`), and so does a name the team already uses (409); use `PUT` to change
/// an existing workload. A workload that can never run as submitted (above a limit,
/// non-preemptible above the guarantee, a shape no cluster could hold) is refused (422,
/// naming the field to change). With `?dry_run=true` nothing is written.
///
/// With an `Idempotency-Key` header (1 to 255 visible ASCII characters, a UUID say), a
/// retry — same caller, team, key and batch, within 24 hours — answers what the first
/// request created (201, `Idempotent-Replayed: true`) and creates nothing; the same key
/// with another batch is a 422 naming `Idempotency-Key`.
#[utoipa::path(post, path = "/api/v1/teams/{team}/workloads", tag = "workloads",
    params(("team" = String, Path, description = "Team name"), WriteParams,
        ("Idempotency-Key" = Option<String>, Header, description = "Makes a retry answer the first result instead of creating again")),
    request_body = WorkloadBatch,
    responses(
        (status = 201, description = "Created, in the order given (or, with `Idempotent-Replayed: true`, as the first request with the key created them)", body = WorkloadBatchCreated),
        (status = 200, description = "`dry_run`: as they would be created (or, with `Idempotent-Replayed: true`, the first answer to the key); nothing written", body = WorkloadBatchCreated)))]
async fn create_workloads(
    State(s): State<AppState>,
    ApiPath(team): ApiPath<String>,
    ApiQuery(q): ApiQuery<WriteParams>,
    headers: HeaderMap,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<WorkloadBatch>,
) -> Result<Response, ApiError> {
    let key = match headers.get(app::IDEMPOTENCY_KEY) {
        Some(v) => Some(v.to_str().map_err(|_| {
            berth_core::Error::invalid(app::IDEMPOTENCY_KEY, "must be 1 to 255 visible ASCII characters")
        })?),
        None => None,
    };
    let (status, batch) = if q.dry_run {
        (StatusCode::OK, app::workload_create_batch_dry_run(&s.db, &opctx, &team, &body, key).await?)
    } else {
        (StatusCode::CREATED, app::workload_create_batch(&s.db, &opctx, &team, &body, key).await?)
    };
    let created = (status, Json(WorkloadBatchCreated { items: batch.items }));
    Ok(if batch.replayed {
        ([("idempotent-replayed", "true")], created).into_response()
    } else {
        created.into_response()
    })
}

/// Get a workload.
#[utoipa::path(get, path = "/api/v1/teams/{team}/workloads/{name}", tag = "workloads",
    params(("team" = String, Path, description = "Team name"), ("name" = String, Path, description = "Workload name")),
    responses((status = 200, description = "The workload", body = Workload, headers(("ETag" = String)))))]
async fn get_workload(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath((team, name)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let workload = app::workload_get(&s.db, &opctx, &team, &name).await?;
    Ok(object(StatusCode::OK, &workload.metadata, &workload))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LogsParams {
    /// Which task (0-based: a training job's rank, a serving job's replica); 0 by default.
    pub task: Option<u32>,
    /// Which attempt (a requeued workload has one per run); the current one by default.
    pub attempt: Option<u32>,
    /// Only the last this many lines.
    pub tail: Option<u32>,
    /// Keep the answer open and send each new line as it is printed, until the task ends
    /// (`kubectl logs -f`).
    #[serde(default)]
    pub follow: bool,
}

/// What a task of the workload's job printed, as plain text: all of it, or its last `tail`
/// lines; with `follow=true` the answer streams each new line until the task ends.
/// Kubernetes jobs answer from their pods' logs, simulated jobs from the lines they write,
/// Slurm jobs from their output file where berthd can read it (a filesystem shared with the
/// cluster; its last MiB, then, followed, what it gains, read every second). Where the
/// output cannot be read, or before the workload has a job, the answer is 409 saying why
/// and where it is.
#[utoipa::path(get, path = "/api/v1/teams/{team}/workloads/{name}/logs", tag = "workloads",
    params(("team" = String, Path, description = "Team name"), ("name" = String, Path, description = "Workload name"), LogsParams),
    responses(
        (status = 200, description = "The output", body = String, content_type = "text/plain; charset=utf-8"),
        (status = 409, description = "No output Berth can read: the problem says why and where it is", body = crate::problem::Problem, content_type = "application/problem+json")))]
async fn get_workload_logs(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiPath((team, name)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<LogsParams>,
) -> Result<Response, ApiError> {
    let query = LogsQuery { task: q.task.unwrap_or(0), attempt: q.attempt, tail: q.tail, follow: q.follow };
    let stream = berth_app::logs::workload_logs(&s.db, &opctx, &s.backends, &team, &name, &query).await?;
    let content_type = [(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")];
    if q.follow {
        // A failure mid-stream ends the answer early (its status is long sent).
        let body = stream.map(|chunk| chunk.map_err(|e| std::io::Error::other(e.to_string())));
        return Ok((content_type, axum::body::Body::from_stream(body)).into_response());
    }
    let chunks: Vec<String> =
        stream.try_collect().await.map_err(|e| berth_core::Error::Unavailable(format!("reading the logs: {e}")))?;
    Ok((content_type, chunks.concat()).into_response())
}

/// Submit or replace a workload. A new workload starts in phase `Pending`.
///
/// Once admitted, a workload holds its shape on its cluster: only `priority`,
/// `max_runtime_seconds` and `inference` may change, and any other change is refused (422,
/// naming the field; cancel and resubmit). A workload that has ended keeps the spec it ran
/// with (409 for a change).
///
/// A workload that can never run as submitted is refused (422, naming the field to
/// change): above its team's or an ancestor's limit, non-preemptible above its team's
/// guarantee, or — once every cluster its placement allows has reported its nodes — a
/// shape none of them could hold even empty, or work none of them can run. With
/// `?dry_run=true` every check runs and the answer is the one the write would give, with
/// nothing written.
#[utoipa::path(put, path = "/api/v1/teams/{team}/workloads/{name}", tag = "workloads",
    params(
        ("team" = String, Path, description = "Team name"),
        ("name" = String, Path, description = "Workload name (DNS-1123 label)"),
        WriteParams,
        crate::openapi::IfMatchHeader),
    request_body = WorkloadApply,
    responses(
        (status = 200, description = "Replaced, or unchanged; with `dry_run`, the workload as it would be (nothing written, no ETag)", body = Workload, headers(("ETag" = String))),
        (status = 201, description = "Created", body = Workload, headers(("ETag" = String), ("Location" = String)))))]
async fn put_workload(
    State(s): State<AppState>,
    ApiPath((team, name)): ApiPath<(String, String)>,
    ApiQuery(q): ApiQuery<WriteParams>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
    ApiJson(body): ApiJson<WorkloadApply>,
) -> Result<Response, ApiError> {
    if q.dry_run {
        // Nothing was created or changed: 200 and the workload as it would be, without
        // an ETag or Location of something that does not exist.
        let (workload, _) = app::workload_apply_dry_run(&s.db, &opctx, &team, &name, &body, if_match.as_ref()).await?;
        return Ok((StatusCode::OK, Json(workload)).into_response());
    }
    let (workload, outcome) = app::workload_apply(&s.db, &opctx, &team, &name, &body, if_match.as_ref()).await?;
    Ok(applied(outcome, &format!("/api/v1/teams/{team}/workloads/{name}"), &workload.metadata, &workload))
}

/// Cancel a workload and keep it (as `scancel`): one without a job ends `Cancelled` at
/// once; one with a job keeps its phase with `status.cancellation` set while its job is
/// stopped with the cancel grace period, then ends `Cancelled`. Either way it stays, with
/// its events and times, until the retention period (`BERTH_RETENTION_DAYS`) removes it.
/// Only its owner or an admin of its team may cancel it. Cancelling again while it stops
/// answers 202 again; an ended workload is a 409.
#[utoipa::path(post, path = "/api/v1/teams/{team}/workloads/{name}/cancel", tag = "workloads",
    params(
        ("team" = String, Path, description = "Team name"),
        ("name" = String, Path, description = "Workload name"),
        crate::openapi::IfMatchHeader),
    responses(
        (status = 202, description = "Cancelled, or being cancelled; the workload", body = Workload, headers(("ETag" = String))),
        (status = 409, description = "It has ended already, or is being deleted", body = crate::problem::Problem, content_type = "application/problem+json")))]
async fn cancel_workload(
    State(s): State<AppState>,
    ApiPath((team, name)): ApiPath<(String, String)>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
) -> Result<Response, ApiError> {
    let workload = app::workload_cancel(&s.db, &opctx, &team, &name, if_match.as_ref()).await?;
    Ok(object(StatusCode::ACCEPTED, &workload.metadata, &workload))
}

/// Acknowledge a checkpoint: the workload's job, told to stop (preempted, cancelled or
/// deleted: SIGTERM, a `berth.dev/stop-by` annotation, Slurm's signal), says its checkpoint
/// is written, so its job is stopped now and its GPUs released without waiting out the
/// rest of its grace period. The job calls it with the token in its environment
/// (`curl -X POST -H "Authorization: Bearer $BERTH_JOB_TOKEN" "$BERTH_CHECKPOINTED_URL"`); that
/// token is good for this call on this attempt only. Anyone who may cancel the workload
/// may call it too. Calling it again answers 204 again.
#[utoipa::path(post, path = "/api/v1/teams/{team}/workloads/{name}/checkpointed", tag = "workloads",
    params(
        ("team" = String, Path, description = "Team name"),
        ("name" = String, Path, description = "Workload name")),
    responses(
        (status = 204, description = "Acknowledged: its job is stopped now"),
        (status = 409, description = "It was not told to stop, has ended, or the token's attempt is over", body = crate::problem::Problem, content_type = "application/problem+json")))]
async fn checkpointed_workload(
    State(s): State<AppState>,
    ApiPath((team, name)): ApiPath<(String, String)>,
    OpCtx(opctx): OpCtx,
) -> Result<StatusCode, ApiError> {
    app::workload_checkpointed(&s.db, &opctx, &team, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Report activity: a running notebook (or service) says it is in use, so its idle
/// timeout (`spec.notebook.idle_timeout_seconds`) counts from now. The notebook calls it
/// while it is used, with its own token (`curl -X POST -H "Authorization: Bearer
/// $BERTH_JOB_TOKEN" "$BERTH_ACTIVITY_URL"`); anyone who may cancel it may call it too.
/// Reports within 10 s of the last one change nothing.
#[utoipa::path(post, path = "/api/v1/teams/{team}/workloads/{name}/activity", tag = "workloads",
    params(
        ("team" = String, Path, description = "Team name"),
        ("name" = String, Path, description = "Workload name")),
    responses(
        (status = 204, description = "Recorded"),
        (status = 409, description = "It is neither a notebook nor a service, it does not run, or the token's attempt is over", body = crate::problem::Problem, content_type = "application/problem+json")))]
async fn workload_activity(
    State(s): State<AppState>,
    ApiPath((team, name)): ApiPath<(String, String)>,
    OpCtx(opctx): OpCtx,
) -> Result<StatusCode, ApiError> {
    app::workload_activity(&s.db, &opctx, &team, &name, chrono::Utc::now()).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Where a running inference service or notebook answers (`status.backend_ref.url`: on
/// Kubernetes its Service's in-cluster URL) and, for a notebook, the token that opens it
/// (`?token=`), with its last activity and when it is stopped if idle. Only its owner and
/// admins of its team may read it.
#[utoipa::path(get, path = "/api/v1/teams/{team}/workloads/{name}/endpoint", tag = "workloads",
    params(
        ("team" = String, Path, description = "Team name"),
        ("name" = String, Path, description = "Workload name")),
    responses(
        (status = 200, description = "Its endpoint", body = berth_core::workload::Endpoint),
        (status = 403, description = "The caller is neither its owner nor an admin of its team", body = crate::problem::Problem, content_type = "application/problem+json"),
        (status = 409, description = "It serves nothing (yet)", body = crate::problem::Problem, content_type = "application/problem+json")))]
async fn get_workload_endpoint(
    State(s): State<AppState>,
    ApiPath((team, name)): ApiPath<(String, String)>,
    OpCtx(opctx): OpCtx,
) -> Result<Json<berth_core::workload::Endpoint>, ApiError> {
    let issuer = s.auth.verifier.berth.as_ref();
    Ok(Json(app::workload_endpoint(&s.db, &opctx, issuer, &team, &name).await?))
}

/// Delete a workload.
///
/// Answers 202: a workload that never reached a backend, or has ended, is removed at once;
/// one that runs is marked (`metadata.deletion_timestamp`) and removed by the controllers
/// once its backend job is cancelled. To stop a workload and keep its record, cancel it
/// instead (`POST .../cancel`). Only its owner or an admin of its team may delete it.
#[utoipa::path(delete, path = "/api/v1/teams/{team}/workloads/{name}", tag = "workloads",
    params(
        ("team" = String, Path, description = "Team name"),
        ("name" = String, Path, description = "Workload name"),
        crate::openapi::IfMatchHeader),
    responses((status = 202, description = "Deletion accepted; the workload as marked", body = Workload)))]
async fn delete_workload(
    State(s): State<AppState>,
    ApiPath((team, name)): ApiPath<(String, String)>,
    Preconditions(if_match): Preconditions,
    OpCtx(opctx): OpCtx,
) -> Result<Response, ApiError> {
    let workload = app::workload_delete(&s.db, &opctx, &team, &name, if_match.as_ref()).await?;
    Ok(object(StatusCode::ACCEPTED, &workload.metadata, &workload))
}
