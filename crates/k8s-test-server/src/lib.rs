//! A test Kubernetes API server for Berth's tests and demo — not a production part.
//!
//! It serves, over plain HTTP, the subset of the Kubernetes REST API Berth uses — discovery,
//! namespaces, nodes, pods, services, batch/v1 jobs, apps/v1 deployments and (optionally)
//! jobset.x-k8s.io/v1alpha2 jobsets — with real k8s-openapi validation, a global
//! resourceVersion, list and watch (history replay, bookmarks, 410 Gone), Status errors,
//! server-side apply and merge patch, and deletion with propagation. Built-in controllers make
//! it behave like a small cluster: a scheduler aware of GPUs, taints and node affinity, a fake
//! kubelet driven by container env (`FAKE_RUN_SECONDS`, `FAKE_EXIT_CODE`,
//! `FAKE_TERMINATION_REASON`, `FAKE_SIGTERM_SECONDS`, images under `missing.invalid/`), the Job
//! and Deployment controllers and a garbage collector.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use berth_k8s_test_server::{Config, FakeNode, TestApiServer};
//!
//! let server = TestApiServer::start(Config {
//!     nodes: vec![FakeNode::gpu("gpu-1", 8, "NVIDIA-H100-80GB-HBM3")],
//!     ..Config::default()
//! })
//! .await?;
//! println!("{}", server.kubeconfig());
//! # Ok(())
//! # }
//! ```

mod cluster;
mod config;
mod controllers;
mod defaults;
mod deletion;
mod discovery;
mod disruption;
mod http;
mod kubeconfig;
mod logs;
mod meta;
mod nodes;
mod operations;
mod patch;
mod resources;
mod selector;
mod server;
mod shared;
mod status;
mod store;
mod validation;
mod watch;

pub use config::{Config, FakeNode};
pub use server::TestApiServer;
