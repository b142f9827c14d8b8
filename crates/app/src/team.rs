//! Team use cases: the quota tree's rules (parents exist, no cycles, children's guarantees
//! fit in their parent's) are checked here under the team-tree lock.

use berth_core::apply::{self, Applied, ApplyAction, IfMatch};
use berth_core::event::AuditVerb;
use berth_core::page::{Page, PageRequest};
use berth_core::team::{QuotaPreview, Team, TeamApply, TeamSpec, check_guarantees_nest, check_min_runtime_nests};
use berth_core::{Error, TeamId};
use berth_store::{PgPool, Tx, flavor as flavors, team as store};

use crate::context::OpContext;
use crate::{
    ApplyResult, CREATE_RACE_ATTEMPTS, Write, audit_apply, audit_change, current, lost_create_race, missing_references,
    resource_version,
};

const KIND: &str = "team";

/// Creates or replaces a team.
///
/// # Errors
/// [`Error::Invalid`] for a bad body, an unknown flavor or parent, a cycle, or guarantees
/// that do not nest; [`Error::PreconditionFailed`] / [`Error::Conflict`] for stale
/// versions; store errors.
pub async fn team_apply(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &TeamApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Team> {
    apply_as(db, opctx, name, input, if_match, Write::Commit).await
}

/// [`team_apply`]'s every check, and the team as it would be, without writing it
/// (`?dry_run=true`).
///
/// # Errors
/// As [`team_apply`].
pub async fn team_apply_dry_run(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &TeamApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Team> {
    apply_as(db, opctx, name, input, if_match, Write::RollBack).await
}

async fn apply_as(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &TeamApply,
    if_match: Option<&IfMatch>,
    write: Write,
) -> ApplyResult<Team> {
    opctx.access().apply_team(name, input.spec.parent.as_deref())?;
    input.validate(name)?;
    let labels = input.metadata.labels.clone().unwrap_or_default();
    for _ in 0..CREATE_RACE_ATTEMPTS {
        let mut tx = berth_store::begin(db).await?;
        berth_store::lock_team_tree(&mut tx).await?;
        check_flavors(&mut tx, input).await?;
        let existing = store::team_fetch(&mut *tx, name).await?;
        let cur = existing.as_ref().map(|t| current(&t.metadata, &t.spec)).transpose()?;
        let action = apply::plan(cur, &input.metadata, &input.spec, &labels, if_match)?;
        if action == ApplyAction::Unchanged {
            return Ok((existing.expect("unchanged implies existing"), Applied::Unchanged));
        }
        let uid = existing.as_ref().map_or_else(TeamId::new, |t| TeamId(t.metadata.uid));
        let parent = check_tree(&mut tx, opctx, name, uid, existing.is_some(), input).await?;
        let (team, applied) = match action {
            ApplyAction::Create => match store::team_insert(&mut tx, uid, name, parent, &labels, &input.spec).await? {
                Some(t) => (t, Applied::Created),
                None => continue,
            },
            ApplyAction::Update { generation } => {
                // Work running below a team that moves keeps what it used so far under the
                // ancestors it had: the ledger is cut at the move (reports of the time before
                // do not change).
                if existing.as_ref().is_some_and(|t| t.spec.parent != input.spec.parent) {
                    berth_store::ledger::ledger_cut_at_move(&mut tx, uid.0, chrono::Utc::now()).await?;
                }
                (store::team_update(&mut tx, uid, parent, &labels, &input.spec, generation).await?, Applied::Updated)
            }
            ApplyAction::Unchanged => unreachable!("handled above"),
        };
        let before = existing.as_ref().map(|t| (t.metadata.generation, &t.spec));
        audit_apply(&mut tx, &opctx.actor, KIND, (&team.metadata, &team.spec), applied, before).await?;
        if write == Write::Commit {
            berth_store::commit(tx).await?;
            crate::feasibility::forget(db);
            crate::access_cache::forget(db);
        }
        return Ok((team, applied));
    }
    Err(lost_create_race(KIND, name))
}

/// What replacing an existing team's quotas (and fair sharing) with `input`'s would do: the change is checked
/// as [`team_apply`] would check it, `preview` works out its effect (the scheduler's
/// what-if, which lives with the controllers), and the answer is redacted for the caller.
/// Nothing is written.
///
/// # Errors
/// As [`team_apply`]; [`Error::NotFound`] when there is no such team; `preview`'s errors.
pub async fn team_preview(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    input: &TeamApply,
    preview: impl AsyncFnOnce(&TeamSpec) -> Result<QuotaPreview, Error>,
) -> Result<QuotaPreview, Error> {
    opctx.access().apply_team(name, input.spec.parent.as_deref())?;
    input.validate(name)?;
    let mut tx = berth_store::begin(db).await?;
    check_flavors(&mut tx, input).await?;
    let team = store::team_fetch(&mut *tx, name).await?.ok_or_else(|| not_found(name))?;
    check_tree(&mut tx, opctx, name, TeamId(team.metadata.uid), true, input).await?;
    tx.rollback().await.map_err(berth_store::db_error)?;
    Ok(opctx.redactor().preview(preview(&input.spec).await?))
}

/// The flavors the body names exist, and are held until the transaction ends (see
/// [`flavors::flavor_missing`]).
async fn check_flavors(tx: &mut Tx<'_>, input: &TeamApply) -> Result<(), Error> {
    let quotas =
        input.spec.quotas.iter().enumerate().map(|(i, q)| (format!("/spec/quotas/{i}/flavor"), q.flavor.clone()));
    let budgets = (input.spec.budgets.iter().enumerate())
        .filter_map(|(i, b)| Some((format!("/spec/budgets/{i}/flavor"), b.flavor.clone()?)));
    let refs: Vec<(String, String)> = quotas.chain(budgets).collect();
    let named: Vec<String> = refs.iter().map(|(_, f)| f.clone()).collect();
    let missing = flavors::flavor_missing(&mut **tx, &named).await?;
    let errors = missing_references(&missing, refs.into_iter(), "flavor");
    if errors.is_empty() { Ok(()) } else { Err(Error::Invalid(errors)) }
}

/// Checks the parent exists, no cycle forms, guarantees nest and the min runtime is one
/// the teams above allow; returns the parent's uid. The teams above are named as the
/// caller may read them: a team admin low in the tree learns what they allow, not who.
async fn check_tree(
    tx: &mut Tx<'_>,
    opctx: &OpContext,
    name: &str,
    uid: TeamId,
    exists: bool,
    input: &TeamApply,
) -> Result<Option<TeamId>, Error> {
    let parent = match &input.spec.parent {
        None => None,
        Some(parent_name) => {
            let parent = store::team_fetch(&mut **tx, parent_name)
                .await?
                .ok_or_else(|| Error::invalid("/spec/parent", format!("team {parent_name:?} does not exist")))?;
            let parent_uid = TeamId(parent.metadata.uid);
            if exists {
                let ancestors = store::team_ancestors(tx, parent_uid).await?;
                if ancestors.iter().any(|a| a == name) {
                    let mut chain = vec![name.to_owned(), parent_name.clone()];
                    chain.extend(ancestors.into_iter().take_while(|a| a != name));
                    chain.push(name.to_owned());
                    return Err(Error::invalid("/spec/parent", format!("would make a cycle: {}", chain.join(" -> "))));
                }
            }
            Some((parent_uid, parent))
        }
    };
    let children = if exists { store::team_children_specs(tx, uid, None).await? } else { Vec::new() };
    let siblings = match &parent {
        Some((parent_uid, _)) => store::team_children_specs(tx, *parent_uid, Some(uid)).await?,
        None => Vec::new(),
    };
    let mut errors = check_guarantees_nest(
        &input.spec,
        parent.as_ref().map(|(_, p)| (p.metadata.name.as_str(), &p.spec)),
        &siblings,
        &children,
    );
    if input.spec.preemption.is_some()
        && let Some((_, parent)) = &parent
    {
        let redactor = opctx.redactor();
        let lineage = store::team_lineage_specs(&mut **tx, &parent.metadata.name).await?;
        let named: Vec<_> = lineage.iter().map(|(name, spec)| (redactor.team(name), spec)).collect();
        let above: Vec<_> = named.iter().map(|(name, spec)| (name.as_str(), *spec)).collect();
        errors.extend(check_min_runtime_nests(&input.spec, &above));
    }
    if errors.is_empty() { Ok(parent.map(|(uid, _)| uid)) } else { Err(Error::Invalid(errors)) }
}

/// Fetches a team.
///
/// # Errors
/// [`Error::NotFound`] when there is none by that name.
pub async fn team_get(db: &PgPool, opctx: &OpContext, name: &str) -> Result<Team, Error> {
    opctx.access().read_team(name)?;
    store::team_fetch(db, name).await?.ok_or_else(|| not_found(name))
}

/// Lists the teams the caller can see, optionally only the children of `parent`.
///
/// # Errors
/// Store errors.
pub async fn team_list(
    db: &PgPool,
    opctx: &OpContext,
    parent: Option<&str>,
    page: &PageRequest<String>,
) -> Result<Page<Team>, Error> {
    store::team_list(db, parent, opctx.visible_teams().as_deref(), page).await
}

/// Deletes a team with no children and no live workloads (finished ones go with it).
///
/// # Errors
/// [`Error::NotFound`], [`Error::PreconditionFailed`], or [`Error::Conflict`] naming the
/// children or workloads in the way.
pub async fn team_delete(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    if_match: Option<&IfMatch>,
) -> Result<Team, Error> {
    opctx.access().delete_team(name)?;
    let mut tx = berth_store::begin(db).await?;
    berth_store::lock_team_tree(&mut tx).await?;
    let team = store::team_fetch(&mut *tx, name).await?.ok_or_else(|| not_found(name))?;
    apply::check_delete(resource_version(&team.metadata)?, if_match)?;
    let uid = TeamId(team.metadata.uid);
    store::team_lock(&mut tx, uid).await?;
    let children = store::team_child_names(&mut tx, uid).await?;
    if !children.is_empty() {
        return Err(Error::Conflict {
            field: None,
            message: format!("team {name:?} still has child teams: {}", children.join(", ")),
        });
    }
    let live = store::team_live_workloads(&mut tx, uid).await?;
    if !live.is_empty() {
        return Err(Error::Conflict {
            field: None,
            message: format!("team {name:?} still has live workloads: {}", live.join(", ")),
        });
    }
    // Its recent use stays with its parent at once (the fair-sharing task counts it so from
    // the ledger on its next pass; until then the scheduler would have lost it).
    if let (Some(parent), Some(used)) = (&team.spec.parent, &team.status.recent_usage)
        && let Some(p) = store::team_fetch(&mut *tx, parent).await?
        && let Some(mut into) = p.status.recent_usage
    {
        into.absorb(used);
        store::team_write_recent_usage(&mut tx, &[(TeamId(p.metadata.uid), Some(into))]).await?;
    }
    store::team_delete(&mut tx, uid).await?;
    audit_change(&mut tx, &opctx.actor, AuditVerb::Delete, KIND, &team.metadata).await?;
    berth_store::commit(tx).await?;
    crate::feasibility::forget(db);
    crate::access_cache::forget(db);
    Ok(team)
}

pub(crate) fn not_found(name: &str) -> Error {
    Error::NotFound { kind: KIND, name: name.into() }
}
