//! `berth-k8s-test-server`: runs the test Kubernetes API server for the demo.

use std::net::SocketAddr;
use std::path::PathBuf;

use berth_k8s_test_server::{Config, FakeNode, TestApiServer};
use clap::Parser;

/// A test Kubernetes API server with fake GPU nodes (for Berth's demo; not a production part).
#[derive(Debug, Parser)]
#[command(name = "berth-k8s-test-server", version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// A node, as NAME:GPUS:PRODUCT[:BLOCK] (BLOCK becomes label berth.dev/topology-block). Repeatable.
    #[arg(long = "node", value_parser = parse_node)]
    nodes: Vec<FakeNode>,
    /// Require this bearer token on every request.
    #[arg(long)]
    token: Option<String>,
    /// How long containers run when their env has no FAKE_RUN_SECONDS.
    #[arg(long, default_value_t = 1.0)]
    run_seconds: f64,
    /// Write a kubeconfig for the server to this path.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
}

/// Parses `NAME:GPUS:PRODUCT[:BLOCK]`.
fn parse_node(spec: &str) -> Result<FakeNode, String> {
    let parts: Vec<&str> = spec.split(':').collect();
    let (name, gpus, product, block) = match parts.as_slice() {
        [name, gpus, product] => (*name, *gpus, *product, None),
        [name, gpus, product, block] => (*name, *gpus, *product, Some(*block)),
        _ => return Err(format!("expected NAME:GPUS:PRODUCT[:BLOCK], got {spec:?}")),
    };
    let gpus = gpus.parse().map_err(|_| format!("GPUS must be a number in {spec:?}"))?;
    let node = FakeNode::gpu(name, gpus, product);
    Ok(match block {
        Some(block) => node.label("berth.dev/topology-block", block),
        None => node,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let server = TestApiServer::start_on(
        args.listen,
        Config { nodes: args.nodes, token: args.token, default_run_seconds: args.run_seconds, ..Config::default() },
    )
    .await?;
    if let Some(path) = &args.kubeconfig_out {
        std::fs::write(path, server.kubeconfig())?;
        tracing::info!(path = %path.display(), "kubeconfig written");
    }
    shutdown_signal().await?;
    tracing::info!("shutting down");
    drop(server);
    Ok(())
}

/// Waits for ctrl-c or SIGTERM.
async fn shutdown_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_flags_parse_with_optional_block() {
        let node = parse_node("gpu-1:8:NVIDIA-H100:b1").unwrap();
        assert_eq!(node.gpus, 8);
        assert_eq!(node.labels["berth.dev/topology-block"], "b1");
        assert_eq!(node.labels["nvidia.com/gpu.product"], "NVIDIA-H100");
        assert!(parse_node("gpu-1:x:P").is_err());
        assert!(parse_node("gpu-1").is_err());
    }
}
