//! The `berthd` binary: serves the API; prints the OpenAPI document; runs migrations.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use berthd::state::AppState;
use berthd::telemetry::{self, LogFormat};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "berthd", version, about = "Berth control plane server")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the API (the default).
    Serve,
    /// Print the OpenAPI document.
    Openapi,
    /// Apply database migrations and exit.
    Migrate,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Postgres connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Size of the database connection pool.
    #[arg(long, env = "BERTH_DB_MAX_CONNECTIONS", default_value_t = 32)]
    db_max_connections: u32,
    /// Log line format.
    #[arg(long, env = "BERTH_LOG_FORMAT", value_enum, default_value = "json")]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Serve) {
        Command::Openapi => {
            print!("{}", berthd::openapi::document_json());
            Ok(())
        }
        Command::Migrate => {
            let _telemetry = telemetry::init(cli.serve.log_format)?;
            let db = connect(&cli.serve).await?;
            berth_store::migrate(&db).await?;
            Ok(())
        }
        Command::Serve => serve(cli.serve).await,
    }
}

async fn connect(args: &ServeArgs) -> anyhow::Result<berth_store::PgPool> {
    let url = args
        .database_url
        .as_deref()
        .context("DATABASE_URL is not set: point it at Postgres, or use scripts/run, which starts a local one")?;
    // The database may still be starting (docker compose, a fresh machine): retry a while.
    let mut delay = Duration::from_millis(200);
    for attempt in 1.. {
        match berth_store::connect(url, args.db_max_connections).await {
            Ok(db) => return Ok(db),
            Err(berth_core::Error::Unavailable(e)) if attempt < 30 => {
                tracing::warn!(attempt, error = %e, "database not reachable yet; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e).context("connecting to the database"),
        }
    }
    unreachable!()
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let _telemetry = telemetry::init(args.log_format)?;
    let db = connect(&args).await?;
    berth_store::migrate(&db).await.context("migrating the database")?;
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(address = %listener.local_addr()?, "berthd listening");
    axum::serve(listener, berthd::app(AppState::new(db)))
        .with_graceful_shutdown(shutdown())
        .await
        .context("serving HTTP")
}

async fn shutdown() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = ctrl_c => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
