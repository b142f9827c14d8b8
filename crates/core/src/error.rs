//! The one domain error enum. Every layer returns it; the HTTP layer maps it to RFC 9457
//! problem details in exactly one place (`api/src/problem.rs`).

use crate::validation::FieldError;

/// What went wrong, in terms a client can act on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The named object does not exist (404).
    #[error("{kind} {name:?} not found")]
    NotFound { kind: &'static str, name: String },
    /// The request is well-formed but breaks a rule; each entry names the field (422).
    #[error("invalid request: {}", summary(.0))]
    Invalid(Vec<FieldError>),
    /// The caller may see the object but not make this change (403).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// The request conflicts with the current state, e.g. a stale `resource_version` in the
    /// body or a delete blocked by dependants (409).
    #[error("{message}")]
    Conflict { field: Option<String>, message: String },
    /// An `If-Match` precondition did not hold (412).
    #[error("{0}")]
    PreconditionFailed(String),
    /// A dependency (the database) is unavailable or overloaded; the client may retry (503).
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// A fault on our side. The detail is logged, never returned to the client (500).
    #[error("internal error: {0}")]
    Internal(String),
}

/// Shorthand for results carrying the domain [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A validation error about a single field.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid(vec![FieldError::new(field, message)])
    }

    /// A 409 conflict that names the field at fault.
    pub fn conflict(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Conflict { field: Some(field.into()), message: message.into() }
    }
}

fn summary(errors: &[FieldError]) -> String {
    errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect::<Vec<_>>().join("; ")
}
