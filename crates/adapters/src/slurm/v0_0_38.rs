//! slurmrestd API v0.0.38 (Slurm 22.05, what Debian bookworm ships): its paths, the submit
//! body, and the fields Berth reads from its answers. Everything that differs between
//! slurmrestd versions lives here; the adapter speaks in the version-neutral types of
//! [`super::wire`]. What this version answers is written down in
//! `docs/slurmrestd-v0.0.38.md`.

use serde::Deserialize;
use serde_json::{Value, json};

use super::wire::{ApiError, Job, Node, Partition, Submission};

pub const VERSION: &str = "v0.0.38";

pub fn ping() -> String {
    format!("/slurm/{VERSION}/ping")
}

pub fn jobs() -> String {
    format!("/slurm/{VERSION}/jobs")
}

pub fn job(id: u64) -> String {
    format!("/slurm/{VERSION}/job/{id}")
}

pub fn submit() -> String {
    format!("/slurm/{VERSION}/job/submit")
}

pub fn nodes() -> String {
    format!("/slurm/{VERSION}/nodes")
}

pub fn partitions() -> String {
    format!("/slurm/{VERSION}/partitions")
}

/// `DELETE` on this path signals the job (`signal` only delivers it), or cancels it when
/// `signal` is `None`.
pub fn cancel(id: u64, signal: Option<&str>) -> String {
    match signal {
        Some(s) => format!("/slurm/{VERSION}/job/{id}?signal={s}"),
        None => job(id),
    }
}

/// The body of `POST /job/submit`.
pub fn submit_body(s: &Submission) -> Value {
    let mut job = json!({
        "name": s.name,
        "comment": s.comment,
        "partition": s.partition,
        "nodes": s.nodes,
        "tasks": s.tasks,
        "environment": s.environment,
        "current_working_directory": s.working_directory,
    });
    let fields = [
        ("gpus_per_task", s.gpus_per_task.clone().map(Value::from)),
        ("cpus_per_task", s.cpus_per_task.map(Value::from)),
        ("memory_per_node", s.memory_mib_per_node.map(Value::from)),
        ("time_limit", s.time_limit_minutes.map(Value::from)),
    ];
    for (key, value) in fields {
        if let Some(v) = value {
            job[key] = v;
        }
    }
    json!({"script": s.script, "job": job})
}

/// The body of `POST /job/{id}` that replaces the job's comment.
pub fn update_comment_body(comment: &str) -> Value {
    json!({"comment": comment})
}

/// The `errors[]` of any answer (empty when the body is not JSON or has none). Three
/// shapes occur: `{error_code, error}`, `{error_number, error, description, source}` and
/// `{errno, error}`.
pub fn errors(body: &[u8]) -> Vec<ApiError> {
    #[derive(Deserialize)]
    struct Errors {
        #[serde(default)]
        errors: Vec<Value>,
    }
    let Ok(parsed) = serde_json::from_slice::<Errors>(body) else { return Vec::new() };
    parsed
        .errors
        .iter()
        .map(|e| {
            let code = ["error_code", "error_number", "errno"].iter().find_map(|k| e[k].as_i64());
            let text = |k: &str| e[k].as_str().filter(|s| !s.is_empty()).map(str::to_owned);
            let message = match (text("description"), text("error")) {
                (Some(d), Some(e)) if d != e => format!("{d}: {e}"),
                (Some(m), _) | (None, Some(m)) => m,
                (None, None) => "no description".into(),
            };
            ApiError { code, message }
        })
        .collect()
}

/// The job id of a submit answer (absent when it was refused).
pub fn submitted_job_id(body: &[u8]) -> Option<u64> {
    serde_json::from_slice::<Value>(body).ok()?["job_id"].as_u64()
}

#[derive(Deserialize)]
struct JobsAnswer {
    #[serde(default)]
    jobs: Vec<JobV38>,
}

#[derive(Deserialize)]
struct JobV38 {
    job_id: u64,
    #[serde(default)]
    name: String,
    #[serde(default)]
    job_state: String,
    #[serde(default)]
    state_reason: Option<String>,
    #[serde(default)]
    exit_code: Option<i64>,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    submit_time: i64,
    #[serde(default)]
    start_time: i64,
    #[serde(default)]
    end_time: i64,
    #[serde(default)]
    flags: Vec<String>,
    /// One entry per allocated node, in the order of `job_resources.allocated_nodes`.
    #[serde(default)]
    gres_detail: Vec<String>,
    #[serde(default)]
    job_resources: Option<JobResources>,
}

#[derive(Deserialize)]
struct JobResources {
    #[serde(default)]
    allocated_nodes: Vec<AllocatedNode>,
}

#[derive(Deserialize)]
struct AllocatedNode {
    nodename: String,
}

/// The jobs of `GET /jobs` or `GET /job/{id}`.
///
/// # Errors
/// The body is not the expected JSON.
pub fn parse_jobs(body: &[u8]) -> Result<Vec<Job>, serde_json::Error> {
    let answer: JobsAnswer = serde_json::from_slice(body)?;
    Ok(answer
        .jobs
        .into_iter()
        .map(|j| {
            let nodes = j.job_resources.map(|r| r.allocated_nodes).unwrap_or_default();
            Job {
                id: j.job_id,
                name: j.name,
                state: j.job_state,
                reason: j.state_reason.filter(|r| r != "None" && !r.is_empty()),
                wait_status: j.exit_code,
                comment: j.comment.unwrap_or_default(),
                submit_time: j.submit_time,
                start_time: j.start_time,
                end_time: j.end_time,
                was_running: j.flags.iter().any(|f| f == "JOB_WAS_RUNNING"),
                gres_by_node: nodes.into_iter().map(|n| n.nodename).zip(j.gres_detail).collect(),
            }
        })
        .collect())
}

#[derive(Deserialize)]
struct NodesAnswer {
    #[serde(default)]
    nodes: Vec<NodeV38>,
}

#[derive(Deserialize)]
struct NodeV38 {
    name: String,
    #[serde(default)]
    state: String,
    #[serde(default)]
    state_flags: Vec<String>,
    #[serde(default)]
    gres: String,
    #[serde(default)]
    gres_used: String,
    #[serde(default)]
    cpus: u32,
    #[serde(default)]
    real_memory: u64,
    #[serde(default)]
    partitions: Vec<String>,
    #[serde(default)]
    features: String,
}

/// The nodes of `GET /nodes`.
///
/// # Errors
/// The body is not the expected JSON.
pub fn parse_nodes(body: &[u8]) -> Result<Vec<Node>, serde_json::Error> {
    let answer: NodesAnswer = serde_json::from_slice(body)?;
    Ok(answer
        .nodes
        .into_iter()
        .map(|n| Node {
            name: n.name,
            state: n.state.to_ascii_lowercase(),
            flags: n.state_flags.iter().map(|f| f.to_ascii_uppercase()).collect(),
            gres: n.gres,
            gres_used: n.gres_used,
            cpus: n.cpus,
            memory_mib: n.real_memory,
            partitions: n.partitions,
            features: n.features.split(',').filter(|f| !f.is_empty()).map(str::to_owned).collect(),
        })
        .collect())
}

#[derive(Deserialize)]
struct PartitionsAnswer {
    #[serde(default)]
    partitions: Vec<PartitionV38>,
}

#[derive(Deserialize)]
struct PartitionV38 {
    name: String,
    #[serde(default)]
    state: String,
}

/// The partitions of `GET /partitions`.
///
/// # Errors
/// The body is not the expected JSON.
pub fn parse_partitions(body: &[u8]) -> Result<Vec<Partition>, serde_json::Error> {
    let answer: PartitionsAnswer = serde_json::from_slice(body)?;
    Ok(answer
        .partitions
        .into_iter()
        .map(|p| Partition { up: p.state.eq_ignore_ascii_case("UP"), name: p.name })
        .collect())
}
