//! The row shape shared by the cluster-scoped kinds (flavors, teams, clusters).

use berth_core::meta::{Labels, ObjectMeta};
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use uuid::Uuid;

/// One row of `flavors`, `teams` or `clusters`, as every `SELECT`/`RETURNING` there reads it.
pub(crate) struct ObjectRow<S, T> {
    pub uid: Uuid,
    pub name: String,
    pub labels: Json<Labels>,
    pub spec: Json<S>,
    pub status: Json<T>,
    pub generation: i64,
    pub resource_version: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl<S, T> ObjectRow<S, T> {
    /// Splits the row into the envelope's three parts.
    pub fn into_parts(self) -> (ObjectMeta, S, T) {
        let meta = ObjectMeta {
            name: self.name,
            team: None,
            uid: self.uid,
            labels: self.labels.0,
            generation: self.generation,
            resource_version: self.resource_version.to_string(),
            creation_timestamp: self.created_at,
            update_timestamp: self.updated_at,
            deletion_timestamp: None,
            owner: None,
        };
        (meta, self.spec.0, self.status.0)
    }
}
