//! RFC 9457 problem details: the one place where domain errors become HTTP responses.
//!
//! Internal detail (SQL, backend text) is logged with the request id and never returned;
//! a 500 carries only that id.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_core::{Error, FieldError};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "type": "urn:berth:problem:validation",
    "title": "The request is invalid",
    "status": 422,
    "detail": "1 field is invalid",
    "request_id": "0f5c3f1e-6c1b-4b8e-9a55-1c1d5e1f2a3b",
    "errors": [{"field": "/spec/quotas/0/limit", "message": "limit (4) must not be below guaranteed (8)"}]
}))]
pub struct Problem {
    /// A URI naming the kind of problem.
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The request path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Quote it when reporting a problem: it finds the request in the server's logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// For invalid input: each broken rule and the field it concerns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

impl Problem {
    pub fn new(status: StatusCode, slug: &str, title: &str, detail: impl Into<Option<String>>) -> Self {
        Self {
            problem_type: format!("urn:berth:problem:{slug}"),
            title: title.into(),
            status: status.as_u16(),
            detail: detail.into(),
            instance: None,
            request_id: None,
            errors: Vec::new(),
        }
    }

    /// A 400 for input that could not be parsed at all; `field` names where, if known.
    pub fn bad_request(field: Option<String>, detail: String) -> Self {
        let mut p =
            Self::new(StatusCode::BAD_REQUEST, "malformed-request", "The request could not be parsed", detail.clone());
        p.errors = field.map(|f| FieldError::new(f, detail)).into_iter().collect();
        p
    }

    /// The generic problem for a status that no handler described (404 on an unknown
    /// path, 405, …).
    pub fn for_status(status: StatusCode) -> Self {
        let (slug, title) = match status {
            StatusCode::NOT_FOUND => ("not-found", "No such resource"),
            StatusCode::METHOD_NOT_ALLOWED => ("method-not-allowed", "Method not allowed on this resource"),
            StatusCode::PAYLOAD_TOO_LARGE => ("payload-too-large", "The request body is too large"),
            StatusCode::UNSUPPORTED_MEDIA_TYPE => ("unsupported-media-type", "Unsupported content type"),
            StatusCode::REQUEST_TIMEOUT => ("timeout", "The request took too long"),
            s if s.is_server_error() => ("internal", "Internal server error"),
            _ => ("http-error", status.canonical_reason().unwrap_or("HTTP error")),
        };
        Self::new(status, slug, title, None)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut response = (status, axum::Json(self)).into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if status == StatusCode::SERVICE_UNAVAILABLE {
            // A dependency is down or busy: come back in a second (a 429 sets its own).
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A handler's error: a domain error or a ready-made problem.
#[derive(Debug)]
pub enum ApiError {
    Domain(Error),
    Problem(Box<Problem>),
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        Self::Domain(e)
    }
}

impl From<Problem> for ApiError {
    fn from(p: Problem) -> Self {
        Self::Problem(Box::new(p))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            Self::Problem(p) => p.into_response(),
            Self::Domain(e) => problem_of(e).into_response(),
        }
    }
}

/// Maps a domain error to its problem.
pub fn problem_of(e: Error) -> Problem {
    match e {
        Error::NotFound { kind, name } => Problem::new(
            StatusCode::NOT_FOUND,
            "not-found",
            "No such object",
            format!("{kind} {name:?} does not exist"),
        ),
        Error::Invalid(errors) => {
            let n = errors.len();
            let mut p = Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "validation",
                "The request is invalid",
                format!("{n} field{} invalid: {}", if n == 1 { " is" } else { "s are" }, errors[0].message),
            );
            p.errors = errors;
            p
        }
        Error::Conflict { field, message } => {
            let mut p = Problem::new(
                StatusCode::CONFLICT,
                "conflict",
                "The request conflicts with the current state",
                message.clone(),
            );
            p.errors = field.filter(|f| !f.is_empty()).map(|f| FieldError::new(f, message)).into_iter().collect();
            p
        }
        Error::Forbidden(message) => Problem::new(StatusCode::FORBIDDEN, "forbidden", "Not allowed", message),
        Error::PreconditionFailed(message) => {
            Problem::new(StatusCode::PRECONDITION_FAILED, "precondition-failed", "A precondition failed", message)
        }
        Error::Unavailable(detail) => {
            tracing::warn!(%detail, "dependency unavailable");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Service temporarily unavailable",
                "a dependency is unavailable or busy; retry shortly".to_owned(),
            )
        }
        Error::Internal(detail) => {
            tracing::error!(%detail, "internal error");
            Problem::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "Internal server error",
                "an unexpected error occurred; quote the request_id when reporting it".to_owned(),
            )
        }
    }
}
