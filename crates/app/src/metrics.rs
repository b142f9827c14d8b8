//! The state metrics `/metrics` serves, read from the store at each scrape (so every
//! replica answers the same, and the values are the API's): workloads per team, flavor and
//! phase; each team's GPUs allocated, borrowed, guaranteed, limited and its fair share;
//! budgets; clusters' capacity and health. The controllers' own counters and histograms
//! (admissions, preemptions, admission wait, pass durations) come from the leader's
//! process.

use std::fmt::Write;

use berth_core::Error;
use berth_core::cluster::ClusterHealth;
use berth_store::{PgPool, cluster, team, workload};

/// One metric family being written: `# HELP`, `# TYPE` and its samples.
struct Family<'a> {
    out: &'a mut String,
    name: &'static str,
}

impl<'a> Family<'a> {
    fn gauge(out: &'a mut String, name: &'static str, help: &str) -> Self {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        Self { out, name }
    }

    fn sample(&mut self, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let _ = writeln!(self.out, "{}{{{}}} {value}", self.name, labels.join(","));
    }
}

/// A label value as the text format wants it.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The state metrics in the Prometheus text format.
///
/// # Errors
/// Store errors.
pub async fn state_metrics(db: &PgPool) -> Result<String, Error> {
    let mut out = String::new();
    let counts = workload::workload_count_live(db).await?;
    let mut f = Family::gauge(&mut out, "berth_workloads", "Workloads not yet ended, by team, flavor and phase.");
    for (team, flavor, phase, n) in &counts {
        f.sample(&[("team", team), ("flavor", flavor), ("phase", phase)], *n as f64);
    }

    let teams = team::team_list_all(db).await?;
    let usage = |name, help, value: fn(&berth_core::team::FlavorUsage) -> f64, out: &mut String| {
        let mut f = Family::gauge(out, name, help);
        for t in &teams {
            for u in &t.status.usage {
                f.sample(&[("team", &t.metadata.name), ("flavor", &u.flavor)], value(u));
            }
        }
    };
    usage("berth_team_gpus_allocated", "GPUs held by the team's own workloads.", |u| u.allocated, &mut out);
    usage(
        "berth_team_gpus_borrowed",
        "Of those, GPUs beyond the team's own guarantee (its guarantee less its child teams').",
        |u| u.borrowed,
        &mut out,
    );
    usage(
        "berth_team_subtree_gpus_allocated",
        "GPUs held by the team and every team below it.",
        |u| u.subtree_allocated,
        &mut out,
    );
    usage("berth_team_fair_share_gpus", "The team's current fair share.", |u| u.fair_share, &mut out);
    let mut f = Family::gauge(&mut out, "berth_team_gpus_guaranteed", "The team's guaranteed GPUs.");
    for t in &teams {
        for q in &t.spec.quotas {
            f.sample(&[("team", &t.metadata.name), ("flavor", &q.flavor)], f64::from(q.guaranteed));
        }
    }
    let mut f = Family::gauge(&mut out, "berth_team_gpus_limit", "The most GPUs the team's subtree may hold.");
    for t in &teams {
        for q in &t.spec.quotas {
            if let Some(l) = q.limit {
                f.sample(&[("team", &t.metadata.name), ("flavor", &q.flavor)], f64::from(l));
            }
        }
    }
    for (name, help, used) in [
        ("berth_budget_used_gpu_hours", "GPU-hours used of a budget in its current period.", true),
        ("berth_budget_gpu_hours", "GPU-hours a budget allows per period.", false),
    ] {
        let mut f = Family::gauge(&mut out, name, help);
        for t in &teams {
            for b in &t.status.budgets {
                let flavor = b.budget.flavor.as_deref().unwrap_or("");
                let period = match b.budget.period {
                    berth_core::usage::BudgetPeriod::Week => "week",
                    berth_core::usage::BudgetPeriod::Month => "month",
                };
                let labels = [
                    ("team", t.metadata.name.as_str()),
                    ("flavor", flavor),
                    ("period", period),
                    ("action", b.budget.action.as_str()),
                ];
                f.sample(&labels, if used { b.used_gpu_hours } else { b.budget.gpu_hours });
            }
        }
    }

    let clusters = cluster::cluster_list_all(db).await?;
    let mut f = Family::gauge(&mut out, "berth_cluster_gpus", "GPUs a cluster has, by flavor.");
    for c in &clusters {
        for i in &c.status.inventory {
            f.sample(&[("cluster", &c.metadata.name), ("flavor", &i.flavor)], i.gpus_total);
        }
    }
    let mut f = Family::gauge(&mut out, "berth_cluster_gpus_free", "GPUs free on a cluster, by flavor.");
    for c in &clusters {
        for i in &c.status.inventory {
            f.sample(&[("cluster", &c.metadata.name), ("flavor", &i.flavor)], i.gpus_free);
        }
    }
    let mut f = Family::gauge(&mut out, "berth_cluster_healthy", "1 when the cluster answers and is healthy, else 0.");
    for c in &clusters {
        f.sample(&[("cluster", &c.metadata.name)], f64::from(u8::from(c.status.health == ClusterHealth::Healthy)));
    }
    Ok(out)
}
