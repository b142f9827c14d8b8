//! What slurmrestd answers, in version-neutral types (each API version's module fills
//! them), and Slurm's own formats that do not change between API versions: GRES strings,
//! wait statuses, job and node states.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::backend::JobState;

/// One slurmrestd API (data-parser) version: its submit and update bodies and how its
/// answers read. Every version answers on `/slurm/{version}/…` with the same paths for
/// what Berth calls (ping, jobs, job/{id}, job/submit, nodes, partitions).
pub trait Dialect: Sync {
    /// `v0.0.45`.
    fn version(&self) -> &'static str;
    /// The body of `POST /job/submit`.
    fn submit_body(&self, s: &Submission) -> Value;
    /// The body of `POST /job/{id}` that replaces the job's comment.
    fn update_comment_body(&self, comment: &str) -> Value {
        serde_json::json!({"comment": comment})
    }
    /// The job id of a submit answer (absent when it was refused).
    fn submitted_job_id(&self, body: &[u8]) -> Option<u64> {
        serde_json::from_slice::<Value>(body).ok()?["job_id"].as_u64()
    }
    /// The jobs of `GET /jobs` or `GET /job/{id}`.
    ///
    /// # Errors
    /// The body is not the expected JSON.
    fn parse_jobs(&self, body: &[u8]) -> Result<Vec<Job>, serde_json::Error>;
    /// The nodes of `GET /nodes`.
    ///
    /// # Errors
    /// The body is not the expected JSON.
    fn parse_nodes(&self, body: &[u8]) -> Result<Vec<Node>, serde_json::Error>;
    /// The partitions of `GET /partitions`.
    ///
    /// # Errors
    /// The body is not the expected JSON.
    fn parse_partitions(&self, body: &[u8]) -> Result<Vec<Partition>, serde_json::Error>;
}

/// The `errors[]` of any answer of any version (empty when the body is not JSON or has
/// none). Three shapes occur: `{error_code, error}`, `{error_number, error, description,
/// source}` and `{errno, error}`.
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

/// The Slurm release an answer comes from (`meta.slurm.release`, `meta.Slurm.release` in
/// 22.05).
pub fn release(body: &[u8]) -> Option<String> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let meta = &v["meta"];
    meta["slurm"]["release"].as_str().or_else(|| meta["Slurm"]["release"].as_str()).map(str::to_owned)
}

/// Where a job's standard output goes: Slurm's file name pattern (`slurm-%j.out` when
/// none was given) with `%j`, `%x`, `%u` and `%%` replaced, relative to the job's
/// working directory. `None` when the pattern uses what Berth cannot expand (`%N`, `%t`…).
pub fn output_path(pattern: &str, directory: &str, id: u64, name: &str, user: &str) -> Option<String> {
    let pattern = if pattern.is_empty() { "slurm-%j.out" } else { pattern };
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'j' | 'A' => out.push_str(&id.to_string()),
            'x' => out.push_str(name),
            'u' => out.push_str(user),
            '%' => out.push('%'),
            _ => return None,
        }
    }
    Some(if out.starts_with('/') { out } else { format!("{}/{out}", directory.trim_end_matches('/')) })
}

/// One `errors[]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// Slurm's error number, when the entry has one.
    pub code: Option<i64>,
    pub message: String,
}

impl ApiError {
    /// Slurm's job, partition and request errors (`ESLURM_*`, 2000–2999) and slurmrestd's
    /// parse errors (9000–9999): the request is wrong, not the cluster.
    pub fn is_rejection(&self) -> bool {
        self.code.is_some_and(|c| (2000..3000).contains(&c) || (9000..10000).contains(&c))
    }
}

/// Joins errors into one line for a condition or a log.
pub fn describe(errors: &[ApiError]) -> String {
    if errors.is_empty() {
        return "no errors[] in the answer".into();
    }
    errors
        .iter()
        .map(|e| match e.code {
            Some(c) => format!("{} (error {c})", e.message),
            None => e.message.clone(),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A job as slurmrestd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: u64,
    pub name: String,
    /// The base state: `PENDING`, `RUNNING`, `COMPLETED`, …
    pub state: String,
    pub reason: Option<String>,
    /// The batch script's exit code, or 128 + the signal that ended it.
    pub exit_code: Option<i32>,
    pub comment: String,
    /// Epoch seconds; 0 when unset.
    pub submit_time: i64,
    pub start_time: i64,
    pub end_time: i64,
    /// The job ran at some point (a pending job's `start_time` is only an estimate).
    pub was_running: bool,
    /// GRES held on each allocated node, while the job runs.
    pub gres_by_node: Vec<(String, String)>,
    /// The file its standard output goes to, where Slurm says (see [`output_path`]).
    pub output: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    /// Lowercase base state: `idle`, `mixed`, `allocated`, `down`, …
    pub state: String,
    /// Uppercase flags: `DRAIN`, `NOT_RESPONDING`, …
    pub flags: Vec<String>,
    pub gres: String,
    pub gres_used: String,
    pub cpus: u32,
    pub memory_mib: u64,
    pub partitions: Vec<String>,
    pub features: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    pub name: String,
    pub up: bool,
    /// Its `MaxTime` in minutes; `None`: unlimited.
    pub max_time_minutes: Option<u64>,
}

/// A job's time limit as Slurm takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeLimit {
    Minutes(u64),
    Unlimited,
}

/// Slurm's `INFINITE` (a `uint32_t` of all ones), where a version takes a plain number.
pub const INFINITE: u64 = 0xffff_ffff;

/// A batch job to submit.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    pub script: String,
    pub name: String,
    pub comment: String,
    pub partition: String,
    pub nodes: u32,
    pub tasks: u32,
    pub gpus_per_task: Option<Gpus>,
    /// GRES shards per task, for a task of a fraction of a GPU (and per node, the most
    /// tasks on one node times that: versions that ask per node).
    pub shards_per_task: Option<u32>,
    pub shards_per_node: Option<u32>,
    pub cpus_per_task: Option<u32>,
    pub memory_mib_per_node: Option<u64>,
    /// Always given: left out, Slurm would give the partition's `DefaultTime`.
    pub time_limit: TimeLimit,
    pub environment: BTreeMap<String, String>,
    pub working_directory: String,
}

/// GPUs asked for per task: of one type, or of any.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpus {
    pub gpu_type: Option<String>,
    pub count: u32,
}

impl Gpus {
    /// `h100:2`, or `2` of any type.
    pub fn typed_count(&self) -> String {
        match &self.gpu_type {
            Some(t) => format!("{t}:{}", self.count),
            None => self.count.to_string(),
        }
    }
}

/// GPUs in a GRES string (`gpu:h100:8`, `gpu:4(S:0-1)`, `gpu:h100:5(IDX:0-4),shard:2`),
/// counting only `gpu_type` when it is given.
pub fn gpus_in(gres: &str, gpu_type: Option<&str>) -> u32 {
    count_in(gres, "gpu", gpu_type)
}

/// Shards in a GRES string (`gpu:h100:8,shard:32`, `shard:h100:2(0/8,2/8)`), of any type.
pub fn shards_in(gres: &str) -> u32 {
    count_in(gres, "shard", None)
}

/// GRES of one name (and type, when given) in a GRES string.
fn count_in(gres: &str, name: &str, gpu_type: Option<&str>) -> u32 {
    let mut depth = 0;
    let mut start = 0;
    let mut items = Vec::new();
    for (i, c) in gres.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&gres[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&gres[start..]);
    items
        .into_iter()
        .filter_map(|item| {
            let item = item.split('(').next().unwrap_or_default();
            let parts: Vec<&str> = item.split(':').collect();
            let (kind, typ, count) = match parts.as_slice() {
                [kind, count] => (*kind, None, *count),
                [kind, typ, count] => (*kind, Some(*typ), *count),
                _ => return None,
            };
            if kind != name || gpu_type.is_some_and(|t| typ != Some(t)) {
                return None;
            }
            count.parse::<u32>().ok()
        })
        .sum()
}

/// The exit code of a wait status: the script's own code, or 128 + the signal that killed
/// it (as a shell reports it).
pub fn exit_code(wait_status: i64) -> i32 {
    let signal = wait_status & 0x7f;
    let code = if signal == 0 { (wait_status >> 8) & 0xff } else { 128 + signal };
    i32::try_from(code).unwrap_or(i32::MAX)
}

/// Berth's view of a Slurm job state.
pub fn job_state(state: &str, was_running: bool) -> JobState {
    match state {
        "PENDING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED" | "RESV_DEL_HOLD" => JobState::Queued,
        "RUNNING" | "COMPLETING" | "CONFIGURING" | "SUSPENDED" | "STOPPED" | "SIGNALING" | "STAGE_OUT" | "RESIZING"
        | "POWER_UP_NODE" | "UPDATE_DB" => JobState::Running,
        "COMPLETED" => JobState::Succeeded,
        "CANCELLED" => JobState::Cancelled,
        "TIMEOUT" => JobState::TimedOut,
        "FAILED" | "NODE_FAIL" | "PREEMPTED" | "OUT_OF_MEMORY" | "BOOT_FAIL" | "DEADLINE" => JobState::Failed,
        // A state this adapter does not know yet: judge by whether it ever ran.
        _ if was_running => JobState::Running,
        _ => JobState::Queued,
    }
}

/// Why a job ended as it did, in words a person reads on the workload.
pub fn final_reason(state: &str, reason: Option<&str>) -> Option<String> {
    let what = match state {
        "TIMEOUT" => "it reached its time limit",
        "NODE_FAIL" => "a node it ran on failed",
        "PREEMPTED" => "Slurm preempted it",
        "OUT_OF_MEMORY" => "it ran out of memory",
        "BOOT_FAIL" => "its nodes failed to boot",
        "DEADLINE" => "it missed its deadline",
        "FAILED" => "its script exited with an error",
        "CANCELLED" => "it was cancelled",
        _ => return reason.map(str::to_owned),
    };
    Some(match reason {
        Some(r) => format!("{state}: {what} ({r})"),
        None => format!("{state}: {what}"),
    })
}

/// A node takes new work: up (idle, mixed or allocated) and not drained, failing, in
/// maintenance or powered down.
pub fn schedulable(node: &Node) -> bool {
    const BLOCKING: [&str; 9] = [
        "DRAIN",
        "DRAINING",
        "DRAINED",
        "FAIL",
        "MAINTENANCE",
        "NOT_RESPONDING",
        "POWER_DOWN",
        "POWERED_DOWN",
        "REBOOT_REQUESTED",
    ];
    matches!(node.state.as_str(), "idle" | "mixed" | "allocated" | "completing")
        && !node.flags.iter().any(|f| BLOCKING.contains(&f.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gres_strings_count_gpus_of_the_asked_type() {
        assert_eq!(gpus_in("gpu:h100:8", None), 8);
        assert_eq!(gpus_in("gpu:h100:8", Some("h100")), 8);
        assert_eq!(gpus_in("gpu:h100:8", Some("a100")), 0);
        assert_eq!(gpus_in("gpu:h100:5(IDX:0-4)", Some("h100")), 5);
        assert_eq!(gpus_in("gpu:h100:3(IDX:0,2-3),gpu:a100:2(IDX:0-1)", None), 5);
        assert_eq!(gpus_in("gpu:4(S:0-1),shard:8", None), 4);
        assert_eq!(gpus_in("", None), 0);
        assert_eq!(gpus_in("(null)", None), 0);
        assert_eq!(shards_in("gpu:h100:8(S:0),shard:32(S:0)"), 32);
        assert_eq!(shards_in("gpu:h100:0(IDX:N/A),shard:h100:3(2/4,1/4,0/4,0/4)"), 3);
        assert_eq!(shards_in("gpu:h100:8"), 0);
    }

    #[test]
    fn wait_statuses_become_shell_exit_codes() {
        assert_eq!(exit_code(0), 0);
        assert_eq!(exit_code(768), 3);
        assert_eq!(exit_code(9), 137);
        assert_eq!(exit_code(15), 143);
    }

    #[test]
    fn slurm_states_map_to_berth_states() {
        assert_eq!(job_state("PENDING", false), JobState::Queued);
        assert_eq!(job_state("COMPLETING", true), JobState::Running);
        assert_eq!(job_state("COMPLETED", true), JobState::Succeeded);
        for s in ["FAILED", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"] {
            assert_eq!(job_state(s, true), JobState::Failed, "{s}");
        }
        assert_eq!(job_state("TIMEOUT", true), JobState::TimedOut);
        assert_eq!(job_state("CANCELLED", false), JobState::Cancelled);
        assert_eq!(job_state("SOMETHING_NEW", true), JobState::Running);
        assert_eq!(job_state("SOMETHING_NEW", false), JobState::Queued);
        assert_eq!(final_reason("TIMEOUT", None).unwrap(), "TIMEOUT: it reached its time limit");
    }

    #[test]
    fn drained_down_and_unresponsive_nodes_take_no_work() {
        let node = |state: &str, flags: &[&str]| Node {
            name: "n".into(),
            state: state.into(),
            flags: flags.iter().map(|f| (*f).into()).collect(),
            gres: String::new(),
            gres_used: String::new(),
            cpus: 1,
            memory_mib: 1,
            partitions: Vec::new(),
            features: Vec::new(),
        };
        assert!(schedulable(&node("idle", &[])));
        assert!(schedulable(&node("mixed", &[])));
        assert!(!schedulable(&node("idle", &["DRAIN"])));
        assert!(!schedulable(&node("down", &[])));
        assert!(!schedulable(&node("allocated", &["NOT_RESPONDING"])));
    }

    #[test]
    fn job_and_request_errors_are_rejections_and_the_rest_are_outages() {
        let e = |code| ApiError { code, message: String::new() };
        assert!(e(Some(2000)).is_rejection());
        assert!(e(Some(9001)).is_rejection());
        assert!(!e(Some(5005)).is_rejection());
        assert!(!e(Some(-1)).is_rejection());
        assert!(!e(None).is_rejection());
    }
}
