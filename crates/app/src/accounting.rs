//! Accounting: the usage report (GPU-hours and cost over the ledger and the work running
//! now), scoped to what the caller may read.

use berth_core::Error;
use berth_core::usage::{self, Guarantee, REPORT_MAX_BUCKETS, REPORT_MAX_DAYS, ReportRequest, UsageReport, Visibility};
use berth_store::ledger::{LedgerScope, ledger_intervals};
use berth_store::{PgPool, team};
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
    let visibility = match access.visible_teams() {
        None => Visibility::All,
        Some(teams) => Visibility::Some { teams, covering: access.covering_teams() },
    };
    let scope = match &visibility {
        Visibility::All => None,
        Visibility::Some { teams, covering } => {
            Some(LedgerScope { teams: teams.iter().cloned().collect(), covering: covering.clone() })
        }
    };
    let intervals = ledger_intervals(db, req.from, req.to, now, scope.as_ref()).await?;
    let guarantees: Vec<Guarantee> = team::team_list_all(db)
        .await?
        .into_iter()
        .flat_map(|t| {
            let (name, parent, since) = (t.metadata.name, t.spec.parent, t.metadata.creation_timestamp);
            t.spec.quotas.into_iter().map(move |q| Guarantee {
                team: name.clone(),
                parent: parent.clone(),
                flavor: q.flavor,
                gpus: f64::from(q.guaranteed),
                since,
            })
        })
        .collect();
    Ok(usage::report(req, &intervals, &guarantees, &visibility, now))
}
