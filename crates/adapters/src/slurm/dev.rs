//! The real Slurm clusters of `scripts/slurm-dev`, for tests and benchmarks.
//!
//! Tests that need Slurm call [`DevCluster::get`], which fails (never skips) when the
//! cluster is not running; `scripts/test` starts the clusters before the tests run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;

use serde_json::{Value, json};

/// A running `scripts/slurm-dev` cluster, as `scripts/slurm-dev env NAME` describes it.
#[derive(Debug, Clone)]
pub struct DevCluster {
    pub name: String,
    pub url: String,
    pub user: String,
    /// A JWT for `user`, valid for a day.
    pub token: String,
    pub partition: String,
    pub gpu_type: String,
    pub gpus_per_node: u32,
    /// GRES shards per GPU (0: none configured).
    pub shards_per_gpu: u32,
    pub nodes: Vec<String>,
    /// The cluster's `slurm.conf`, for `squeue`, `sinfo`, `scontrol`.
    pub slurm_conf: String,
    /// The Slurm release it runs (`22.05`, `24.11`, `26.05`).
    pub release: String,
    /// The newest slurmrestd API version that release has.
    pub api: String,
    /// Where its jobs start (`working_directory`), readable here.
    pub work_dir: String,
    /// The chroot its Slurm runs in (empty: the machine's own Slurm).
    pub chroot: String,
}

impl DevCluster {
    /// The running cluster `name`.
    ///
    /// # Panics
    /// When it is not running: start it with `scripts/slurm-dev start NAME`.
    pub fn get(name: &str) -> Self {
        let out = Command::new(script()).args(["env", name]).output().expect("scripts/slurm-dev runs");
        assert!(
            out.status.success(),
            "the Slurm dev cluster {name} is not running (start it with `scripts/slurm-dev start {name}`; \
             scripts/test does): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env: HashMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect();
        let var = |k: &str| env.get(k).cloned().unwrap_or_else(|| panic!("slurm-dev env printed no {k}"));
        Self {
            name: var("BERTH_SLURM_CLUSTER"),
            url: var("BERTH_SLURM_URL"),
            user: var("BERTH_SLURM_USER"),
            token: var("BERTH_SLURM_TOKEN"),
            partition: var("BERTH_SLURM_PARTITION"),
            gpu_type: var("BERTH_SLURM_GPU_TYPE"),
            gpus_per_node: var("BERTH_SLURM_GPUS_PER_NODE").parse().expect("a number"),
            shards_per_gpu: var("BERTH_SLURM_SHARDS_PER_GPU").parse().expect("a number"),
            nodes: var("BERTH_SLURM_NODES").split(',').map(str::to_owned).collect(),
            slurm_conf: var("SLURM_CONF"),
            release: var("BERTH_SLURM_RELEASE"),
            api: var("BERTH_SLURM_API"),
            work_dir: var("BERTH_SLURM_WORKDIR"),
            chroot: var("SLURM_CHROOT"),
        }
    }

    /// The body of `PUT /api/v1/clusters/{name}` for this cluster, its one partition
    /// holding `flavor` (with its GPU shards), the token read from the secret
    /// `credentials_ref`.
    pub fn apply_body(&self, flavor: &str, credentials_ref: &str) -> Value {
        let mut partition = json!({"name": self.partition, "flavor": flavor, "gpu_type": self.gpu_type});
        if self.shards_per_gpu > 0 {
            partition["shards_per_gpu"] = self.shards_per_gpu.into();
        }
        json!({"spec": {
            "kind": "slurm", "endpoint": self.url, "credentials_ref": credentials_ref,
            "slurm": {"user": self.user, "working_directory": self.work_dir, "partitions": [partition]},
        }})
    }

    /// A Slurm command (`squeue`, `sinfo`, `scontrol`) of the cluster's release, aimed at
    /// it.
    pub fn command(&self, program: &str) -> Command {
        let mut c = if self.chroot.is_empty() {
            Command::new(program)
        } else {
            let mut c = Command::new("chroot");
            c.args([&self.chroot, program]);
            c
        };
        c.env("SLURM_CONF", &self.slurm_conf);
        c
    }

    /// Runs a Slurm command and returns its standard output.
    ///
    /// # Panics
    /// When the command fails.
    pub fn output(&self, program: &str, args: &[&str]) -> String {
        let out = self.command(program).args(args).output().unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `scripts/slurm-dev ARGS… NAME` (`stop-ctld`, `start-ctld`).
    ///
    /// # Panics
    /// When the script fails.
    pub fn control(&self, command: &str) {
        let out = Command::new(script()).args([command, &self.name]).output().expect("scripts/slurm-dev runs");
        assert!(out.status.success(), "slurm-dev {command} {}: {}", self.name, String::from_utf8_lossy(&out.stderr));
    }
}

/// `scripts/slurm-dev` in this checkout.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/slurm-dev")
}
