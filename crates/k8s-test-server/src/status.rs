//! Errors as Kubernetes `Status` objects.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::resources::ResourceType;

/// One field-level problem of an invalid object.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Cause {
    /// JSON path of the field, e.g. `spec.template`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl Cause {
    /// A cause for `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// A failed request, answered with a `Status` body.
#[derive(Clone, Debug)]
pub(crate) struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason, e.g. `NotFound`.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` of the Status, if any.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }

    fn with_details(mut self, rt: &ResourceType, kind: &str, name: &str) -> Self {
        self.details = Some(json!({"name": name, "group": rt.group, "kind": kind}));
        self
    }

    /// 404: the object does not exist.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{} \"{name}\" not found", rt.qualified())).with_details(rt, rt.plural, name)
    }

    /// 404: the path names nothing the server serves.
    pub fn unknown_path(path: &str) -> Self {
        Self::new(404, "NotFound", format!("the server could not find the requested resource ({path})"))
    }

    /// 409: an object with that name exists.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", rt.qualified()))
            .with_details(rt, rt.plural, name)
    }

    /// 409: the write was based on an outdated resourceVersion (or failed a precondition).
    pub fn conflict(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self::new(409, "Conflict", format!("Operation cannot be fulfilled on {} \"{name}\": {why}", rt.qualified()))
            .with_details(rt, rt.plural, name)
    }

    /// 422: the object failed validation.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> Self {
        let summary = causes.iter().map(|c| format!("{}: {}", c.field, c.message)).collect::<Vec<_>>().join(", ");
        let mut err = Self::new(422, "Invalid", format!("{} \"{name}\" is invalid: {summary}", rt.kind))
            .with_details(rt, rt.kind, name);
        let causes: Vec<Value> = causes
            .into_iter()
            .map(|c| json!({"reason": "FieldValueInvalid", "message": c.message, "field": c.field}))
            .collect();
        if let Some(details) = err.details.as_mut() {
            details["causes"] = Value::Array(causes);
        }
        err
    }

    /// 400: the request itself is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401: missing or wrong bearer token.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 405: the verb is not served on this path.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 415: the patch type is not supported.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// The watch ERROR event object for a resourceVersion older than the retained history.
pub(crate) fn expired(requested: u64, oldest: u64) -> Value {
    ApiError::new(410, "Expired", format!("too old resource version: {requested} ({oldest})")).to_status()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        crate::http::json_response(code, &self.to_status())
    }
}
