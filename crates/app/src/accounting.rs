//! Accounting: the usage report (GPU-hours and cost over the ledger and the work running
//! now), scoped to what the caller may read.

use berth_core::Error;
use berth_core::usage::{
    self, Guarantee, REPORT_MAX_BUCKETS, REPORT_MAX_DAYS, REPORT_MAX_ROWS, ReportRequest, UsageReport, Visibility,
};
use berth_store::ledger::{LedgerScope, ledger_intervals, ledger_teams_with_work_below};
use berth_store::{PgPool, team};
use std::collections::{BTreeSet, HashMap};

use berth_core::team::Team;
use chrono::{DateTime, TimeDelta, Utc};

use crate::context::OpContext;

/// The usage report over `[req.from, req.to)` as of `now`, of the work the caller may read:
/// its visible teams' and, for a team-admin or viewer of a department, of every team that
/// was below it (deleted teams included).
///
/// # Errors
/// [`Error::Invalid`] naming `from`, `to` or `bucket` for a period that is empty, longer
/// than [`REPORT_MAX_DAYS`] or cut into more than [`REPORT_MAX_BUCKETS`] buckets; store
/// errors.
pub async fn usage_report(
    db: &PgPool,
    opctx: &OpContext,
    req: &ReportRequest,
    now: DateTime<Utc>,
) -> Result<UsageReport, Error> {
    if req.to <= req.from {
        return Err(Error::invalid("to", "must be after from"));
    }
    if req.to - req.from > TimeDelta::days(REPORT_MAX_DAYS) {
        return Err(Error::invalid("from", format!("a report covers at most {REPORT_MAX_DAYS} days")));
    }
    if let Some(b) = req.bucket {
        let (mut n, mut at) = (0, b.floor(req.from));
        while at < req.to {
            n += 1;
            if n > REPORT_MAX_BUCKETS {
                return Err(Error::invalid(
                    "bucket",
                    format!("the period has more than {REPORT_MAX_BUCKETS} buckets of this size; choose a larger one"),
                ));
            }
            at = b.next(at);
        }
    }
    let access = opctx.access();
    let teams = team::team_list_all(db).await?;
    let by_name: HashMap<&str, &Team> = teams.iter().map(|t| (t.metadata.name.as_str(), t)).collect();
    let uid = |name: &String| by_name.get(name.as_str()).map(|t| t.metadata.uid);
    let covering = access.covering_teams();
    let visibility = match access.visible_teams() {
        None => Visibility::All,
        Some(visible) => Visibility::Some {
            teams: visible.iter().filter_map(uid).collect(),
            covering: covering.iter().filter_map(uid).collect(),
        },
    };
    let scope = match &visibility {
        Visibility::All => None,
        Visibility::Some { teams, covering } => {
            Some(LedgerScope { teams: teams.iter().copied().collect(), covering: covering.iter().copied().collect() })
        }
    };
    let intervals = ledger_intervals(db, req.from, req.to, now, scope.as_ref()).await?;
    // Teams whose whole subtree the caller reads: their guarantees' idle share is theirs to
    // see (a member of a department sees only its own work, not its department's; a member
    // of a team with none below it, all of it, unless the period has work of a team below it
    // deleted since: that is not in what the member reads).
    let parents: BTreeSet<&str> = teams.iter().filter_map(|t| t.spec.parent.as_deref()).collect();
    let mut guaranteed: BTreeSet<String> = teams
        .iter()
        .map(|t| &t.metadata.name)
        .filter(|t| access.reads_subtree(t) || !parents.contains(t.as_str()) && access.can_read_team(t))
        .cloned()
        .collect();
    let leaves: Vec<uuid::Uuid> = guaranteed.iter().filter(|t| !access.reads_subtree(t)).filter_map(uid).collect();
    if !leaves.is_empty() {
        for had in ledger_teams_with_work_below(db, req.from, req.to, &leaves).await? {
            if let Some(t) = teams.iter().find(|t| t.metadata.uid == had) {
                guaranteed.remove(&t.metadata.name);
            }
        }
    }
    let guarantees: Vec<Guarantee> = teams
        .iter()
        .filter(|t| guaranteed.contains(&t.metadata.name))
        .flat_map(|t| {
            t.spec.quotas.iter().map(|q| Guarantee {
                team: t.metadata.name.clone(),
                uid: t.metadata.uid,
                parent: t.spec.parent.clone(),
                flavor: q.flavor.clone(),
                gpus: f64::from(q.guaranteed),
                since: t.metadata.creation_timestamp,
            })
        })
        .collect();
    // What was borrowed depends on what the team's own work held against its own guarantee
    // (its guarantee less its child teams', as the scheduler counts it): settled for the
    // teams whose subtree the caller reads, as their idle guarantee is shown; the others'
    // work is shown as it was admitted.
    let children_guaranteed = |parent: &str, flavor: &str| -> f64 {
        (teams.iter().filter(|t| t.spec.parent.as_deref() == Some(parent)))
            .flat_map(|t| t.spec.quotas.iter().filter(|q| q.flavor == flavor))
            .map(|q| f64::from(q.guaranteed))
            .sum()
    };
    let guarantee_gpus: usage::GuaranteeGpus = guarantees
        .iter()
        .map(|g| ((g.uid, g.flavor.clone()), (g.gpus - children_guaranteed(&g.team, &g.flavor)).max(0.0)))
        .collect();
    let current: HashMap<String, uuid::Uuid> =
        teams.iter().map(|t| (t.metadata.name.clone(), t.metadata.uid)).collect();
    // Half a million intervals take a second: off the threads that serve requests.
    let req = req.clone();
    let mut report = tokio::task::spawn_blocking(move || {
        let mut intervals = intervals;
        let mut pieces = usage::settle_borrowed(&mut intervals, &guarantee_gpus, &req);
        usage::mark_reused_names(&mut intervals, &current);
        usage::mark_reused_names(&mut pieces, &current);
        usage::report(&req, intervals.iter().chain(&pieces), &guarantees, &guaranteed, &visibility, now)
    })
    .await
    .map_err(|e| Error::Internal(format!("the report failed: {e}")))?;
    if report.rows.len() > REPORT_MAX_ROWS {
        return Err(Error::invalid(
            "group_by",
            format!(
                "the report would have {} rows, more than {REPORT_MAX_ROWS}: choose larger buckets or fewer groups",
                report.rows.len()
            ),
        ));
    }
    // A team that exists is shown under its parent now (the ledger has the parent of each
    // attempt's time).
    for t in &mut report.teams {
        if let Some(now) = by_name.get(t.team.as_str()) {
            t.parent.clone_from(&now.spec.parent);
        }
    }
    Ok(report)
}
