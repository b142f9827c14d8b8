//! The scheduler: binds pending pods to the first node (in name order) that is Ready,
//! schedulable, matches the pod's node selector and required node affinity, has no untolerated
//! NoSchedule/NoExecute taint, breaks none of the pod's required anti-affinity terms and has
//! room for the pod's requests.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Pod, Taint, Toleration};
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::selector::label_selector_matches;
use crate::{meta, nodes, resources};

/// Resource amounts by resource name (cpu in cores, memory in bytes, the rest in units).
type Amounts = BTreeMap<String, f64>;

/// Parses a Kubernetes quantity (`500m`, `2`, `1.5Gi`, `10G`, `1e3`) into base units.
fn parse_quantity(quantity: &str) -> Option<f64> {
    let q = quantity.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let number: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0_f64.powi(2),
        "Gi" => 1024.0_f64.powi(3),
        "Ti" => 1024.0_f64.powi(4),
        "Pi" => 1024.0_f64.powi(5),
        "Ei" => 1024.0_f64.powi(6),
        exponent => 10f64.powi(exponent.strip_prefix(['e', 'E'])?.parse().ok()?),
    };
    Some(number * factor)
}

/// What a pod asks of a node: the sum of its containers' requests (requests default to limits),
/// plus one pod.
fn pod_requests(pod: &Pod) -> Amounts {
    let mut total = Amounts::from([("pods".to_string(), 1.0)]);
    for container in pod.spec.iter().flat_map(|s| &s.containers) {
        let Some(resources) = &container.resources else {
            continue;
        };
        let mut asked: BTreeMap<&String, &str> = BTreeMap::new();
        for (name, q) in resources.limits.iter().flatten() {
            asked.insert(name, &q.0);
        }
        for (name, q) in resources.requests.iter().flatten() {
            asked.insert(name, &q.0);
        }
        for (name, q) in asked {
            *total.entry(name.clone()).or_default() += parse_quantity(q).unwrap_or(0.0);
        }
    }
    total
}

fn allocatable(node: &Node) -> Amounts {
    node.status
        .iter()
        .flat_map(|s| s.allocatable.iter().flatten())
        .map(|(name, q)| (name.clone(), parse_quantity(&q.0).unwrap_or(0.0)))
        .collect()
}

fn expression_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.clone().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(actual), Some(bound)) = (value.and_then(number), values.first().and_then(|b| number(b))) else {
                return false;
            };
            if req.operator == "Gt" { actual > bound } else { actual < bound }
        }
        _ => false,
    }
}

/// nodeSelector and required node affinity.
fn selector_matches(pod: &Pod, node: &Node) -> bool {
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let Some(spec) = &pod.spec else {
        return true;
    };
    let selector_ok = spec.node_selector.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref())
        .map(|r| &r.node_selector_terms);
    let node_name = node.metadata.name.clone().unwrap_or_default();
    let affinity_ok = terms.is_none_or(|terms| {
        terms.iter().any(|term| {
            let expressions = term.match_expressions.iter().flatten();
            let fields = term.match_fields.iter().flatten();
            let non_empty = term.match_expressions.as_ref().is_some_and(|e| !e.is_empty())
                || term.match_fields.as_ref().is_some_and(|f| !f.is_empty());
            non_empty
                && expressions.clone().all(|e| expression_matches(e, labels.get(&e.key).map(String::as_str)))
                && fields.clone().all(|f| {
                    let value = (f.key == "metadata.name").then_some(node_name.as_str());
                    expression_matches(f, value)
                })
        })
    });
    selector_ok && affinity_ok
}

fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    if toleration.effect.as_deref().is_some_and(|e| !e.is_empty() && e != taint.effect) {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => toleration.key.as_deref().is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            toleration.key.as_deref() == Some(taint.key.as_str())
                && toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
        }
    }
}

/// A pod that holds its node: where it runs, its namespace and labels.
struct Placed {
    node: String,
    namespace: String,
    labels: BTreeMap<String, String>,
}

/// Whether binding `pod` to `node` would put it in the same topology domain (the value of
/// each term's `topologyKey` on the nodes) as a pod its required anti-affinity excludes.
fn breaks_anti_affinity(pod: &Pod, node: &Node, nodes: &[(Value, Node)], placed: &[Placed]) -> bool {
    let terms = pod
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
    let label = |n: &Node, key: &str| n.metadata.labels.as_ref().and_then(|l| l.get(key)).cloned();
    let own_namespace = pod.metadata.namespace.clone().unwrap_or_default();
    terms.into_iter().flatten().any(|term| {
        let Some(domain) = label(node, &term.topology_key) else { return false };
        let namespaces =
            term.namespaces.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| vec![own_namespace.clone()]);
        placed.iter().any(|other| {
            let same_domain = nodes.iter().any(|(_, n)| {
                n.metadata.name.as_deref() == Some(other.node.as_str())
                    && label(n, &term.topology_key).as_ref() == Some(&domain)
            });
            same_domain
                && namespaces.contains(&other.namespace)
                && term.label_selector.as_ref().is_some_and(|sel| label_selector_matches(sel, &other.labels))
        })
    })
}

/// Why the pod does not fit the node, as the scheduler's per-node reasons; empty when it fits.
fn misfits(pod: &Pod, node_obj: &Value, node: &Node, requests: &Amounts, used: &Amounts) -> Vec<String> {
    if !nodes::is_ready(node_obj) {
        return vec!["node(s) were not ready".to_string()];
    }
    if node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
        return vec!["node(s) were unschedulable".to_string()];
    }
    if !selector_matches(pod, node) {
        return vec!["node(s) didn't match Pod's node affinity/selector".to_string()];
    }
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
    let untolerated = node
        .spec
        .iter()
        .flat_map(|s| s.taints.iter().flatten())
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .find(|t| !tolerations.iter().any(|tol| tolerates(tol, t)));
    if let Some(taint) = untolerated {
        return vec![format!(
            "node(s) had untolerated taint {{{}: {}}}",
            taint.key,
            taint.value.as_deref().unwrap_or_default()
        )];
    }
    let capacity = allocatable(node);
    requests
        .iter()
        .filter(|(name, amount)| {
            // Extended resources (`vendor/name`), cpu, memory and pods must fit; other standard
            // resources (ephemeral-storage, hugepages) only where the node reports them.
            let checked = name.contains('/') || ["cpu", "memory", "pods"].contains(&name.as_str());
            let Some(available) = capacity.get(*name).copied().or((!checked).then_some(f64::INFINITY)) else {
                return **amount > 0.0;
            };
            let in_use = used.get(*name).copied().unwrap_or(0.0);
            **amount > 0.0 && in_use + **amount > available + 1e-9
        })
        .map(|(name, _)| if name == "pods" { "Too many pods".to_string() } else { format!("Insufficient {name}") })
        .collect()
}

/// The scheduler's message for a pod that fits no node.
fn unschedulable_message(node_count: usize, reasons: &BTreeMap<String, usize>) -> String {
    if node_count == 0 {
        return "no nodes available to schedule pods".to_string();
    }
    let mut parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    parts.sort();
    format!("0/{node_count} nodes are available: {}.", parts.join(", "))
}

/// One scheduling pass over every unbound pod that is not being deleted.
pub(crate) fn reconcile(cluster: &mut Cluster) {
    let pending = |p: &Value| p["spec"]["nodeName"].as_str().is_none_or(str::is_empty) && !meta::is_deleting(p);
    if !cluster.store.list(resources::PODS.plural).any(pending) {
        return;
    }
    let node_objs = cluster.store.snapshot(resources::NODES.plural);
    let typed_nodes: Vec<(Value, Node)> =
        node_objs.into_iter().filter_map(|obj| meta::typed::<Node>(&obj).map(|n| (obj, n))).collect();
    // Finished pods hold nothing.
    let pods = cluster.store.snapshot_where(resources::PODS.plural, |p| !finished(p));
    let mut used: HashMap<String, Amounts> = HashMap::new();
    let mut placed: Vec<Placed> = Vec::new();
    for obj in &pods {
        let Some(node) = obj["spec"]["nodeName"].as_str() else {
            continue;
        };
        if let Some(pod) = meta::typed::<Pod>(obj) {
            placed.push(Placed {
                node: node.to_string(),
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                labels: pod.metadata.labels.clone().unwrap_or_default(),
            });
            let usage = used.entry(node.to_string()).or_default();
            for (name, amount) in pod_requests(&pod) {
                *usage.entry(name).or_default() += amount;
            }
        }
    }
    for obj in pods.into_iter().filter(pending) {
        let Some(pod) = meta::typed::<Pod>(&obj) else {
            continue;
        };
        let requests = pod_requests(&pod);
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut chosen = None;
        for (node_obj, node) in &typed_nodes {
            let name = meta::name(node_obj).to_string();
            let mut misfit = misfits(&pod, node_obj, node, &requests, used.get(&name).unwrap_or(&Amounts::new()));
            if misfit.is_empty() && breaks_anti_affinity(&pod, node, &typed_nodes, &placed) {
                misfit.push("node(s) didn't match pod anti-affinity rules".to_string());
            }
            if misfit.is_empty() {
                chosen = Some(name);
                break;
            }
            for reason in misfit {
                *reasons.entry(reason).or_default() += 1;
            }
        }
        let mut updated = obj.clone();
        match chosen {
            Some(node) => {
                placed.push(Placed {
                    node: node.clone(),
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    labels: pod.metadata.labels.clone().unwrap_or_default(),
                });
                let usage = used.entry(node.clone()).or_default();
                for (name, amount) in requests {
                    *usage.entry(name).or_default() += amount;
                }
                updated["spec"]["nodeName"] = json!(node);
                meta::set_condition(&mut updated, "PodScheduled", "True", "", "");
            }
            None => {
                let message = unschedulable_message(typed_nodes.len(), &reasons);
                meta::set_condition(&mut updated, "PodScheduled", "False", "Unschedulable", &message);
            }
        }
        cluster.store.update(resources::PODS.plural, updated);
    }
}

fn finished(pod: &Value) -> bool {
    matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_to_base_units() {
        assert_eq!(parse_quantity("500m"), Some(0.5));
        assert_eq!(parse_quantity("2"), Some(2.0));
        assert_eq!(parse_quantity("1Gi"), Some(1024.0 * 1024.0 * 1024.0));
        assert_eq!(parse_quantity("1e3"), Some(1000.0));
        assert_eq!(parse_quantity("abc"), None);
    }

    #[test]
    fn message_counts_reasons_like_the_real_scheduler() {
        let reasons = BTreeMap::from([("Insufficient nvidia.com/gpu".to_string(), 3)]);
        assert_eq!(unschedulable_message(3, &reasons), "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.");
    }
}
