//! `berth apply` and `berth diff`: files of the API's own objects, compared with the
//! server field by field, and applied in dependency order.
//!
//! A document is the API's body plus its kind:
//!
//! ```yaml
//! kind: Team            # Flavor | Team | Cluster | RoleBinding | Workload
//! metadata:
//!   name: nlp
//!   labels: {owner: platform}
//! spec:
//!   parent: research
//!   quotas: [{flavor: h100, guaranteed: 8}]
//! ```
//!
//! A workload also names its team (`metadata.team`); a role binding has no name (its
//! spec is the API's: `subject`, `role`, `team`, `issuer`). Specs are read into the
//! server's own types, so a file with an unknown or mistyped field is refused before
//! anything is sent, and a spec is compared with the server's with every default filled
//! in: a field the file leaves out is its default, on both sides.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use berth_core::cluster::ClusterSpec;
use berth_core::flavor::FlavorSpec;
use berth_core::meta::{ApplyMeta, Labels};
use berth_core::selector::LabelSelector;
use berth_core::team::TeamSpec;
use berth_core::workload::WorkloadSpec;
use serde::{Deserialize as _, Serialize};
use serde_json::{Value, json};

use crate::client::{ApiError, Client, seg};
use crate::output::cell;

/// The kinds a file may hold, in the order they are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Kind {
    Flavor,
    Team,
    Cluster,
    RoleBinding,
    Workload,
}

impl Kind {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "Flavor" => Self::Flavor,
            "Team" => Self::Team,
            "Cluster" => Self::Cluster,
            "RoleBinding" => Self::RoleBinding,
            "Workload" => Self::Workload,
            _ => return None,
        })
    }

    pub fn noun(self) -> &'static str {
        match self {
            Self::Flavor => "flavor",
            Self::Team => "team",
            Self::Cluster => "cluster",
            Self::RoleBinding => "rolebinding",
            Self::Workload => "workload",
        }
    }

    /// The spec with every default filled in, as the server stores it.
    fn normalize(self, spec: &Value) -> Result<Value, String> {
        fn norm<T: serde::de::DeserializeOwned + Serialize>(spec: &Value) -> Result<Value, String> {
            let typed: T = serde_path_to_error::deserialize(spec.clone())
                .map_err(|e| format!("spec.{}: {}", e.path(), e.inner()))?;
            Ok(serde_json::to_value(typed).expect("a spec serializes"))
        }
        match self {
            Self::Flavor => norm::<FlavorSpec>(spec),
            Self::Team => norm::<TeamSpec>(spec),
            Self::Cluster => norm::<ClusterSpec>(spec),
            Self::Workload => norm::<WorkloadSpec>(spec),
            Self::RoleBinding => norm::<berth_core::auth::NewRoleBinding>(spec),
        }
    }
}

/// One object of the files.
#[derive(Debug, Clone)]
pub struct Document {
    pub kind: Kind,
    pub name: String,
    pub team: Option<String>,
    pub labels: Labels,
    /// Normalized.
    pub spec: Value,
    /// `file` or `file#N` (the Nth document of a file, from 1).
    pub source: String,
}

impl Document {
    /// `team/nlp`, `workload/nlp/train`.
    pub fn id(&self) -> String {
        match &self.team {
            Some(team) => format!("{}/{team}/{}", self.kind.noun(), self.name),
            None => format!("{}/{}", self.kind.noun(), self.name),
        }
    }

    fn path(&self) -> String {
        object_path(self.kind, self.team.as_deref(), &self.name)
    }

    /// The server's own checks of what needs no other object, so a bad document is named
    /// before anything is sent (or planned: `--dry-run` said `would be created` of one the
    /// server then refused, halfway through an apply).
    fn validate(&self) -> Result<(), String> {
        fn check<T: serde::de::DeserializeOwned>(
            body: Value,
            validate: impl FnOnce(&T) -> Result<(), berth_core::Error>,
        ) -> Result<(), String> {
            let typed: T = serde_json::from_value(body).map_err(|e| e.to_string())?;
            match validate(&typed) {
                Err(berth_core::Error::Invalid(errors)) => {
                    Err(errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect::<Vec<_>>().join("; "))
                }
                Err(other) => Err(other.to_string()),
                Ok(()) => Ok(()),
            }
        }
        let (name, body) = (self.name.as_str(), self.body());
        match self.kind {
            Kind::Flavor => check(body, |a: &berth_core::flavor::FlavorApply| a.validate(name)),
            Kind::Team => check(body, |a: &berth_core::team::TeamApply| a.validate(name)),
            Kind::Cluster => check(body, |a: &berth_core::cluster::ClusterApply| a.validate(name)),
            Kind::Workload => {
                let team = self.team.as_deref().unwrap_or_default();
                check(body, |a: &berth_core::workload::WorkloadApply| a.validate(team, name))
            }
            Kind::RoleBinding => check(self.spec.clone(), |b: &berth_core::auth::NewRoleBinding| b.validate()),
        }
    }

    fn body(&self) -> Value {
        json!({"metadata": {"labels": self.labels}, "spec": self.spec})
    }
}

fn object_path(kind: Kind, team: Option<&str>, name: &str) -> String {
    match kind {
        Kind::Flavor => format!("/api/v1/flavors/{}", seg(name)),
        Kind::Team => format!("/api/v1/teams/{}", seg(name)),
        Kind::Cluster => format!("/api/v1/clusters/{}", seg(name)),
        Kind::Workload => format!("/api/v1/teams/{}/workloads/{}", seg(team.unwrap_or_default()), seg(name)),
        Kind::RoleBinding => "/api/v1/role-bindings".to_owned(),
    }
}

/// Reads every document of `paths` (files, or directories of `.yaml`, `.yml` and `.json`
/// files, read in name order).
pub fn read(paths: &[PathBuf]) -> Result<Vec<Document>> {
    let mut files = Vec::new();
    for p in paths {
        collect(p, &mut files)?;
    }
    let mut docs = Vec::new();
    let mut problems = Vec::new();
    for file in files {
        let text = if file == Path::new("-") {
            std::io::read_to_string(std::io::stdin()).context("reading standard input")?
        } else {
            std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?
        };
        let mut n = 0;
        for de in serde_norway::Deserializer::from_str(&text) {
            n += 1;
            let value = match Value::deserialize(de) {
                Ok(Value::Null) => continue,
                Ok(v) => v,
                // A syntax error: the parser yields it again for every document it is
                // asked for (an apply of `a: [` looped, taking 500 MB a second).
                Err(e) => {
                    problems.push(format!("{}#{n}: {e} (the rest of the file is not read)", file.display()));
                    break;
                }
            };
            match document(&value, format!("{}#{n}", file.display())) {
                Ok(d) => docs.push(d),
                Err(e) => problems.push(e),
            }
        }
    }
    let mut seen: HashMap<String, String> = HashMap::new();
    for d in &docs {
        if d.kind != Kind::RoleBinding
            && let Some(first) = seen.insert(d.id(), d.source.clone())
        {
            problems.push(format!("{}: {} is also in {first}", d.source, d.id()));
        }
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    Ok(docs)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    if path == Path::new("-") || path.is_file() {
        out.push(path.to_owned());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for e in entries {
        if e.is_dir() {
            collect(&e, out)?;
        } else if e.extension().is_some_and(|x| x == "yaml" || x == "yml" || x == "json") {
            out.push(e);
        }
    }
    Ok(())
}

fn document(v: &Value, source: String) -> Result<Document, String> {
    let at = |m: String| format!("{source}: {m}");
    let kind = v["kind"]
        .as_str()
        .ok_or_else(|| at("kind: required (Flavor, Team, Cluster, RoleBinding or Workload)".into()))?;
    let kind = Kind::parse(kind)
        .ok_or_else(|| at(format!("kind: {kind:?} is not one of Flavor, Team, Cluster, RoleBinding, Workload")))?;
    // Read as strictly as the server reads a body: a field it would refuse is not dropped
    // (`metadata.parent` made a top-level team of one meant to be below another).
    if let Some(unknown) = v
        .as_object()
        .into_iter()
        .flat_map(|o| o.keys())
        .find(|k| !["kind", "metadata", "spec", "status"].contains(&k.as_str()))
    {
        return Err(at(format!("{unknown}: not a field of a document (kind, metadata, spec; status is ignored)")));
    }
    let meta: ApplyMeta = match &v["metadata"] {
        Value::Null => ApplyMeta::default(),
        m => serde_json::from_value(m.clone()).map_err(|e| {
            let hint = if m.get("parent").is_some() { " (a team's parent is spec.parent)" } else { "" };
            at(format!("metadata: {e}{hint}"))
        })?,
    };
    if meta.team.is_some() && kind != Kind::Workload {
        return Err(at("metadata.team: only a workload names its team (a team's parent is spec.parent)".into()));
    }
    let spec = kind.normalize(&v["spec"]).map_err(at)?;
    let labels: Labels = meta.labels.unwrap_or_default();
    let (name, team) = match kind {
        Kind::RoleBinding => {
            let b: berth_core::auth::NewRoleBinding =
                serde_json::from_value(spec.clone()).map_err(|e| at(e.to_string()))?;
            (format!("{} {} {}", b.subject, b.role.as_str(), b.team.as_deref().unwrap_or("(global)")), None)
        }
        _ => {
            let name = meta.name.ok_or_else(|| at("metadata.name: required".into()))?;
            if kind == Kind::Workload && meta.team.is_none() {
                return Err(at("metadata.team: required for a workload".into()));
            }
            (name, meta.team)
        }
    };
    let doc = Document { kind, name, team, labels, spec, source: source.clone() };
    doc.validate().map_err(at)?;
    Ok(doc)
}

/// What applying a document does.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Create,
    Change,
    Unchanged,
    Delete,
}

/// One step of a plan.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub kind: Kind,
    pub id: String,
    pub action: Action,
    /// `field: before → after` for a change.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<String>,
    /// What the scheduler would do (a team's quota change, `--dry-run` only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preview: Vec<String>,
    /// The server's refusal of this step, as its check without writing found it
    /// (`--dry-run` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    #[serde(skip)]
    pub doc: Option<Document>,
    /// The version the plan read (the write is conditional on it).
    #[serde(skip)]
    pub version: Option<String>,
    #[serde(skip)]
    pub path: String,
}

/// Compares the documents with the server; with `prune`, objects of the kinds
/// Flavor, Team and Cluster that carry the selector's labels and are in no file are
/// deleted (children before parents).
pub async fn plan(client: &Client, docs: &[Document], prune: Option<&LabelSelector>) -> Result<Vec<Step>, ApiError> {
    let mut ordered: Vec<&Document> = docs.iter().collect();
    let depth = team_depths(docs);
    ordered.sort_by_key(|d| (d.kind, depth.get(d.name.as_str()).copied().unwrap_or(0), d.id()));
    let mut steps = Vec::new();
    let bindings = if docs.iter().any(|d| d.kind == Kind::RoleBinding) {
        client.items("/api/v1/role-bindings").await?
    } else {
        Vec::new()
    };
    for d in ordered {
        let path = d.path();
        let mut step = Step {
            kind: d.kind,
            id: d.id(),
            action: Action::Unchanged,
            changes: Vec::new(),
            preview: Vec::new(),
            refused: None,
            doc: Some(d.clone()),
            version: None,
            path: path.clone(),
        };
        if d.kind == Kind::RoleBinding {
            let exists = bindings.iter().any(|b| {
                b["subject"] == d.spec["subject"]
                    && b["role"] == d.spec["role"]
                    && b["team"] == d.spec["team"]
                    && (d.spec["issuer"].is_null() || b["issuer"] == d.spec["issuer"])
            });
            step.action = if exists { Action::Unchanged } else { Action::Create };
            steps.push(step);
            continue;
        }
        match client.get_opt(&path).await? {
            None => step.action = Action::Create,
            Some(current) => {
                step.version = current["metadata"]["resource_version"].as_str().map(str::to_owned);
                let theirs = d.kind.normalize(&current["spec"]).unwrap_or_else(|_| current["spec"].clone());
                let mut changes = Vec::new();
                diff("spec", &theirs, &d.spec, &mut changes);
                let labels = |l: &Value| if l.is_null() { json!({}) } else { l.clone() };
                diff("metadata.labels", &labels(&current["metadata"]["labels"]), &json!(d.labels), &mut changes);
                if !changes.is_empty() {
                    step.action = Action::Change;
                    step.changes = changes;
                }
            }
        }
        steps.push(step);
    }
    if let Some(selector) = prune {
        let named: HashSet<String> = docs.iter().map(Document::id).collect();
        let mut doomed = Vec::new();
        for (kind, list) in
            [(Kind::Cluster, "/api/v1/clusters"), (Kind::Team, "/api/v1/teams"), (Kind::Flavor, "/api/v1/flavors")]
        {
            let mut found: Vec<(usize, Value)> = Vec::new();
            let items = client.list(list).await?;
            let parents: HashMap<String, Option<String>> = items
                .iter()
                .map(|t| (cell(&t["metadata"]["name"]), t["spec"]["parent"].as_str().map(str::to_owned)))
                .collect();
            for item in items {
                let name = cell(&item["metadata"]["name"]);
                let labels: Labels = serde_json::from_value(item["metadata"]["labels"].clone()).unwrap_or_default();
                if !selector.matches(&labels) || named.contains(&format!("{}/{name}", kind.noun())) {
                    continue;
                }
                let mut depth = 0;
                let mut up = parents.get(&name).cloned().flatten();
                while let Some(p) = up {
                    depth += 1;
                    up = parents.get(&p).cloned().flatten();
                }
                found.push((depth, item));
            }
            // Children first.
            found.sort_by(|a, b| {
                b.0.cmp(&a.0).then_with(|| cell(&a.1["metadata"]["name"]).cmp(&cell(&b.1["metadata"]["name"])))
            });
            for (_, item) in found {
                let name = cell(&item["metadata"]["name"]);
                doomed.push(Step {
                    kind,
                    id: format!("{}/{name}", kind.noun()),
                    action: Action::Delete,
                    changes: Vec::new(),
                    preview: Vec::new(),
                    refused: None,
                    doc: None,
                    version: item["metadata"]["resource_version"].as_str().map(str::to_owned),
                    path: object_path(kind, None, &name),
                });
            }
        }
        steps.extend(doomed);
    }
    Ok(steps)
}

/// How deep each team of the files is under other teams of the files (parents first).
fn team_depths(docs: &[Document]) -> HashMap<&str, usize> {
    let parents: HashMap<&str, &str> = docs
        .iter()
        .filter(|d| d.kind == Kind::Team)
        .filter_map(|d| Some((d.name.as_str(), d.spec["parent"].as_str()?)))
        .collect();
    let mut depths = HashMap::new();
    for d in docs.iter().filter(|d| d.kind == Kind::Team) {
        let (mut depth, mut at) = (0, d.name.as_str());
        while let Some(p) = parents.get(at) {
            depth += 1;
            at = p;
            if depth > parents.len() {
                break;
            }
        }
        depths.insert(d.name.as_str(), depth);
    }
    depths
}

/// Adds what differs between `before` and `after` under `at`, as `field: before → after`
/// (`+ field: value` for an added field, `- field: value` for a removed one).
pub fn diff(at: &str, before: &Value, after: &Value, out: &mut Vec<String>) {
    match (before, after) {
        (Value::Object(b), Value::Object(a)) => {
            let keys: std::collections::BTreeSet<&String> = b.keys().chain(a.keys()).collect();
            for k in keys {
                let field = format!("{at}.{k}");
                match (b.get(k), a.get(k)) {
                    (Some(x), Some(y)) => diff(&field, x, y, out),
                    (None, Some(y)) if !y.is_null() => out.push(format!("+ {field}: {y}")),
                    (Some(x), None) if !x.is_null() => out.push(format!("- {field}: {x}")),
                    _ => {}
                }
            }
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            for (i, (x, y)) in b.iter().zip(a).enumerate() {
                diff(&format!("{at}[{i}]"), x, y, out);
            }
        }
        _ if before != after => out.push(format!("{at}: {before} → {after}")),
        _ => {}
    }
}

/// Asks the server what each team change would do to admitted and running work, and has
/// it check each flavor, cluster, team and workload to create or change as it would write
/// it (`?dry_run=true`: every check, the team's limits and what can ever run included,
/// nothing written), unless the plan first changes what that check reads, which it would
/// not see: flavors (for clusters, teams and workloads), other teams (for a team: its
/// guarantee nests beside its siblings' in its parent's, its min runtime in every team
/// above it), teams or clusters (for workloads). Deletes are not tried. Each step left
/// unchecked says so.
pub async fn preview(client: &Client, steps: &mut [Step]) -> Result<(), ApiError> {
    let changes = |s: &Step| !matches!(s.action, Action::Unchanged);
    let flavors_change = steps.iter().any(|s| s.kind == Kind::Flavor && changes(s));
    let others_change = steps.iter().any(|s| !matches!(s.kind, Kind::Workload | Kind::RoleBinding) && changes(s));
    let teams_changing = steps.iter().filter(|s| s.kind == Kind::Team && changes(s)).count();
    for step in steps.iter_mut().filter(|s| s.kind != Kind::RoleBinding && changes(s)) {
        let unseen = match (step.kind, &step.action) {
            (_, Action::Delete) => {
                Some("deletes are not tried (one is refused while in use, as a team with live work)")
            }
            (Kind::Workload, _) if others_change => Some("the plan changes teams, flavors or clusters first"),
            (Kind::Cluster | Kind::Team, _) if flavors_change => Some("the plan changes flavors first"),
            (Kind::Team, _) if teams_changing > 1 => Some("the plan changes other teams too, which it would not see"),
            _ => None,
        };
        if let Some(unseen) = unseen {
            step.preview.push(format!("not checked by the server: {unseen}"));
            continue;
        }
        let Some(doc) = &step.doc else { continue };
        if step.kind == Kind::Team && matches!(step.action, Action::Change) {
            let answer = match client.post(&format!("{}/preview", step.path), Some(&doc.body())).await {
                Ok(answer) => answer,
                Err(e) if refusal(&e) => {
                    step.refused = Some(e.to_string());
                    continue;
                }
                Err(e) => return Err(e),
            };
            // The server's summary says it all in words, fair shares included.
            let mut lines: Vec<String> = answer["summary"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect();
            if lines.is_empty() {
                lines.push("no running or waiting work would change".into());
            }
            step.preview = lines;
            continue;
        }
        let version = if matches!(step.action, Action::Change) { step.version.as_deref() } else { None };
        match client.put(&format!("{}?dry_run=true", step.path), &doc.body(), version).await {
            Ok(_) => {}
            Err(e) if refusal(&e) => step.refused = Some(e.to_string()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Whether the server refused the request itself (bad input, a conflict, not allowed), as
/// the write would be refused, not for the caller's credentials or rate.
fn refusal(e: &ApiError) -> bool {
    e.status().is_some_and(|s| (400..500).contains(&s) && s != 401 && s != 429)
}

fn said(action: &Action, dry_run: bool) -> (&'static str, &'static str) {
    match action {
        Action::Create => ("+", if dry_run { "would be created" } else { "created" }),
        Action::Change => ("~", if dry_run { "would change" } else { "changed" }),
        Action::Unchanged => ("=", "unchanged"),
        Action::Delete => ("-", if dry_run { "would be deleted (pruned)" } else { "deleted (pruned)" }),
    }
}

pub fn print(steps: &[Step], dry_run: bool) {
    for s in steps {
        let (mark, what) = said(&s.action, dry_run);
        match &s.refused {
            Some(_) => println!("! {} would be refused (below)", s.id),
            None => println!("{mark} {} {what}", s.id),
        }
        for c in &s.changes {
            println!("    {c}");
        }
        for p in &s.preview {
            println!("    preview: {p}");
        }
    }
    let count = |f: fn(&Action) -> bool| steps.iter().filter(|s| s.refused.is_none() && f(&s.action)).count();
    let refused = steps.iter().filter(|s| s.refused.is_some()).count();
    println!(
        "{}: {} to create, {} to change, {} unchanged, {} to delete{}",
        if dry_run { "Plan" } else { "Applied" },
        count(|a| matches!(a, Action::Create)),
        count(|a| matches!(a, Action::Change)),
        count(|a| matches!(a, Action::Unchanged)),
        count(|a| matches!(a, Action::Delete)),
        if refused > 0 { format!(", {refused} the server would refuse") } else { String::new() },
    );
}

/// Carries the plan out, in its order; each change and delete is conditional on the
/// version the plan read, so a concurrent change is reported rather than overwritten.
pub async fn execute(client: &Client, steps: &[Step]) -> Result<()> {
    for (n, s) in steps.iter().enumerate() {
        let result = match (&s.action, &s.doc) {
            (Action::Unchanged, _) => continue,
            (Action::Create, Some(d)) if d.kind == Kind::RoleBinding => client.post(&s.path, Some(&d.spec)).await,
            (Action::Create, Some(d)) => client.put(&s.path, &d.body(), None).await,
            (Action::Change, Some(d)) => client.put(&s.path, &d.body(), s.version.as_deref()).await,
            (Action::Delete, _) => client.delete(&s.path, s.version.as_deref()).await,
            (_, None) => continue,
        };
        if let Err(e) = result {
            let hint = match e.status() {
                Some(412) => " (it changed since the plan was made: run apply again)",
                _ => "",
            };
            let source = s.doc.as_ref().map_or(String::new(), |d| format!(" ({})", d.source));
            // What was done before it stays done: said, so that a run again is no surprise.
            let mut done = steps[..n].iter().filter(|d| !matches!(d.action, Action::Unchanged)).peekable();
            let partly = if done.peek().is_some() { " (what is above was applied, the rest not)" } else { "" };
            for d in done {
                let (mark, what) = said(&d.action, false);
                eprintln!("{mark} {} {what}", d.id);
            }
            return Err(anyhow!(e)).context(format!("{}{source}{hint}{partly}", s.id));
        }
    }
    Ok(())
}

/// Groups what a plan changes, for `-o json`.
pub fn as_json(steps: &[Step]) -> Value {
    let mut by: BTreeMap<&str, usize> = BTreeMap::new();
    for s in steps {
        *by.entry(match s.action {
            Action::Create => "create",
            Action::Change => "change",
            Action::Unchanged => "unchanged",
            Action::Delete => "delete",
        })
        .or_default() += 1;
    }
    json!({"steps": steps, "counts": by})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diff_names_each_field_that_changed() {
        let mut out = Vec::new();
        let before = json!({"quotas": [{"flavor": "h100", "guaranteed": 8}], "parent": null, "d": "x"});
        let after = json!({"quotas": [{"flavor": "h100", "guaranteed": 12}], "parent": "r"});
        diff("spec", &before, &after, &mut out);
        assert_eq!(out, ["- spec.d: \"x\"", "spec.parent: null → \"r\"", "spec.quotas[0].guaranteed: 8 → 12"]);
    }

    #[test]
    fn documents_are_read_into_the_servers_types_and_bad_ones_named() {
        let good = json!({"kind": "Team", "metadata": {"name": "nlp"}, "spec": {"quotas": [{"flavor": "h100", "guaranteed": 2}]}});
        let d = document(&good, "f#1".into()).unwrap();
        assert_eq!(d.spec["quotas"][0]["weight"], 1, "defaults are filled in: {}", d.spec);
        let bad = json!({"kind": "Team", "metadata": {"name": "nlp"}, "spec": {"quota": []}});
        let e = document(&bad, "f#2".into()).unwrap_err();
        assert!(e.starts_with("f#2: spec"), "{e}");
        let e =
            document(&json!({"kind": "Workload", "metadata": {"name": "w"}, "spec": {}}), "f#3".into()).unwrap_err();
        assert!(e.contains("spec"), "{e}");
        let e = document(&json!({"kind": "Pod"}), "f#4".into()).unwrap_err();
        assert!(e.contains("not one of"), "{e}");
    }

    #[test]
    fn documents_the_server_would_refuse_are_named_before_anything_is_sent() {
        // Well typed, but a limit below the guarantee and a name no object may have: a dry
        // run said "would be created" and the apply stopped halfway at the server's 422.
        let team = json!({"kind": "Team", "metadata": {"name": "nlp"},
                          "spec": {"quotas": [{"flavor": "h100", "guaranteed": 8, "limit": 4}]}});
        let e = document(&team, "f#1".into()).unwrap_err();
        assert!(e.starts_with("f#1: /spec/quotas/0/limit: "), "{e}");
        let flavor = json!({"kind": "Flavor", "metadata": {"name": "H100"}, "spec": {}});
        assert!(document(&flavor, "f#2".into()).unwrap_err().contains("/metadata/name"));
        let workload = json!({"kind": "Workload", "metadata": {"name": "w", "team": "nlp"},
            "spec": {"kind": "training", "tasks": {"count": 1, "resources": {"flavors": ["h100"], "gpus": 1.5}}}});
        assert!(document(&workload, "f#3".into()).unwrap_err().contains("/spec/tasks/resources/gpus"));
        let binding = json!({"kind": "RoleBinding", "spec": {"subject": " ", "role": "member", "team": "nlp"}});
        assert!(document(&binding, "f#4".into()).unwrap_err().contains("/subject"));
    }

    #[test]
    fn a_field_the_server_would_refuse_is_not_dropped() {
        // `metadata.parent` was dropped: the team was made a top-level one, and the apply said
        // it was created as asked.
        let team = json!({"kind": "Team", "metadata": {"name": "nlp", "parent": "research"}, "spec": {"quotas": []}});
        let e = document(&team, "f#1".into()).unwrap_err();
        assert!(
            e.starts_with("f#1: metadata: unknown field `parent`") && e.ends_with("(a team's parent is spec.parent)"),
            "{e}"
        );
        let top = json!({"kind": "Flavor", "apiVersion": "v1", "metadata": {"name": "h100"}, "spec": {}});
        assert!(document(&top, "f#2".into()).unwrap_err().starts_with("f#2: apiVersion: not a field"));
        let named = json!({"kind": "Team", "metadata": {"name": "nlp", "team": "research"}, "spec": {"quotas": []}});
        assert!(document(&named, "f#3".into()).unwrap_err().starts_with("f#3: metadata.team: only a workload"));
        // What the server sets, as a GET answers it, is taken and left to the server.
        let read = json!({"kind": "Team", "metadata": {"name": "nlp", "uid": "00000000-0000-0000-0000-000000000001",
            "labels": {"a": "b"}, "generation": 3, "resource_version": "12", "creation_timestamp": "2026-12-01T00:00:00Z",
            "update_timestamp": "2026-12-01T00:00:00Z"}, "spec": {"quotas": []}, "status": {"allocated": []}});
        let d = document(&read, "f#4".into()).unwrap();
        assert_eq!((d.name.as_str(), d.labels.get("a").map(String::as_str), d.team), ("nlp", Some("b"), None));
    }

    #[test]
    fn a_syntax_error_is_named_once_and_ends_the_file() {
        // Each of these looped forever, the parser yielding its error for every document
        // asked of it: an unclosed list, an unclosed mapping, a tab, truncated JSON.
        let dir = std::env::temp_dir().join(format!("berth-apply-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = "kind: Flavor\nmetadata: {name: h100}\nspec: {}\n---\n";
        for (i, bad) in ["a: [\n", "metadata: {name: x\n", "a:\n\tb: 1\n", "{\"kind\":\"Team\","].iter().enumerate() {
            let path = dir.join(format!("bad{i}.yaml"));
            std::fs::write(&path, format!("{good}{bad}")).unwrap();
            let e = read(&[path]).unwrap_err().to_string();
            assert_eq!(e.lines().count(), 1, "{e}");
            assert!(
                e.contains(&format!("bad{i}.yaml#2: ")) && e.ends_with("(the rest of the file is not read)"),
                "{e}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
