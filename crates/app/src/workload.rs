//! Workload use cases.

use berth_core::apply::{self, Applied, ApplyAction, IfMatch};
use berth_core::event::AuditVerb;
use berth_core::event::EventType;
use berth_core::meta::Labels;
use berth_core::page::{Page, PageRequest};
use berth_core::workload::{
    CHANGEABLE_AFTER_ADMISSION, Cancellation, Phase, PhaseCount, Queue, Workload, WorkloadApply, WorkloadBatch,
    WorkloadKind, WorkloadSpec, WorkloadStatus, WorkloadSummary,
};
use berth_core::{Error, FieldError, WorkloadId};
use berth_store::event::event_record;
use berth_store::idempotency::{self, KeyScope};
use berth_store::ledger::{self, Attempt, Outcome};
use berth_store::workload::{NewWorkload, StatusWrite, WorkloadFilter};
use berth_store::{PgPool, team as teams, workload as store};
use chrono::Utc;

use crate::context::OpContext;
use crate::{
    ApplyResult, CREATE_RACE_ATTEMPTS, Write, audit_apply, audit_change, current, lost_create_race, missing_references,
    resource_version,
};

const KIND: &str = "workload";
/// `?owner=me`: the caller's own workloads.
pub const OWNER_ME: &str = "me";
pub(crate) const CREATED_MESSAGE: &str = "workload submitted; waiting for admission";

/// Creates or replaces a workload. A new workload starts `Pending`.
///
/// # Errors
/// [`Error::NotFound`] when the team does not exist; [`Error::Invalid`] for a bad body, an
/// unknown flavor, or a workload that can never run as submitted
/// ([`crate::feasibility`]); [`Error::Conflict`] when the workload is being deleted or the body's
/// version is stale; [`Error::PreconditionFailed`]; store errors.
pub async fn workload_apply(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    input: &WorkloadApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Workload> {
    apply(db, opctx, team, name, input, if_match, Write::Commit).await
}

/// [`workload_apply`]'s every check, and the workload as it would be, without writing it
/// (`?dry_run=true`).
///
/// # Errors
/// As [`workload_apply`].
pub async fn workload_apply_dry_run(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    input: &WorkloadApply,
    if_match: Option<&IfMatch>,
) -> ApplyResult<Workload> {
    apply(db, opctx, team, name, input, if_match, Write::RollBack).await
}

async fn apply(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    input: &WorkloadApply,
    if_match: Option<&IfMatch>,
    write: Write,
) -> ApplyResult<Workload> {
    opctx.access().write_workloads(team)?;
    let (workload, applied) = write_workload(db, opctx, team, name, input, if_match, write).await?;
    Ok((opctx.redactor().workload(workload), applied))
}

async fn write_workload(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    input: &WorkloadApply,
    if_match: Option<&IfMatch>,
    write: Write,
) -> ApplyResult<Workload> {
    input.validate(team, name)?;
    let actor = &opctx.actor;
    let status = WorkloadStatus { submitted_at: Some(Utc::now()), ..WorkloadStatus::default() };
    let owner = opctx.principal.owner();
    let wanted = &input.spec.tasks.resources.flavors;
    // Fast path for the common case, a plain submission of a new name: the team and
    // flavors as the door check last read them (the statement checks that they still
    // exist), written with the submissions made meanwhile, in one statement with its event
    // and audit record ([`crate::group_commit`]). Anything else (the name exists,
    // preconditions were given, the team or a flavor is unknown or went meanwhile) takes
    // the general path below, which reads them, locks the row and applies the declarative
    // rules.
    let meta = &input.metadata;
    let plain = write == Write::Commit && if_match.is_none() && meta.resource_version.is_none() && meta.uid.is_none();
    if plain && let Some(team_uid) = crate::feasibility::resolve(db, team, wanted).await? {
        crate::feasibility::refuse_impossible(db, opctx, team, &[(String::new(), &input.spec)]).await?;
        let submission = crate::group_commit::Submission {
            uid: WorkloadId::new(),
            team_uid,
            team: team.to_owned(),
            name: name.to_owned(),
            labels: input.metadata.labels.clone().unwrap_or_default(),
            spec: input.spec.clone(),
            status: status.clone(),
            owner: owner.clone(),
            actor: actor.clone(),
        };
        if let Some(w) = crate::group_commit::create(db, submission).await? {
            return Ok((w, Applied::Created));
        }
    }
    let lookup = store::workload_lookup(db, team, wanted).await?;
    let team_uid = lookup.team_uid.ok_or_else(|| crate::team::not_found(team))?;
    let missing_flavors = |missing: &[String]| {
        let refs = wanted.iter().enumerate().map(|(i, f)| (format!("/spec/tasks/resources/flavors/{i}"), f.clone()));
        Error::Invalid(missing_references(missing, refs, "flavor"))
    };
    if !lookup.missing_flavors.is_empty() {
        return Err(missing_flavors(&lookup.missing_flavors));
    }
    crate::feasibility::refuse_impossible(db, opctx, team, &[(String::new(), &input.spec)]).await?;
    let labels = input.metadata.labels.clone().unwrap_or_default();
    let new = NewWorkload {
        owner: Some(&owner),
        uid: WorkloadId::new(),
        team_uid,
        team,
        name,
        labels: &labels,
        spec: &input.spec,
        status: &status,
        actor,
    };
    for _ in 0..CREATE_RACE_ATTEMPTS {
        let mut tx = berth_store::begin(db).await?;
        // Held against a delete until this commits (one may have gone since the lookup).
        let missing = berth_store::flavor::flavor_missing(&mut *tx, wanted).await?;
        if !missing.is_empty() {
            return Err(missing_flavors(&missing));
        }
        let existing = store::workload_fetch_for_update(&mut tx, team, name).await?;
        if existing.as_ref().is_some_and(|w| w.metadata.deletion_timestamp.is_some()) {
            return Err(Error::Conflict {
                field: None,
                message: format!("workload {team}/{name} is being deleted; apply it again once it is gone"),
            });
        }
        if let Some(w) = &existing {
            // Before anything else is said of it: a teammate's identical PUT was a 200 with
            // the whole object, and one of an ended workload told its state.
            opctx.access().change_workload(team, w.metadata.owner.as_ref())?;
            refuse_change_of_what_runs(team, name, w, &input.spec)?;
        }
        let cur = existing.as_ref().map(|w| current(&w.metadata, &w.spec)).transpose()?;
        let (workload, applied, reason, message) =
            match apply::plan(cur, &input.metadata, &input.spec, &labels, if_match)? {
                ApplyAction::Unchanged => {
                    return Ok((existing.expect("unchanged implies existing"), Applied::Unchanged));
                }
                ApplyAction::Create => match store::workload_insert(&mut tx, &new).await? {
                    Some(w) => (w, Applied::Created, "Created", "workload submitted; waiting for admission".to_owned()),
                    None => continue,
                },
                ApplyAction::Update { generation } => {
                    let existing = existing.as_ref().expect("update implies existing");
                    let uid = WorkloadId(existing.metadata.uid);
                    let w = store::workload_update_spec(&mut tx, uid, &labels, &input.spec, generation).await?;
                    let message = format!("spec changed (generation {generation})");
                    (w, Applied::Updated, "SpecUpdated", message)
                }
            };
        if workload.metadata.generation != existing.as_ref().map_or(0, |w| w.metadata.generation) {
            event_record(&mut *tx, KIND, workload.metadata.uid, EventType::Normal, reason, &message).await?;
        }
        let before = existing.as_ref().map(|w| (w.metadata.generation, &w.spec));
        audit_apply(&mut tx, actor, KIND, (&workload.metadata, &workload.spec), applied, before).await?;
        if write == Write::Commit {
            berth_store::commit(tx).await?;
        }
        return Ok((workload, applied));
    }
    Err(lost_create_race(KIND, name))
}

/// Creates a batch of new workloads in one team, all or none: any broken item, or a name
/// the team already uses, and nothing is written. Each workload gets its `Created` event
/// and audit record, as if submitted alone; they come back in the order given.
///
/// With an idempotency key, the first successful answer is recorded (for a day) in the
/// same transaction as the workloads, and a retry with the key — by the same caller, to the
/// same team, with the same batch — gets that answer instead of creating anything
/// (`Batch::replayed`); a concurrent retry waits for the first to finish.
///
/// # Errors
/// [`Error::NotFound`] when the team does not exist; [`Error::Invalid`] naming every broken
/// field as `/items/{i}/...` (an item without a name, a repeated name, a `resource_version`,
/// an unknown flavor, a workload that can never run), or `Idempotency-Key` when the key was
/// used with another batch; [`Error::Conflict`] naming the first item whose name is taken;
/// store errors.
pub async fn workload_create_batch(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    batch: &WorkloadBatch,
    idempotency_key: Option<&str>,
) -> Result<Batch, Error> {
    let Some(key) = idempotency_key else {
        return Ok(Batch { items: create_batch(db, opctx, team, batch, Write::Commit, None).await?, replayed: false });
    };
    let caller = opctx.principal.owner();
    let (scope, hash) = keyed(opctx, &caller, team, key, batch)?;
    for _ in 0..CREATE_RACE_ATTEMPTS {
        if let Some(first) = idempotency::idempotency_fetch(db, &scope).await? {
            return replay(first, &hash);
        }
        match create_batch(db, opctx, team, batch, Write::Commit, Some((&scope, &hash))).await {
            Err(Error::Unavailable(m)) if m == KEY_TAKEN => continue,
            created => return Ok(Batch { items: created?, replayed: false }),
        }
    }
    Err(Error::Unavailable(format!("Idempotency-Key {key:?} kept being used concurrently; retry")))
}

/// The scope of a batch's idempotency key and the hash of the batch, once the caller may
/// write the team's workloads and the key is well formed.
fn keyed<'a>(
    opctx: &OpContext,
    caller: &'a berth_core::meta::Owner,
    team: &'a str,
    key: &'a str,
    batch: &WorkloadBatch,
) -> Result<(KeyScope<'a>, Vec<u8>), Error> {
    opctx.access().write_workloads(team)?;
    berth_core::validation::check_idempotency_key(key).map_err(|m| Error::invalid(IDEMPOTENCY_KEY, m))?;
    let hash = berth_auth::token_sha256(&serde_json::to_string(batch).map_err(|e| Error::Internal(e.to_string()))?);
    Ok((KeyScope { caller, team, key }, hash))
}

/// What a batch created, and whether it is the recorded answer to an earlier request with
/// the same idempotency key.
#[derive(Debug)]
pub struct Batch {
    pub items: Vec<Workload>,
    pub replayed: bool,
}

/// The header an idempotency key comes in, as errors name it.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// Internal: another request claimed the key between our read and our claim.
const KEY_TAKEN: &str = "idempotency key taken";

fn replay(first: idempotency::Recorded, hash: &[u8]) -> Result<Batch, Error> {
    if first.request_hash != hash {
        return Err(Error::invalid(
            IDEMPOTENCY_KEY,
            "this key was used with a different batch; use a new key for a new request",
        ));
    }
    let items = serde_json::from_value(first.response).map_err(|e| Error::Internal(e.to_string()))?;
    Ok(Batch { items, replayed: true })
}

/// [`workload_create_batch`]'s every check, and its answer, without writing anything
/// (`?dry_run=true`): the workloads as they would be, or, for a key used before, that
/// request's answer (the same batch) or the refusal (another batch).
///
/// # Errors
/// As [`workload_create_batch`].
pub async fn workload_create_batch_dry_run(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    batch: &WorkloadBatch,
    idempotency_key: Option<&str>,
) -> Result<Batch, Error> {
    if let Some(key) = idempotency_key {
        let caller = opctx.principal.owner();
        let (scope, hash) = keyed(opctx, &caller, team, key, batch)?;
        if let Some(first) = idempotency::idempotency_fetch(db, &scope).await? {
            return replay(first, &hash);
        }
    }
    Ok(Batch { items: create_batch(db, opctx, team, batch, Write::RollBack, None).await?, replayed: false })
}

async fn create_batch(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    batch: &WorkloadBatch,
    write: Write,
    idempotency_key: Option<(&KeyScope<'_>, &[u8])>,
) -> Result<Vec<Workload>, Error> {
    opctx.access().write_workloads(team)?;
    let actor = &opctx.actor;
    let items = &batch.items;
    if items.is_empty() || items.len() > WorkloadBatch::MAX_ITEMS {
        let message = format!("must hold 1 to {} workloads, not {}", WorkloadBatch::MAX_ITEMS, items.len());
        return Err(Error::invalid("/items", message));
    }
    let mut errors = Vec::new();
    let generated: Vec<Option<String>> = items
        .iter()
        .enumerate()
        .map(|(i, item)| match (&item.metadata.name, &item.metadata.generate_name) {
            (None, Some(prefix)) => match generated_name(prefix) {
                Ok(name) => Some(name),
                Err(message) => {
                    errors.push(FieldError::new(format!("/items/{i}/metadata/generate_name"), message));
                    None
                }
            },
            _ => None,
        })
        .collect();
    let mut names: Vec<&str> = Vec::with_capacity(items.len());
    let mut first_with: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let at = |field: &str| format!("/items/{i}{field}");
        let Some(name) = item.metadata.name.as_deref().or(generated[i].as_deref()) else {
            if item.metadata.generate_name.is_none() {
                errors.push(FieldError::new(
                    at("/metadata/name"),
                    "required: each workload of a batch names itself, or gives metadata.generate_name",
                ));
            }
            continue;
        };
        let first = *first_with.entry(name).or_insert(i);
        if first != i {
            errors.push(FieldError::new(at("/metadata/name"), format!("{name:?} is also the name of item {first}")));
        }
        names.push(name);
        for (given, field) in
            [(item.metadata.resource_version.is_some(), "resource_version"), (item.metadata.uid.is_some(), "uid")]
        {
            if given {
                errors.push(FieldError::new(
                    at(&format!("/metadata/{field}")),
                    "a batch only creates workloads; omit it (PUT the workload to update it)",
                ));
            }
        }
        if let Err(Error::Invalid(found)) = item.validate(team, name) {
            errors.extend(found.into_iter().map(|e| FieldError::new(at(&e.field), e.message)));
        }
    }
    if !errors.is_empty() {
        return Err(Error::Invalid(errors));
    }
    let mut wanted: Vec<String> = items.iter().flat_map(|w| w.spec.tasks.resources.flavors.iter().cloned()).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let lookup = store::workload_lookup(db, team, &wanted).await?;
    let team_uid = lookup.team_uid.ok_or_else(|| crate::team::not_found(team))?;
    if !lookup.missing_flavors.is_empty() {
        let refs = items.iter().enumerate().flat_map(|(i, w)| {
            let flavors = &w.spec.tasks.resources.flavors;
            flavors
                .iter()
                .enumerate()
                .map(move |(j, f)| (format!("/items/{i}/spec/tasks/resources/flavors/{j}"), f.clone()))
        });
        return Err(Error::Invalid(missing_references(&lookup.missing_flavors, refs, "flavor")));
    }
    let specs: Vec<(String, &_)> =
        items.iter().enumerate().map(|(i, item)| (format!("/items/{i}"), &item.spec)).collect();
    crate::feasibility::refuse_impossible(db, opctx, team, &specs).await?;
    let empty = Labels::new();
    let status = WorkloadStatus { submitted_at: Some(Utc::now()), ..WorkloadStatus::default() };
    let owner = opctx.principal.owner();
    let new: Vec<NewWorkload<'_>> = items
        .iter()
        .zip(&names)
        .map(|(item, name)| NewWorkload {
            uid: WorkloadId::new(),
            team_uid,
            team,
            name,
            labels: item.metadata.labels.as_ref().unwrap_or(&empty),
            spec: &item.spec,
            status: &status,
            owner: Some(&owner),
            actor,
        })
        .collect();
    let mut tx = berth_store::begin(db).await?;
    if let Some((scope, hash)) = idempotency_key
        && !idempotency::idempotency_claim(&mut tx, scope, hash).await?
    {
        return Err(Error::Unavailable(KEY_TAKEN.into()));
    }
    let created = store::workload_create_many(&mut *tx, &new, CREATED_MESSAGE).await?;
    if created.workloads.iter().any(Option::is_none) {
        // Some names are taken: nothing of the batch is kept.
        drop(tx);
        let taken = store::workload_names_taken(db, team, &names).await?;
        let first = names.iter().position(|n| taken.iter().any(|t| t == n));
        return Err(match first {
            Some(i) => Error::conflict(
                format!("/items/{i}/metadata/name"),
                format!(
                    "workload {team}/{} already exists (a name is unique in its team until the workload is \
                     deleted): choose another, or give metadata.generate_name",
                    names[i]
                ),
            ),
            None => Error::Unavailable("a name of the batch was taken and freed again meanwhile; retry".into()),
        });
    }
    let redactor = opctx.redactor();
    let answer: Vec<Workload> = created.workloads.iter().flatten().map(|w| redactor.workload(w.clone())).collect();
    if let Some((scope, _)) = idempotency_key {
        let answer = serde_json::to_value(&answer).map_err(|e| Error::Internal(e.to_string()))?;
        idempotency::idempotency_answer(&mut tx, scope, &answer).await?;
    }
    if write == Write::Commit {
        berth_store::commit(tx).await?;
        created.committed(db);
        crate::change_notice::workloads_submitted(db);
    }
    Ok(answer)
}

/// Fetches a workload, as committed when the call began (from [`crate::workload_cache`]).
///
/// # Errors
/// [`Error::NotFound`] when the team has no workload by that name, or the caller cannot
/// see the team.
pub async fn workload_get(db: &PgPool, opctx: &OpContext, team: &str, name: &str) -> Result<Workload, Error> {
    opctx.access().read_team(team)?;
    let workload = crate::workload_cache::workload(db, team, name).await?.ok_or_else(|| not_found(team, name))?;
    Ok(opctx.redactor().workload(Workload::clone(&workload)))
}

/// Lists workloads, filtered: of `team` when given (taken from the path), else of every
/// team the caller can see (`filter.team` narrows them to one).
///
/// # Errors
/// [`Error::NotFound`] when `team` names no team the caller can see; store errors.
pub async fn workload_list(
    db: &PgPool,
    opctx: &OpContext,
    team: Option<&str>,
    mut filter: WorkloadFilter,
    page: &PageRequest<(String, String)>,
) -> Result<Page<Workload>, Error> {
    // A team named by the filter is one named by the path: 404 out of the caller's reach.
    let named = filter.team.take();
    let team = match (team, named.as_deref()) {
        (Some(path), Some(query)) if path != query => {
            return Err(Error::invalid("team", format!("the path names team {path}; leave this out or name it")));
        }
        (path, query) => path.or(query),
    };
    match team {
        Some(team) => {
            opctx.access().read_team(team)?;
            team_must_exist(db, team).await?;
            filter.team = Some(team.to_owned());
            filter.teams = None;
        }
        None => filter.teams = opctx.visible_teams(),
    }
    if filter.owner_subject.as_deref() == Some(OWNER_ME) {
        let me = opctx.principal.owner();
        filter.owner_subject = Some(me.subject);
        filter.owner_issuer = Some(me.issuer);
    }
    let page = store::workload_list(db, &filter, page).await?;
    let redactor = opctx.redactor();
    Ok(Page { items: page.items.into_iter().map(|w| redactor.workload(w)).collect(), next: page.next })
}

/// The first `limit` pending workloads in queue order, and the totals: of `team` when
/// given, else of every team the caller can see.
///
/// # Errors
/// [`Error::NotFound`] when `team` names no team the caller can see; store errors.
pub async fn workload_queue(db: &PgPool, opctx: &OpContext, team: Option<&str>, limit: u32) -> Result<Queue, Error> {
    let only = match team {
        Some(team) => {
            opctx.access().read_team(team)?;
            team_must_exist(db, team).await?;
            Some(vec![team.to_owned()])
        }
        None => opctx.visible_teams(),
    };
    let (items, total, gpus) = store::workload_queue(db, only.as_deref(), limit).await?;
    let redactor = opctx.redactor();
    Ok(Queue { total, gpus, items: items.into_iter().map(|w| redactor.workload(w)).collect() })
}

/// Workloads per phase of the teams the caller can see, every phase listed.
///
/// # Errors
/// Store errors.
pub async fn workload_summary(db: &PgPool, opctx: &OpContext) -> Result<WorkloadSummary, Error> {
    let counts = store::workload_phase_counts(db, opctx.visible_teams().as_deref()).await?;
    let phases = Phase::ALL
        .iter()
        .map(|&phase| {
            let (workloads, gpus) = counts.iter().find(|(p, ..)| *p == phase).map_or((0, 0.0), |(_, n, g)| (*n, *g));
            PhaseCount { phase, workloads, gpus }
        })
        .collect();
    Ok(WorkloadSummary { phases })
}

/// Checks that a team exists (for team-scoped lists, so an unknown team is a 404 rather
/// than an empty list).
///
/// # Errors
/// [`Error::NotFound`] when it does not.
async fn team_must_exist(db: &PgPool, team: &str) -> Result<(), Error> {
    teams::team_fetch_uid(db, team).await?.map(|_| ()).ok_or_else(|| crate::team::not_found(team))
}

/// Requests a workload's deletion. One that never reached a backend is removed at once;
/// otherwise it is marked (`deletion_timestamp`) and the controllers cancel its backend job
/// and then remove it. Returns the workload as it was at deletion.
///
/// # Errors
/// [`Error::NotFound`]; [`Error::Forbidden`] unless the caller owns the workload or
/// administers its team; [`Error::PreconditionFailed`]; store errors.
pub async fn workload_delete(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    if_match: Option<&IfMatch>,
) -> Result<Workload, Error> {
    opctx.access().write_workloads(team)?;
    let actor = &opctx.actor;
    let mut tx = berth_store::begin(db).await?;
    let workload = lock_to_change(&mut tx, opctx, team, name, if_match).await?;
    let uid = WorkloadId(workload.metadata.uid);
    if workload.metadata.deletion_timestamp.is_some() {
        return Ok(workload);
    }
    let deleted = if workload.status.phase.reached_backend() {
        let marked = store::workload_mark_deleted(&mut tx, uid).await?;
        let message = "deletion requested; cancelling the backend job";
        event_record(&mut *tx, KIND, uid.0, EventType::Normal, "DeletionRequested", message).await?;
        marked
    } else {
        if workload.status.phase == Phase::Admitted {
            let record = Attempt::of(&workload, Outcome::Deleted, None, Utc::now());
            ledger::ledger_record(&mut tx, record.as_slice()).await?;
        }
        store::workload_delete(&mut tx, uid).await?;
        let message = "deleted before it reached a backend";
        event_record(&mut *tx, KIND, uid.0, EventType::Normal, "Deleted", message).await?;
        let mut gone = workload;
        gone.metadata.deletion_timestamp = Some(Utc::now());
        gone
    };
    audit_change(&mut tx, actor, AuditVerb::Delete, KIND, &deleted.metadata).await?;
    berth_store::commit(tx).await?;
    Ok(opctx.redactor().workload(deleted))
}

/// Cancels a workload and keeps it, as `scancel` does: one without a job ends `Cancelled`
/// at once; one with a job is marked (`status.cancellation`) and the controllers stop the
/// job with the cancel grace period and then end it `Cancelled`. Its events and times stay,
/// until retention removes it. Cancelling again while it stops answers the same.
///
/// # Errors
/// [`Error::NotFound`]; [`Error::Forbidden`] unless the caller owns the workload or
/// administers its team; [`Error::Conflict`] when it has ended or is being deleted;
/// [`Error::PreconditionFailed`]; store errors.
pub async fn workload_cancel(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    if_match: Option<&IfMatch>,
) -> Result<Workload, Error> {
    opctx.access().write_workloads(team)?;
    let mut tx = berth_store::begin(db).await?;
    let w = lock_to_change(&mut tx, opctx, team, name, if_match).await?;
    let phase = w.status.phase;
    if phase.is_final() {
        return Err(Error::conflict("/status/phase", format!("{team}/{name} has already ended ({})", phase.as_str())));
    }
    if w.metadata.deletion_timestamp.is_some() {
        return Err(Error::conflict("/metadata/deletion_timestamp", format!("{team}/{name} is being deleted")));
    }
    if w.status.cancellation.is_some() {
        return Ok(opctx.redactor().workload(w));
    }
    let now = Utc::now();
    let by = opctx.actor.subject.clone();
    let cancellation = Some(Cancellation { requested_at: now, by: by.clone() });
    // Pending or Admitted: no job was made from it yet (a dispatch already under way finds
    // the workload ended, and the orphan collector cancels what it made).
    let (status, reason, message) = if phase.reached_backend() {
        let status = WorkloadStatus { cancellation, ..w.status.clone() };
        (status, "CancelRequested", format!("cancel requested by {by}; stopping the backend job"))
    } else {
        let message = format!("cancelled by {by} before it reached a backend");
        let status = WorkloadStatus {
            phase: Phase::Cancelled,
            reason: Some("Cancelled".into()),
            message: Some(message.clone()),
            finished_at: Some(now),
            pending_reason: None,
            queue_position: None,
            estimated_start: None,
            cancellation,
            ..w.status.clone()
        };
        (status, "Cancelled", message)
    };
    let uid = WorkloadId(w.metadata.uid);
    if phase == Phase::Admitted {
        // Admitted, it held GPUs in the books (though no job ran): its attempt is accounted.
        let record = Attempt::of(&w, Outcome::Cancelled, None, now);
        ledger::ledger_record(&mut tx, record.as_slice()).await?;
    }
    let write = StatusWrite { uid, resource_version: resource_version(&w.metadata)?, status };
    store::workload_write_statuses(&mut tx, std::slice::from_ref(&write)).await?;
    event_record(&mut *tx, KIND, uid.0, EventType::Normal, reason, &message).await?;
    audit_change(&mut tx, &opctx.actor, AuditVerb::Cancel, KIND, &w.metadata).await?;
    berth_store::commit(tx).await?;
    let cancelled = store::workload_fetch(db, team, name).await?.ok_or_else(|| not_found(team, name))?;
    Ok(opctx.redactor().workload(cancelled))
}

/// The job of a workload told to stop (preempted, cancelled or deleted) says its checkpoint
/// is written: its job is stopped now instead of at the end of its grace period, and the
/// GPUs go to whoever waits for them. The caller is the workload's own token (given to its
/// job, for this attempt) or anyone who may cancel it. Saying it again changes nothing.
///
/// # Errors
/// [`Error::NotFound`] (also for a workload token of another workload);
/// [`Error::Forbidden`] unless the caller may cancel it; [`Error::Conflict`] when it was
/// not told to stop, has ended, or the token's attempt is over; store errors.
pub async fn workload_checkpointed(db: &PgPool, opctx: &OpContext, team: &str, name: &str) -> Result<(), Error> {
    let mut tx = berth_store::begin(db).await?;
    let w = lock_for_its_job(&mut tx, opctx, team, name).await?;
    let phase = w.status.phase;
    if phase.is_final() {
        return Err(Error::conflict("/status/phase", format!("{team}/{name} has already ended ({})", phase.as_str())));
    }
    let told = phase == Phase::Preempting || w.status.cancellation.is_some() || w.metadata.deletion_timestamp.is_some();
    if !told || !phase.reached_backend() {
        return Err(Error::conflict(
            "/status/phase",
            format!(
                "{team}/{name} was not told to stop ({}): acknowledge a checkpoint after the stop notice (SIGTERM)",
                phase.as_str()
            ),
        ));
    }
    if w.status.checkpointed_at.is_some() {
        return Ok(());
    }
    let now = Utc::now();
    let after = w.status.cancel_requested_at.map_or_else(String::new, |at| {
        format!(" {:.1} s after the stop notice", (now - at).num_milliseconds().max(0) as f64 / 1000.0)
    });
    let message = format!("checkpoint acknowledged by {}{after}; its job is stopped now", opctx.actor.subject);
    let status = WorkloadStatus { checkpointed_at: Some(now), ..w.status.clone() };
    let uid = WorkloadId(w.metadata.uid);
    let write = StatusWrite { uid, resource_version: resource_version(&w.metadata)?, status };
    store::workload_write_statuses(&mut tx, std::slice::from_ref(&write)).await?;
    event_record(&mut *tx, KIND, uid.0, EventType::Normal, "Checkpointed", &message).await?;
    berth_store::commit(tx).await
}

/// The workload locked for a call its own job may make (checkpointed, activity): by the
/// workload's own token for its current attempt, or by anyone who may cancel it.
async fn lock_for_its_job(
    tx: &mut berth_store::Tx<'_>,
    opctx: &OpContext,
    team: &str,
    name: &str,
) -> Result<Workload, Error> {
    let Some(scope) = &opctx.principal.workload else {
        opctx.access().write_workloads(team)?;
        return lock_to_change(tx, opctx, team, name, None).await;
    };
    let w = store::workload_fetch_for_update(tx, team, name).await?;
    let w = w.filter(|w| w.metadata.uid == scope.uid).ok_or_else(|| not_found(team, name))?;
    if w.status.attempt != scope.attempt {
        return Err(Error::conflict(
            "/status/attempt",
            format!(
                "this token is for attempt {} of {team}/{name}, which is over (it is on attempt {})",
                scope.attempt, w.status.attempt
            ),
        ));
    }
    Ok(w)
}

/// A running notebook (or service) says it is in use, at `at` (now, for a request): its
/// idle timeout counts from then. The caller is its own token or anyone who may cancel
/// it; reports closer than [`ACTIVITY_RESOLUTION`] to the last one write nothing.
///
/// # Errors
/// As [`workload_checkpointed`]; [`Error::Conflict`] when it does not run.
pub async fn workload_activity(
    db: &PgPool,
    opctx: &OpContext,
    team: &str,
    name: &str,
    at: chrono::DateTime<Utc>,
) -> Result<(), Error> {
    let mut tx = berth_store::begin(db).await?;
    let w = lock_for_its_job(&mut tx, opctx, team, name).await?;
    if !matches!(w.spec.kind, WorkloadKind::Notebook | WorkloadKind::Inference) {
        let kind = w.spec.kind.as_str();
        return Err(Error::conflict(
            "/spec/kind",
            format!("{team}/{name} is a {kind}: only notebooks and services report activity"),
        ));
    }
    if !matches!(w.status.phase, Phase::Dispatched | Phase::Running) {
        let phase = w.status.phase.as_str();
        return Err(Error::conflict("/status/phase", format!("{team}/{name} does not run ({phase})")));
    }
    let recent = w.status.last_activity_at.is_some_and(|last| (at - last).abs() < ACTIVITY_RESOLUTION);
    if recent {
        return Ok(());
    }
    let status = WorkloadStatus { last_activity_at: Some(at), ..w.status.clone() };
    let write =
        StatusWrite { uid: WorkloadId(w.metadata.uid), resource_version: resource_version(&w.metadata)?, status };
    store::workload_write_statuses(&mut tx, std::slice::from_ref(&write)).await?;
    berth_store::commit(tx).await
}

/// Activity reported within this time of the last report is not written again.
pub const ACTIVITY_RESOLUTION: chrono::TimeDelta = chrono::TimeDelta::seconds(10);

/// Where a running service or notebook answers and, for a notebook, the token that opens
/// it (derived by `issuer`; none without one). Only its owner and admins of its team may
/// read it: the token opens the notebook.
///
/// # Errors
/// [`Error::NotFound`]; [`Error::Forbidden`] unless the caller may change it;
/// [`Error::Conflict`] when it serves nothing (yet).
pub async fn workload_endpoint(
    db: &PgPool,
    opctx: &OpContext,
    issuer: Option<&berth_auth::BerthIssuer>,
    team: &str,
    name: &str,
) -> Result<berth_core::workload::Endpoint, Error> {
    let w = store::workload_fetch(db, team, name).await?.ok_or_else(|| not_found(team, name))?;
    opctx.access().open_endpoint(team, w.metadata.owner.as_ref())?;
    let url = w.status.backend_ref.as_ref().and_then(|b| b.url.clone()).filter(|_| !w.status.phase.is_final());
    let Some(url) = url else {
        return Err(Error::conflict(
            "/status/backend_ref/url",
            format!("{team}/{name} serves nothing ({}, a {})", w.status.phase.as_str(), w.spec.kind.as_str()),
        ));
    };
    let notebook = w.spec.kind == berth_core::workload::WorkloadKind::Notebook;
    Ok(berth_core::workload::Endpoint {
        url,
        token: issuer.filter(|_| notebook).map(|i| i.notebook_token(berth_core::auth::WorkloadScope::of(&w))),
        last_activity_at: w.status.last_activity_at,
        idle_stop_at: w.idle_stop_at(),
    })
}

/// The workload, locked for a change (cancel, delete) by the caller: 404 when it does not
/// exist, 403 unless the caller may change it, 412 when `if_match` is stale.
async fn lock_to_change(
    tx: &mut berth_store::Tx<'_>,
    opctx: &OpContext,
    team: &str,
    name: &str,
    if_match: Option<&IfMatch>,
) -> Result<Workload, Error> {
    let w = store::workload_fetch_for_update(tx, team, name).await?.ok_or_else(|| not_found(team, name))?;
    opctx.access().change_workload(team, w.metadata.owner.as_ref())?;
    apply::check_delete(resource_version(&w.metadata)?, if_match)?;
    Ok(w)
}

/// Once admitted, a workload holds its shape on its cluster (the job was made from it), so
/// only what holds nothing may change ([`CHANGEABLE_AFTER_ADMISSION`]); once ended, its
/// spec records what ran and does not change at all.
fn refuse_change_of_what_runs(team: &str, name: &str, w: &Workload, new: &WorkloadSpec) -> Result<(), Error> {
    let phase = w.status.phase;
    if w.spec == *new || phase == Phase::Pending {
        return Ok(());
    }
    if phase.is_final() {
        return Err(Error::conflict(
            "/spec",
            format!(
                "{team}/{name} has ended ({}): its spec records what ran and cannot change; submit a new workload",
                phase.as_str()
            ),
        ));
    }
    // The backend enforces the limit the job was submitted with (Slurm's time limit, a
    // Kubernetes Job's deadline): a change after that would be a spec the job does not keep.
    if w.status.backend_ref.is_some() && w.spec.max_runtime_seconds != new.max_runtime_seconds {
        return Err(Error::invalid(
            "/spec/max_runtime_seconds",
            format!(
                "{team}/{name} runs ({}) under the time limit its job was submitted with; cancel and resubmit to \
                 change it",
                phase.as_str()
            ),
        ));
    }
    match w.spec.fixed_field_changed(new) {
        Some(field) => Err(Error::invalid(
            &field,
            format!(
                "cannot change {field} of an admitted workload ({}); cancel and resubmit (only {} may change)",
                phase.as_str(),
                CHANGEABLE_AFTER_ADMISSION.join(", ")
            ),
        )),
        None => Ok(()),
    }
}

/// A name made from a `generate_name` prefix and 5 random characters (as Kubernetes makes
/// them: no vowels, so no words, and no characters that look alike).
fn generated_name(prefix: &str) -> Result<String, String> {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    berth_core::validation::check_name_prefix(prefix)?;
    let random = uuid::Uuid::new_v4();
    let suffix: String =
        random.as_bytes()[..5].iter().map(|b| char::from(ALPHABET[usize::from(*b) % ALPHABET.len()])).collect();
    Ok(format!("{prefix}{suffix}"))
}

pub(crate) fn not_found(team: &str, name: &str) -> Error {
    Error::NotFound { kind: KIND, name: format!("{team}/{name}") }
}
