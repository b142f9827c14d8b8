//! Berth's application layer: one function per use case the API offers. Each validates its
//! input, checks references to other objects, and writes the change together with its
//! audit record (and events) in one transaction — so nothing is ever half written.
//!
//! Each takes the caller's [`context::OpContext`] and checks access first, so
//! authorization lives here and nowhere else. The HTTP layer calls exactly one of these per
//! request.

pub mod access_cache;
pub mod accounting;
pub mod change_notice;
pub mod cluster;
pub mod context;
pub mod controller;
pub mod demo;
pub mod feasibility;
pub mod flavor;
pub mod group_commit;
pub mod history;
pub mod identity;
pub mod logs;
pub mod metrics;
pub mod team;
pub mod workload;
pub mod workload_cache;

use berth_core::Error;
use berth_core::apply::{Applied, Current};
use berth_core::event::{Actor, AuditVerb};
use berth_core::meta::ObjectMeta;
pub use berth_store::PgPool;
use berth_store::audit::{AuditEntry, audit_record};
use berth_store::{PerDatabase, database_key};

/// How many times an apply retries when a concurrent create of the same name wins the race
/// between our lookup and our insert. The retry then sees the object and updates it.
const CREATE_RACE_ATTEMPTS: usize = 3;

/// The outcome of an apply: the object as stored, and whether it was created, updated or
/// left unchanged.
pub type ApplyResult<T> = Result<(T, Applied), Error>;

fn resource_version(meta: &ObjectMeta) -> Result<i64, Error> {
    meta.resource_version
        .parse()
        .map_err(|_| Error::Internal(format!("stored resource_version {:?} is not a number", meta.resource_version)))
}

fn current<'a, S>(meta: &'a ObjectMeta, spec: &'a S) -> Result<Current<'a, S>, Error> {
    Ok(Current {
        uid: meta.uid,
        generation: meta.generation,
        resource_version: resource_version(meta)?,
        spec,
        labels: &meta.labels,
    })
}

/// Records a create or update of `meta`'s object, whose spec is now `spec`; `before` is the
/// object as it was (its generation and spec), kept with an update's record.
async fn audit_apply<S: serde::Serialize>(
    tx: &mut berth_store::Tx<'_>,
    actor: &Actor,
    kind: &'static str,
    (meta, spec): (&ObjectMeta, &S),
    applied: Applied,
    before: Option<(i64, &S)>,
) -> Result<(), Error> {
    let verb = if applied == Applied::Created { AuditVerb::Create } else { AuditVerb::Update };
    let json = |s: &S| serde_json::to_value(s).map_err(|e| Error::Internal(format!("serializing a spec: {e}")));
    let spec_change = match before {
        Some((_, old)) if verb == AuditVerb::Update => Some((json(old)?, json(spec)?)),
        _ => None,
    };
    let before = before.map(|(generation, _)| generation);
    let entry = AuditEntry {
        actor,
        verb,
        kind,
        team: meta.team.as_deref(),
        name: &meta.name,
        uid: meta.uid,
        generation_before: before,
        generation_after: Some(meta.generation),
        spec_change,
    };
    audit_record(&mut **tx, &entry).await
}

/// Records the deletion (`Delete`) or cancellation (`Cancel`) of `meta`'s object.
async fn audit_change(
    tx: &mut berth_store::Tx<'_>,
    actor: &Actor,
    verb: AuditVerb,
    kind: &'static str,
    meta: &ObjectMeta,
) -> Result<(), Error> {
    let entry = AuditEntry {
        actor,
        verb,
        kind,
        team: meta.team.as_deref(),
        name: &meta.name,
        uid: meta.uid,
        generation_before: Some(meta.generation),
        generation_after: (verb != AuditVerb::Delete).then_some(meta.generation),
        spec_change: None,
    };
    audit_record(&mut **tx, &entry).await
}

fn lost_create_race(kind: &'static str, name: &str) -> Error {
    Error::Unavailable(format!("{kind} {name:?} kept being created concurrently; retry"))
}

/// Turns a list of missing names into one field error per occurrence.
fn missing_references(
    missing: &[String],
    refs: impl Iterator<Item = (String, String)>,
    what: &str,
) -> Vec<berth_core::FieldError> {
    refs.filter(|(_, name)| missing.contains(name))
        .map(|(field, name)| berth_core::FieldError::new(field, format!("{what} {name:?} does not exist")))
        .collect()
}

/// Whether a write is kept, or only tried (a dry run: the same statements in a
/// transaction that is rolled back, so the answer is exactly what the write would give).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Write {
    Commit,
    RollBack,
}
