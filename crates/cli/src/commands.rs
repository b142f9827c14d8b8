//! Each command: what it asks the API and how it shows the answer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use serde_json::{Value, json};

use crate::apply::{self, Action};
use crate::client::{ApiError, Client, exit, seg};
use crate::config::{Config, Context};
use crate::output::{self, Format, age, cell, gpus, gpus_said, structured, table};
use crate::submit;

/// What every command reaches.
#[derive(Clone)]
pub struct Env<'a> {
    pub client: &'a Client,
    /// The context's team.
    pub team: Option<String>,
    pub out: Format,
}

impl Env<'_> {
    /// The team a command is about: given, else the context's, else the one team the
    /// caller is a member or admin of.
    async fn team(&self, given: Option<String>) -> Result<String> {
        if let Some(t) = given.or(self.team.clone()) {
            return Ok(t);
        }
        let me = self.client.get("/api/v1/me").await?;
        let mut teams: Vec<String> = me["grants"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|g| g["role"] == "member" || g["role"] == "team-admin")
            .filter_map(|g| g["team"].as_str().map(str::to_owned))
            .collect();
        teams.dedup();
        match teams.as_slice() {
            [one] => Ok(one.clone()),
            [] => bail!("say which team: --team NAME (or `berth login --team NAME`)"),
            many => bail!("you are in several teams ({}): say which with --team", many.join(", ")),
        }
    }
}

pub async fn login(
    mut config: Config,
    context: Option<&str>,
    server: &str,
    token: Option<String>,
    team: Option<String>,
) -> Result<i32> {
    let token = match token {
        Some(t) => t,
        None => obtain_token(server).await?,
    };
    if token.is_empty() {
        bail!("no token given");
    }
    let me = Client::new(server, Some(token.clone())).get("/api/v1/me").await.context("checking the token")?;
    let name = context.map(str::to_owned).or(config.current.clone()).unwrap_or_else(|| "default".to_owned());
    let previous = config.contexts.get(&name).and_then(|c| c.team.clone());
    config
        .contexts
        .insert(name.clone(), Context { server: server.to_owned(), token: Some(token), team: team.or(previous) });
    config.current = Some(name.clone());
    let path = config.save()?;
    eprintln!("Signed in to {server} as {} (context {name:?} in {})", cell(&me["subject"]), path.display());
    Ok(0)
}

/// How to get a token for `server`: its identity provider's device-code flow when the
/// server names one (`GET /auth/config`), else a token pasted on standard input.
async fn obtain_token(server: &str) -> Result<String> {
    let config = Client::new(server, None).get("/auth/config").await.context("asking the server how to sign in")?;
    if config["oidc"]["client_id"].is_string() {
        return device_flow(&config["oidc"]).await;
    }
    eprintln!("Paste a token for {server} (from your administrator or `berthd token create`), then press Enter:");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).context("reading the token")?;
    Ok(line.trim().to_owned())
}

/// OAuth 2.0 device authorization (RFC 8628): the user approves in a browser; the CLI
/// polls the token endpoint and keeps the token whose audience is Berth's.
async fn device_flow(oidc: &Value) -> Result<String> {
    let http = reqwest::Client::new();
    let text = |v: &Value, what: &str| {
        v[what].as_str().map(str::to_owned).ok_or_else(|| anyhow!("the identity provider sent no {what}"))
    };
    let (issuer, client_id, audience) = (text(oidc, "issuer")?, text(oidc, "client_id")?, text(oidc, "audience")?);
    let discovery_url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
    let discovery: Value = http
        .get(&discovery_url)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await
        .with_context(|| format!("reading {discovery_url}"))?;
    let device =
        text(&discovery, "device_authorization_endpoint").context("the identity provider offers no device flow")?;
    let token_url = text(&discovery, "token_endpoint")?;
    let start: Value = http
        .post(&device)
        .form(&[("client_id", client_id.as_str()), ("scope", "openid profile email")])
        .send()
        .await?
        .error_for_status()
        .context("starting the device flow")?
        .json()
        .await?;
    let device_code = text(&start, "device_code")?;
    let uri = start["verification_uri_complete"].as_str().or(start["verification_uri"].as_str()).unwrap_or_default();
    eprintln!("To sign in, open {uri} and enter the code {}", cell(&start["user_code"]));
    let mut interval = start["interval"].as_u64().unwrap_or(5).max(1);
    let deadline = std::time::Instant::now() + Duration::from_secs(start["expires_in"].as_u64().unwrap_or(600));
    loop {
        tokio::time::sleep(Duration::from_secs(interval)).await;
        if std::time::Instant::now() > deadline {
            bail!("the code expired before it was approved: run berth login again");
        }
        let answer: Value = http
            .post(&token_url)
            .form(&[
                ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
                ("device_code", device_code.as_str()),
                ("client_id", client_id.as_str()),
            ])
            .send()
            .await?
            .json()
            .await
            .unwrap_or_default();
        match answer["error"].as_str() {
            None => {
                return ["access_token", "id_token"]
                    .iter()
                    .filter_map(|k| answer[*k].as_str())
                    .find(|t| audience_of(t).contains(&audience))
                    .map(str::to_owned)
                    .ok_or_else(|| {
                        anyhow!("the identity provider's tokens are not for the audience {audience:?} Berth accepts")
                    });
            }
            Some("authorization_pending") => {}
            Some("slow_down") => interval += 5,
            Some(e) => bail!("sign-in failed: {e}: {}", cell(&answer["error_description"])),
        }
    }
}

/// The `aud` of a JWT, read without checking it (Berth checks it).
fn audience_of(token: &str) -> Vec<String> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1).unwrap_or_default();
    let claims: Value = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    match &claims["aud"] {
        Value::String(a) => vec![a.clone()],
        Value::Array(a) => a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect(),
        _ => Vec::new(),
    }
}

pub async fn apply(env: &Env<'_>, files: &[PathBuf], dry_run: bool, prune: Option<String>) -> Result<i32> {
    let docs = apply::read(files)?;
    let selector = match &prune {
        Some(s) => {
            let selector =
                berth_core::selector::LabelSelector::parse("selector", s).map_err(|e| anyhow!("--selector: {e}"))?;
            // An empty one (an unset variable in a pipeline) would match every flavor, team
            // and cluster, labelled or not.
            if selector == berth_core::selector::LabelSelector::default() {
                anyhow::bail!(
                    "--selector {s:?}: --prune needs labels to choose what it may delete (as -l managed-by=gitops): \
                     an empty selector would delete every flavor, team and cluster in no file"
                );
            }
            Some(selector)
        }
        None => None,
    };
    let mut steps = apply::plan(env.client, &docs, selector.as_ref()).await?;
    if dry_run {
        apply::preview(env.client, &mut steps).await?;
    } else {
        apply::execute(env.client, &steps).await?;
    }
    if !structured(env.out, &apply::as_json(&steps)) {
        apply::print(&steps, dry_run);
    }
    let refused: Vec<_> = steps.iter().filter_map(|s| Some((s, s.refused.as_ref()?))).collect();
    for (s, e) in &refused {
        let source = s.doc.as_ref().map_or(String::new(), |d| format!(" ({})", d.source));
        eprintln!("error: {}{source} would be refused: {e}", s.id);
    }
    Ok(if refused.is_empty() { 0 } else { exit::REFUSED })
}

pub async fn diff(env: &Env<'_>, files: &[PathBuf]) -> Result<i32> {
    let docs = apply::read(files)?;
    let steps = apply::plan(env.client, &docs, None).await?;
    let differs = steps.iter().any(|s| !matches!(s.action, Action::Unchanged));
    if !structured(env.out, &apply::as_json(&steps)) {
        for s in steps.iter().filter(|s| !matches!(s.action, Action::Unchanged)) {
            match s.action {
                Action::Create => println!("+ {} (not on the server)", s.id),
                _ => {
                    println!("~ {}", s.id);
                    s.changes.iter().for_each(|c| println!("    {c}"));
                }
            }
        }
    }
    Ok(if differs { exit::DIFFERENT } else { 0 })
}

/// What `get` and `describe` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ObjectKind {
    #[value(alias = "flavor")]
    Flavors,
    #[value(alias = "team")]
    Teams,
    #[value(alias = "cluster")]
    Clusters,
    #[value(alias = "workload", alias = "wl")]
    Workloads,
    #[value(alias = "rolebinding")]
    Rolebindings,
}

#[derive(Debug, clap::Args)]
pub struct GetArgs {
    kind: ObjectKind,
    name: Option<String>,
    /// Workloads of this team [default: all you can see]
    #[arg(long)]
    team: Option<String>,
    /// Label selector (workloads)
    #[arg(short = 'l', long)]
    selector: Option<String>,
    /// Only workloads submitted by this subject; `me` for yours
    #[arg(long)]
    owner: Option<String>,
    /// Only workloads in this phase
    #[arg(long)]
    phase: Option<String>,
    /// Only workloads whose name contains this
    #[arg(long)]
    name_contains: Option<String>,
    /// Keep watching: print the table again whenever it changes
    #[arg(short, long)]
    watch: bool,
}

pub async fn get(env: &Env<'_>, a: GetArgs) -> Result<i32> {
    let c = env.client;
    if let Some(name) = &a.name {
        let path = match a.kind {
            ObjectKind::Workloads => {
                format!("/api/v1/teams/{}/workloads/{}", seg(&env.team(a.team.clone()).await?), seg(name))
            }
            ObjectKind::Rolebindings => format!("/api/v1/role-bindings/{}", seg(name)),
            kind => format!("{}/{}", collection(kind), seg(name)),
        };
        let object = c.get(&path).await?;
        if !structured(env.out, &object) {
            rows(a.kind, &[object], env.out == Format::Wide);
        }
        return Ok(0);
    }
    let mut query = Vec::new();
    if a.kind == ObjectKind::Workloads {
        let filters = [
            ("team", &a.team),
            ("label_selector", &a.selector),
            ("owner", &a.owner),
            ("phase", &a.phase),
            ("name_contains", &a.name_contains),
        ];
        for (k, v) in filters {
            if let Some(v) = v {
                query.push(format!("{k}={}", seg(v)));
            }
        }
    }
    let path = if query.is_empty() {
        collection(a.kind).to_owned()
    } else {
        format!("{}?{}", collection(a.kind), query.join("&"))
    };
    let mut last = String::new();
    loop {
        let items = if a.kind == ObjectKind::Rolebindings { c.items(&path).await? } else { c.list(&path).await? };
        let shown = json!({"items": items});
        let text = shown.to_string();
        if text != last {
            if !structured(env.out, &shown) {
                if !last.is_empty() {
                    println!();
                }
                rows(a.kind, &items, env.out == Format::Wide);
            }
            last = text;
        }
        if !a.watch {
            return Ok(0);
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn collection(kind: ObjectKind) -> &'static str {
    match kind {
        ObjectKind::Flavors => "/api/v1/flavors",
        ObjectKind::Teams => "/api/v1/teams",
        ObjectKind::Clusters => "/api/v1/clusters",
        ObjectKind::Workloads => "/api/v1/workloads",
        ObjectKind::Rolebindings => "/api/v1/role-bindings",
    }
}

fn gpus_of(w: &Value) -> f64 {
    let t = &w["spec"]["tasks"];
    t["count"].as_f64().unwrap_or(0.0) * t["resources"]["gpus"].as_f64().unwrap_or(0.0)
}

fn rows(kind: ObjectKind, items: &[Value], wide: bool) {
    match kind {
        ObjectKind::Flavors => table(
            &["NAME", "GPU MEMORY GIB", "SLURM GRES", "DESCRIPTION"],
            &items
                .iter()
                .map(|f| {
                    let s = &f["spec"];
                    vec![
                        cell(&f["metadata"]["name"]),
                        cell(&s["gpu_memory_gib"]),
                        cell(&s["slurm"]["gres_type"]),
                        cell(&s["description"]),
                    ]
                })
                .collect::<Vec<_>>(),
        ),
        ObjectKind::Teams => table(
            &["NAME", "PARENT", "QUOTAS (guaranteed/limit)", "ALLOCATED"],
            &items
                .iter()
                .map(|t| {
                    let quotas: Vec<String> = t["spec"]["quotas"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|q| {
                            format!(
                                "{}: {}/{}",
                                cell(&q["flavor"]),
                                cell(&q["guaranteed"]),
                                q["limit"].as_u64().map_or("-".into(), |l| l.to_string())
                            )
                        })
                        .collect();
                    let used: Vec<String> = t["status"]["usage"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|u| {
                            format!("{}: {}", cell(&u["flavor"]), gpus(u["subtree_allocated"].as_f64().unwrap_or(0.0)))
                        })
                        .collect();
                    vec![cell(&t["metadata"]["name"]), cell(&t["spec"]["parent"]), quotas.join(", "), used.join(", ")]
                })
                .collect::<Vec<_>>(),
        ),
        ObjectKind::Clusters => table(
            &["NAME", "KIND", "HEALTH", "GPUS FREE/TOTAL", "CORDONED", "API"],
            &items
                .iter()
                .map(|c| {
                    let inv = c["status"]["inventory"].as_array().cloned().unwrap_or_default();
                    let (free, total) = inv.iter().fold((0.0, 0.0), |(f, t), i| {
                        (f + i["gpus_free"].as_f64().unwrap_or(0.0), t + i["gpus_total"].as_f64().unwrap_or(0.0))
                    });
                    vec![
                        cell(&c["metadata"]["name"]),
                        cell(&c["spec"]["kind"]),
                        cell(&c["status"]["health"]),
                        format!("{}/{}", gpus(free), gpus(total)),
                        if c["spec"]["cordoned"] == true { "yes".into() } else { String::new() },
                        if wide { cell(&c["status"]["api"]) } else { String::new() },
                    ]
                })
                .collect::<Vec<_>>(),
        ),
        ObjectKind::Workloads => {
            let mut headers = vec!["TEAM", "NAME", "OWNER", "KIND", "PHASE", "GPUS", "CLUSTER", "AGE"];
            if wide {
                headers.extend(["POSITION", "ESTIMATED START", "WHY"]);
            }
            let rows: Vec<Vec<String>> = items
                .iter()
                .map(|w| {
                    let (m, s) = (&w["metadata"], &w["status"]);
                    let mut row = vec![
                        cell(&m["team"]),
                        cell(&m["name"]),
                        cell(&m["owner"]["subject"]),
                        cell(&w["spec"]["kind"]),
                        cell(&s["phase"]),
                        gpus(gpus_of(w)),
                        cell(&s["admission"]["cluster"]),
                        age(&m["creation_timestamp"]),
                    ];
                    if wide {
                        row.push(cell(&s["queue_position"]["global"]));
                        row.push(age(&s["estimated_start"]["at"]));
                        row.push(cell(&s["pending_reason"]["message"]).chars().take(80).collect());
                    }
                    row
                })
                .collect();
            table(&headers, &rows);
        }
        ObjectKind::Rolebindings => table(
            &["ID", "SUBJECT", "ROLE", "TEAM", "ISSUER"],
            &items
                .iter()
                .map(|b| {
                    vec![cell(&b["id"]), cell(&b["subject"]), cell(&b["role"]), cell(&b["team"]), cell(&b["issuer"])]
                })
                .collect::<Vec<_>>(),
        ),
    }
}

pub async fn describe(env: &Env<'_>, kind: ObjectKind, name: &str, team: Option<String>) -> Result<i32> {
    if kind != ObjectKind::Workloads {
        return get(
            env,
            GetArgs {
                kind,
                name: Some(name.to_owned()),
                team,
                selector: None,
                owner: None,
                phase: None,
                name_contains: None,
                watch: false,
            },
        )
        .await;
    }
    let path = format!("/api/v1/teams/{}/workloads/{}", seg(&env.team(team).await?), seg(name));
    let w = env.client.get(&path).await?;
    let events = env.client.list(&format!("{path}/events")).await?;
    if structured(env.out, &json!({"workload": w, "events": events})) {
        return Ok(0);
    }
    let (m, s) = (&w["metadata"], &w["status"]);
    let mut facts: Vec<(&str, String)> = vec![
        ("Name", format!("{}/{}", cell(&m["team"]), cell(&m["name"]))),
        ("Owner", cell(&m["owner"]["subject"])),
        ("Kind", cell(&w["spec"]["kind"])),
        ("Phase", cell(&s["phase"])),
        ("Reason", cell(&s["pending_reason"]["message"]).to_string() + &cell(&s["message"])),
        (
            "Queue position",
            s["queue_position"]["global"]
                .as_u64()
                .map_or(String::new(), |g| format!("{g} overall, {} in the team", cell(&s["queue_position"]["team"]))),
        ),
        ("Estimated start", estimate(&w)),
        (
            "GPUs",
            format!(
                "{} ({} × {})",
                gpus(gpus_of(&w)),
                cell(&w["spec"]["tasks"]["count"]),
                cell(&w["spec"]["tasks"]["resources"]["gpus"])
            ),
        ),
        (
            "Flavors",
            w["spec"]["tasks"]["resources"]["flavors"]
                .as_array()
                .map(|f| f.iter().map(cell).collect::<Vec<_>>().join(", "))
                .unwrap_or_default(),
        ),
        ("Cluster", cell(&s["admission"]["cluster"])),
        (
            "Placement",
            s["admission"]["placement"]
                .as_array()
                .map(|p| p.iter().map(|t| cell(&t["node"])).collect::<Vec<_>>().join(", "))
                .unwrap_or_default(),
        ),
        ("Backend job", cell(&s["backend_ref"]["job_id"])),
        ("Attempt", cell(&s["attempt"])),
        ("Submitted", cell(&s["submitted_at"])),
        ("Started", cell(&s["started_at"])),
        ("Finished", cell(&s["finished_at"])),
        ("Exit code", cell(&s["exit_code"])),
        ("Cancelled by", cell(&s["cancellation"]["by"])),
    ];
    facts.retain(|(_, v)| !v.is_empty());
    let width = facts.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in facts {
        println!("{k:<width$}  {v}");
    }
    println!("Events:");
    for e in events {
        println!("  {}  {:<18} {}", cell(&e["time"]), cell(&e["reason"]), cell(&e["message"]));
    }
    Ok(0)
}

fn estimate(w: &Value) -> String {
    let s = &w["status"];
    // Estimates are made every 10 s for work the scheduler has left waiting.
    let new = w["metadata"]["creation_timestamp"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .is_some_and(|t| (chrono::Utc::now() - t.to_utc()).num_seconds() < 20);
    match s["estimated_start"]["at"].as_str() {
        Some(at) => format!("{at} ({}; {})", age(&s["estimated_start"]["at"]), cell(&s["estimated_start"]["basis"])),
        None if s["phase"] != "Pending" => String::new(),
        None if s["pending_reason"]["code"] == "Unschedulable" => "never, as it was submitted (above)".into(),
        None if new || s["pending_reason"].is_null() => "not known yet: estimates are made every 10 seconds".into(),
        None => "not known: what it waits for has no runtime limit, or it is too far back in the queue to tell".into(),
    }
}

#[derive(Debug, clap::Args)]
pub struct Shape {
    /// Team [default: the context's, or your only team]
    #[arg(long)]
    team: Option<String>,
    /// Workload name [default: the script's job name, else generated]
    #[arg(long)]
    name: Option<String>,
    /// GPUs per task (sbatch's GPUs in all: -G)
    #[arg(long, value_parser = gpus_per_task)]
    gpus: Option<f64>,
    /// Flavor of the GPUs
    #[arg(long)]
    flavor: Option<String>,
    /// Tasks (a training job's ranks)
    #[arg(long)]
    tasks: Option<u32>,
    /// Nodes: one task per node unless --tasks is given (of MIN-MAX, as sbatch: MIN)
    #[arg(long, value_parser = node_count)]
    nodes: Option<u32>,
    /// Runtime limit: 4h, 30m, 2d or Slurm's 01:00:00, 1-12:00
    #[arg(long)]
    time: Option<String>,
    /// CPUs per task
    #[arg(long)]
    cpus: Option<u32>,
    /// Priority within the team, -1000 to 1000
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i32>,
    /// Whether Berth may preempt it
    #[arg(long)]
    preemptible: Option<bool>,
    /// Workload kind: training, batch, inference, notebook
    #[arg(long)]
    kind: Option<String>,
    /// Run time on a simulated cluster, in seconds
    #[arg(long)]
    sim_seconds: Option<f64>,
    /// Labels, key=value
    #[arg(long = "label")]
    labels: Vec<String>,
    /// A workload per index, as sbatch's --array: 0-15, 1,3,5, 0-15:4
    #[arg(long, short = 'a')]
    array: Option<String>,
    /// Check everything and show the workload; submit nothing
    #[arg(long)]
    dry_run: bool,
}

/// `--gpus`: Berth's is GPUs per task, a number; sbatch's `--gpus=TYPE:N` (GPUs in all)
/// is `-G` here.
fn gpus_per_task(v: &str) -> Result<f64, String> {
    v.parse().map_err(|_| {
        let sbatch = if v.contains(':') {
            format!("; for sbatch's --gpus={v} (GPUs in all) give -G {v}")
        } else {
            String::new()
        };
        format!("Berth's --gpus is a number of GPUs per task{sbatch}")
    })
}

/// `--nodes`: N, or sbatch's MIN-MAX (Berth asks for MIN).
fn node_count(v: &str) -> Result<u32, String> {
    v.split('-').next().unwrap_or(v).parse().map_err(|_| "not a number of nodes (N, or MIN-MAX)".to_owned())
}

/// A parse error of Berth's options in words of its own (clap's starts with "error: ",
/// which the caller's report adds again, and goes on with its usage and help).
fn clap_message(e: &clap::Error) -> String {
    let text = e.to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    text.split("\n\n").next().unwrap_or(text).trim().to_owned()
}

impl Shape {
    fn onto(&self, r: &mut submit::Request) -> Result<()> {
        macro_rules! set {
            ($($from:ident => $to:ident),*) => { $(if let Some(v) = &self.$from { r.$to = Some(v.clone()); })* };
        }
        set!(team => team, name => name, flavor => flavor, tasks => tasks, nodes => nodes, cpus => cpus_per_task, priority => priority, preemptible => preemptible, kind => kind, sim_seconds => sim_seconds, gpus => gpus_per_task);
        if let Some(t) = &self.time {
            r.time_seconds = if submit::no_time_limit(t) {
                None
            } else {
                Some(submit::slurm_time(t).ok_or_else(|| {
                    anyhow!("--time {t}: not a time (4h, 30m, 01:00:00, 1-12:00; UNLIMITED for none)")
                })?)
            };
        }
        for l in &self.labels {
            let (k, v) = l.split_once('=').ok_or_else(|| anyhow!("--label {l}: not key=value"))?;
            r.labels.push((k.to_owned(), v.to_owned()));
        }
        if let Some(a) = &self.array {
            r.array = Some(submit::Array::parse(a).map_err(|e| anyhow!("--array {a}: {e}"))?);
        }
        Ok(())
    }
}

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    shape: Shape,
    /// sbatch's options as on its command line, which win over the script's (`-J train
    /// --gres=gpu:h100:2 -t 4:00:00`), then the batch script (`-` for standard input)
    #[arg(value_name = "[SBATCH OPTIONS] SCRIPT", required = true, allow_hyphen_values = true)]
    words: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    #[command(flatten)]
    shape: Shape,
    /// Container image
    #[arg(long)]
    image: String,
    /// Environment variables, NAME=value
    #[arg(long = "env")]
    env: Vec<String>,
    /// The command and its arguments
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// Parses `#BERTH` words as the submit options.
#[derive(Debug, clap::Parser)]
#[command(no_binary_name = true, name = "#BERTH")]
struct Directives {
    #[command(flatten)]
    shape: Shape,
}

pub async fn submit(env: &Env<'_>, a: SubmitArgs) -> Result<i32> {
    let line = submit::CommandLine::split(&a.words, own_option)?;
    let out = match &line.output {
        Some(o) => <Format as clap::ValueEnum>::from_str(o, false).map_err(|_| {
            anyhow!(
                "-o {o}: after the script, -o is Berth's (how it prints: table, wide, json or yaml); sbatch's -o, \
                     the job's output file, goes before the script after another sbatch option \
                     (berth submit -J NAME -o {o} SCRIPT), and berth logs NAME reads a job's output"
            )
        })?,
        None => env.out,
    };
    let env = &Env { out, ..env.clone() };
    if !line.args.is_empty() {
        bail!(
            "{} after the script: Berth runs a batch script without arguments (sbatch would pass them to it); \
             put them in the script",
            line.args.join(" ")
        );
    }
    if let Some(global) = line
        .berth
        .iter()
        .find(|w| ["--server", "--token", "--context"].contains(&w.split('=').next().unwrap_or_default()))
    {
        bail!("{global}: give Berth's --server, --token and --context before the script and sbatch's options");
    }
    // Among sbatch's options -o is sbatch's --output (a file); one naming a format of
    // Berth's was meant as Berth's.
    let formats = ["table", "wide", "json", "yaml"];
    for (i, w) in line.sbatch.iter().enumerate() {
        let value = match w.as_str() {
            "-o" | "--output" => line.sbatch.get(i + 1).map(String::as_str),
            w => w.strip_prefix("--output=").or_else(|| w.strip_prefix("-o")),
        };
        if let Some(f) = value.filter(|v| formats.contains(v)) {
            bail!(
                "{w} {f}: after sbatch's options this is sbatch's --output (a file): give Berth's -o {f} before them, or after the script"
            );
        }
    }
    let script = if line.script == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the script")?
    } else {
        std::fs::read_to_string(&line.script).with_context(|| format!("reading {}", line.script))?
    };
    submit::check_script(&script)?;
    let (sbatch, berth) = submit::directives(&script);
    let mut r = submit::Request::default();
    for words in &sbatch {
        submit::read_sbatch(words, &mut r, "#SBATCH ")?;
    }
    if !r.ignored.is_empty() {
        eprintln!("note: #SBATCH options Berth does not use: {}", std::mem::take(&mut r.ignored).join(" "));
    }
    let directives =
        <Directives as clap::Parser>::try_parse_from(&berth).map_err(|e| anyhow!("#BERTH: {}", clap_message(&e)))?;
    directives.shape.onto(&mut r)?;
    // The command line wins, as sbatch's does: sbatch's options, then Berth's own.
    submit::read_command_line(&line.sbatch, &mut r)?;
    if !r.ignored.is_empty() {
        eprintln!("note: sbatch options Berth does not use: {}", r.ignored.join(" "));
    }
    for note in &r.notes {
        eprintln!("note: {note}");
    }
    let own = <Directives as clap::Parser>::try_parse_from(&line.berth).map_err(|e| anyhow!("{}", clap_message(&e)))?;
    own.shape.onto(&mut r)?;
    a.shape.onto(&mut r)?;
    if let (Some(nodes), Some(tasks)) = (r.nodes, r.tasks)
        && nodes > tasks
    {
        eprintln!(
            "note: --ntasks={tasks} on --nodes={nodes}: as Slurm, nodes without a task are not asked for (--nodes={tasks})"
        );
    }
    let dry_run = a.shape.dry_run || directives.shape.dry_run || own.shape.dry_run || r.test_only;
    create(env, r, &script, None, dry_run).await
}

/// Whether `berth submit` has the option `opt` of its own, and whether it takes a value:
/// given among sbatch's options it is still Berth's (`--gpus` is GPUs per task). Berth's
/// options of every command are refused there: as sbatch's, they would be passed over.
fn own_option(opt: &str) -> Option<bool> {
    let command = <Directives as clap::CommandFactory>::command();
    let takes = |a: &clap::Arg| a.get_action().takes_values();
    if let Some(long) = opt.strip_prefix("--") {
        if ["server", "token", "context"].contains(&long) {
            // Not sbatch's: handed over as Berth's, to be refused (see `submit`).
            return Some(true);
        }
        command.get_arguments().find(|a| a.get_long() == Some(long)).map(takes)
    } else {
        let short = opt.strip_prefix('-').and_then(|s| s.chars().next())?;
        command.get_arguments().find(|a| a.get_short() == Some(short)).map(takes)
    }
}

pub async fn run(env: &Env<'_>, a: RunArgs) -> Result<i32> {
    let mut r = submit::Request { image: Some(a.image.clone()), ..Default::default() };
    a.shape.onto(&mut r)?;
    let mut vars = serde_json::Map::new();
    for e in &a.env {
        let (k, v) = e.split_once('=').ok_or_else(|| anyhow!("--env {e}: not NAME=value"))?;
        vars.insert(k.to_owned(), json!(v));
    }
    create(env, r, "", Some((a.command, vars)), a.shape.dry_run).await
}

/// Resolves the flavor, builds the spec and creates the workload (a generated name when
/// none is given, and an idempotency key so a retried submit is not doubled); an array's
/// workloads are created together, all or none.
async fn create(
    env: &Env<'_>,
    r: submit::Request,
    script: &str,
    command: Option<(Vec<String>, serde_json::Map<String, Value>)>,
    dry_run: bool,
) -> Result<i32> {
    let c = env.client;
    let team = env.team(r.team.clone()).await?;
    let flavor = flavor(c, &r).await?;
    let mut spec = submit::spec(&r, &flavor, script)?;
    if let Some((command, vars)) = command {
        spec["run"] = json!({"command": command, "image": r.image, "env": vars});
    }
    let labels: serde_json::Map<String, Value> = r.labels.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let label = r.name.as_deref().map(|n| (n, submit::dns_label(n)));
    let path = format!("/api/v1/teams/{}/workloads{}", seg(&team), if dry_run { "?dry_run=true" } else { "" });
    let post = async |items: Vec<Value>| -> Result<Value> {
        let body = json!({ "items": items });
        let size = body.to_string().len();
        if size > BODY_MOST {
            bail!(
                "--array: {} workloads with this script make a request of {size} bytes; Berth takes at most \
                 {BODY_MOST}: submit fewer indices at a time",
                items.len()
            );
        }
        let key = uuid::Uuid::new_v4().to_string();
        Ok(c.send(c.request(reqwest::Method::POST, &path).header("Idempotency-Key", key).json(&body)).await?)
    };
    let answer = match &r.array {
        None => {
            let mut metadata = json!({"labels": labels});
            let prefix = |label: &str| json!(format!("{}-", &label[..label.len().min(57)]));
            match label {
                // sbatch runs a script again under the same job name; a name is unique in a
                // team, so one already taken (the last run's) gets a generated end.
                Some((n, Some(label))) if label == n => {
                    let path = format!("/api/v1/teams/{}/workloads/{}", seg(&team), seg(&label));
                    match c.get_opt(&path).await? {
                        Some(taken) => {
                            let phase = cell(&taken["status"]["phase"]);
                            eprintln!("{team}/{label} exists ({phase}): this one gets a name of its own");
                            metadata["generate_name"] = prefix(&label);
                        }
                        // An array's name: `berth cancel NAME` would take this one.
                        None if has_array(env, &team, &label).await? => {
                            eprintln!("{team}/{label} is an array's name: this one gets a name of its own");
                            metadata["generate_name"] = prefix(&label);
                        }
                        None => metadata["name"] = json!(label),
                    }
                }
                Some((_, Some(label))) => metadata["generate_name"] = prefix(&label),
                _ => metadata["generate_name"] = json!("job-"),
            }
            post(vec![json!({"metadata": metadata, "spec": spec})]).await.map_err(the_one_item)?
        }
        Some(array) => {
            if let Some(n) = array.at_once {
                eprintln!(
                    "note: --array %{n} is not kept: every index is queued, and the team's quota decides how many run"
                );
            }
            // NAME-INDEX, as Slurm's JOBID_INDEX, all labelled with the array's name.
            let items = |base: &str| -> Vec<Value> {
                let mut labels = labels.clone();
                labels.insert(ARRAY_LABEL.to_owned(), json!(base));
                let labels = Value::Object(labels);
                let item = |i: u32| {
                    let mut spec = spec.clone();
                    for (k, v) in array.environment(i) {
                        spec["run"]["env"][k] = json!(v);
                    }
                    json!({"metadata": {"name": format!("{base}-{i}"), "labels": labels}, "spec": spec})
                };
                array.indices.iter().map(|&i| item(i)).collect()
            };
            // Room for -INDEX (and, should the name be taken, a random end).
            let room = 63 - 1 - array.indices[array.indices.len() - 1].to_string().len();
            let again = |base: &str| {
                let again = format!("{}-{}", submit::shortened(base, room - 6), random_end());
                eprintln!("{team}/{base} (an array, or {base}-INDEX) exists: this array is named {again}");
                again
            };
            match label {
                Some((_, Some(label))) => {
                    let mut base = submit::shortened(&label, room).to_owned();
                    // An array of that name (the last run's, other indices maybe): as sbatch
                    // gives each run a job id of its own, this one gets a name of its own.
                    // A workload of that name would take the array's in `berth cancel`.
                    let named = format!("/api/v1/teams/{}/workloads/{}", seg(&team), seg(&base));
                    if has_array(env, &team, &base).await? || c.get_opt(&named).await?.is_some() {
                        base = again(&base);
                    }
                    match post(items(&base)).await {
                        // Names taken by other workloads.
                        Err(e) if e.downcast_ref::<ApiError>().is_some_and(names_taken) => {
                            post(items(&again(&base))).await?
                        }
                        answer => answer?,
                    }
                }
                _ => post(items(&format!("job-{}", random_end()))).await?,
            }
        }
    };
    let what = if dry_run { "would be submitted" } else { "submitted" };
    match &r.array {
        // As sbatch --parsable prints the job id alone (an array's: what scancel takes).
        _ if r.parsable && matches!(env.out, Format::Table | Format::Wide) => {
            let w = &answer["items"][0];
            let name = if r.array.is_some() { &w["metadata"]["labels"][ARRAY_LABEL] } else { &w["metadata"]["name"] };
            println!("{}", cell(name));
        }
        None => {
            let w = &answer["items"][0];
            if !structured(env.out, w) {
                let name = cell(&w["metadata"]["name"]);
                println!("workload {team}/{name} {what} ({} of {flavor})", gpus_said(gpus_of(w)));
            }
        }
        Some(array) => {
            if !structured(env.out, &answer["items"]) {
                let w = &answer["items"][0];
                let base = cell(&w["metadata"]["labels"][ARRAY_LABEL]);
                let (first, last) = (array.indices[0], array.indices[array.indices.len() - 1]);
                let (count, names) = match array.indices.len() {
                    1 => ("1 workload".to_owned(), format!("{base}-{first}")),
                    n => (format!("{n} workloads"), format!("{base}-{first} … {base}-{last}")),
                };
                println!(
                    "array {team}/{base}: {count} {what} ({names}, {} of {flavor} each); \
                     berth get workloads --team {team} -l {ARRAY_LABEL}={base}",
                    gpus_said(gpus_of(w)),
                );
            }
        }
    }
    Ok(0)
}

/// The label an array's workloads carry: the array's name.
const ARRAY_LABEL: &str = "berth.dev/array";

/// The largest request body the API takes (`berthd`'s `BODY_LIMIT`).
const BODY_MOST: usize = 1024 * 1024;

/// A refusal of a batch of one workload, with its fields as of that workload
/// (`/items/0/spec/kind` → `/spec/kind`): one script, one job.
fn the_one_item(e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<ApiError>() {
        Ok(ApiError::Problem { status, title, detail, errors }) => {
            let errors = errors
                .into_iter()
                .map(|(field, message)| match field.strip_prefix("/items/0") {
                    Some(own) => (own.to_owned(), message),
                    None => (field, message),
                })
                .collect();
            ApiError::Problem { status, title, detail, errors }.into()
        }
        Ok(other) => other.into(),
        Err(e) => e,
    }
}

/// Whether the API refused a batch only because names in it are taken.
fn names_taken(e: &ApiError) -> bool {
    matches!(e, ApiError::Problem { status: 409, errors, .. }
        if !errors.is_empty() && errors.iter().all(|(at, _)| at.ends_with("/metadata/name")))
}

/// Five random characters that end a DNS label.
fn random_end() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..5].to_owned()
}

/// The flavor a request names: `--flavor`, else the GPU type (a flavor's name or its Slurm
/// GRES type), else the partition (the flavor a cluster's Slurm partition holds: the first
/// of a list that one has), else the only flavor there is. A partition no cluster has is
/// refused, as sbatch refuses it, unless `--flavor` is given.
async fn flavor(c: &Client, r: &submit::Request) -> Result<String> {
    if let Some(f) = &r.flavor {
        return Ok(f.clone());
    }
    let partition = match &r.partition {
        Some(p) => {
            let clusters = c.list("/api/v1/clusters").await?;
            let held: Vec<Value> = clusters
                .iter()
                .flat_map(|c| c["spec"]["slurm"]["partitions"].as_array().cloned().unwrap_or_default())
                .collect();
            let found = p.split(',').find_map(|name| held.iter().find(|part| part["name"] == name));
            let Some(part) = found else {
                bail!(
                    "no cluster has a Slurm partition {p:?} (sbatch: invalid partition specified): remove the \
                     line, or name the flavor with --flavor"
                );
            };
            Some(cell(&part["flavor"]))
        }
        None => None,
    };
    let flavors = c.list("/api/v1/flavors").await?;
    let name = |f: &Value| cell(&f["metadata"]["name"]);
    if let Some(ty) = &r.gpu_type {
        return flavors
            .iter()
            .find(|f| name(f) == *ty)
            .or_else(|| flavors.iter().find(|f| f["spec"]["slurm"]["gres_type"] == ty.as_str()))
            .map(name)
            .ok_or_else(|| {
                anyhow!("no flavor is named {ty:?} or has the Slurm GRES type {ty:?}: see `berth get flavors`")
            });
    }
    if let Some(flavor) = partition {
        return Ok(flavor);
    }
    match flavors.as_slice() {
        [only] => Ok(name(only)),
        _ => bail!(
            "say which GPUs: --flavor NAME (in a batch script, #SBATCH --gres=gpu:TYPE:N too) (flavors: {})",
            flavors.iter().map(name).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Cancels a workload, or (as scancel takes an array's job id) every workload of the array
/// of that name that has not ended.
pub async fn cancel(env: &Env<'_>, name: &str, team: Option<String>) -> Result<i32> {
    let team = env.team(team).await?;
    let c = env.client;
    let w = match c.post(&format!("/api/v1/teams/{}/workloads/{}/cancel", seg(&team), seg(name)), None).await {
        Err(e) if e.status() == Some(404) => {
            return cancel_array(env, &team, name, &array_of(env, &team, name, e).await?).await;
        }
        // A workload of an array's name (anyone may give one that name) is not the array.
        Err(e) if e.status() == Some(403) => {
            let array = array_of(env, &team, name, e).await?;
            eprintln!("note: the workload {team}/{name} is not yours to cancel: this cancels the array {name}");
            return cancel_array(env, &team, name, &array).await;
        }
        w => w?,
    };
    if !structured(env.out, &w) {
        let phase = cell(&w["status"]["phase"]);
        if phase == "Cancelled" {
            println!("workload {team}/{name} cancelled");
        } else {
            println!("workload {team}/{name} is being cancelled: its job gets the grace period to stop");
        }
    }
    Ok(0)
}

/// The workloads of the array named `name`, when `missing` (the 404 for a workload of
/// that name) is because `name` is an array's; else `missing`.
async fn array_of(env: &Env<'_>, team: &str, name: &str, missing: ApiError) -> Result<Vec<Value>> {
    // (Only a name as arrays have: anything else would change the selector.)
    if submit::dns_label(name).as_deref() != Some(name) {
        return Err(missing.into());
    }
    let selector = seg(&format!("{ARRAY_LABEL}={name}"));
    let array = env.client.list(&format!("/api/v1/teams/{}/workloads?label_selector={selector}", seg(team))).await?;
    if array.is_empty() {
        return Err(missing.into());
    }
    Ok(array)
}

/// Whether the team has workloads of an array named `name`.
async fn has_array(env: &Env<'_>, team: &str, name: &str) -> Result<bool> {
    let path = format!(
        "/api/v1/teams/{}/workloads?label_selector={}&limit=1",
        seg(team),
        seg(&format!("{ARRAY_LABEL}={name}"))
    );
    Ok(env.client.get(&path).await?["items"].as_array().is_some_and(|items| !items.is_empty()))
}

/// Whether `name`, the name of a workload, is an array's too (anyone in the team may give
/// a workload an array's name).
async fn also_an_array(env: &Env<'_>, team: &str, name: &str) -> Result<bool> {
    Ok(submit::dns_label(name).as_deref() == Some(name) && has_array(env, team, name).await?)
}

/// Says which workload `w` is, of the name an array has too, and how to name the array's.
fn array_note(team: &str, name: &str, w: &Value) {
    eprintln!(
        "note: this is {}'s workload {team}/{name}; an array is named {name} too: its workloads are {name}-INDEX \
         (berth get workloads --team {team} -l {ARRAY_LABEL}={name})",
        cell(&w["metadata"]["owner"]["subject"])
    );
}

/// The names of an array's workloads, for a line: `sweep-0 … sweep-15`, or all of them
/// when there are two or one.
fn member_names(array: &[Value]) -> String {
    let mut names: Vec<String> = array.iter().map(|w| cell(&w["metadata"]["name"])).collect();
    names.sort_by_key(|n| by_index(n));
    match names.as_slice() {
        [first, _, .., last] => format!("{first} … {last}"),
        names => names.join(", "),
    }
}

/// An array's members in the order of their indices (`sweep-2` before `sweep-10`).
fn by_index(name: &str) -> (Option<u64>, String) {
    (name.rsplit_once('-').and_then(|(_, i)| i.parse().ok()), name.to_owned())
}

/// Cancels every member of an array that has not ended. A member the caller may not cancel
/// (anyone may label a workload of their own as an array's member) is passed over and
/// named, and the rest are cancelled all the same (scancel of an array cancels what it
/// may); the exit status is then that of a refusal.
async fn cancel_array(env: &Env<'_>, team: &str, name: &str, array: &[Value]) -> Result<i32> {
    const ENDED: [&str; 3] = ["Succeeded", "Failed", "Cancelled"];
    let (mut answers, mut refused, mut failed) = (Vec::new(), Vec::new(), None);
    let mut ended = 0;
    for w in array {
        if w["status"]["phase"].as_str().is_some_and(|p| ENDED.contains(&p)) {
            ended += 1;
            continue;
        }
        let member = cell(&w["metadata"]["name"]);
        let path = format!("/api/v1/teams/{}/workloads/{}/cancel", seg(team), seg(&member));
        match env.client.post(&path, None).await {
            Ok(w) => answers.push(w),
            // Ended or deleted meanwhile.
            Err(e) if matches!(e.status(), Some(404 | 409)) => ended += 1,
            Err(e) if e.status() == Some(403) => refused.push((member, e)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let structured = structured(env.out, &json!({"items": answers}));
    if !structured || failed.is_some() {
        let mut line = format!("array {team}/{name}: {} of its {} workloads cancelled", answers.len(), array.len());
        if ended > 0 {
            line.push_str(&format!(", {ended} had ended"));
        }
        if !refused.is_empty() {
            line.push_str(&format!(", {} not yours to cancel", refused.len()));
        }
        if failed.is_some() {
            line.push_str(", then it stopped (below): run it again for the rest");
        }
        if structured { eprintln!("{line}") } else { println!("{line}") }
    }
    array_done(team, "cancelled", !answers.is_empty(), &refused, failed)
}

/// The end of a bulk command over an array: the members refused named, and its exit.
/// Another's workload labelled as a member (anyone may label one so) beside the caller's
/// is named in a note, and the caller's array counts as done; none of it the caller's:
/// refused.
fn array_done(
    team: &str,
    done: &str,
    mine: bool,
    refused: &[(String, ApiError)],
    failed: Option<ApiError>,
) -> Result<i32> {
    for (member, e) in refused {
        eprintln!("{}: {team}/{member} was not {done}: {e}", if mine { "note" } else { "error" });
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    Ok(if refused.is_empty() || mine { 0 } else { exit::REFUSED })
}

pub async fn delete(env: &Env<'_>, name: &str, team: Option<String>) -> Result<i32> {
    let team = env.team(team).await?;
    let w = match env.client.delete(&format!("/api/v1/teams/{}/workloads/{}", seg(&team), seg(name)), None).await {
        Err(e) if e.status() == Some(404) => {
            return delete_array(env, &team, name, &array_of(env, &team, name, e).await?).await;
        }
        // A workload of an array's name (anyone may give one that name) is not the array.
        Err(e) if e.status() == Some(403) => {
            let array = array_of(env, &team, name, e).await?;
            eprintln!("note: the workload {team}/{name} is not yours to delete: this deletes the array {name}");
            return delete_array(env, &team, name, &array).await;
        }
        w => w?,
    };
    if !structured(env.out, &w) {
        // Removed at once when it has no job (pending) or has ended.
        let gone = ["Pending", "Succeeded", "Failed", "Cancelled"];
        if w["status"]["phase"].as_str().is_none_or(|p| gone.contains(&p)) {
            println!("workload {team}/{name} deleted");
        } else {
            println!("workload {team}/{name} is being deleted: its job gets the grace period to stop");
        }
    }
    Ok(0)
}

/// Deletes every member of an array, as [`cancel_array`] cancels them: a member the caller
/// may not delete is passed over and named.
async fn delete_array(env: &Env<'_>, team: &str, name: &str, array: &[Value]) -> Result<i32> {
    let (mut answers, mut refused, mut failed) = (Vec::new(), Vec::new(), None);
    for w in array {
        let member = cell(&w["metadata"]["name"]);
        match env.client.delete(&format!("/api/v1/teams/{}/workloads/{}", seg(team), seg(&member)), None).await {
            Ok(w) => answers.push(w),
            // Deleted meanwhile.
            Err(e) if e.status() == Some(404) => {}
            Err(e) if e.status() == Some(403) => refused.push((member, e)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let structured = structured(env.out, &json!({"items": answers}));
    if !structured || failed.is_some() {
        let mut line = format!("array {team}/{name}: {} of its {} workloads deleted", answers.len(), array.len());
        if !refused.is_empty() {
            line.push_str(&format!(", {} not yours to delete", refused.len()));
        }
        if failed.is_some() {
            line.push_str(", then it stopped (below): run it again for the rest");
        }
        line.push_str(" (one with a job stops within its grace period)");
        if structured { eprintln!("{line}") } else { println!("{line}") }
    }
    array_done(team, "deleted", !answers.is_empty(), &refused, failed)
}

/// Acknowledges the workload's checkpoint. Inside its job the job's own token
/// (`BERTH_JOB_TOKEN`) and Berth's URL as the job was told it (`BERTH_API_URL`) are used,
/// where the command line and contexts name none.
pub async fn checkpointed(
    server: &str,
    token: Option<String>,
    name: &str,
    team: Option<String>,
    out: crate::output::Format,
) -> Result<i32> {
    let from_job = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
    let (server, token) = match from_job("BERTH_JOB_TOKEN") {
        Some(job) => (from_job("BERTH_API_URL").unwrap_or_else(|| server.to_owned()), Some(job)),
        None => (server.to_owned(), token),
    };
    let client = crate::client::Client::new(&server, token);
    let env = Env { client: &client, team: None, out };
    let team = env.team(team).await?;
    let path = format!("/api/v1/teams/{}/workloads/{}/checkpointed", seg(&team), seg(name));
    env.client.post(&path, None).await?;
    if !structured(out, &serde_json::json!({"team": team, "name": name, "checkpointed": true})) {
        println!("checkpoint of {team}/{name} acknowledged: its job is stopped now");
    }
    Ok(0)
}

pub async fn endpoint(env: &Env<'_>, name: &str, team: Option<String>) -> Result<i32> {
    let team = env.team(team).await?;
    let e = env.client.get(&format!("/api/v1/teams/{}/workloads/{}/endpoint", seg(&team), seg(name))).await?;
    if structured(env.out, &e) {
        return Ok(0);
    }
    let url = cell(&e["url"]);
    println!("URL:    {url}");
    if let Some(token) = e["token"].as_str() {
        println!("Token:  {token}");
        println!("Open:   {url}/?token={token}");
    }
    if let Some(at) = e["idle_stop_at"].as_str() {
        println!(
            "Stops:  {at} unless it reports activity (last: {})",
            e["last_activity_at"].as_str().unwrap_or("none")
        );
    }
    Ok(0)
}

pub struct LogOptions {
    pub follow: bool,
    pub tail: Option<u32>,
    pub task: Option<u32>,
    pub attempt: Option<u32>,
}

pub async fn logs(env: &Env<'_>, name: &str, team: Option<String>, o: LogOptions) -> Result<i32> {
    use std::io::Write as _;
    let team = env.team(team).await?;
    let mut query = vec![format!("follow={}", o.follow)];
    for (k, v) in [("tail", o.tail), ("task", o.task), ("attempt", o.attempt)] {
        if let Some(v) = v {
            query.push(format!("{k}={v}"));
        }
    }
    let path = format!("/api/v1/teams/{}/workloads/{}/logs?{}", seg(&team), seg(name), query.join("&"));
    let mut waiting = None;
    let mut response = loop {
        let response = env
            .client
            .request(reqwest::Method::GET, &path)
            .send()
            .await
            .map_err(|e| crate::client::ApiError::Unreachable(e.to_string()))?;
        // Followed before its job started (submit, then logs -f, and it queues): it waits,
        // as `tail -F` waits for the file.
        if o.follow && response.status() == reqwest::StatusCode::CONFLICT {
            let w = env.client.get(&format!("/api/v1/teams/{}/workloads/{}", seg(&team), seg(name))).await?;
            let phase = w["status"]["phase"].as_str().unwrap_or_default().to_owned();
            if ["Pending", "Admitted", "Dispatched"].contains(&phase.as_str()) {
                if waiting.as_ref() != Some(&phase) {
                    let why = w["status"]["pending_reason"]["message"].as_str().map(|m| format!(": {m}"));
                    eprintln!("{team}/{name} is {phase}{}; its logs follow once it starts", why.unwrap_or_default());
                    waiting = Some(phase);
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
                continue;
            }
        }
        break response;
    };
    if !response.status().is_success() {
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let e = crate::client::problem(status, &text);
        if status == reqwest::StatusCode::NOT_FOUND {
            // As Slurm writes a file per array task: name the one to read.
            let array = array_of(env, &team, name, e).await?;
            eprintln!(
                "error: {team}/{name} is an array of {} workloads ({}), each with logs of its own: name one",
                array.len(),
                member_names(&array)
            );
            return Ok(exit::USAGE);
        }
        return Err(e.into());
    }
    if also_an_array(env, &team, name).await? {
        let w = env.client.get(&format!("/api/v1/teams/{}/workloads/{}", seg(&team), seg(name))).await?;
        array_note(&team, name, &w);
    }
    let mut stdout = std::io::stdout();
    while let Some(chunk) = response.chunk().await.map_err(|e| crate::client::ApiError::Unreachable(e.to_string()))? {
        stdout.write_all(&chunk)?;
        stdout.flush()?;
    }
    Ok(0)
}

/// Words on what would let a waiting workload run, by its reason's code.
fn unblock(code: &str) -> &'static str {
    match code {
        "BudgetExhausted" => {
            "a budget of its team (or a team above it) is used up: wait for it to reset, or raise the budget"
        }
        "QuotaLimitReached" => {
            "its team (or a team above it) is at its limit: wait for the team's running work, or raise the limit"
        }
        "GuaranteeExceeded" => {
            "non-preemptible work runs within the guarantee only: make it preemptible, or raise the guarantee"
        }
        "FairShareReached" => {
            "its team has its fair share: it runs as others' work ends, sooner with a higher priority"
        }
        "BorrowingPaused" => {
            "a workload of this team or a parent team waits for the guarantee this would use: it runs once that one starts"
        }
        "WaitingForPreemptor" | "WaitingForReclaim" => {
            "capacity is being freed for it: it starts when the preempted work stops"
        }
        "WaitingForMinRuntime" => {
            "the work it would preempt is protected by its min runtime: it is preempted once that has passed"
        }
        // Not "ask for fewer": with its team at a limit, fewer would wait as long.
        "NotEnoughGpus" | "NoClusterFits" => {
            "no cluster has that many GPUs free in one place now: it starts as running work ends"
        }
        "Fragmented" => "the free GPUs are spread over nodes: wait, or ask for smaller tasks",
        "InsufficientCpu" | "InsufficientMemory" => "the nodes lack the CPU or memory it asks for: ask for less",
        "PlacementMatchesNoCluster" => "its placement (cluster selector, backend kinds) matches no cluster: change it",
        "ClustersCordoned" => "the clusters it may use are cordoned: wait for an administrator to uncordon them",
        "TopologyUnsatisfiable" => "no topology block holds all its tasks: relax spec.topology",
        "Unschedulable" => "it can never run as submitted: change its shape",
        _ => "it runs when the scheduler finds room",
    }
}

pub async fn why(env: &Env<'_>, name: &str, team: Option<String>) -> Result<i32> {
    let team = env.team(team).await?;
    let w = match env.client.get(&format!("/api/v1/teams/{}/workloads/{}", seg(&team), seg(name))).await {
        Err(e) if e.status() == Some(404) => return why_array(env, &team, name, &array_of(env, &team, name, e).await?),
        w => w?,
    };
    if also_an_array(env, &team, name).await? {
        array_note(&team, name, &w);
    }
    let s = &w["status"];
    let code = cell(&s["pending_reason"]["code"]);
    let answer = json!({
        "phase": s["phase"], "reason": s["pending_reason"], "queue_position": s["queue_position"],
        "estimated_start": s["estimated_start"], "unblock": (!code.is_empty()).then(|| unblock(&code)),
    });
    if structured(env.out, &answer) {
        return Ok(0);
    }
    if s["phase"] != "Pending" {
        println!("{team}/{name} is {}: it is not waiting. {}", cell(&s["phase"]), cell(&s["message"]));
        return Ok(0);
    }
    match s["pending_reason"]["message"].as_str() {
        Some(m) => println!("{team}/{name} waits: {m}"),
        None => println!("{team}/{name} waits: the scheduler has not looked at it yet"),
    }
    // The sentence names only the nearest few clusters: here, every one.
    let misses = cluster_misses(&s["pending_reason"]);
    if misses.len() > 3 {
        println!("Clusters:\n{}", misses.join("\n"));
    }
    if let Some(g) = s["queue_position"]["global"].as_u64() {
        println!("Position: {g} in the queue, {} in team {team}", cell(&s["queue_position"]["team"]));
    }
    println!("Expected start: {}", estimate(&w));
    if !code.is_empty() {
        println!("What would let it run: {}", unblock(&code));
    }
    Ok(0)
}

/// Each cluster a `NoClusterFits` reason tried, a line each: `  cluster/flavor: Code (free,
/// needed)`.
fn cluster_misses(reason: &Value) -> Vec<String> {
    (reason["details"]["attempts"].as_array().into_iter().flatten())
        .flat_map(|a| {
            a["clusters"].as_array().into_iter().flatten().map(move |c| {
                let m = &c["miss"];
                let (free, needed, unit) = match m["free_mib"].as_f64() {
                    Some(free) => (Some(free), m["needed_mib"].as_f64(), " MiB"),
                    None => (m["free"].as_f64(), m["needed"].as_f64(), ""),
                };
                let amounts = match (free, needed) {
                    (Some(free), Some(needed)) => format!(" ({free}{unit} free, {needed}{unit} needed)"),
                    _ => String::new(),
                };
                format!("  {}/{}: {}{amounts}", cell(&c["cluster"]), cell(&a["flavor"]), cell(&m["code"]))
            })
        })
        .collect()
}

/// Why each waiting member of an array waits (as `squeue -r` gives each task's reason),
/// after how many are in each other phase.
fn why_array(env: &Env<'_>, team: &str, name: &str, array: &[Value]) -> Result<i32> {
    let mut array = array.to_vec();
    array.sort_by_key(|w| by_index(&cell(&w["metadata"]["name"])));
    let items: Vec<Value> = array
        .iter()
        .map(|w| {
            let s = &w["status"];
            json!({"name": w["metadata"]["name"], "phase": s["phase"], "reason": s["pending_reason"],
                "queue_position": s["queue_position"], "estimated_start": s["estimated_start"]})
        })
        .collect();
    if structured(env.out, &json!({"items": items})) {
        return Ok(0);
    }
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    for w in &array {
        *phases.entry(cell(&w["status"]["phase"])).or_default() += 1;
    }
    let counts: Vec<String> = phases.iter().map(|(p, n)| format!("{n} {p}")).collect();
    println!("array {team}/{name}: {} workloads: {}", array.len(), counts.join(", "));
    let mut codes = Vec::new();
    for w in array.iter().filter(|w| w["status"]["phase"] == "Pending") {
        let s = &w["status"];
        let why = s["pending_reason"]["message"].as_str().unwrap_or("the scheduler has not looked at it yet");
        println!("  {} waits: {why}", cell(&w["metadata"]["name"]));
        let code = cell(&s["pending_reason"]["code"]);
        if !code.is_empty() && !codes.contains(&code) {
            codes.push(code);
        }
    }
    for code in codes {
        println!("What would let those waiting with {code} run: {}", unblock(&code));
    }
    Ok(0)
}

pub async fn queue(env: &Env<'_>, team: Option<String>, limit: u32) -> Result<i32> {
    let mut path = format!("/api/v1/queue?limit={limit}");
    if let Some(t) = &team {
        path.push_str(&format!("&team={}", seg(t)));
    }
    let q = env.client.get(&path).await?;
    if structured(env.out, &q) {
        return Ok(0);
    }
    println!("{} waiting for {}", cell(&q["total"]), gpus_said(q["gpus"].as_f64().unwrap_or(0.0)));
    let rows: Vec<Vec<String>> = q["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|w| {
            let s = &w["status"];
            vec![
                cell(&s["queue_position"]["global"]),
                format!("{}/{}", cell(&w["metadata"]["team"]), cell(&w["metadata"]["name"])),
                cell(&w["metadata"]["owner"]["subject"]),
                gpus(gpus_of(w)),
                age(&s["estimated_start"]["at"]),
                cell(&s["pending_reason"]["message"]),
            ]
        })
        .collect();
    table(&["POS", "WORKLOAD", "OWNER", "GPUS", "START", "WHY"], &rows);
    Ok(0)
}

pub async fn top(env: &Env<'_>) -> Result<i32> {
    let teams = env.client.list("/api/v1/teams").await?;
    let mut rows = Vec::new();
    let mut out = Vec::new();
    for t in &teams {
        for u in t["status"]["usage"].as_array().into_iter().flatten() {
            let quota = t["spec"]["quotas"].as_array().into_iter().flatten().find(|q| q["flavor"] == u["flavor"]);
            let guaranteed = quota.map_or(Value::Null, |q| q["guaranteed"].clone());
            out.push(json!({"team": t["metadata"]["name"], "flavor": u["flavor"], "allocated": u["allocated"],
                "borrowed": u["borrowed"], "fair_share": u["fair_share"], "guaranteed": guaranteed,
                "subtree_allocated": u["subtree_allocated"], "subtree_borrowed": u["subtree_borrowed"],
                "subtree_fair_share": u["subtree_fair_share"]}));
            // A department's guarantee, what it borrows and its fair share are its subtree's:
            // its own (it runs little or nothing itself) read 0 while it held 32 against 24.
            rows.push(vec![
                cell(&t["metadata"]["name"]),
                cell(&u["flavor"]),
                cell(&u["allocated"]),
                cell(&u["subtree_allocated"]),
                cell(&guaranteed),
                cell(&u["subtree_borrowed"]),
                output::gpus(u["subtree_fair_share"].as_f64().unwrap_or(0.0)),
            ]);
        }
    }
    if !structured(env.out, &json!({"items": out})) {
        table(&["TEAM", "FLAVOR", "GPUS", "WITH SUBTEAMS", "GUARANTEED", "BORROWED", "FAIR SHARE"], &rows);
        if teams.iter().any(|t| t["spec"]["parent"].is_string()) {
            println!(
                "\nGUARANTEED, BORROWED and FAIR SHARE are a team's with the teams below it (GPUS: its own work's)"
            );
        }
    }
    Ok(0)
}

/// What `berth usage` asks for.
pub struct UsageOptions {
    pub from: Option<String>,
    pub to: Option<String>,
    pub by: String,
    pub bucket: Option<String>,
    pub csv: bool,
}

pub async fn usage(env: &Env<'_>, o: UsageOptions) -> Result<i32> {
    let mut query = vec![format!("group_by={}", seg(&o.by))];
    for (name, value) in [("from", &o.from), ("to", &o.to)] {
        if let Some(v) = value {
            query.push(format!("{name}={}", seg(&when(name, v)?)));
        }
    }
    if let Some(b) = &o.bucket {
        query.push(format!("bucket={b}"));
    }
    if o.csv {
        query.push("format=csv".into());
    }
    let r = env.client.get(&format!("/api/v1/usage/report?{}", query.join("&"))).await?;
    if o.csv {
        print!("{}", r.as_str().unwrap_or_default());
        return Ok(0);
    }
    if structured(env.out, &r) {
        return Ok(0);
    }
    let by: Vec<&str> = r["group_by"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let bucketed = r["bucket"].is_string();
    let mut headers: Vec<String> = Vec::new();
    if bucketed {
        headers.push("BUCKET".into());
    }
    headers.extend(by.iter().map(|b| b.to_uppercase()));
    headers.extend(["GPU-HOURS", "BORROWED", "COST"].map(str::to_owned));
    let hours = |v: &Value| format!("{:.1}", v.as_f64().unwrap_or(0.0));
    // Of amounts: their cost, `-` when none of it has a price, marked `*` when some has none.
    let money = |a: &Value| {
        let (cost, unpriced) = (a["cost"].as_f64().unwrap_or(0.0), a["unpriced_gpu_hours"].as_f64().unwrap_or(0.0));
        match (cost, unpriced) {
            (_, 0.0) => format!("{cost:.2}"),
            (0.0, _) => "-".to_owned(),
            _ => format!("{cost:.2}*"),
        }
    };
    let rows: Vec<Vec<String>> = r["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|row| {
            let mut cells = Vec::new();
            if bucketed {
                cells.push(row["bucket"].as_str().unwrap_or_default().chars().take(16).collect());
            }
            cells.extend(by.iter().map(|b| cell(&row[*b])));
            cells.extend([hours(&row["gpu_hours"]), hours(&row["borrowed_gpu_hours"]), money(row)]);
            cells
        })
        .collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    table(&headers, &rows);
    // Wide: each team's own and department (subtree) figures, as a manager explains them.
    if env.out == Format::Wide {
        let teams: Vec<Vec<String>> = r["teams"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                let s = &t["subtree"];
                let idle = t.get("idle_guarantee_gpu_hours").map_or_else(|| "-".to_owned(), hours);
                let parent = t["parent"].as_str().unwrap_or("-").to_owned();
                let (own, subtree) = (hours(&t["own"]["gpu_hours"]), hours(&s["gpu_hours"]));
                let (in_quota, borrowed) = (hours(&s["in_quota_gpu_hours"]), hours(&s["borrowed_gpu_hours"]));
                vec![cell(&t["team"]), parent, own, subtree, in_quota, borrowed, idle, money(s)]
            })
            .collect();
        println!();
        let headers = ["TEAM", "PARENT", "OWN", "WITH SUBTEAMS", "IN QUOTA", "BORROWED", "IDLE GUARANTEE", "COST"];
        table(&headers, &teams);
    }
    let t = &r["totals"];
    let unpriced = t["unpriced_gpu_hours"].as_f64().unwrap_or(0.0);
    println!(
        "\n{} to {}: {} GPU-hours ({} borrowed), cost {:.2}{}",
        cell(&r["from"]),
        cell(&r["to"]),
        hours(&t["gpu_hours"]),
        hours(&t["borrowed_gpu_hours"]),
        t["cost"].as_f64().unwrap_or(0.0),
        if unpriced > 0.0 {
            format!(" (* without {} GPU-hours of flavors that have no price)", hours(&t["unpriced_gpu_hours"]))
        } else {
            String::new()
        }
    );
    Ok(0)
}

/// A `--from`/`--to` value as the API takes it: a date is its midnight UTC.
fn when(option: &str, v: &str) -> Result<String> {
    if chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d").is_ok() {
        return Ok(format!("{v}T00:00:00Z"));
    }
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|_| v.to_owned())
        .map_err(|_| anyhow!("--{option}: {v:?} is neither a date (2026-11-01) nor an RFC 3339 time"))
}

pub async fn preview(env: &Env<'_>, name: &str, file: &Path) -> Result<i32> {
    let docs = apply::read(&[file.to_owned()])?;
    let doc = docs
        .iter()
        .find(|d| d.kind == apply::Kind::Team && d.name == name)
        .ok_or_else(|| anyhow!("{} has no Team named {name}", file.display()))?;
    let body = json!({"metadata": {"labels": doc.labels}, "spec": doc.spec});
    let p = env.client.post(&format!("/api/v1/teams/{}/preview", seg(name)), Some(&body)).await?;
    if !structured(env.out, &p) {
        let lines = p["summary"].as_array().map(Vec::as_slice).unwrap_or_default();
        if lines.is_empty() {
            println!("nothing would change now");
        }
        for line in lines {
            println!("{}", cell(line));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_estimate_says_why_it_is_missing() {
        let at = |secs: i64| (chrono::Utc::now() - chrono::TimeDelta::seconds(secs)).to_rfc3339();
        let pending = |age: i64, code: Value| {
            json!({"metadata": {"creation_timestamp": at(age)},
                   "status": {"phase": "Pending", "pending_reason": code.as_str().map(|c| json!({"code": c}))}})
        };
        // Just submitted: it said "it waits for work without a runtime limit", which was not
        // known, nor true of an empty cluster.
        assert!(estimate(&pending(2, json!("NoClusterFits"))).starts_with("not known yet"));
        assert!(estimate(&pending(600, Value::Null)).starts_with("not known yet"), "not looked at yet");
        assert!(estimate(&pending(600, json!("NoClusterFits"))).starts_with("not known: what it waits for"));
        assert!(estimate(&pending(600, json!("Unschedulable"))).starts_with("never"));
        let running = json!({"metadata": {"creation_timestamp": at(600)}, "status": {"phase": "Running"}});
        assert_eq!(estimate(&running), "");
    }

    #[test]
    fn berths_own_options_take_what_sbatch_users_type_or_say_what_to_type() {
        assert_eq!((node_count("2-4"), node_count("3")), (Ok(2), Ok(3)));
        let e = gpus_per_task("h100:2").unwrap_err();
        assert!(e.ends_with("for sbatch's --gpus=h100:2 (GPUs in all) give -G h100:2"), "{e}");
        // Said once: "error: error: …" before, and clap's usage after.
        let e = <Directives as clap::Parser>::try_parse_from(["--priority", "high"]).unwrap_err();
        assert_eq!(clap_message(&e), "invalid value 'high' for '--priority <PRIORITY>': invalid digit found in string");
    }

    /// `berth why` lists every cluster a `NoClusterFits` reason tried (its sentence names
    /// only the nearest few), with the amounts where there are some.
    #[test]
    fn each_cluster_tried_is_a_line_of_why() {
        let reason = json!({"code": "NoClusterFits", "details": {"attempts": [
            {"flavor": "h100", "clusters": [
                {"cluster": "east", "miss": {"code": "NotEnoughGpus", "free": 2.0, "needed": 8.0}},
                {"cluster": "west", "miss": {"code": "Cordoned"}}]},
            {"flavor": "a100", "clusters": [
                {"cluster": "east", "miss": {"code": "InsufficientMemory", "free_mib": 512, "needed_mib": 1024}}]}]}});
        assert_eq!(
            cluster_misses(&reason),
            [
                "  east/h100: NotEnoughGpus (2 free, 8 needed)",
                "  west/h100: Cordoned",
                "  east/a100: InsufficientMemory (512 MiB free, 1024 MiB needed)"
            ]
        );
    }
}
