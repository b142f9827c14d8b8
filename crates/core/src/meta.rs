//! The object envelope shared by every resource: `{metadata, spec, status}`.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

/// Free-form `key: value` labels, matched by label selectors.
pub type Labels = BTreeMap<String, String>;

/// Metadata of a stored object. Everything but `name` and `labels` is set by Berth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ObjectMeta {
    /// Unique within the kind (within the team for workloads); a DNS-1123 label.
    #[schema(example = "nlp")]
    pub name: String,
    /// For workloads: the owning team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// Assigned at creation, never reused.
    pub uid: Uuid,
    #[serde(default)]
    pub labels: Labels,
    /// Increments each time `spec` changes, and only then.
    #[schema(example = 1)]
    pub generation: i64,
    /// Changes on every write (spec, labels or status). Sent back as the `ETag`; send it in
    /// `If-Match` or here to make a write conditional.
    #[schema(example = "42")]
    pub resource_version: String,
    pub creation_timestamp: DateTime<Utc>,
    pub update_timestamp: DateTime<Utc>,
    /// Set when deletion was requested and is still being finished by the controllers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<DateTime<Utc>>,
    /// For workloads: who submitted it, set by Berth from the caller's token (absent on
    /// workloads submitted before owners were recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<Owner>,
}

/// Who submitted a workload: the subject of the token (a user's `sub`, or
/// `serviceaccount:{name}`) and its issuer; for a service account, also its uid (an account
/// created again under the same name is another owner: it inherits nothing).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Owner {
    #[schema(example = "alice")]
    pub subject: String,
    #[schema(example = "https://login.example.org")]
    pub issuer: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_uid: Option<uuid::Uuid>,
}

/// Metadata as a client sends it in a PUT body.
///
/// Only `labels` is written. `name` and `team` must match the path when given.
/// `resource_version`, when given, must equal the stored one (else 409), and `uid`, when
/// given, must be the stored object's (else 409); either given for an object that does not
/// exist is a 409 too, not a create (a deleted object is not brought back by sending it
/// again as it was read). The read-only fields Berth sets
/// (`generation`, timestamps) are accepted so that an object fetched with GET can be sent
/// back as is, and ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyMeta {
    /// The name in the path, when given.
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub name: Option<String>,
    /// `POST /api/v1/teams/{team}/workloads` only, for an item without `name`: a prefix
    /// (at most 58 characters) to which Berth adds 5 random characters to make a name no
    /// workload of the team has (as Kubernetes' `generateName`). Ignored by `PUT`.
    #[schema(pattern = "^[a-z0-9][-a-z0-9]{0,57}$")]
    pub generate_name: Option<String>,
    /// The team in the path (workloads), when given.
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub team: Option<String>,
    pub uid: Option<Uuid>,
    /// At most 64 labels: keys `[prefix/]name` as in Kubernetes, values at most 63
    /// characters.
    pub labels: Option<Labels>,
    /// The stored version this write expects (digits), as `If-Match` carries it.
    #[schema(pattern = "^[0-9]+$")]
    pub resource_version: Option<String>,
    /// Read-only; ignored.
    pub generation: Option<i64>,
    /// Read-only; ignored.
    pub creation_timestamp: Option<DateTime<Utc>>,
    /// Read-only; ignored.
    pub update_timestamp: Option<DateTime<Utc>>,
    /// Read-only; ignored.
    pub deletion_timestamp: Option<DateTime<Utc>>,
    /// Read-only (set from the submitter's token); ignored.
    pub owner: Option<Owner>,
}
