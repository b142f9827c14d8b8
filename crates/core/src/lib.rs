//! Berth's domain model: the API's nouns (flavors, teams, clusters, workloads), their
//! validation, and the pure rules of declarative apply (generation, preconditions).
//!
//! This crate does no IO. Everything here can be unit-tested without a database, and every
//! other crate (store, scheduler, adapters, HTTP layer) speaks these types.

pub mod apply;
pub mod auth;
pub mod cluster;
pub mod controller;
pub mod error;
pub mod event;
pub mod flavor;
pub mod ids;
pub mod meta;
pub mod page;
pub mod redact;
pub mod selector;
pub mod team;
pub mod usage;
pub mod validation;
pub mod workload;

pub use error::{Error, Result};
pub use ids::{ClusterId, FlavorId, TeamId, WorkloadId};
pub use validation::{FieldError, Validator};
