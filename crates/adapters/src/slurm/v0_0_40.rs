//! slurmrestd API v0.0.40 (Slurm 23.11 to 24.11): the data-parser format that every later
//! version keeps for what Berth reads. Compared with v0.0.38: the script goes inside the
//! job, the environment is a list of `KEY=value`, GPUs are asked for as TRES
//! (`gres/gpu:h100:2`), numbers that may be unset are `{set, infinite, number}`, states
//! and node states are lists (base state first, then flags), the exit code is a structure
//! with the return code and the signal, and a partition's state is under `partition`.
//!
//! The one thing [`super::v0_0_41`] changed is how a job's allocated nodes are listed, so
//! this module reads a job with the node list it is given.

use serde::Deserialize;
use serde_json::{Value, json};

use super::wire::{self, Dialect, Job, Node, Partition, Submission, TimeLimit};

/// The API of Slurm 23.11 and 24.05, deprecated in 24.11.
pub struct V0040;

impl Dialect for V0040 {
    fn version(&self) -> &'static str {
        "v0.0.40"
    }

    fn submit_body(&self, s: &Submission) -> Value {
        submit_body(s)
    }

    fn parse_jobs(&self, body: &[u8]) -> Result<Vec<Job>, serde_json::Error> {
        parse_jobs::<AllocatedNodes>(body)
    }

    fn parse_nodes(&self, body: &[u8]) -> Result<Vec<Node>, serde_json::Error> {
        parse_nodes(body)
    }

    fn parse_partitions(&self, body: &[u8]) -> Result<Vec<Partition>, serde_json::Error> {
        parse_partitions(body)
    }
}

/// A number slurmrestd may leave unset or infinite.
#[derive(Debug, Default, Deserialize)]
pub(super) struct Number {
    #[serde(default)]
    set: bool,
    #[serde(default)]
    infinite: bool,
    #[serde(default)]
    number: i64,
}

impl Number {
    fn get(&self) -> Option<i64> {
        (self.set && !self.infinite).then_some(self.number)
    }
}

fn number(n: impl Into<i64>) -> Value {
    json!({"set": true, "infinite": false, "number": n.into()})
}

pub(super) fn submit_body(s: &Submission) -> Value {
    let environment: Vec<String> = s.environment.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut job = json!({
        "script": s.script,
        "name": s.name,
        "comment": s.comment,
        "partition": s.partition,
        "nodes": s.nodes.to_string(),
        "tasks": s.tasks,
        "environment": environment,
        "current_working_directory": s.working_directory,
    });
    let fields = [
        (
            "tres_per_task",
            match (&s.gpus_per_task, s.shards_per_task) {
                (Some(g), _) => Some(Value::from(format!("gres/gpu:{}", g.typed_count()))),
                (None, Some(n)) => Some(Value::from(format!("gres/shard:{n}"))),
                (None, None) => None,
            },
        ),
        ("cpus_per_task", s.cpus_per_task.map(Value::from)),
        ("memory_per_node", s.memory_mib_per_node.map(|m| number(i64::try_from(m).unwrap_or(i64::MAX)))),
        (
            "time_limit",
            Some(match s.time_limit {
                TimeLimit::Minutes(m) => number(i64::try_from(m).unwrap_or(i64::MAX)),
                TimeLimit::Unlimited => json!({"set": true, "infinite": true, "number": 0}),
            }),
        ),
    ];
    for (key, value) in fields {
        if let Some(v) = value {
            job[key] = v;
        }
    }
    json!({"job": job})
}

/// How a version lists the nodes a job was allocated, in the order of `gres_detail`.
pub(super) trait JobNodes: for<'de> Deserialize<'de> + Default {
    fn names(self) -> Vec<String>;
}

/// v0.0.40: `job_resources.allocated_nodes[].nodename`.
#[derive(Default, Deserialize)]
struct AllocatedNodes {
    #[serde(default)]
    allocated_nodes: Vec<AllocatedNode>,
}

#[derive(Deserialize)]
struct AllocatedNode {
    nodename: String,
}

impl JobNodes for AllocatedNodes {
    fn names(self) -> Vec<String> {
        self.allocated_nodes.into_iter().map(|n| n.nodename).collect()
    }
}

#[derive(Deserialize)]
#[serde(bound = "")]
struct JobsAnswer<N: JobNodes> {
    #[serde(default)]
    jobs: Vec<JobV40<N>>,
}

#[derive(Deserialize)]
#[serde(bound = "")]
struct JobV40<N: JobNodes> {
    job_id: u64,
    #[serde(default)]
    name: String,
    #[serde(default)]
    job_state: Vec<String>,
    #[serde(default)]
    state_reason: Option<String>,
    #[serde(default)]
    exit_code: Option<ExitCode>,
    #[serde(default)]
    comment: Option<String>,
    #[serde(default)]
    submit_time: Number,
    #[serde(default)]
    start_time: Number,
    #[serde(default)]
    end_time: Number,
    #[serde(default)]
    flags: Vec<String>,
    /// One entry per allocated node, in the order of the job's node list.
    #[serde(default)]
    gres_detail: Vec<String>,
    #[serde(default)]
    job_resources: Option<N>,
    #[serde(default)]
    standard_output: String,
    #[serde(default)]
    current_working_directory: String,
    #[serde(default)]
    user_name: String,
}

#[derive(Default, Deserialize)]
struct ExitCode {
    #[serde(default)]
    return_code: Number,
    #[serde(default)]
    signal: Signal,
}

#[derive(Default, Deserialize)]
struct Signal {
    #[serde(default)]
    id: Number,
}

impl ExitCode {
    /// The script's own code, or 128 + the signal that killed it (as a shell reports it).
    fn code(&self) -> Option<i32> {
        let code = match (self.signal.id.get(), self.return_code.get()) {
            (Some(signal), _) if signal > 0 => 128 + signal,
            (_, Some(code)) => code,
            _ => return None,
        };
        i32::try_from(code).ok()
    }
}

/// The one state Slurm's own `job_state_string` would name (and v0.0.38 reported): a
/// flag that says the job is still changing (`COMPLETING`: its processes are being killed
/// and its GPUs are still held) wins over the base state, which comes first.
fn state(states: &[String]) -> String {
    const FLAGS_FIRST: [&str; 9] = [
        "COMPLETING",
        "CONFIGURING",
        "RESIZING",
        "RESV_DEL_HOLD",
        "REQUEUE_FED",
        "REQUEUE_HOLD",
        "REQUEUED",
        "SIGNALING",
        "STAGE_OUT",
    ];
    FLAGS_FIRST
        .iter()
        .find(|f| states.iter().any(|s| s == *f))
        .map(|f| (*f).to_owned())
        .or_else(|| states.first().cloned())
        .unwrap_or_default()
}

pub(super) fn parse_jobs<N: JobNodes>(body: &[u8]) -> Result<Vec<Job>, serde_json::Error> {
    let answer: JobsAnswer<N> = serde_json::from_slice(body)?;
    Ok(answer
        .jobs
        .into_iter()
        .map(|j| {
            let nodes = j.job_resources.map(JobNodes::names).unwrap_or_default();
            Job {
                id: j.job_id,
                state: state(&j.job_state),
                reason: j.state_reason.filter(|r| r != "None" && !r.is_empty()),
                exit_code: j.exit_code.as_ref().and_then(ExitCode::code),
                comment: j.comment.unwrap_or_default(),
                submit_time: j.submit_time.get().unwrap_or(0),
                start_time: j.start_time.get().unwrap_or(0),
                end_time: j.end_time.get().unwrap_or(0),
                was_running: j.flags.iter().any(|f| f == "JOB_WAS_RUNNING"),
                gres_by_node: nodes.into_iter().zip(j.gres_detail).collect(),
                output: wire::output_path(
                    &j.standard_output,
                    &j.current_working_directory,
                    j.job_id,
                    &j.name,
                    &j.user_name,
                ),
                name: j.name,
            }
        })
        .collect())
}

#[derive(Deserialize)]
struct NodesAnswer {
    #[serde(default)]
    nodes: Vec<NodeV40>,
}

#[derive(Deserialize)]
struct NodeV40 {
    name: String,
    #[serde(default)]
    state: Vec<String>,
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
    features: Vec<String>,
}

pub(super) fn parse_nodes(body: &[u8]) -> Result<Vec<Node>, serde_json::Error> {
    let answer: NodesAnswer = serde_json::from_slice(body)?;
    Ok(answer
        .nodes
        .into_iter()
        .map(|n| {
            let mut states = n.state.iter();
            Node {
                name: n.name,
                state: states.next().map(|s| s.to_ascii_lowercase()).unwrap_or_default(),
                flags: states.map(|f| f.to_ascii_uppercase()).collect(),
                gres: n.gres,
                gres_used: n.gres_used,
                cpus: n.cpus,
                memory_mib: n.real_memory,
                partitions: n.partitions,
                features: n.features,
            }
        })
        .collect())
}

#[derive(Deserialize)]
struct PartitionsAnswer {
    #[serde(default)]
    partitions: Vec<PartitionV40>,
}

#[derive(Deserialize)]
struct PartitionV40 {
    name: String,
    #[serde(default)]
    partition: PartitionState,
    #[serde(default)]
    maximums: PartitionMaximums,
}

#[derive(Default, Deserialize)]
struct PartitionMaximums {
    #[serde(default)]
    time: Number,
}

#[derive(Default, Deserialize)]
struct PartitionState {
    #[serde(default)]
    state: Vec<String>,
}

pub(super) fn parse_partitions(body: &[u8]) -> Result<Vec<Partition>, serde_json::Error> {
    let answer: PartitionsAnswer = serde_json::from_slice(body)?;
    Ok(answer
        .partitions
        .into_iter()
        .map(|p| Partition {
            up: p.partition.state.iter().any(|s| s.eq_ignore_ascii_case("UP")),
            max_time_minutes: p.maximums.time.get().and_then(|m| u64::try_from(m).ok()),
            name: p.name,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completing_job_is_still_completing_whatever_its_base_state() {
        let s = |v: &[&str]| state(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>());
        assert_eq!(s(&["CANCELLED", "COMPLETING"]), "COMPLETING");
        assert_eq!(s(&["RUNNING"]), "RUNNING");
        assert_eq!(s(&["PENDING", "REQUEUED"]), "REQUEUED");
        assert_eq!(s(&[]), "");
    }

    #[test]
    fn exit_codes_are_the_scripts_or_128_plus_the_signal() {
        let code = |v: serde_json::Value| serde_json::from_value::<ExitCode>(v).unwrap().code();
        let n = |set: bool, number: i64| json!({"set": set, "infinite": false, "number": number});
        assert_eq!(code(json!({"return_code": n(true, 3), "signal": {"id": n(false, 0)}})), Some(3));
        assert_eq!(code(json!({"return_code": n(false, 0), "signal": {"id": n(true, 15), "name": "TERM"}})), Some(143));
        assert_eq!(code(json!({"return_code": n(false, 0), "signal": {"id": n(false, 0)}})), None);
    }
}
