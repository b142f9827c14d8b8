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
    /// Compete to run the controllers (only the leader runs them). Off: serve HTTP only.
    #[arg(long, env = "BERTH_CONTROLLERS", default_value_t = true, action = clap::ArgAction::Set)]
    controllers: bool,
    /// This replica's name in the leader lease; default: host name and process id.
    #[arg(long, env = "BERTH_REPLICA_ID")]
    replica_id: Option<String>,
    /// Where simulated clusters keep their journals, so they outlive a restart of
    /// berthd; unset: in memory only.
    #[arg(long, env = "BERTH_SIM_STATE_DIR")]
    sim_state_dir: Option<std::path::PathBuf>,
    /// Seed the demo world (two sim clusters, flavors, teams) and submit a demo workload
    /// every `demo_interval_seconds`. Never in production.
    #[arg(long, env = "BERTH_DEMO", default_value_t = false, action = clap::ArgAction::Set)]
    demo: bool,
    #[arg(long, env = "BERTH_DEMO_INTERVAL_SECONDS", default_value_t = 5)]
    demo_interval_seconds: u64,
    /// Time a cancelled job gets to checkpoint.
    #[arg(long, env = "BERTH_CANCEL_GRACE_SECONDS", default_value_t = 30)]
    cancel_grace_seconds: u64,
    /// How long running work on an unreachable cluster stays Unknown before it is
    /// requeued or failed.
    #[arg(long, env = "BERTH_UNKNOWN_TIMEOUT_SECONDS", default_value_t = 120)]
    unknown_timeout_seconds: u64,
    /// Age after which a backend job no workload owns is cancelled.
    #[arg(long, env = "BERTH_ORPHAN_GRACE_SECONDS", default_value_t = 60)]
    orphan_grace_seconds: u64,
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
    if args.demo {
        berth_app::demo::seed(&db).await.context("seeding the demo world")?;
        tokio::spawn(berth_app::demo::trickle(db.clone(), Duration::from_secs(args.demo_interval_seconds.max(1))));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let controllers = args.controllers.then(|| {
        let ctx = berth_controllers::Context {
            db: db.clone(),
            backends: std::sync::Arc::new(berth_adapters::Registry::new(args.sim_state_dir.clone())),
            config: berth_controllers::Config {
                cancel_grace: Duration::from_secs(args.cancel_grace_seconds),
                unknown_timeout: Duration::from_secs(args.unknown_timeout_seconds),
                orphan_grace: Duration::from_secs(args.orphan_grace_seconds),
                ..berth_controllers::Config::default()
            },
        };
        let holder = args.replica_id.clone().unwrap_or_else(default_replica_id);
        tokio::spawn(berth_controllers::leader::run(ctx, holder, stopped))
    });
    axum::serve(listener, berthd::app(AppState::new(db)))
        .with_graceful_shutdown(shutdown())
        .await
        .context("serving HTTP")?;
    let _ = stop.send(true);
    if let Some(c) = controllers {
        let _ = c.await;
    }
    Ok(())
}

fn default_replica_id() -> String {
    let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    format!("{}-{}", if host.is_empty() { "berthd" } else { &host }, std::process::id())
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
