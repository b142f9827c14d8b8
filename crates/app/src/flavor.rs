//! Flavor use cases.

use berth_core::apply::{self, Applied, ApplyAction, IfMatch};
use berth_core::event::AuditVerb;
use berth_core::flavor::{Flavor, FlavorApply};
use berth_core::page::{Page, PageRequest};
use berth_core::{Error, FlavorId};
use berth_store::{PgPool, flavor as store};

use crate::context::OpContext;
use crate::{
    ApplyResult, CREATE_RACE_ATTEMPTS, Write, audit_apply, audit_change, current, lost_create_race, resource_version,
};

const KIND: &str = "flavor";

/// Creates or replaces a flavor.
///
/// # Errors
/// [`Error::Invalid`] for a bad body, [`Error::PreconditionFailed`] / [`Error::Conflict`]
/// for stale versions, and store errors.
pub async fn flavor_apply(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &FlavorApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Flavor> {
    apply_as(db, opctx, name, input, if_match, Write::Commit).await
}

/// [`flavor_apply`]'s every check, and the flavor as it would be, without writing it
/// (`?dry_run=true`).
///
/// # Errors
/// As [`flavor_apply`].
pub async fn flavor_apply_dry_run(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &FlavorApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Flavor> {
    apply_as(db, opctx, name, input, if_match, Write::RollBack).await
}

async fn apply_as(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &FlavorApply,
    if_match: Option<&IfMatch>,
    write: Write,
) -> ApplyResult<Flavor> {
    opctx.access().platform_admin("change flavors")?;
    input.validate(name)?;
    let labels = input.metadata.labels.clone().unwrap_or_default();
    for _ in 0..CREATE_RACE_ATTEMPTS {
        let mut tx = berth_store::begin(db).await?;
        let existing = store::flavor_fetch_for_update(&mut tx, name).await?;
        let cur = existing.as_ref().map(|f| current(&f.metadata, &f.spec)).transpose()?;
        let (flavor, applied) = match apply::plan(cur, &input.metadata, &input.spec, &labels, if_match)? {
            ApplyAction::Unchanged => return Ok((existing.expect("unchanged implies existing"), Applied::Unchanged)),
            ApplyAction::Create => {
                match store::flavor_insert(&mut tx, FlavorId::new(), name, &labels, &input.spec).await? {
                    Some(f) => (f, Applied::Created),
                    None => continue,
                }
            }
            ApplyAction::Update { generation } => {
                let uid = FlavorId(existing.as_ref().expect("update implies existing").metadata.uid);
                (store::flavor_update(&mut tx, uid, &labels, &input.spec, generation).await?, Applied::Updated)
            }
        };
        let before = existing.as_ref().map(|f| (f.metadata.generation, &f.spec));
        audit_apply(&mut tx, &opctx.actor, KIND, (&flavor.metadata, &flavor.spec), applied, before).await?;
        if write == Write::Commit {
            berth_store::commit(tx).await?;
        }
        return Ok((flavor, applied));
    }
    Err(lost_create_race(KIND, name))
}

/// Fetches a flavor. Flavors are the catalogue every caller submits against: anyone
/// authenticated reads them.
///
/// # Errors
/// [`Error::NotFound`] when there is none by that name.
pub async fn flavor_get(db: &PgPool, opctx: &OpContext, name: &str) -> Result<Flavor, Error> {
    opctx.access().read_catalogue()?;
    store::flavor_fetch(db, name).await?.ok_or_else(|| not_found(name))
}

/// Lists flavors.
///
/// # Errors
/// Store errors.
pub async fn flavor_list(db: &PgPool, opctx: &OpContext, page: &PageRequest<String>) -> Result<Page<Flavor>, Error> {
    opctx.access().read_catalogue()?;
    store::flavor_list(db, page).await
}

/// Deletes a flavor that nothing refers to any more.
///
/// # Errors
/// [`Error::NotFound`], [`Error::PreconditionFailed`], or [`Error::Conflict`] naming what
/// still uses it.
pub async fn flavor_delete(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    if_match: Option<&IfMatch>,
) -> Result<Flavor, Error> {
    opctx.access().platform_admin("delete flavors")?;
    let mut tx = berth_store::begin(db).await?;
    let flavor = store::flavor_fetch_for_update(&mut tx, name).await?.ok_or_else(|| not_found(name))?;
    apply::check_delete(resource_version(&flavor.metadata)?, if_match)?;
    let users = store::flavor_users(&mut tx, name).await?;
    if !users.is_empty() {
        return Err(Error::Conflict {
            field: None,
            message: format!("flavor {name:?} is still used by {}", users.join(", ")),
        });
    }
    store::flavor_delete(&mut tx, FlavorId(flavor.metadata.uid)).await?;
    audit_change(&mut tx, &opctx.actor, AuditVerb::Delete, KIND, &flavor.metadata).await?;
    berth_store::commit(tx).await?;
    Ok(flavor)
}

fn not_found(name: &str) -> Error {
    Error::NotFound { kind: KIND, name: name.into() }
}
