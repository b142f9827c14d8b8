//! Teams: nodes of the quota tree, each with per-flavor quotas.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::apply::validate_meta;
use crate::error::Error;
use crate::meta::{ApplyMeta, ObjectMeta};
use crate::usage::{BUDGET_GPU_HOURS_MAX, BUDGETS_MAX};
use crate::validation::{FieldError, Validator};

/// Upper bound on any quota number, far above any real cluster, so sums never overflow.
pub const QUOTA_MAX: u32 = 1_000_000;
pub const WEIGHT_MAX: u32 = 10_000;

/// Desired state of a team.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "parent": "research",
    "description": "Natural language processing",
    "quotas": [{"flavor": "h100-80gb", "guaranteed": 16, "limit": 32, "weight": 2}]
}))]
pub struct TeamSpec {
    /// The parent team (not the team itself); none for a top-level team (a department).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024, pattern = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$")]
    pub description: Option<String>,
    /// At most one entry per flavor (64 in all). A flavor with no entry has guaranteed 0,
    /// no limit and weight 1.
    #[serde(default)]
    #[schema(max_items = 64)]
    pub quotas: Vec<Quota>,
    /// GPU-hours the team's subtree may use per week or month (16 at most). Usage against
    /// each is in `status.budgets`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 16)]
    pub budgets: Vec<crate::usage::Budget>,
    /// How preemption treats the running work of the team's subtree: the protection its
    /// workloads get, and the most one may ask for. A team below may only lower it, and
    /// without one on the top-level team nothing in its tree is protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<crate::workload::PreemptionPolicy>,
    /// Fairness over time, for the team's whole tree (top-level teams only): what each team
    /// of the tree gets above its guarantee is weighted down by its recent use. Without it
    /// (the default) only quotas and demand divide the GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_sharing: Option<FairSharing>,
}

/// Fairness over time (as Slurm's fair-share factor and KAI's time-based fair share): the
/// weight a team divides idle capacity with among its siblings is multiplied by
/// `2^(−U/S)`, where `U` is the team's part of the siblings' recent GPU-hours and `S` its
/// part of their weights. Guarantees are never touched. Recent use counts every GPU-hour
/// of the subtree, halved for each `usage_half_life_seconds` since it was used. It applies
/// inside the tree, and among top-level teams when every one that wants GPUs sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"usage_half_life_seconds": 604800}))]
pub struct FairSharing {
    /// How fast past use is forgotten: a GPU-hour counts half after this long, a quarter
    /// after twice as long (1 hour to 90 days).
    #[schema(minimum = 3600, maximum = 7_776_000)]
    pub usage_half_life_seconds: u32,
}

/// Bounds of [`FairSharing::usage_half_life_seconds`].
pub const HALF_LIFE_MIN: u32 = 3600;
pub const HALF_LIFE_MAX: u32 = 7_776_000;

/// A team's quota for one flavor, in GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    #[schema(example = "h100-80gb", pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub flavor: String,
    /// Always available to the team; reclaimed from borrowers when the team needs it.
    #[schema(example = 16, maximum = 1_000_000)]
    pub guaranteed: u32,
    /// Most the team may hold, borrowed GPUs included (at least `guaranteed`); none means
    /// up to capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = 32, maximum = 1_000_000)]
    pub limit: Option<u32>,
    /// The team's share of idle capacity relative to its siblings.
    #[serde(default = "default_weight")]
    #[schema(example = 1, maximum = 10_000)]
    pub weight: u32,
}

fn default_weight() -> u32 {
    1
}

/// Observed state of a team, written by the controllers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct TeamStatus {
    /// Per flavor: GPUs allocated, borrowed and the current fair share, of the team's own
    /// workloads and of its whole subtree.
    #[serde(default)]
    pub usage: Vec<FlavorUsage>,
    /// Per `spec.budgets` entry, in the same order: GPU-hours used in the current period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub budgets: Vec<crate::usage::BudgetStatus>,
    /// When the team's tree sets `spec.fair_sharing`: its recent use, as the scheduler
    /// weighs it (added up every minute).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_usage: Option<RecentUsage>,
}

/// A team's recent use: GPU-hours, each counted `2^(−age / half-life)`. The use of a team
/// that was deleted counts as its nearest remaining ancestor's own; a team's subtree is the
/// teams below it now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RecentUsage {
    /// The half-life it was added up with: the tree's `spec.fair_sharing` then (a minute at
    /// most after a change). Until the top-level team's use has been added up once, its
    /// tree is divided as without fairness over time.
    pub usage_half_life_seconds: u32,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// The flavors used lately (a flavor left out: none).
    pub flavors: Vec<FlavorRecentUsage>,
}

impl RecentUsage {
    /// Takes in the own use of a child team being deleted (its subtree's is already in
    /// this one's), as the next count will: a deleted team's use stays with its parent.
    pub fn absorb(&mut self, deleted: &Self) {
        for d in deleted.flavors.iter().filter(|d| d.gpu_hours > 0.0) {
            match self.flavors.iter_mut().find(|f| f.flavor == d.flavor) {
                Some(f) => f.gpu_hours += d.gpu_hours,
                None => self.flavors.push(FlavorRecentUsage { subtree_gpu_hours: d.gpu_hours, ..d.clone() }),
            }
        }
    }
}

/// A team's recent use of one flavor, in decayed GPU-hours.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FlavorRecentUsage {
    pub flavor: String,
    /// Of the team's own workloads.
    pub gpu_hours: f64,
    /// Of the team and every team below it.
    pub subtree_gpu_hours: f64,
}

/// A team's use of one flavor. The plain fields count the team's own workloads; the
/// `subtree_` ones count the team and every team below it, which is what a department's
/// guarantee and limit cover.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FlavorUsage {
    pub flavor: String,
    pub allocated: f64,
    /// Allocated above the team's own guarantee (its guarantee less its child teams').
    pub borrowed: f64,
    pub fair_share: f64,
    pub subtree_allocated: f64,
    /// The subtree's allocation above the team's guarantee.
    pub subtree_borrowed: f64,
    pub subtree_fair_share: f64,
}

/// What the scheduler would do differently if a team's quotas were as proposed: its next
/// plan as things are against its next plan with the change (`POST
/// /api/v1/teams/{name}/preview`). Nothing is written.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QuotaPreview {
    /// The differences in plain words; empty when the change alters nothing now.
    pub summary: Vec<String>,
    /// Waiting workloads the change would admit.
    pub admitted: Vec<PreviewWorkload>,
    /// Workloads that would be admitted as things are, but not with the change.
    pub no_longer_admitted: Vec<PreviewWorkload>,
    /// Running workloads the change would preempt.
    pub preempted: Vec<PreviewWorkload>,
    /// Running workloads that would be preempted as things are, but not with the change.
    pub no_longer_preempted: Vec<PreviewWorkload>,
    /// Running workloads within their min runtime that the change would have preempted
    /// once it ends: nothing is preempted for them before.
    #[serde(default)]
    pub preempted_once_protected_ends: Vec<PreviewWorkload>,
    /// Running non-preemptible workloads the change puts beyond their team's guarantee:
    /// they are never preempted, and run on in what the change takes from their team
    /// until they end.
    #[serde(default)]
    pub kept_beyond_guarantee: Vec<PreviewWorkload>,
    /// Fair shares that change, in GPUs.
    pub fair_shares: Vec<FairShareChange>,
    /// Flavors of which the team, or a team above it after the change, would hold more in
    /// running work than its limit. A lower limit preempts nothing: the work runs on, and
    /// nothing more of the flavor is admitted into that team's subtree until it is under.
    #[serde(default)]
    pub over_limit: Vec<OverLimit>,
}

impl QuotaPreview {
    /// The preview in plain words.
    pub fn summarize(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut say = |what: &[PreviewWorkload], words: &str| {
            if what.is_empty() {
                return;
            }
            let gpus: f64 = what.iter().map(|w| w.gpus).sum();
            let (n, s) = (what.len(), if what.len() == 1 { "" } else { "s" });
            let mut teams: Vec<&str> = what.iter().map(|w| w.team.as_deref().unwrap_or("another team")).collect();
            teams.sort_unstable();
            teams.dedup();
            let words = words.replace("{its}", if n == 1 { "its" } else { "their" });
            lines.push(format!("{n} workload{s} {words} ({} GPUs: {})", round_gpus(gpus), teams.join(", ")));
        };
        say(&self.preempted, "would be preempted");
        say(&self.admitted, "would be admitted");
        say(&self.no_longer_admitted, "would no longer be admitted");
        say(&self.no_longer_preempted, "would no longer be preempted");
        say(&self.preempted_once_protected_ends, "would be preempted once {its} min runtime ends, not before");
        say(
            &self.kept_beyond_guarantee,
            "would run on beyond {its} team's guarantee until done: non-preemptible, never preempted",
        );
        for c in &self.fair_shares {
            let (before, after) = (round_gpus(c.before), round_gpus(c.after));
            lines.push(format!("fair share of {} on {}: {before} → {after} GPUs", c.team, c.flavor));
        }
        for o in &self.over_limit {
            lines.push(format!(
                "{} would run {} GPUs of {}, above its limit of {}: nothing is preempted for that, \
                 but its subtree gets no more {} until it is under",
                o.team,
                round_gpus(o.holds),
                o.flavor,
                o.limit,
                o.flavor,
            ));
        }
        lines
    }
}

/// GPUs to at most two decimals, as the scheduler counts them (hundredths of a GPU).
pub fn round_gpus(gpus: f64) -> f64 {
    (gpus * 100.0).round() / 100.0
}

/// A workload named in a [`QuotaPreview`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PreviewWorkload {
    /// Team and name are none when the caller may not read that team.
    pub team: Option<String>,
    pub name: Option<String>,
    pub gpus: f64,
}

/// A team that would hold more of a flavor than its limit (a quota preview's `over_limit`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct OverLimit {
    pub team: String,
    pub flavor: String,
    /// GPUs its subtree's running work holds (that the change does not preempt).
    pub holds: f64,
    pub limit: u32,
}

/// A team's fair share of a flavor before and after a proposed change, in GPUs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FairShareChange {
    pub team: String,
    pub flavor: String,
    pub before: f64,
    pub after: f64,
}

/// GPUs allocated to teams over time (`GET /api/v1/usage/history`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageHistory {
    pub since: chrono::DateTime<chrono::Utc>,
    /// One series per team and flavor, by team and flavor name.
    pub series: Vec<UsageSeries>,
}

/// A team's GPUs of one flavor over time: a step function, each point's values holding
/// until the next point (the last until now). The first point is at `since` when the team
/// held GPUs of the flavor then.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageSeries {
    pub team: String,
    pub flavor: String,
    pub points: Vec<UsagePoint>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsagePoint {
    pub at: chrono::DateTime<chrono::Utc>,
    pub allocated: f64,
    pub borrowed: f64,
}

/// A team in the quota tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Team {
    pub metadata: ObjectMeta,
    pub spec: TeamSpec,
    pub status: TeamStatus,
}

/// The body of `PUT /api/v1/teams/{name}`. `status` is accepted and ignored.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeamApply {
    #[serde(default)]
    pub metadata: ApplyMeta,
    pub spec: TeamSpec,
    /// Ignored: status is written only by Berth.
    #[serde(default)]
    pub status: Option<serde_json::Value>,
}

impl TeamApply {
    /// Checks everything that needs no other object.
    ///
    /// # Errors
    /// [`Error::Invalid`] listing every broken rule.
    pub fn validate(&self, name: &str) -> Result<(), Error> {
        let mut v = Validator::new();
        validate_meta(&mut v, &self.metadata, name);
        let s = &self.spec;
        if let Some(parent) = &s.parent {
            v.name("/spec/parent", parent);
            v.check(parent != name, "/spec/parent", || "a team cannot be its own parent".into());
        }
        if let Some(d) = &s.description {
            v.text("/spec/description", d, 1024);
        }
        v.check(s.quotas.len() <= 64, "/spec/quotas", || "at most 64 quotas".into());
        let mut seen = BTreeMap::new();
        for (i, q) in s.quotas.iter().enumerate() {
            let at = |f: &str| format!("/spec/quotas/{i}/{f}");
            v.name(&at("flavor"), &q.flavor);
            if let Some(first) = seen.insert(q.flavor.as_str(), i) {
                v.error(at("flavor"), format!("flavor {:?} already has a quota at /spec/quotas/{first}", q.flavor));
            }
            v.check(q.guaranteed <= QUOTA_MAX, at("guaranteed"), || format!("must be at most {QUOTA_MAX}"));
            if let Some(limit) = q.limit {
                v.check(limit <= QUOTA_MAX, at("limit"), || format!("must be at most {QUOTA_MAX}"));
                v.check(limit >= q.guaranteed, at("limit"), || {
                    format!("limit ({limit}) must not be below guaranteed ({})", q.guaranteed)
                });
            }
            v.check(q.weight <= WEIGHT_MAX, at("weight"), || format!("must be at most {WEIGHT_MAX}"));
        }
        if let Some(p) = &s.preemption {
            p.validate(&mut v, "/spec/preemption");
        }
        if let Some(f) = &s.fair_sharing {
            v.check(s.parent.is_none(), "/spec/fair_sharing", || {
                "set only on a top-level team: it applies to the team's whole tree".into()
            });
            v.check(
                (HALF_LIFE_MIN..=HALF_LIFE_MAX).contains(&f.usage_half_life_seconds),
                "/spec/fair_sharing/usage_half_life_seconds",
                || format!("must be from {HALF_LIFE_MIN} (an hour) to {HALF_LIFE_MAX} (90 days)"),
            );
        }
        v.check(s.budgets.len() <= BUDGETS_MAX, "/spec/budgets", || format!("at most {BUDGETS_MAX} budgets"));
        let mut seen = BTreeMap::new();
        for (i, b) in s.budgets.iter().enumerate() {
            let at = |f: &str| format!("/spec/budgets/{i}/{f}");
            if let Some(f) = &b.flavor {
                v.name(&at("flavor"), f);
            }
            v.check(
                b.gpu_hours.is_finite() && (0.0..=BUDGET_GPU_HOURS_MAX).contains(&b.gpu_hours),
                at("gpu_hours"),
                || format!("must be a number from 0 to {BUDGET_GPU_HOURS_MAX}"),
            );
            if let Some(first) = seen.insert((b.flavor.as_deref(), b.period, b.action), i) {
                v.error(
                    at("action"),
                    format!("the same budget (flavor, period and action) is already at /spec/budgets/{first}"),
                );
            }
        }
        v.finish()
    }
}

impl TeamSpec {
    /// The guaranteed GPUs of `flavor` (0 without a quota entry).
    pub fn guaranteed(&self, flavor: &str) -> u32 {
        self.quotas.iter().find(|q| q.flavor == flavor).map_or(0, |q| q.guaranteed)
    }
}

/// Checks that children's guarantees fit inside their parent's, per flavor.
///
/// `team` is the team being written, `children` the specs of its children, and `siblings`
/// the specs of the other children of its parent (`parent` is that parent's spec).
/// Errors point into `team`'s own spec, since that is what the client sent.
pub fn check_guarantees_nest(
    team: &TeamSpec,
    parent: Option<(&str, &TeamSpec)>,
    siblings: &[TeamSpec],
    children: &[TeamSpec],
) -> Vec<FieldError> {
    let mut errors = Vec::new();
    for (i, q) in team.quotas.iter().enumerate() {
        let kids: u64 = children.iter().map(|c| u64::from(c.guaranteed(&q.flavor))).sum();
        if kids > u64::from(q.guaranteed) {
            errors.push(FieldError::new(
                format!("/spec/quotas/{i}/guaranteed"),
                format!("children already hold {kids} guaranteed {} GPUs, more than {}", q.flavor, q.guaranteed),
            ));
        }
    }
    // A flavor the team drops from its quotas must not be guaranteed to its children.
    let mut dropped: Vec<&str> = children
        .iter()
        .flat_map(|c| c.quotas.iter().filter(|q| q.guaranteed > 0).map(|q| q.flavor.as_str()))
        .filter(|f| !team.quotas.iter().any(|q| q.flavor == *f))
        .collect();
    dropped.sort_unstable();
    dropped.dedup();
    for flavor in dropped {
        errors.push(FieldError::new(
            "/spec/quotas",
            format!("children hold guaranteed {flavor} GPUs, so this team needs a guarantee for {flavor} too"),
        ));
    }
    if let Some((parent_name, parent)) = parent {
        for (i, q) in team.quotas.iter().enumerate() {
            let others: u64 = siblings.iter().map(|s| u64::from(s.guaranteed(&q.flavor))).sum();
            let available = u64::from(parent.guaranteed(&q.flavor));
            if others + u64::from(q.guaranteed) > available {
                errors.push(FieldError::new(
                    format!("/spec/quotas/{i}/guaranteed"),
                    format!(
                        "parent {parent_name:?} guarantees {available} {} GPUs and its other children hold {others}; at most {} are left",
                        q.flavor,
                        available.saturating_sub(others)
                    ),
                ));
            }
        }
    }
    errors
}

/// Checks that the min runtime a team asks for is one the teams above it allow (a team below
/// may only lower it; nothing in a tree whose top-level team sets none is protected).
///
/// `ancestors` are the specs above `team`, its parent first. Without any it is a top-level
/// team and may set what it likes.
pub fn check_min_runtime_nests(team: &TeamSpec, ancestors: &[(&str, &TeamSpec)]) -> Vec<FieldError> {
    let Some(asked) = team.preemption.map(|p| p.min_runtime_seconds).filter(|&a| a > 0) else { return Vec::new() };
    let Some(&(top, top_spec)) = ancestors.last() else { return Vec::new() };
    let lowest = ancestors.iter().filter_map(|(name, s)| s.preemption.map(|p| (p.min_runtime_seconds, *name))).min();
    // Names unquoted, each where "an ancestor team" reads well in its place: the caller
    // passes the teams above as the reader may know them (`Redactor::team`).
    let message = match (top_spec.preemption, lowest) {
        (None, _) => format!(
            "must be 0: {top}, the top-level team of this tree, sets no spec.preemption, so nothing in it is \
             protected (set it there first)"
        ),
        (Some(_), Some((allowed, by))) if asked > allowed => {
            format!(
                "must be at most {allowed}, the min runtime allowed by {by}, a team above it (a team below may only lower it)"
            )
        }
        _ => return Vec::new(),
    };
    vec![FieldError::new("/spec/preemption/min_runtime_seconds", message)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(quotas: &[(&str, u32)]) -> TeamSpec {
        TeamSpec {
            quotas: quotas
                .iter()
                .map(|(f, g)| Quota { flavor: (*f).into(), guaranteed: *g, limit: None, weight: 1 })
                .collect(),
            ..TeamSpec::default()
        }
    }

    #[test]
    fn children_guarantees_must_fit_in_the_parents() {
        let parent = spec(&[("h100", 16)]);
        let sibling = spec(&[("h100", 10)]);
        let fits = spec(&[("h100", 6)]);
        let too_big = spec(&[("h100", 7)]);
        assert!(check_guarantees_nest(&fits, Some(("root", &parent)), std::slice::from_ref(&sibling), &[]).is_empty());
        let errors = check_guarantees_nest(&too_big, Some(("root", &parent)), &[sibling], &[]);
        assert_eq!(errors[0].field, "/spec/quotas/0/guaranteed");
        assert!(errors[0].message.contains("at most 6"), "{}", errors[0].message);
    }

    #[test]
    fn a_parent_cannot_shrink_below_its_children() {
        let kids = [spec(&[("h100", 8)]), spec(&[("h100", 8)])];
        assert!(check_guarantees_nest(&spec(&[("h100", 16)]), None, &[], &kids).is_empty());
        assert_eq!(check_guarantees_nest(&spec(&[("h100", 15)]), None, &[], &kids).len(), 1);
        assert_eq!(check_guarantees_nest(&spec(&[]), None, &[], &kids)[0].field, "/spec/quotas");
    }

    #[test]
    fn fair_sharing_is_set_on_a_top_level_team_with_a_half_life_of_an_hour_to_90_days() {
        let apply = |parent: Option<&str>, seconds: u32| TeamApply {
            metadata: ApplyMeta::default(),
            spec: TeamSpec {
                parent: parent.map(Into::into),
                fair_sharing: Some(FairSharing { usage_half_life_seconds: seconds }),
                ..TeamSpec::default()
            },
            status: None,
        };
        assert!(apply(None, 604_800).validate("research").is_ok());
        let fields = |a: TeamApply| match a.validate("nlp") {
            Err(Error::Invalid(errors)) => errors.into_iter().map(|e| e.field).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(fields(apply(Some("research"), 604_800)), ["/spec/fair_sharing"]);
        assert_eq!(fields(apply(None, 3599)), ["/spec/fair_sharing/usage_half_life_seconds"]);
        assert_eq!(fields(apply(None, HALF_LIFE_MAX + 1)), ["/spec/fair_sharing/usage_half_life_seconds"]);
    }

    #[test]
    fn limit_below_guaranteed_and_duplicate_flavors_are_rejected() {
        let apply = TeamApply {
            metadata: ApplyMeta::default(),
            spec: TeamSpec {
                quotas: vec![
                    Quota { flavor: "h100".into(), guaranteed: 8, limit: Some(4), weight: 1 },
                    Quota { flavor: "h100".into(), guaranteed: 1, limit: None, weight: 1 },
                ],
                ..TeamSpec::default()
            },
            status: None,
        };
        let Err(Error::Invalid(errors)) = apply.validate("nlp") else { panic!() };
        let fields: Vec<_> = errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["/spec/quotas/0/limit", "/spec/quotas/1/flavor"]);
    }

    #[test]
    fn a_min_runtime_above_what_the_teams_above_allow_is_rejected() {
        let with = |seconds: Option<u32>| TeamSpec {
            preemption: seconds.map(|min_runtime_seconds| crate::workload::PreemptionPolicy { min_runtime_seconds }),
            ..TeamSpec::default()
        };
        let (top, mid, unset) = (with(Some(3600)), with(Some(600)), with(None));
        let field = |errors: Vec<FieldError>| errors.into_iter().map(|e| (e.field, e.message)).collect::<Vec<_>>();
        // A top-level team sets what it likes; below, at most the lowest above.
        assert!(check_min_runtime_nests(&with(Some(86_400)), &[]).is_empty());
        assert!(check_min_runtime_nests(&with(Some(600)), &[("mid", &mid), ("top", &top)]).is_empty());
        assert!(check_min_runtime_nests(&with(None), &[("mid", &mid), ("top", &top)]).is_empty());
        let above = field(check_min_runtime_nests(&with(Some(601)), &[("mid", &mid), ("top", &top)]));
        assert_eq!(above.len(), 1);
        assert_eq!(above[0].0, "/spec/preemption/min_runtime_seconds");
        assert!(above[0].1.contains("at most 600") && above[0].1.contains("allowed by mid,"), "{}", above[0].1);
        // A middle team without one does not lift the limit of the one above.
        let through = field(check_min_runtime_nests(&with(Some(4000)), &[("unset", &unset), ("top", &top)]));
        assert!(through[0].1.contains("at most 3600"), "{}", through[0].1);
        // Under a top-level team without one, only 0.
        assert!(check_min_runtime_nests(&with(Some(0)), &[("unset", &unset)]).is_empty());
        let none = field(check_min_runtime_nests(&with(Some(60)), &[("unset", &unset)]));
        assert!(none[0].1.contains("must be 0: unset, the top-level team"), "{}", none[0].1);
    }

    #[test]
    fn a_min_runtime_above_a_week_is_rejected() {
        let apply = |seconds| TeamApply {
            metadata: ApplyMeta::default(),
            spec: TeamSpec {
                preemption: Some(crate::workload::PreemptionPolicy { min_runtime_seconds: seconds }),
                ..TeamSpec::default()
            },
            status: None,
        };
        assert!(apply(604_800).validate("nlp").is_ok());
        let Err(Error::Invalid(errors)) = apply(604_801).validate("nlp") else { panic!() };
        assert_eq!(errors[0].field, "/spec/preemption/min_runtime_seconds");
    }
}
