//! Events (what happened to an object) and audit records (who changed what).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Whether an event is routine or needs attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }

    /// Parses the stored form.
    pub fn from_db(s: &str) -> Self {
        if s == "Warning" { Self::Warning } else { Self::Normal }
    }
}

/// Something that happened to a workload, in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Event {
    /// Increases with time; the timeline's order.
    pub id: i64,
    #[serde(rename = "type")]
    pub event_type: EventType,
    /// A short machine-readable CamelCase reason, e.g. `Created`, `SpecUpdated`.
    #[schema(example = "Created")]
    pub reason: String,
    pub message: String,
    pub time: DateTime<Utc>,
}

/// The write an audit record describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuditVerb {
    Create,
    Update,
    Delete,
    /// A workload's cancellation.
    Cancel,
}

impl AuditVerb {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
            Self::Delete => "delete",
            Self::Cancel => "cancel",
        }
    }

    /// Parses the stored form.
    pub fn from_db(s: &str) -> Self {
        match s {
            "create" => Self::Create,
            "delete" => Self::Delete,
            "cancel" => Self::Cancel,
            _ => Self::Update,
        }
    }
}

/// One mutation: who did what to which object, and how its generation moved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditRecord {
    pub id: i64,
    pub time: DateTime<Utc>,
    /// Who made the change.
    #[schema(example = "alice")]
    pub actor: String,
    pub verb: AuditVerb,
    /// The object's kind: `flavor`, `team`, `cluster` or `workload`.
    #[schema(example = "workload")]
    pub kind: String,
    /// For workloads: the owning team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub name: String,
    pub uid: Uuid,
    pub generation_before: Option<i64>,
    pub generation_after: Option<i64>,
    /// The request that made the change, to find it in the logs.
    pub request_id: Option<String>,
    /// For an update: the spec before the change ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_before: Option<serde_json::Value>,
    /// ... and after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_after: Option<serde_json::Value>,
}

/// Who is acting: an authenticated principal's subject, or a component of Berth itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub subject: String,
    /// The request id, recorded with audit records.
    pub request_id: Option<String>,
}

impl Actor {
    pub fn new(subject: impl Into<String>, request_id: Option<String>) -> Self {
        Self { subject: subject.into(), request_id }
    }
}
