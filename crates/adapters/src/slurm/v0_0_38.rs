//! slurmrestd API v0.0.38 (Slurm 22.05, what Debian bookworm ships): the submit body and
//! the fields Berth reads from its answers, in the version-neutral types of
//! [`super::wire`]. What this version answers is written down in
//! `docs/slurmrestd-v0.0.38.md`.

use serde::Deserialize;
use serde_json::{Value, json};

use super::wire::{self, Dialect, INFINITE, Job, Node, Partition, Submission, TimeLimit};

/// The API of Slurm 22.05.
pub struct V0038;

impl Dialect for V0038 {
    fn version(&self) -> &'static str {
        "v0.0.38"
    }

    fn submit_body(&self, s: &Submission) -> Value {
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
            ("gpus_per_task", s.gpus_per_task.as_ref().map(|g| Value::from(g.typed_count()))),
            // v0.0.38 asks for other GRES per node only.
            ("gres", s.shards_per_node.map(|n| Value::from(format!("shard:{n}")))),
            ("cpus_per_task", s.cpus_per_task.map(Value::from)),
            ("memory_per_node", s.memory_mib_per_node.map(Value::from)),
            (
                "time_limit",
                Some(match s.time_limit {
                    TimeLimit::Minutes(m) => Value::from(m),
                    TimeLimit::Unlimited => Value::from(INFINITE),
                }),
            ),
        ];
        for (key, value) in fields {
            if let Some(v) = value {
                job[key] = v;
            }
        }
        json!({"script": s.script, "job": job})
    }

    fn parse_jobs(&self, body: &[u8]) -> Result<Vec<Job>, serde_json::Error> {
        parse_jobs(body)
    }

    fn parse_nodes(&self, body: &[u8]) -> Result<Vec<Node>, serde_json::Error> {
        parse_nodes(body)
    }

    fn parse_partitions(&self, body: &[u8]) -> Result<Vec<Partition>, serde_json::Error> {
        parse_partitions(body)
    }
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
    #[serde(default)]
    standard_output: String,
    #[serde(default)]
    current_working_directory: String,
    #[serde(default)]
    user_name: String,
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

fn parse_jobs(body: &[u8]) -> Result<Vec<Job>, serde_json::Error> {
    let answer: JobsAnswer = serde_json::from_slice(body)?;
    Ok(answer
        .jobs
        .into_iter()
        .map(|j| {
            let nodes = j.job_resources.map(|r| r.allocated_nodes).unwrap_or_default();
            let output =
                wire::output_path(&j.standard_output, &j.current_working_directory, j.job_id, &j.name, &j.user_name);
            Job {
                id: j.job_id,
                name: j.name,
                state: j.job_state,
                reason: j.state_reason.filter(|r| r != "None" && !r.is_empty()),
                // The raw wait status of the batch script (`exit 3` is 768).
                exit_code: j.exit_code.map(wire::exit_code),
                comment: j.comment.unwrap_or_default(),
                submit_time: j.submit_time,
                start_time: j.start_time,
                end_time: j.end_time,
                was_running: j.flags.iter().any(|f| f == "JOB_WAS_RUNNING"),
                gres_by_node: nodes.into_iter().map(|n| n.nodename).zip(j.gres_detail).collect(),
                output,
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

fn parse_nodes(body: &[u8]) -> Result<Vec<Node>, serde_json::Error> {
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
    #[serde(default)]
    max_time_limit: Option<u64>,
}

fn parse_partitions(body: &[u8]) -> Result<Vec<Partition>, serde_json::Error> {
    let answer: PartitionsAnswer = serde_json::from_slice(body)?;
    Ok(answer
        .partitions
        .into_iter()
        .map(|p| Partition {
            up: p.state.eq_ignore_ascii_case("UP"),
            max_time_minutes: p.max_time_limit.filter(|&m| m < INFINITE - 1),
            name: p.name,
        })
        .collect())
}
