//! What the controllers report about themselves: who leads, and each reconciler's last
//! pass.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The replica running the controllers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Leader {
    /// The replica's id (`BERTH_REPLICA_ID`, by default host and process id).
    pub holder: String,
    pub since: DateTime<Utc>,
    /// The leader renews this every second; an old value means no replica leads.
    pub renewed_at: DateTime<Utc>,
    /// The lease's fencing token: one more at every change of leader; only writes made
    /// under the current epoch land.
    pub epoch: i64,
}

/// One reconciler's last reported pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ControllerReport {
    #[schema(example = "scheduler")]
    pub name: String,
    pub holder: String,
    pub updated_at: DateTime<Utc>,
    /// Passes run and failed, the last pass's duration, its typed status (`last.ok`) or
    /// error (`last.error`), and how long the controller rests after it (`rest_ms`, and
    /// `rest_for_submissions_ms` unless a change that may free room comes first).
    pub status: serde_json::Value,
}

/// `GET /api/v1/controllers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ControllersOverview {
    pub leader: Option<Leader>,
    pub controllers: Vec<ControllerReport>,
}
