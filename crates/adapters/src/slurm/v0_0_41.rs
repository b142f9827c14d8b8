//! slurmrestd API v0.0.41 (Slurm 24.05 on): as [`super::v0_0_40`], except that a job's
//! allocated nodes are `job_resources.nodes.allocation[].name`.
//!
//! v0.0.42 (24.11), v0.0.43 (25.05), v0.0.44 (25.11) and v0.0.45 (26.05) take the same
//! submit body and answer the same for every field Berth reads, which the conformance
//! tests check against real 24.11 and 26.05 clusters; they are this dialect under their
//! own names. A version that changes one of those fields gets a module of its own.

use serde::Deserialize;
use serde_json::Value;

use super::v0_0_40::{self, JobNodes};
use super::wire::{Dialect, Job, Node, Partition, Submission};

/// The API of Slurm 24.05 and later, under one of its version names.
pub struct V0041(pub &'static str);

impl Dialect for V0041 {
    fn version(&self) -> &'static str {
        self.0
    }

    fn submit_body(&self, s: &Submission) -> Value {
        v0_0_40::submit_body(s)
    }

    fn parse_jobs(&self, body: &[u8]) -> Result<Vec<Job>, serde_json::Error> {
        v0_0_40::parse_jobs::<Resources>(body)
    }

    fn parse_nodes(&self, body: &[u8]) -> Result<Vec<Node>, serde_json::Error> {
        v0_0_40::parse_nodes(body)
    }

    fn parse_partitions(&self, body: &[u8]) -> Result<Vec<Partition>, serde_json::Error> {
        v0_0_40::parse_partitions(body)
    }
}

#[derive(Default, Deserialize)]
struct Resources {
    #[serde(default)]
    nodes: Nodes,
}

#[derive(Default, Deserialize)]
struct Nodes {
    #[serde(default)]
    allocation: Vec<Allocated>,
}

#[derive(Deserialize)]
struct Allocated {
    name: String,
}

impl JobNodes for Resources {
    fn names(self) -> Vec<String> {
        self.nodes.allocation.into_iter().map(|n| n.name).collect()
    }
}
