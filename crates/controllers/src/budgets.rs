//! Budgets: each team's GPU-hours in the current week or month against its
//! `spec.budgets`, from the ledger and the work running now, written to `status.budgets`.
//! Crossing 80 % and 100 % is recorded as an event on the team; a used-up budget whose
//! action is `stop_borrowing` or `stop_new` is enforced by the scheduler (it reads the
//! status, and the spec for a budget declared or changed since) until the period resets.
//! Nothing running is stopped.

use std::collections::HashMap;

use berth_core::Error;
use berth_core::event::EventType;
use berth_core::team::Team;
use berth_core::usage::{BudgetState, BudgetStatus};
use berth_store::event::NewEvent;
use chrono::SecondsFormat;
use serde::Serialize;

use crate::Context;

/// The kind events about teams are recorded under.
pub const TEAM_EVENT_KIND: &str = "team";

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BudgetsStatus {
    /// Teams with budgets.
    pub teams: usize,
    /// Teams whose `status.budgets` this pass rewrote.
    pub updated: usize,
    /// Budgets used up now.
    pub exhausted: usize,
}

impl crate::runner::Report for BudgetsStatus {
    fn changes(&self) -> usize {
        self.updated
    }
}

/// # Errors
/// Store errors.
pub async fn reconcile(ctx: &Context) -> Result<BudgetsStatus, Error> {
    let now = ctx.clock.now();
    let teams = berth_store::team::team_list_all(&ctx.db).await?;
    let with: Vec<&Team> =
        teams.iter().filter(|t| !t.spec.budgets.is_empty() || !t.status.budgets.is_empty()).collect();
    let mut status = BudgetsStatus { teams: with.len(), ..BudgetsStatus::default() };
    if with.iter().all(|t| t.spec.budgets.is_empty()) {
        // Budgets were removed: clear what their status said.
        let writes: Vec<_> = with.iter().map(|t| (berth_core::TeamId(t.metadata.uid), Vec::new())).collect();
        return write(ctx, &writes, &[], status).await;
    }
    // Each team's use per flavor since the start of each current period (a week's, a
    // month's), added up in Postgres.
    let uids: Vec<uuid::Uuid> = with.iter().map(|t| t.metadata.uid).collect();
    let mut starts: Vec<_> = with.iter().flat_map(|t| &t.spec.budgets).map(|b| b.period.around(now).0).collect();
    starts.sort_unstable();
    starts.dedup();
    let mut use_since = HashMap::new();
    for start in starts {
        use_since.insert(start, berth_store::ledger::ledger_use(&ctx.db, start, now, &uids).await?);
    }
    let mut writes = Vec::new();
    let mut events = Vec::new();
    for t in with {
        let next: Vec<BudgetStatus> = t
            .spec
            .budgets
            .iter()
            .map(|b| {
                let (period_start, resets_at) = b.period.around(now);
                let mine: Vec<(&str, f64)> = use_since[&period_start]
                    .iter()
                    .filter(|(team, _, _)| *team == t.metadata.uid)
                    .map(|(_, flavor, h)| (flavor.as_str(), *h))
                    .collect();
                let used = b.used(&mine);
                let state = BudgetState::of(used, b.gpu_hours);
                BudgetStatus {
                    budget: b.clone(),
                    used_gpu_hours: used,
                    state,
                    period_start,
                    resets_at,
                    updated_at: now,
                }
            })
            .collect();
        status.exhausted += next.iter().filter(|b| b.state == BudgetState::Exhausted).count();
        for b in &next {
            let before = t
                .status
                .budgets
                .iter()
                .find(|o| o.budget == b.budget && o.period_start == b.period_start)
                .map_or(BudgetState::Ok, |o| o.state);
            if b.state > before {
                let (event_type, reason, what) = match b.state {
                    BudgetState::Exhausted => (EventType::Warning, "BudgetExhausted", "is used up"),
                    _ => (EventType::Normal, "BudgetWarning", "is 80 % used"),
                };
                let action = match b.budget.action {
                    berth_core::usage::BudgetAction::Warn => String::new(),
                    a if b.state == BudgetState::Exhausted => {
                        format!(" ({} until {})", a.as_str(), b.resets_at.to_rfc3339())
                    }
                    _ => String::new(),
                };
                events.push(NewEvent {
                    uid: t.metadata.uid,
                    event_type,
                    reason,
                    message: format!(
                        "budget {} {what}: {} GPU-hours since {}{action}",
                        b.budget.describe(),
                        hours(b.used_gpu_hours),
                        b.period_start.to_rfc3339_opts(SecondsFormat::Secs, true)
                    ),
                    details: None,
                });
            }
        }
        if changed(&t.status.budgets, &next) {
            writes.push((berth_core::TeamId(t.metadata.uid), next));
        }
    }
    write(ctx, &writes, &events, status).await
}

/// GPU-hours in words: a tenth of an hour from 1 up, three decimals below (none, or a
/// sum's rounding below zero, is 0: a budget of 0 said "used up: -0.000 GPU-hours").
pub(crate) fn hours(h: f64) -> String {
    let h = if h > 0.0 { h } else { 0.0 };
    if h >= 1.0 { format!("{h:.1}") } else { format!("{h:.3}") }
}

/// Whether `next` says something `before` does not: another budget, state or period; or
/// use moved by 1 % of the budget (at most a GPU-hour) and the status is a minute old.
/// Running work moves the use all the time: it is not written every pass (each write wakes
/// the controllers).
fn changed(before: &[BudgetStatus], next: &[BudgetStatus]) -> bool {
    before.len() != next.len()
        || before.iter().zip(next).any(|(a, b)| {
            a.budget != b.budget
                || a.state != b.state
                || a.period_start != b.period_start
                || ((a.used_gpu_hours - b.used_gpu_hours).abs() >= (0.01 * b.budget.gpu_hours).clamp(1e-3, 1.0)
                    && b.updated_at - a.updated_at >= chrono::TimeDelta::minutes(1))
        })
}

async fn write(
    ctx: &Context,
    writes: &[(berth_core::TeamId, Vec<BudgetStatus>)],
    events: &[NewEvent],
    mut status: BudgetsStatus,
) -> Result<BudgetsStatus, Error> {
    if writes.is_empty() && events.is_empty() {
        return Ok(status);
    }
    let mut tx = ctx.begin().await?;
    berth_store::team::team_write_budgets(&mut tx, writes).await?;
    berth_store::event::event_record_many(&mut *tx, TEAM_EVENT_KIND, events).await?;
    berth_store::commit(tx).await?;
    status.updated = writes.len();
    Ok(status)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hours_read_as_people_say_them() {
        assert_eq!(
            [-0.0, -1e-12, 0.0004, 0.25, 12.345].map(super::hours),
            ["0.000", "0.000", "0.000", "0.250", "12.3"]
        );
    }
}
