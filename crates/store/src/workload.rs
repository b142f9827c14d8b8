//! SQL for workloads.

use berth_core::meta::{Labels, ObjectMeta, Owner};
use berth_core::page::{PAGE_BYTES, Page, PageRequest, encode_cursor};
use berth_core::selector::LabelSelector;
use berth_core::workload::{
    PendingReason, Phase, QueuePosition, StartEstimate, Workload, WorkloadKind, WorkloadSpec, WorkloadStatus,
};
use berth_core::{Error, TeamId, WorkloadId};
use chrono::{DateTime, Utc};
use sqlx::types::Json;
use sqlx::{PgConnection, PgExecutor, PgPool};
use uuid::Uuid;

use crate::db_error;

struct WorkloadRow {
    uid: Uuid,
    team_name: String,
    name: String,
    labels: Json<Labels>,
    spec: Json<WorkloadSpec>,
    status: Json<WorkloadStatus>,
    generation: i64,
    resource_version: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    deletion_timestamp: Option<DateTime<Utc>>,
    owner: Option<Json<Owner>>,
    /// Its row of `workload_explanations`, when it is pending and has one.
    explanation: Option<Json<StoredExplanation>>,
}

/// A row of `workload_explanations` as `to_jsonb` gives it: what the controllers last
/// explained of a pending workload's attempt ([`workload_explain`], [`workload_estimate`]).
#[derive(Debug, serde::Deserialize)]
struct StoredExplanation {
    attempt: i64,
    pending_reason: Option<PendingReason>,
    queue_position: Option<QueuePosition>,
    estimated_start: Option<StartEstimate>,
}

/// A [`WorkloadRow`] of a budgeted page, with how many rows the page's key query found.
struct PagedRow {
    uid: Uuid,
    team_name: String,
    name: String,
    labels: Json<Labels>,
    spec: Json<WorkloadSpec>,
    status: Json<WorkloadStatus>,
    generation: i64,
    resource_version: i64,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    deletion_timestamp: Option<DateTime<Utc>>,
    owner: Option<Json<Owner>>,
    explanation: Option<Json<StoredExplanation>>,
    fetched: i64,
}

impl From<PagedRow> for WorkloadRow {
    fn from(r: PagedRow) -> Self {
        Self {
            uid: r.uid,
            team_name: r.team_name,
            name: r.name,
            labels: r.labels,
            spec: r.spec,
            status: r.status,
            generation: r.generation,
            resource_version: r.resource_version,
            created_at: r.created_at,
            updated_at: r.updated_at,
            deletion_timestamp: r.deletion_timestamp,
            owner: r.owner,
            explanation: r.explanation,
        }
    }
}

impl From<WorkloadRow> for Workload {
    fn from(r: WorkloadRow) -> Self {
        let mut status = r.status.0;
        // What was explained of another attempt (before a requeue) is not said of this one.
        if let Some(Json(e)) = r.explanation
            && status.phase == Phase::Pending
            && e.attempt == i64::from(status.attempt)
        {
            status.pending_reason = e.pending_reason;
            status.queue_position = e.queue_position;
            status.estimated_start = e.estimated_start;
        }
        Workload {
            metadata: ObjectMeta {
                name: r.name,
                team: Some(r.team_name),
                uid: r.uid,
                labels: r.labels.0,
                generation: r.generation,
                resource_version: r.resource_version.to_string(),
                creation_timestamp: r.created_at,
                update_timestamp: r.updated_at,
                deletion_timestamp: r.deletion_timestamp,
                owner: r.owner.map(|o| o.0),
            },
            spec: r.spec.0,
            status,
        }
    }
}

/// Which workloads a list returns. `None` fields do not filter.
#[derive(Debug, Clone, Default)]
pub struct WorkloadFilter {
    pub team: Option<String>,
    /// Only these teams (the caller's visible ones); `None`: all.
    pub teams: Option<Vec<String>>,
    pub phase: Option<Phase>,
    pub cluster: Option<String>,
    pub kind: Option<WorkloadKind>,
    pub labels: LabelSelector,
    /// Only workloads whose owner has this subject.
    pub owner_subject: Option<String>,
    /// ... and this issuer.
    pub owner_issuer: Option<String>,
    /// Only workloads whose name contains this.
    pub name_contains: Option<String>,
}

/// Fetches a workload by team and name.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_fetch(db: impl PgExecutor<'_>, team: &str, name: &str) -> Result<Option<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM workloads w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           WHERE w.team_name = $1 AND w.name = $2"#,
        team,
        name
    )
    .fetch_optional(db)
    .await
    .map(|r| r.map(Workload::from))
    .map_err(db_error)
}

/// Fetches a workload and locks it for the rest of the transaction.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_fetch_for_update(
    tx: &mut PgConnection,
    team: &str,
    name: &str,
) -> Result<Option<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM workloads w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           WHERE w.team_name = $1 AND w.name = $2 FOR UPDATE OF w"#,
        team,
        name
    )
    .fetch_optional(tx)
    .await
    .map(|r| r.map(Workload::from))
    .map_err(db_error)
}

/// A workload to insert.
pub struct NewWorkload<'a> {
    pub uid: WorkloadId,
    pub team_uid: TeamId,
    pub team: &'a str,
    pub name: &'a str,
    pub labels: &'a Labels,
    pub spec: &'a WorkloadSpec,
    pub status: &'a WorkloadStatus,
    pub owner: Option<&'a Owner>,
    /// Who submits it, for its audit record.
    pub actor: &'a berth_core::event::Actor,
}

/// Inserts a workload; `None` when another writer created the name first.
///
/// # Errors
/// As [`db_error`]; a conflict when the team was deleted meanwhile.
pub async fn workload_insert(tx: &mut PgConnection, w: &NewWorkload<'_>) -> Result<Option<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"INSERT INTO workloads (uid, team_uid, team_name, name, kind, phase, flavors, labels, spec, status, owner)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
           ON CONFLICT (team_name, name) DO NOTHING
           RETURNING uid, team_name, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                     generation, resource_version, created_at, updated_at, deletion_timestamp, owner AS "owner: _",
                     NULL::jsonb AS "explanation: _""#,
        w.uid.0,
        w.team_uid.0,
        w.team,
        w.name,
        w.spec.kind.as_str(),
        w.status.phase.as_str(),
        &w.spec.tasks.resources.flavors,
        Json(w.labels) as _,
        Json(w.spec) as _,
        Json(w.status) as _,
        w.owner.map(Json) as _,
    )
    .fetch_optional(tx)
    .await
    .map(|r| r.map(Workload::from))
    .map_err(db_error)
}

/// Replaces a workload's labels and spec.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_update_spec(
    tx: &mut PgConnection,
    uid: WorkloadId,
    labels: &Labels,
    spec: &WorkloadSpec,
    generation: i64,
) -> Result<Workload, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"WITH w AS (
           UPDATE workloads
           SET labels = $2, spec = $3, kind = $4, flavors = $5, generation = $6,
               resource_version = nextval('resource_version_seq'), updated_at = now(),
               written_by = pg_current_xact_id()
           WHERE uid = $1
           RETURNING *)
           SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'"#,
        uid.0,
        Json(labels) as _,
        Json(spec) as _,
        spec.kind.as_str(),
        &spec.tasks.resources.flavors,
        generation,
    )
    .fetch_one(tx)
    .await
    .map(Workload::from)
    .map_err(db_error)
}

/// Marks a workload for deletion; the controllers finish it.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_mark_deleted(tx: &mut PgConnection, uid: WorkloadId) -> Result<Workload, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"WITH w AS (
           UPDATE workloads
           SET deletion_timestamp = coalesce(deletion_timestamp, now()),
               resource_version = nextval('resource_version_seq'), updated_at = now(),
               written_by = pg_current_xact_id()
           WHERE uid = $1
           RETURNING *)
           SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'"#,
        uid.0,
    )
    .fetch_one(tx)
    .await
    .map(Workload::from)
    .map_err(db_error)
}

/// Removes a workload row.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_delete(tx: &mut PgConnection, uid: WorkloadId) -> Result<(), Error> {
    sqlx::query!("DELETE FROM workloads WHERE uid = $1", uid.0).execute(tx).await.map_err(db_error)?;
    Ok(())
}

/// Lists workloads ordered by (team, name), filtered, in one query.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list(
    db: impl PgExecutor<'_>,
    filter: &WorkloadFilter,
    page: &PageRequest<(String, String)>,
) -> Result<Page<Workload>, Error> {
    let (after_team, after_name) = page.after.clone().unzip();
    let sel = &filter.labels;
    // The keys of the page first (with each row's size and the running total, in order),
    // then the rows whose start lies within the byte budget: a page of large workloads is
    // cut short, with a `next` cursor, and nothing beyond it is ever read whole.
    let rows = sqlx::query_as!(
        PagedRow,
        r#"WITH keys AS (
             SELECT uid, size, sum(size) OVER (ORDER BY team_name, name ROWS UNBOUNDED PRECEDING) AS running
             FROM (SELECT uid, team_name, name,
                          spec_bytes + octet_length(status::text) + octet_length(labels::text) + 256 AS size
                   FROM workloads w
                   WHERE ($1::text IS NULL OR team_name = $1)
                     AND ($2::text IS NULL OR phase = $2)
                     AND ($3::text IS NULL OR cluster = $3)
                     AND ($4::text IS NULL OR kind = $4)
                     AND labels @> $5
                     AND labels ?& $6
                     AND NOT labels ?| $7
                     AND NOT EXISTS (SELECT 1 FROM jsonb_each_text($8) ne WHERE w.labels ->> ne.key = ne.value)
                     AND ($9::text IS NULL OR (team_name, name) > ($9, $10))
                     AND ($12::text[] IS NULL OR team_name = ANY($12))
                     AND ($14::text IS NULL OR owner ->> 'subject' = $14)
                     AND ($15::text IS NULL OR owner ->> 'issuer' = $15)
                     AND ($16::text IS NULL OR strpos(name, $16) > 0)
                   ORDER BY team_name, name
                   LIMIT $11) matching
           ), counted AS (SELECT uid, size, running, count(*) OVER () AS fetched FROM keys)
           SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _", c.fetched AS "fetched!"
           FROM counted c JOIN workloads w ON w.uid = c.uid
                LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           WHERE c.running - c.size < $13
           ORDER BY w.team_name, w.name"#,
        filter.team.as_deref(),
        filter.phase.map(Phase::as_str),
        filter.cluster.as_deref(),
        filter.kind.map(WorkloadKind::as_str),
        Json(&sel.equals) as _,
        &sel.exists,
        &sel.not_exists,
        Json(&sel.not_equals) as _,
        after_team,
        after_name,
        i64::from(page.limit) + 1,
        filter.teams.as_deref(),
        PAGE_BYTES,
        filter.owner_subject.as_deref(),
        filter.owner_issuer.as_deref(),
        filter.name_contains.as_deref(),
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    let fetched = rows.first().map_or(0, |r| r.fetched);
    let rows: Vec<WorkloadRow> = rows.into_iter().map(WorkloadRow::from).collect();
    let key = |r: &WorkloadRow| (r.team_name.clone(), r.name.clone());
    let page = if (rows.len() as i64) < fetched {
        // Cut by the budget: more follow after the last row sent.
        let next = rows.last().map(|last| encode_cursor(&key(last)));
        Page { items: rows, next }
    } else {
        Page::from_rows(rows, page.limit, key)
    };
    Ok(page.map(Workload::from))
}

/// A pending workload's place in the queue as [`workload_queue`] orders it.
struct QueueKey {
    uid: Uuid,
    team_name: String,
    priority: i32,
    /// When it was submitted, to the second (as the scheduler takes it).
    submitted: i64,
    created_at: DateTime<Utc>,
    /// Its global position as the scheduler last wrote it.
    slot: Option<i32>,
    gpus: f64,
}

/// The first `limit` pending workloads in queue order, of the teams in `only` when given;
/// and how many are pending and their GPUs in all. Each one's `queue_position` is its place
/// in that order.
///
/// Within a team the order is the scheduler's own, which the workloads' specs decide:
/// priority, then submission (to the second), then uid. Between teams it is the
/// scheduler's fair-share order as of the global positions it last wrote: beyond the head
/// of the queue a position is written only once it is a tenth off (`QueuePosition`), so
/// ordered by the positions as stored, a team's workloads came out of order (a priority 27
/// before a priority 35) and two of them had one team position. The team's stored
/// positions are the places its workloads take, in its own order. Those the scheduler has
/// not placed in the queue yet come last, each team's in its order. (Ordered here, not in
/// SQL: two window sorts and a self-join of 100,000 pending rows took 0.9-1.1 s there.)
///
/// # Errors
/// As [`db_error`].
pub async fn workload_queue(
    db: &crate::PgPool,
    only: Option<&[String]>,
    limit: u32,
) -> Result<(Vec<Workload>, i64, f64), Error> {
    let keys = sqlx::query_as!(
        QueueKey,
        r#"SELECT w.uid, w.team_name, coalesce((w.spec ->> 'priority')::int, 0) AS "priority!",
                  floor(extract(epoch FROM coalesce((w.status ->> 'submitted_at')::timestamptz, w.created_at)))::bigint
                      AS "submitted!",
                  w.created_at, (e.queue_position ->> 'global')::int AS slot,
                  coalesce((w.spec #>> '{tasks,count}')::float8 * (w.spec #>> '{tasks,resources,gpus}')::float8, 0)
                      AS "gpus!"
           FROM workloads w
                LEFT JOIN workload_explanations e
                ON e.uid = w.uid AND e.attempt = coalesce((w.status ->> 'attempt')::bigint, 0)
           WHERE w.phase = 'Pending' AND ($1::text[] IS NULL OR w.team_name = ANY($1))"#,
        only,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    let total = i64::try_from(keys.len()).unwrap_or(i64::MAX);
    // Folded from +0: an empty sum of floats is -0, which clients print as "-0 GPUs".
    let gpus = keys.iter().map(|k| k.gpus).fold(0.0, |a, b| a + b);
    let placed = queue_order(&keys, usize::try_from(limit).unwrap_or(usize::MAX));
    let uids: Vec<Uuid> = placed.iter().map(|&(k, ..)| keys[k].uid).collect();
    // As a list page: only the rows within the byte budget.
    let rows = sqlx::query_as!(
        WorkloadRow,
        r#"WITH keys AS (
             SELECT k.uid, k.ord, size, sum(size) OVER (ORDER BY k.ord ROWS UNBOUNDED PRECEDING) AS running
             FROM unnest($1::uuid[]) WITH ORDINALITY AS k (uid, ord)
                  JOIN LATERAL (SELECT spec_bytes + octet_length(status::text) + octet_length(labels::text) + 256
                                       AS size
                                FROM workloads WHERE uid = k.uid) w ON true
           )
           SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM keys k JOIN workloads w ON w.uid = k.uid
                LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           WHERE k.running - k.size < $2 AND w.phase = 'Pending'
           ORDER BY k.ord"#,
        &uids,
        PAGE_BYTES,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    let places: std::collections::HashMap<Uuid, (Option<i32>, u32)> =
        placed.iter().map(|&(k, slot, in_team)| (keys[k].uid, (slot, in_team))).collect();
    // Positions increase down the list: one stored twice (two teams' workloads placed at
    // different cycles) is taken once, by the first; the next takes the one after.
    let mut last = 0;
    let items = rows
        .into_iter()
        .map(Workload::from)
        .map(|mut w| {
            let (slot, in_team) = places.get(&w.metadata.uid).copied().unwrap_or_default();
            w.status.queue_position = slot.map(|slot| {
                last = u32::try_from(slot).unwrap_or(0).max(last + 1);
                QueuePosition { global: last, team: in_team }
            });
            w
        })
        .collect();
    Ok((items, total, gpus))
}

/// The first `limit` of `keys` in queue order ([`workload_queue`]): each as its index, the
/// stored global position it takes, and its place in its team's order.
fn queue_order(keys: &[QueueKey], limit: usize) -> Vec<(usize, Option<i32>, u32)> {
    let mut groups: std::collections::HashMap<(&str, bool), Vec<usize>> = std::collections::HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        groups.entry((k.team_name.as_str(), k.slot.is_some())).or_default().push(i);
    }
    let mut placed = Vec::with_capacity(keys.len());
    for mut own in groups.into_values() {
        let mut slots = own.clone();
        own.sort_unstable_by_key(|&i| (std::cmp::Reverse(keys[i].priority), keys[i].submitted, keys[i].uid));
        slots.sort_unstable_by_key(|&i| (keys[i].slot, keys[i].created_at, keys[i].uid));
        for (n, (&w, &s)) in own.iter().zip(&slots).enumerate() {
            placed.push((w, keys[s].slot, u32::try_from(n + 1).unwrap_or(u32::MAX)));
        }
    }
    let order = |&(w, slot, in_team): &(usize, Option<i32>, u32)| {
        (slot.is_none(), slot, in_team, keys[w].created_at, keys[w].uid)
    };
    if placed.len() > limit {
        placed.select_nth_unstable_by_key(limit, order);
        placed.truncate(limit);
    }
    placed.sort_unstable_by_key(order);
    placed
}

/// How many workloads are in each phase (of the teams in `only` when given), with their
/// GPUs; phases without workloads are left out.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_phase_counts(
    db: &crate::PgPool,
    only: Option<&[String]>,
) -> Result<Vec<(Phase, i64, f64)>, Error> {
    let rows = sqlx::query!(
        r#"SELECT phase AS "phase!", count(*) AS "count!",
                  coalesce(sum((spec #>> '{tasks,count}')::float8 * (spec #>> '{tasks,resources,gpus}')::float8), 0)
                      AS "gpus!"
           FROM workloads WHERE ($1::text[] IS NULL OR team_name = ANY($1))
           GROUP BY phase"#,
        only,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    rows.into_iter().map(|r| Ok((stored_phase(&r.phase)?, r.count, r.gpus))).collect()
}

/// What an apply needs to know before it writes, read in one round trip.
pub struct WorkloadLookup {
    /// The team's uid; `None` when the team does not exist.
    pub team_uid: Option<TeamId>,
    /// Of the requested flavors, those that do not exist.
    pub missing_flavors: Vec<String>,
}

/// Resolves a workload's team and its flavors, in one query.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_lookup(db: impl PgExecutor<'_>, team: &str, flavors: &[String]) -> Result<WorkloadLookup, Error> {
    let row = sqlx::query!(
        r#"SELECT (SELECT uid FROM teams WHERE name = $1) AS team_uid,
                  ARRAY(SELECT f FROM unnest($2::text[]) WITH ORDINALITY AS u (f, i)
                        WHERE NOT EXISTS (SELECT 1 FROM flavors WHERE flavors.name = u.f)
                        ORDER BY u.i) AS "missing_flavors!""#,
        team,
        flavors
    )
    .fetch_one(db)
    .await
    .map_err(db_error)?;
    Ok(WorkloadLookup { team_uid: row.team_uid.map(TeamId), missing_flavors: row.missing_flavors })
}

/// Tells the controllers of every replica that workloads were submitted, from a transaction
/// of its own (see [`workload_create_many`]).
///
/// # Errors
/// As [`db_error`].
pub async fn notify_workloads_submitted(db: impl PgExecutor<'_>) -> Result<(), Error> {
    crate::changes::notify(db, &crate::changes::Change::Submitted).await
}

/// Creates workloads, each with its `Created` event and audit record, in one
/// statement (so one round trip and one implicit transaction). Names already taken are
/// skipped, and so are workloads whose team (that uid under that name) or one of whose
/// flavors no longer exists: the answer has an item per workload given, in order, `None`
/// where it was skipped.
///
/// This is the hot path of submission, alone or in batches; the general path
/// (`workload_insert` + `event_record` + `audit_record` in a transaction) writes the same
/// rows. Its transaction notifies no one: once it has committed, the caller has
/// [`notify_workloads_submitted`] sent (the application layer sends one for many
/// submissions), and hands what it created to this process's readers of the feed
/// ([`crate::created_here::committed`], with [`CreatedMany::written_by`]).
///
/// # Errors
/// As [`db_error`]; a conflict when the team was deleted meanwhile.
pub async fn workload_create_many(
    db: impl PgExecutor<'_>,
    items: &[NewWorkload<'_>],
    event_message: &str,
) -> Result<CreatedMany, Error> {
    let uids: Vec<Uuid> = items.iter().map(|w| w.uid.0).collect();
    let team_uids: Vec<Uuid> = items.iter().map(|w| w.team_uid.0).collect();
    let teams: Vec<&str> = items.iter().map(|w| w.team).collect();
    let names: Vec<&str> = items.iter().map(|w| w.name).collect();
    let kinds: Vec<&str> = items.iter().map(|w| w.spec.kind.as_str()).collect();
    let phases: Vec<&str> = items.iter().map(|w| w.status.phase.as_str()).collect();
    let flavors: Vec<Json<&Vec<String>>> = items.iter().map(|w| Json(&w.spec.tasks.resources.flavors)).collect();
    let labels: Vec<Json<&Labels>> = items.iter().map(|w| Json(w.labels)).collect();
    let specs: Vec<Json<&WorkloadSpec>> = items.iter().map(|w| Json(w.spec)).collect();
    let statuses: Vec<Json<&WorkloadStatus>> = items.iter().map(|w| Json(w.status)).collect();
    let owners: Vec<Option<Json<&Owner>>> = items.iter().map(|w| w.owner.map(Json)).collect();
    let subjects: Vec<&str> = items.iter().map(|w| w.actor.subject.as_str()).collect();
    let request_ids: Vec<Option<&str>> = items.iter().map(|w| w.actor.request_id.as_deref()).collect();
    // Only what Postgres decides comes back; the rest is what was sent.
    let rows = sqlx::query!(
        r#"WITH w AS (
               INSERT INTO workloads (uid, team_uid, team_name, name, kind, phase, flavors, labels, spec, status, owner)
               SELECT i.uid, i.team_uid, i.team_name, i.name, i.kind, i.phase,
                      ARRAY(SELECT jsonb_array_elements_text(i.flavors)), i.labels, i.spec, i.status, i.owner
               FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[], $5::text[], $6::text[],
                           $7::jsonb[], $8::jsonb[], $9::jsonb[], $10::jsonb[], $14::jsonb[])
                    AS i (uid, team_uid, team_name, name, kind, phase, flavors, labels, spec, status, owner)
               -- Written on what the caller read earlier: the team and flavors must still be
               -- (each flavor held, as flavor_missing holds it, against a delete).
               WHERE EXISTS (SELECT 1 FROM teams t WHERE t.uid = i.team_uid AND t.name = i.team_name)
                 AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(i.flavors) AS f (name)
                                 WHERE NOT EXISTS (SELECT 1 FROM flavors WHERE flavors.name = f.name
                                                   FOR KEY SHARE))
               ON CONFLICT (team_name, name) DO NOTHING
               RETURNING uid, team_name, name, generation, resource_version, created_at, updated_at
           ), e AS (
               INSERT INTO events (object_kind, object_uid, type, reason, message)
               SELECT 'workload', uid, 'Normal', 'Created', $11 FROM w
           ), a AS (
               INSERT INTO audit_log (actor, verb, kind, team, name, uid, generation_before, generation_after, request_id)
               SELECT i.actor, 'create', 'workload', w.team_name, w.name, w.uid, NULL, w.generation, i.request_id
               FROM w JOIN unnest($1::uuid[], $12::text[], $13::text[]) AS i (uid, actor, request_id) USING (uid)
           )
           SELECT uid AS "uid!", generation AS "generation!", resource_version AS "resource_version!",
                  created_at AS "created_at!", updated_at AS "updated_at!",
                  pg_current_xact_id()::text::bigint AS "written_by!",
                  -- No notification from this transaction: the caller sends one after it
                  -- commits (migration workload_submissions_notify_later).
                  (SELECT set_config('berth.notify', 'later', true)) AS notify
           FROM w"#,
        &uids,
        &team_uids,
        &teams as _,
        &names as _,
        &kinds as _,
        &phases as _,
        &flavors as _,
        &labels as _,
        &specs as _,
        &statuses as _,
        event_message,
        &subjects as _,
        &request_ids as _,
        &owners as _,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    let written_by = rows.first().map(|r| r.written_by);
    let mut created: std::collections::HashMap<Uuid, _> = rows.into_iter().map(|r| (r.uid, r)).collect();
    let workloads = items
        .iter()
        .map(|w| {
            let r = created.remove(&w.uid.0)?;
            Some(Workload {
                metadata: ObjectMeta {
                    name: w.name.to_owned(),
                    team: Some(w.team.to_owned()),
                    uid: r.uid,
                    labels: w.labels.clone(),
                    generation: r.generation,
                    resource_version: r.resource_version.to_string(),
                    creation_timestamp: r.created_at,
                    update_timestamp: r.updated_at,
                    deletion_timestamp: None,
                    owner: w.owner.cloned(),
                },
                spec: w.spec.clone(),
                status: w.status.clone(),
            })
        })
        .collect();
    Ok(CreatedMany { workloads, written_by })
}

/// What [`workload_create_many`] created: an item per workload given, in order, `None`
/// where it was skipped; and the transaction that wrote them, when it wrote any.
#[derive(Debug)]
pub struct CreatedMany {
    pub workloads: Vec<Option<Workload>>,
    pub written_by: Option<i64>,
}

impl CreatedMany {
    /// Hands what was created to this process's readers of the feed; call once the
    /// statement's transaction has committed.
    pub fn committed(&self, db: &PgPool) {
        if let Some(by) = self.written_by {
            crate::created_here::committed(db, by, self.workloads.iter().flatten());
        }
    }
}

/// Of these names, those the team's workloads already use.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_names_taken(db: impl PgExecutor<'_>, team: &str, names: &[&str]) -> Result<Vec<String>, Error> {
    sqlx::query_scalar!("SELECT name FROM workloads WHERE team_name = $1 AND name = ANY($2::text[])", team, names as _)
        .fetch_all(db)
        .await
        .map_err(db_error)
}

/// A spec cut down as the SQL function `workload_spec_for_scheduling` cuts it (see
/// [`workload_list_active`]), for a workload the scheduler did not read from the store
/// ([`crate::created_here`]).
pub fn spec_for_scheduling(spec: &mut WorkloadSpec) {
    let run = std::mem::take(&mut spec.run);
    let runs_something = run.script.is_some_and(|s| !s.is_empty()) || !run.command.is_empty();
    spec.run.image = run.image;
    if runs_something {
        spec.run.command = vec!["(elided)".to_owned()];
    }
}

/// Every workload not yet finished (final ones are history), ordered by uid, as the
/// scheduler reads them: the SQL function `workload_spec_for_scheduling` keeps of
/// `spec.run` only its image, without the script, command and environment, which make up
/// nearly all of a large spec, so a scheduling pass does not carry every stored script.
/// What the scheduler needs of them — whether there is a script or a command at all
/// (Slurm runs nothing else) — stays, as a `command` of the one placeholder word
/// `(elided)`.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list_active(db: impl PgExecutor<'_>) -> Result<Vec<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", workload_spec_for_scheduling(w.spec) AS "spec!: _",
                  w.status AS "status: _", w.generation, w.resource_version, w.created_at, w.updated_at,
                  w.deletion_timestamp, w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM workloads w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           WHERE w.phase NOT IN ('Succeeded', 'Failed', 'Cancelled')
           ORDER BY w.uid"#
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Workload::from).collect())
    .map_err(db_error)
}

/// Where a reader of the change feed stands: the snapshot its read saw (`pg_snapshot`'s
/// text, `xmin:xmax:in-flight,…`). A read from here returns what that snapshot did not see:
/// the writes of transactions from its `xmax` on and of those it saw in flight, found
/// through the `written_by` index. A transaction left open (a `BEGIN` forgotten in psql)
/// holds back only itself: with the snapshot's `xmin` as the cursor, every read returned
/// all that was written since it began (the scheduler read 5,848 workloads a cycle after
/// 6,000 creates, and its cycle went from 75 to 722 ms).
///
/// A read passes `xmax` and the in-flight list as values ([`FeedCursor::bounds`]), not as
/// expressions of the snapshot for Postgres to work out: `ANY(ARRAY(SELECT
/// pg_snapshot_xip(..)))` is a subquery, which the planner cannot look into, so it guessed
/// that most of the table matched and read all of it once the rows had been rewritten
/// (bench/controllers scale: 100–200 ms a read at 127,000 workloads, against 0.1–1 ms
/// through the index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeedCursor {
    snapshot: String,
    xmax: i64,
    in_flight: Vec<i64>,
}

impl FeedCursor {
    fn parse(snapshot: String) -> Result<Self, Error> {
        let bad = || Error::Internal(format!("unexpected pg_snapshot {snapshot:?}"));
        let mut parts = snapshot.split(':');
        let (Some(xmin), Some(xmax), Some(in_flight), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let (_, xmax): (i64, i64) = (xmin.parse().map_err(|_| bad())?, xmax.parse().map_err(|_| bad())?);
        let in_flight = (in_flight.split(',').filter(|x| !x.is_empty()).map(str::parse))
            .collect::<Result<Vec<i64>, _>>()
            .map_err(|_| bad())?;
        Ok(Self { xmax, in_flight, snapshot })
    }

    /// Whether the snapshot saw what transaction `xid` wrote (it had ended), so that no
    /// read from here returns it.
    pub fn saw(&self, xid: i64) -> bool {
        xid < self.xmax && !self.in_flight.contains(&xid)
    }

    /// What a read from here returns, as a statement takes it: the transactions from
    /// `xmax` on (`written_by >= $a::bigint::text::xid8`) and those listed (`written_by =
    /// ANY($b::bigint[]::text[]::xid8[])`): the ones seen in flight, and `xmax` itself so
    /// that the list is never empty (an empty `ANY` is false, and Postgres then reads a
    /// partial index whole for it).
    fn bounds(&self) -> (i64, Vec<i64>) {
        let mut listed = self.in_flight.clone();
        listed.push(self.xmax);
        (self.xmax, listed)
    }
}

/// Where a reader of the change feed stands after this transaction's snapshot. Call inside
/// [`crate::begin_snapshot`], before anything else.
///
/// # Errors
/// As [`db_error`].
pub async fn change_cursor(db: impl PgExecutor<'_>) -> Result<FeedCursor, Error> {
    let snapshot = sqlx::query_scalar!(r#"SELECT pg_current_snapshot()::text AS "snapshot!""#)
        .fetch_one(db)
        .await
        .map_err(db_error)?;
    FeedCursor::parse(snapshot)
}

/// Every workload, of any phase, written since `cursor` (from [`change_cursor`]), shaped as
/// [`workload_list_active`]'s; but not those still at one of the `known` resource versions
/// (the reader's own writes, which it has already).
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list_written_since(
    db: impl PgExecutor<'_>,
    cursor: &FeedCursor,
    known: &[i64],
) -> Result<Vec<Workload>, Error> {
    let (xmax, listed) = cursor.bounds();
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", workload_spec_for_scheduling(w.spec) AS "spec!: _",
                  w.status AS "status: _", w.generation, w.resource_version, w.created_at, w.updated_at,
                  w.deletion_timestamp, w.owner AS "owner: _",
                  -- Looked up per row (a join was planned, for any bounds, as a scan of every
                  -- explanation: 10 ms a read at 50,000 pending).
                  (SELECT to_jsonb(e) FROM workload_explanations e WHERE e.uid = w.uid AND w.phase = 'Pending')
                      AS "explanation: _"
           FROM workloads w
           WHERE (w.written_by >= $1::bigint::text::xid8 OR w.written_by = ANY($2::bigint[]::text[]::xid8[]))
             -- A hashed subplan: one lookup per row, however many are known.
             AND w.resource_version NOT IN (SELECT unnest($3::bigint[]))
           ORDER BY w.uid"#,
        xmax,
        &listed,
        known,
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Workload::from).collect())
    .map_err(db_error)
}

/// What the change feed holds since `cursor`, read in one statement (so in one snapshot):
/// where the reader stands after it, every workload written (whole, as
/// [`workload_fetch`] gives it), and the uids of those deleted.
pub struct FeedRead {
    pub cursor: FeedCursor,
    pub written: Vec<Workload>,
    pub deleted: Vec<Uuid>,
}

/// Reads the change feed since `cursor` (from [`change_cursor`] or an earlier
/// [`FeedRead`]), or only where it stands now when `cursor` is `None`.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_feed_read(db: impl PgExecutor<'_>, cursor: Option<FeedCursor>) -> Result<FeedRead, Error> {
    let Some(since) = cursor else {
        return Ok(FeedRead { cursor: change_cursor(db).await?, written: Vec::new(), deleted: Vec::new() });
    };
    let (xmax, listed) = since.bounds();
    let rows = sqlx::query!(
        r#"WITH feed AS (
               SELECT pg_current_snapshot()::text AS cursor,
                      ARRAY(SELECT uid FROM workload_tombstones
                            WHERE written_by >= $1::bigint::text::xid8
                               OR written_by = ANY($2::bigint[]::text[]::xid8[])) AS deleted)
           SELECT feed.cursor AS "cursor!", feed.deleted AS "deleted!",
                  w.uid AS "uid?", w.team_name AS "team_name?", w.name AS "name?",
                  w.labels AS "labels?: Json<Labels>", w.spec AS "spec?: Json<WorkloadSpec>",
                  w.status AS "status?: Json<WorkloadStatus>", w.generation AS "generation?",
                  w.resource_version AS "resource_version?", w.created_at AS "created_at?",
                  w.updated_at AS "updated_at?", w.deletion_timestamp, w.owner AS "owner: Json<Owner>",
                  -- Looked up per row, as in workload_list_written_since.
                  (SELECT to_jsonb(e) FROM workload_explanations e WHERE e.uid = w.uid AND w.phase = 'Pending')
                      AS "explanation: Json<StoredExplanation>"
           FROM feed LEFT JOIN workloads w
                -- Written, or explained (a pending reason, a queue position, an estimate): as
                -- an array, looked up by uid (as a join, the planner took an explanations
                -- table it had no statistics of for a large one, and read every workload).
                ON w.uid = ANY(ARRAY(
                       SELECT uid FROM workloads
                       WHERE written_by >= $1::bigint::text::xid8 OR written_by = ANY($2::bigint[]::text[]::xid8[])
                       UNION
                       SELECT uid FROM workload_explanations
                       WHERE written_by >= $1::bigint::text::xid8 OR written_by = ANY($2::bigint[]::text[]::xid8[])))"#,
        xmax,
        &listed,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    let mut read = FeedRead { cursor: since, written: Vec::with_capacity(rows.len()), deleted: Vec::new() };
    for r in rows {
        if read.cursor.snapshot != r.cursor {
            read.cursor = FeedCursor::parse(r.cursor)?;
        }
        if read.deleted.is_empty() {
            read.deleted = r.deleted;
        }
        let (Some(uid), Some(team_name), Some(name), Some(labels), Some(spec), Some(status)) =
            (r.uid, r.team_name, r.name, r.labels, r.spec, r.status)
        else {
            continue;
        };
        let (Some(generation), Some(resource_version), Some(created_at), Some(updated_at)) =
            (r.generation, r.resource_version, r.created_at, r.updated_at)
        else {
            continue;
        };
        read.written.push(Workload::from(WorkloadRow {
            uid,
            team_name,
            name,
            labels,
            spec,
            status,
            generation,
            resource_version,
            created_at,
            updated_at,
            deletion_timestamp: r.deletion_timestamp,
            owner: r.owner,
            explanation: r.explanation,
        }));
    }
    Ok(read)
}

/// The workloads deleted since `cursor`.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_deleted_since(db: impl PgExecutor<'_>, cursor: &FeedCursor) -> Result<Vec<Uuid>, Error> {
    let (xmax, listed) = cursor.bounds();
    sqlx::query_scalar!(
        "SELECT uid FROM workload_tombstones
         WHERE written_by >= $1::bigint::text::xid8 OR written_by = ANY($2::bigint[]::text[]::xid8[])",
        xmax,
        &listed,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)
}

/// Removes the tombstones of workloads deleted more than `kept_seconds` ago by the
/// database's clock (the time the delete ran, not when its transaction began); how many.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_tombstones_purge(db: impl PgExecutor<'_>, kept_seconds: f64) -> Result<u64, Error> {
    sqlx::query!(
        "DELETE FROM workload_tombstones WHERE deleted_at < clock_timestamp() - make_interval(secs => $1)",
        kept_seconds
    )
    .execute(db)
    .await
    .map(|r| r.rows_affected())
    .map_err(db_error)
}

/// The uids of the workloads in `phase`, oldest change first: every one, or (with a
/// `cursor` from [`change_cursor`]) those written since, found through the change feed's
/// index alone.
///
/// The feed's read tests the phase so that the planner cannot use the `workloads_phase`
/// index: every workload that passed through a phase leaves an entry there until vacuum
/// can remove it, which a long snapshot (a full read of the world) holds off, so at 100,000
/// running one look through `Admitted` visited 100,000 dead entries (110–200 ms).
///
/// # Errors
/// As [`db_error`].
pub async fn workload_in_phase(
    db: impl PgExecutor<'_>,
    phase: Phase,
    cursor: Option<&FeedCursor>,
) -> Result<Vec<Uuid>, Error> {
    match cursor {
        None => {
            sqlx::query_scalar!("SELECT uid FROM workloads WHERE phase = $1 ORDER BY updated_at", phase.as_str())
                .fetch_all(db)
                .await
        }
        Some(cursor) => {
            let (xmax, listed) = cursor.bounds();
            sqlx::query_scalar!(
                "SELECT uid FROM workloads
                 WHERE (written_by >= $1::bigint::text::xid8 OR written_by = ANY($2::bigint[]::text[]::xid8[]))
                   AND (phase = $3) IS TRUE
                 ORDER BY updated_at",
                xmax,
                &listed,
                phase.as_str(),
            )
            .fetch_all(db)
            .await
        }
    }
    .map_err(db_error)
}

/// Claims those of `among` still in `phase` for the rest of the transaction, skipping rows
/// another transaction holds: two dispatchers never work on the same workload. Looked up
/// by uid (the phase is tested off its index, as in [`workload_in_phase`]).
///
/// # Errors
/// As [`db_error`].
pub async fn workload_claim(tx: &mut PgConnection, phase: Phase, among: &[Uuid]) -> Result<Vec<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT uid, team_name, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at, deletion_timestamp, owner AS "owner: _",
                  NULL::jsonb AS "explanation: _"
           FROM workloads WHERE uid = ANY($1) AND (phase = $2) IS TRUE
           ORDER BY updated_at
           FOR UPDATE SKIP LOCKED"#,
        among,
        phase.as_str(),
    )
    .fetch_all(tx)
    .await
    .map(|rows| rows.into_iter().map(Workload::from).collect())
    .map_err(db_error)
}

/// A status a controller computed from the workload it read at `resource_version`.
pub struct StatusWrite {
    pub uid: WorkloadId,
    pub resource_version: i64,
    pub status: WorkloadStatus,
}

/// A status write that took: the workload's version as the database made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusWritten {
    pub uid: Uuid,
    pub resource_version: i64,
    pub updated_at: DateTime<Utc>,
    /// The writing transaction, as [`change_cursor`] counts.
    pub written_by: i64,
}

/// Writes statuses, each only if the workload is still at the version its writer read
/// (compare-and-set): a workload that changed meanwhile is left alone for the next pass.
/// Returns those written, with their new versions.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_write_statuses(
    tx: &mut PgConnection,
    writes: &[StatusWrite],
) -> Result<Vec<StatusWritten>, Error> {
    if writes.is_empty() {
        return Ok(Vec::new());
    }
    let uids: Vec<Uuid> = writes.iter().map(|w| w.uid.0).collect();
    let versions: Vec<i64> = writes.iter().map(|w| w.resource_version).collect();
    let statuses: Vec<serde_json::Value> = writes.iter().map(|w| stored_status(&w.status)).collect();
    let phases: Vec<&str> = writes.iter().map(|w| w.status.phase.as_str()).collect();
    let clusters: Vec<Option<String>> =
        writes.iter().map(|w| w.status.admission.as_ref().map(|a| a.cluster.clone())).collect();
    // The change notification names the phases written (`changes::Change::WorkloadStatuses`),
    // so controllers can sleep through writes of no concern to them.
    let written = crate::changes::status_phases_setting(&writes.iter().map(|w| w.status.phase).collect::<Vec<_>>());
    sqlx::query!(
        r#"WITH written AS (
               UPDATE workloads w
               SET status = u.status, phase = u.phase, cluster = u.cluster,
                   resource_version = nextval('resource_version_seq'), updated_at = now(),
                   written_by = pg_current_xact_id()
               FROM unnest($1::uuid[], $2::bigint[], $3::jsonb[], $4::text[], $5::text[])
                    AS u (uid, version, status, phase, cluster),
                    (SELECT set_config('berth.status_phases', $6, true)) AS notify
               WHERE w.uid = u.uid AND w.resource_version = u.version
               RETURNING w.uid, w.phase, w.resource_version, w.updated_at, w.written_by
           ), unexplained AS (
               -- What was explained of a workload's wait goes as it stops waiting.
               DELETE FROM workload_explanations e USING written
               WHERE e.uid = written.uid AND written.phase <> 'Pending'
           )
           SELECT uid AS "uid!", resource_version AS "resource_version!", updated_at AS "updated_at!",
                  written_by::text::bigint AS "written_by!"
           FROM written"#,
        &uids,
        &versions,
        &statuses,
        &phases as &[&str],
        &clusters as &[Option<String>],
        written,
    )
    .fetch_all(tx)
    .await
    .map(|rows| {
        rows.into_iter()
            .map(|r| StatusWritten {
                uid: r.uid,
                resource_version: r.resource_version,
                updated_at: r.updated_at,
                written_by: r.written_by,
            })
            .collect()
    })
    .map_err(db_error)
}

/// A status as the workload's row keeps it: without what is explained of a pending
/// workload, which `workload_explanations` keeps ([`workload_explain`]).
fn stored_status(status: &WorkloadStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(status).expect("status serializes");
    if let Some(fields) = value.as_object_mut() {
        for explained in ["pending_reason", "queue_position", "estimated_start"] {
            fields.remove(explained);
        }
    }
    value
}

/// Why a pending workload waits and where it stands in the queue, as the scheduler
/// explains its attempt `attempt`.
pub struct Explanation {
    pub uid: WorkloadId,
    pub attempt: u32,
    pub pending_reason: Option<PendingReason>,
    pub queue_position: Option<QueuePosition>,
}

/// Writes what the scheduler explains of pending workloads, beside their rows: neither
/// their `resource_version` nor their change notification moves, so no reader of the
/// feed's notifications is woken and no client's `If-Match` is refused because the queue
/// moved; GET's cache sees it through the feed ([`workload_feed_read`]). An estimate of
/// the same attempt stays; one of an earlier attempt goes. Returns how many it wrote.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_explain(db: impl PgExecutor<'_>, explanations: &[Explanation]) -> Result<u64, Error> {
    if explanations.is_empty() {
        return Ok(0);
    }
    let uids: Vec<Uuid> = explanations.iter().map(|e| e.uid.0).collect();
    let attempts: Vec<i64> = explanations.iter().map(|e| i64::from(e.attempt)).collect();
    let reasons: Vec<Option<Json<&PendingReason>>> =
        explanations.iter().map(|e| e.pending_reason.as_ref().map(Json)).collect();
    let positions: Vec<Option<Json<QueuePosition>>> = explanations.iter().map(|e| e.queue_position.map(Json)).collect();
    sqlx::query!(
        r#"INSERT INTO workload_explanations AS e (uid, attempt, pending_reason, queue_position)
           SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::jsonb[], $4::jsonb[])
           ON CONFLICT (uid) DO UPDATE
           SET pending_reason = excluded.pending_reason, queue_position = excluded.queue_position,
               estimated_start = CASE WHEN e.attempt = excluded.attempt THEN e.estimated_start END,
               attempt = excluded.attempt, written_by = pg_current_xact_id()"#,
        &uids,
        &attempts,
        &reasons as _,
        &positions as _,
    )
    .execute(db)
    .await
    .map(|r| r.rows_affected())
    .map_err(db_error)
}

/// Writes when pending workloads should start (`None`: it cannot be estimated), beside
/// their rows, as [`workload_explain`] writes their reasons (which stay, for the same
/// attempt). Returns how many it wrote.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_estimate(
    db: impl PgExecutor<'_>,
    estimates: &[(WorkloadId, u32, Option<StartEstimate>)],
) -> Result<u64, Error> {
    if estimates.is_empty() {
        return Ok(0);
    }
    let uids: Vec<Uuid> = estimates.iter().map(|e| e.0.0).collect();
    let attempts: Vec<i64> = estimates.iter().map(|e| i64::from(e.1)).collect();
    let starts: Vec<Option<Json<&StartEstimate>>> = estimates.iter().map(|e| e.2.as_ref().map(Json)).collect();
    sqlx::query!(
        r#"INSERT INTO workload_explanations AS e (uid, attempt, estimated_start)
           SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::jsonb[])
           ON CONFLICT (uid) DO UPDATE
           SET estimated_start = excluded.estimated_start,
               pending_reason = CASE WHEN e.attempt = excluded.attempt THEN e.pending_reason END,
               queue_position = CASE WHEN e.attempt = excluded.attempt THEN e.queue_position END,
               attempt = excluded.attempt, written_by = pg_current_xact_id()"#,
        &uids,
        &attempts,
        &starts as _,
    )
    .execute(db)
    .await
    .map(|r| r.rows_affected())
    .map_err(db_error)
}

/// Removes what is explained of workloads that are no longer pending, or gone: what
/// [`workload_write_statuses`] did not remove as they left `Pending` (a reason written as
/// its workload was deleted or cancelled). How many it removed.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_explanations_purge(db: impl PgExecutor<'_>) -> Result<u64, Error> {
    sqlx::query!(
        "DELETE FROM workload_explanations e
         WHERE NOT EXISTS (SELECT 1 FROM workloads w WHERE w.uid = e.uid AND w.phase = 'Pending')"
    )
    .execute(db)
    .await
    .map(|r| r.rows_affected())
    .map_err(db_error)
}

/// Removes a workload if it is still at `resource_version`; whether it did.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_delete_at_version(
    tx: &mut PgConnection,
    uid: WorkloadId,
    resource_version: i64,
) -> Result<bool, Error> {
    let done = sqlx::query!("DELETE FROM workloads WHERE uid = $1 AND resource_version = $2", uid.0, resource_version)
        .execute(tx)
        .await
        .map_err(db_error)?;
    Ok(done.rows_affected() == 1)
}

/// A phase as the database holds it.
fn stored_phase(s: &str) -> Result<Phase, Error> {
    Phase::parse(s).ok_or_else(|| Error::Internal(format!("unknown phase {s:?} in the database")))
}

/// The phase and attempt of each of the given workloads that still exists.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_attempts(db: impl PgExecutor<'_>, uids: &[Uuid]) -> Result<Vec<(Uuid, Phase, u32)>, Error> {
    let rows = sqlx::query!(
        r#"SELECT uid, phase, coalesce((status ->> 'attempt')::bigint, 0) AS "attempt!"
           FROM workloads WHERE uid = ANY($1)"#,
        uids
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    rows.into_iter()
        .map(|r| {
            let phase = stored_phase(&r.phase)?;
            Ok((r.uid, phase, u32::try_from(r.attempt).unwrap_or(0)))
        })
        .collect()
}

/// Unfinished workloads in any of `phases`, with or without a deletion request, by uid.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list_in_phases(
    db: impl PgExecutor<'_>,
    phases: &[Phase],
    deleting: bool,
) -> Result<Vec<Workload>, Error> {
    let phases: Vec<&str> = phases.iter().map(|p| p.as_str()).collect();
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM workloads w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           WHERE w.phase = ANY($1) AND (w.deletion_timestamp IS NOT NULL) = $2
           ORDER BY w.uid"#,
        &phases as &[&str],
        deleting,
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Workload::from).collect())
    .map_err(db_error)
}

/// Running notebooks with an idle timeout whose cancellation and deletion were not asked
/// for, by uid (what the idle reaper looks at).
///
/// The phase is tested so that the planner cannot use the `workloads_phase` index: with
/// statistics from before most workloads ran, it took that index as the cheaper way to
/// `Running` and visited every running workload (bench/controllers scale: 400–600 ms a look
/// at 127,000 running, none of them a notebook).
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list_idle_candidates(db: impl PgExecutor<'_>) -> Result<Vec<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT uid, team_name, name, labels AS "labels: _", spec AS "spec: _", status AS "status: _",
                  generation, resource_version, created_at, updated_at, deletion_timestamp, owner AS "owner: _",
                  NULL::jsonb AS "explanation: _"
           FROM workloads -- the first line is the predicate of the index workloads_serving
           WHERE kind IN ('inference', 'notebook') AND phase NOT IN ('Succeeded', 'Failed', 'Cancelled')
             AND (phase = 'Running') IS TRUE AND spec ? 'notebook' AND deletion_timestamp IS NULL
             AND NOT status ? 'cancellation'
           ORDER BY uid"#,
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Workload::from).collect())
    .map_err(db_error)
}

/// Unfinished inference workloads: the services (with `spec.inference`) and their replica
/// workloads (labelled `berth.dev/replica-of`), by uid (what the autoscaler looks at).
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list_serving(db: impl PgExecutor<'_>) -> Result<Vec<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM workloads w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           -- the first line is the predicate of the index workloads_serving
           WHERE w.kind IN ('inference', 'notebook') AND w.phase NOT IN ('Succeeded', 'Failed', 'Cancelled')
             AND w.kind = 'inference' AND (w.spec ? 'inference' OR w.labels ? 'berth.dev/replica-of')
           ORDER BY w.uid"#,
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Workload::from).collect())
    .map_err(db_error)
}

/// Unfinished workloads in any of `phases` whose deletion or cancellation was requested,
/// by uid.
///
/// The search is planned anew on each call, not prepared once per connection: a plan made
/// while the table was empty (a fresh database, as a new site or a benchmark starts) scans
/// every row, and a connection kept it for good (11.6 ms a pass with 26,000 pending
/// workloads, where the partial index `workloads_stopping` answers in 0.02 ms).
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list_stopping(db: &PgPool, phases: &[Phase]) -> Result<Vec<Workload>, Error> {
    let names: Vec<&str> = phases.iter().map(|p| p.as_str()).collect();
    let uids: Vec<Uuid> = sqlx::query_scalar(
        "SELECT uid FROM workloads WHERE phase = ANY($1) AND (deletion_timestamp IS NOT NULL OR status ? 'cancellation')",
    )
    .bind(&names)
    .persistent(false)
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    if uids.is_empty() {
        return Ok(Vec::new());
    }
    // Read again by uid: one may have moved on meanwhile.
    let mut stopping = workload_fetch_many(db, &uids).await?;
    stopping.retain(|w| {
        phases.contains(&w.status.phase) && (w.metadata.deletion_timestamp.is_some() || w.status.cancellation.is_some())
    });
    Ok(stopping)
}

/// Removes up to `limit` workloads that ended before `before`, with a `Removed` event for
/// each; how many it removed.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_remove_ended_before(
    tx: &mut PgConnection,
    before: DateTime<Utc>,
    limit: i64,
) -> Result<u64, Error> {
    let removed = sqlx::query_scalar!(
        r#"WITH gone AS (
               DELETE FROM workloads
               WHERE uid IN (SELECT uid FROM workloads
                             WHERE phase IN ('Succeeded', 'Failed', 'Cancelled')
                               AND (status ->> 'finished_at')::timestamptz < $1
                             LIMIT $2)
               RETURNING uid
           ), e AS (
               INSERT INTO events (object_kind, object_uid, type, reason, message)
               SELECT 'workload', uid, 'Normal', 'Removed', 'removed: it ended longer ago than the retention period'
               FROM gone
           )
           SELECT count(*) AS "n!" FROM gone"#,
        before,
        limit,
    )
    .fetch_one(tx)
    .await
    .map_err(db_error)?;
    Ok(u64::try_from(removed).unwrap_or(0))
}

/// The given workloads, by uid.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_fetch_many(db: impl PgExecutor<'_>, uids: &[Uuid]) -> Result<Vec<Workload>, Error> {
    sqlx::query_as!(
        WorkloadRow,
        r#"SELECT w.uid, w.team_name, w.name, w.labels AS "labels: _", w.spec AS "spec: _", w.status AS "status: _",
                  w.generation, w.resource_version, w.created_at, w.updated_at, w.deletion_timestamp,
                  w.owner AS "owner: _", to_jsonb(e) AS "explanation: _"
           FROM workloads w LEFT JOIN workload_explanations e ON e.uid = w.uid AND w.phase = 'Pending'
           WHERE w.uid = ANY($1) ORDER BY w.uid"#,
        uids,
    )
    .fetch_all(db)
    .await
    .map(|rows| rows.into_iter().map(Workload::from).collect())
    .map_err(db_error)
}

/// Where a workload that reached a backend stands, without its spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendWork {
    pub uid: Uuid,
    pub phase: Phase,
    pub attempt: u32,
    pub cluster: String,
}

/// Unfinished workloads in `phases` on a cluster, not being deleted: the light view status
/// sync compares with the backends' job lists.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_list_backend_work(db: impl PgExecutor<'_>, phases: &[Phase]) -> Result<Vec<BackendWork>, Error> {
    let phases: Vec<&str> = phases.iter().map(|p| p.as_str()).collect();
    let rows = sqlx::query!(
        r#"SELECT uid, phase, coalesce((status ->> 'attempt')::bigint, 0) AS "attempt!", cluster AS "cluster!"
           FROM workloads
           WHERE phase = ANY($1) AND deletion_timestamp IS NULL AND cluster IS NOT NULL"#,
        &phases as &[&str],
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    rows.into_iter()
        .map(|r| {
            let phase = stored_phase(&r.phase)?;
            Ok(BackendWork { uid: r.uid, phase, attempt: u32::try_from(r.attempt).unwrap_or(0), cluster: r.cluster })
        })
        .collect()
}

/// Every workload written since `cursor` (from [`change_cursor`]), with where it stands as [`workload_list_backend_work`] would list it: `None` when that
/// list would not hold it (another phase, being deleted, on no cluster).
///
/// # Errors
/// As [`db_error`].
pub async fn workload_backend_work_written_since(
    db: impl PgExecutor<'_>,
    phases: &[Phase],
    cursor: &FeedCursor,
) -> Result<Vec<(Uuid, Option<BackendWork>)>, Error> {
    let (xmax, listed) = cursor.bounds();
    let rows = sqlx::query!(
        r#"SELECT uid, phase, coalesce((status ->> 'attempt')::bigint, 0) AS "attempt!", cluster,
                  deletion_timestamp IS NOT NULL AS "deleting!"
           FROM workloads
           WHERE written_by >= $1::bigint::text::xid8 OR written_by = ANY($2::bigint[]::text[]::xid8[])"#,
        xmax,
        &listed,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    rows.into_iter()
        .map(|r| {
            let phase = stored_phase(&r.phase)?;
            let work = match r.cluster {
                Some(cluster) if phases.contains(&phase) && !r.deleting => {
                    Some(BackendWork { uid: r.uid, phase, attempt: u32::try_from(r.attempt).unwrap_or(0), cluster })
                }
                _ => None,
            };
            Ok((r.uid, work))
        })
        .collect()
}

/// Workloads not yet ended, counted by team, flavor (the admitted one, else the first
/// acceptable) and phase: `(team, flavor, phase, count)`.
///
/// # Errors
/// As [`db_error`].
pub async fn workload_count_live(db: impl PgExecutor<'_>) -> Result<Vec<(String, String, String, i64)>, Error> {
    let rows = sqlx::query!(
        r#"SELECT team_name AS "team!", coalesce(status->'admission'->>'flavor', flavors[1], '') AS "flavor!",
                  phase AS "phase!", count(*) AS "count!"
           FROM workloads WHERE phase NOT IN ('Succeeded', 'Failed', 'Cancelled')
           GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"#
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows.into_iter().map(|r| (r.team, r.flavor, r.phase, r.count)).collect())
}

#[cfg(test)]
mod tests {
    use super::FeedCursor;

    #[test]
    fn a_cursor_has_seen_what_ended_before_its_snapshot_and_nothing_in_flight() {
        let c = FeedCursor::parse("100:105:100,103".into()).unwrap();
        assert!(c.saw(99) && c.saw(101) && c.saw(104));
        assert!(!c.saw(100) && !c.saw(103), "in flight");
        assert!(!c.saw(105) && !c.saw(200), "from xmax on");
        let idle = FeedCursor::parse("7:7:".into()).unwrap();
        assert!(idle.saw(6) && !idle.saw(7));
        for bad in ["", "1:2", "1:2:3:4", "a:2:", "1:2:x"] {
            assert!(FeedCursor::parse(bad.into()).is_err(), "{bad:?}");
        }
    }
}
