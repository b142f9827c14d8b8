//! `/api/v1/usage/report`: GPU-hours and cost, as JSON or CSV.

use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use berth_app::accounting as app;
use berth_core::usage::{Bucket, GroupBy, ReportRequest, UsageReport, report_csv};
use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::{ApiQuery, OpCtx};
use crate::problem::ApiError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_usage_report))
}

/// How the report is answered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReportFormat {
    #[default]
    Json,
    Csv,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReportParams {
    /// Start of the period (RFC 3339); default 30 days before `to`.
    pub from: Option<DateTime<Utc>>,
    /// End of the period, not included (RFC 3339); default now.
    pub to: Option<DateTime<Utc>>,
    /// What rows are grouped by, comma-separated: `team`, `owner`, `flavor`, `cluster`,
    /// `kind` (of workload), `backend` (slurm, kubernetes). Default: one row per bucket.
    #[param(example = "team,owner", pattern = "^[a-z,]*$")]
    pub group_by: Option<String>,
    /// Cut the period into minutes, hours, days, weeks (from Monday) or months, in UTC.
    /// Default: one bucket, the whole period.
    pub bucket: Option<Bucket>,
    /// `json` (default) or `csv` (the rows, with a header line).
    pub format: Option<ReportFormat>,
}

/// GPU-hours and cost of the work the caller may read over a period — ended attempts from
/// the accounting ledger and work still running, up to now — grouped as asked, with every
/// team's own and subtree (department) totals, in-quota and borrowed, and its idle
/// guarantee. As CSV with `format=csv`.
#[utoipa::path(get, path = "/api/v1/usage/report", tag = "usage", params(ReportParams),
    responses((status = 200, description = "The report", content(
        (UsageReport = "application/json"),
        (String = "text/csv")))))]
async fn get_usage_report(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
    ApiQuery(q): ApiQuery<ReportParams>,
) -> Result<Response, ApiError> {
    let now = Utc::now();
    // Without `to` the report ends now: a `from` not before it is what is wrong.
    if q.to.is_none() && q.from.is_some_and(|from| from >= now) {
        let why = "must be in the past: the report ends now unless `to` says otherwise";
        return Err(berth_core::Error::invalid("from", why).into());
    }
    let to = q.to.unwrap_or(now);
    let mut group_by = Vec::new();
    for part in q.group_by.as_deref().unwrap_or("").split(',').filter(|p| !p.is_empty()) {
        let g = GroupBy::parse(part).ok_or_else(|| {
            berth_core::Error::invalid(
                "group_by",
                format!("{part:?} is not one of team, owner, flavor, cluster, kind, backend"),
            )
        })?;
        if !group_by.contains(&g) {
            group_by.push(g);
        }
    }
    let req = ReportRequest { from: q.from.unwrap_or(to - TimeDelta::days(30)), to, group_by, bucket: q.bucket };
    let report = app::usage_report(&s.db, &opctx, &req, now).await?;
    Ok(match q.format.unwrap_or_default() {
        ReportFormat::Json => Json(report).into_response(),
        ReportFormat::Csv => {
            let name = format!(
                "attachment; filename=\"berth-usage-{}-{}.csv\"",
                report.from.format("%Y%m%dT%H%M%SZ"),
                report.to.format("%Y%m%dT%H%M%SZ")
            );
            (
                [(header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()), (header::CONTENT_DISPOSITION, name)],
                report_csv(&report),
            )
                .into_response()
        }
    })
}
