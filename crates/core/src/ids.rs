//! Typed ids: each resource's uid is its own type, so a `TeamId` can never be passed where
//! a `WorkloadId` is expected. New ids are UUIDv7 (time-ordered, friendly to B-tree indexes).

use serde::{Deserialize, Serialize};
use uuid::Uuid;

macro_rules! typed_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub Uuid);

        impl $name {
            /// A fresh, time-ordered id.
            #[must_use]
            pub fn new() -> Self {
                Self(Uuid::now_v7())
            }
        }

        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                self.0.fmt(f)
            }
        }

        impl From<Uuid> for $name {
            fn from(uuid: Uuid) -> Self {
                Self(uuid)
            }
        }
    };
}

typed_id!(
    /// The uid of a GPU flavor.
    FlavorId
);
typed_id!(
    /// The uid of a team in the quota tree.
    TeamId
);
typed_id!(
    /// The uid of a registered cluster.
    ClusterId
);
typed_id!(
    /// The uid of a workload.
    WorkloadId
);
