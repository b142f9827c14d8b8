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
    /// Berth's own tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Mint a token signed with the configured secret and print it (bootstrap: the token
    /// carries its grant, so it works before any role binding exists).
    Create {
        /// The subject (`sub`) the token acts as; audit records name it.
        #[arg(long)]
        subject: String,
        /// platform-admin, team-admin, member or viewer.
        #[arg(long, value_parser = |s: &str| berth_core::auth::Role::parse(s))]
        role: berth_core::auth::Role,
        /// The team the role applies to (not for platform-admin; optional for viewer).
        #[arg(long)]
        team: Option<String>,
        /// Lifetime, e.g. `1h`, `30d`.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        ttl: Duration,
        #[command(flatten)]
        issuer: IssuerArgs,
    },
}

/// Berth's own token issuer.
#[derive(clap::Args)]
struct IssuerArgs {
    /// HS256 secret (at least 32 bytes) signing Berth's own tokens.
    #[arg(long, env = "BERTH_JWT_SECRET", hide_env_values = true)]
    jwt_secret: Option<String>,
    /// A file holding that secret (its whitespace trimmed).
    #[arg(long, env = "BERTH_JWT_SECRET_FILE", conflicts_with = "jwt_secret")]
    jwt_secret_file: Option<std::path::PathBuf>,
    /// The `iss` of Berth's own tokens.
    #[arg(long, env = "BERTH_JWT_ISSUER", default_value = "berth")]
    jwt_issuer: String,
    /// The `aud` of Berth's own tokens.
    #[arg(long, env = "BERTH_JWT_AUDIENCE", default_value = "berth")]
    jwt_audience: String,
}

impl IssuerArgs {
    fn issuer(&self) -> anyhow::Result<Option<berth_auth::BerthIssuer>> {
        let secret = match (&self.jwt_secret, &self.jwt_secret_file) {
            (Some(s), _) => s.trim().to_owned(),
            (None, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("reading the token secret from {}", path.display()))?
                .trim()
                .to_owned(),
            (None, None) => return Ok(None),
        };
        berth_auth::BerthIssuer::new(&self.jwt_issuer, &self.jwt_audience, secret.as_bytes())
            .map(Some)
            .map_err(anyhow::Error::msg)
    }
}

/// Authentication, rate limits and the HTTP surface.
#[derive(clap::Args)]
struct SecurityArgs {
    #[command(flatten)]
    issuer: IssuerArgs,
    /// An external OIDC issuer (`iss`) whose tokens are accepted.
    #[arg(long, env = "BERTH_OIDC_ISSUER")]
    oidc_issuer: Option<String>,
    /// The audience tokens from the OIDC issuer must carry.
    #[arg(long, env = "BERTH_OIDC_AUDIENCE", default_value = "berth")]
    oidc_audience: String,
    /// The OAuth client registered at the OIDC issuer for `berth login` (a public client
    /// allowed the device-code grant); advertised at `/auth/config`.
    #[arg(long, env = "BERTH_OIDC_CLI_CLIENT_ID")]
    oidc_cli_client_id: Option<String>,
    /// The OAuth client registered at the OIDC issuer for the dashboard: a public client
    /// (authorization code with PKCE) whose redirect URI is the dashboard's address.
    #[arg(long, env = "BERTH_OIDC_WEB_CLIENT_ID")]
    oidc_web_client_id: Option<String>,
    /// The issuer's JWKS URL; default: discovered from its openid-configuration.
    #[arg(long, env = "BERTH_OIDC_JWKS_URL")]
    oidc_jwks_url: Option<String>,
    /// Algorithms accepted from the OIDC issuer (asymmetric only).
    #[arg(long, env = "BERTH_OIDC_ALGORITHMS", default_value = "RS256,ES256", value_delimiter = ',')]
    oidc_algorithms: Vec<String>,
    /// Least seconds between two JWKS fetches (an unknown `kid` triggers one).
    #[arg(long, env = "BERTH_OIDC_JWKS_MIN_REFRESH_SECONDS", default_value_t = 30)]
    oidc_jwks_min_refresh_seconds: u64,
    /// Most seconds a fetched JWKS is used before it is fetched again.
    #[arg(long, env = "BERTH_OIDC_JWKS_REFRESH_SECONDS", default_value_t = 600)]
    oidc_jwks_refresh_seconds: u64,
    /// Clock skew allowed on `exp` and `nbf`, at most 60.
    #[arg(long, env = "BERTH_TOKEN_LEEWAY_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=60))]
    token_leeway_seconds: u64,
    /// Mutating requests per second allowed to one principal (0: no limit).
    #[arg(long, env = "BERTH_RATE_LIMIT_PER_SECOND", default_value_t = 50)]
    rate_limit_per_second: u32,
    /// Burst of mutating requests allowed above that rate.
    #[arg(long, env = "BERTH_RATE_LIMIT_BURST", default_value_t = 200)]
    rate_limit_burst: u32,
    /// Reads per second allowed to one principal (0: no limit).
    #[arg(long, env = "BERTH_READ_RATE_LIMIT_PER_SECOND", default_value_t = 100)]
    read_rate_limit_per_second: u32,
    /// Burst of reads allowed above that rate.
    #[arg(long, env = "BERTH_READ_RATE_LIMIT_BURST", default_value_t = 400)]
    read_rate_limit_burst: u32,
    /// Requests per second counted against one team: on its paths by callers who may read
    /// it, by its service accounts and by its jobs' tokens, together (0: no limit).
    #[arg(long, env = "BERTH_TEAM_RATE_LIMIT_PER_SECOND", default_value_t = 200)]
    team_rate_limit_per_second: u32,
    /// Burst of requests allowed a team above that rate.
    #[arg(long, env = "BERTH_TEAM_RATE_LIMIT_BURST", default_value_t = 800)]
    team_rate_limit_burst: u32,
    /// Browser origins allowed to call the API (CORS), comma-separated; none by default.
    #[arg(long, env = "BERTH_CORS_ORIGINS", value_delimiter = ',')]
    cors_origins: Vec<String>,
    /// Where `/metrics` is served: empty (beside the API), `off`, or an address of its own.
    #[arg(long, env = "BERTH_METRICS_LISTEN", default_value = "")]
    metrics_listen: String,
    /// The dashboard's build (`npm --prefix web run build` writes it), served at `/`.
    #[arg(long, env = "BERTH_WEB_DIR", default_value = "web/dist")]
    web_dir: std::path::PathBuf,
    /// Seconds a client has to send a request's line and headers.
    #[arg(long, env = "BERTH_HEADER_READ_TIMEOUT_SECONDS", default_value_t = 10)]
    header_read_timeout_seconds: u64,
    /// Seconds a connection may move no byte before it is closed.
    #[arg(long, env = "BERTH_IDLE_TIMEOUT_SECONDS", default_value_t = 60)]
    idle_timeout_seconds: u64,
    /// Seconds a request may take, its body included (408 after).
    #[arg(long, env = "BERTH_REQUEST_TIMEOUT_SECONDS", default_value_t = 30)]
    request_timeout_seconds: u64,
    /// API requests served at once; more wait their turn (within their request time).
    #[arg(long, env = "BERTH_MAX_CONCURRENT_REQUESTS", default_value_t = 64)]
    max_concurrent_requests: usize,
}

impl SecurityArgs {
    fn auth(&self) -> anyhow::Result<berthd::auth::Auth> {
        let berth = self.issuer.issuer()?;
        let oidc = match &self.oidc_issuer {
            Some(issuer) => {
                let algorithms = self
                    .oidc_algorithms
                    .iter()
                    .map(|a| {
                        a.trim()
                            .parse()
                            .map_err(|_| anyhow::anyhow!("unknown algorithm {a:?} in BERTH_OIDC_ALGORITHMS"))
                    })
                    .collect::<anyhow::Result<Vec<_>>>()?;
                let config = berth_auth::OidcConfig {
                    issuer: issuer.clone(),
                    audience: self.oidc_audience.clone(),
                    jwks_url: self.oidc_jwks_url.clone(),
                    algorithms,
                    min_refresh: Duration::from_secs(self.oidc_jwks_min_refresh_seconds),
                    refresh_every: Duration::from_secs(self.oidc_jwks_refresh_seconds),
                };
                config.check().map_err(anyhow::Error::msg)?;
                Some(berth_auth::Jwks::new(config))
            }
            None => None,
        };
        anyhow::ensure!(
            berth.is_some() || oidc.is_some(),
            "no token issuer is configured: set BERTH_JWT_SECRET (or BERTH_JWT_SECRET_FILE) and/or BERTH_OIDC_ISSUER \
             (scripts/run does this for you)"
        );
        let verifier = berth_auth::Verifier { berth, oidc, leeway: Duration::from_secs(self.token_leeway_seconds) };
        let limit = |per_second: u32, burst: u32| {
            std::num::NonZeroU32::new(per_second).map(|per_second| berthd::auth::RateLimit {
                per_second,
                burst: std::num::NonZeroU32::new(burst).unwrap_or(per_second),
            })
        };
        let limits = berthd::auth::RateLimits {
            writes: limit(self.rate_limit_per_second, self.rate_limit_burst),
            reads: limit(self.read_rate_limit_per_second, self.read_rate_limit_burst),
            teams: limit(self.team_rate_limit_per_second, self.team_rate_limit_burst),
        };
        Ok(berthd::auth::Auth::with_limits(verifier, limits))
    }

    fn http(&self) -> anyhow::Result<berthd::state::HttpConfig> {
        let cors_origins = self
            .cors_origins
            .iter()
            .filter(|o| !o.trim().is_empty())
            .map(|o| o.trim().parse().with_context(|| format!("CORS origin {o:?}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(berthd::state::HttpConfig {
            cors_origins,
            metrics_here: self.metrics_listen.is_empty(),
            web_dir: Some(self.web_dir.clone()),
            login: berthd::ops::LoginConfig {
                oidc: self
                    .oidc_issuer
                    .clone()
                    .filter(|_| self.oidc_cli_client_id.is_some() || self.oidc_web_client_id.is_some())
                    .map(|issuer| berthd::ops::OidcLogin {
                        issuer,
                        client_id: self.oidc_cli_client_id.clone(),
                        web_client_id: self.oidc_web_client_id.clone(),
                        audience: self.oidc_audience.clone(),
                    }),
            },
            limits: berthd::server::ConnectionLimits {
                header_read: Duration::from_secs(self.header_read_timeout_seconds.max(1)),
                idle: Duration::from_secs(self.idle_timeout_seconds.max(1)),
                request: Duration::from_secs(self.request_timeout_seconds.max(1)),
                concurrent: self.max_concurrent_requests.max(1),
            },
        })
    }
}

#[derive(clap::Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// The URL the clusters' jobs reach this API at: jobs are told it (`BERTH_API_URL`,
    /// with their own token) to acknowledge a checkpoint. Default: `http://` and the
    /// listen address (an unspecified address read as loopback), right only where jobs
    /// run on this host; jobs get no token where Berth signs no tokens of its own.
    #[arg(long, env = "BERTH_PUBLIC_URL")]
    public_url: Option<String>,
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
    /// Where berthd's Kubernetes service account is mounted (its `token`, `ca.crt` and
    /// `namespace`): the identity used for Kubernetes clusters without a `credentials_ref`.
    #[arg(long, env = "BERTH_KUBERNETES_SERVICE_ACCOUNT_DIR", default_value = berth_adapters::kubernetes::SERVICE_ACCOUNT_DIR)]
    kubernetes_service_account_dir: std::path::PathBuf,
    /// Seed the demo world (two sim clusters, flavors, teams) and submit a demo workload
    /// every `demo_interval_seconds`. Never in production.
    #[arg(long, env = "BERTH_DEMO", default_value_t = false, action = clap::ArgAction::Set)]
    demo: bool,
    #[arg(long, env = "BERTH_DEMO_INTERVAL_SECONDS", default_value_t = 5)]
    demo_interval_seconds: u64,
    /// With `demo`: also register the Kubernetes cluster `kube-demo` at this API server
    /// (scripts/run starts the test API server for it), with the kubeconfig in the secret
    /// `BERTH_CREDENTIAL_DEMO_KUBE`.
    #[arg(long, env = "BERTH_DEMO_KUBERNETES")]
    demo_kubernetes: Option<String>,
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
    /// Days an ended workload (succeeded, failed, cancelled) is kept before it is removed.
    #[arg(long, env = "BERTH_RETENTION_DAYS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=36_500))]
    retention_days: u64,
    #[command(flatten)]
    security: SecurityArgs,
}

/// glibc's allocator took a fifth of berthd's time under load (a request allocates and
/// frees across two worker threads); mimalloc takes a small part of that. It is built
/// without transparent huge pages (`no_thp`): where the kernel leaves them to `madvise`, as
/// Debian's does, mimalloc asked for them on its arenas, and each scheduling cycle's fresh
/// memory was zeroed 2 MiB at a time (`clear_page_erms` under `do_huge_pmd_anonymous_page`
/// was 4-5 % of the machine during bench/api-load's creates, the controllers' threads 11 %
/// of it; without, 8 %).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        Command::Token(TokenCommand::Create { subject, role, team, ttl, issuer }) => {
            let issuer = issuer.issuer()?.context("set BERTH_JWT_SECRET or BERTH_JWT_SECRET_FILE to mint tokens")?;
            let grant = berth_core::auth::Grant { role, team };
            let mut v = berth_core::Validator::new();
            if let Err(why) = berth_auth::check_subject(&subject) {
                v.error("--subject", why);
            }
            grant.validate(&mut v, "--role");
            v.finish().map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{}", issuer.mint(&subject, vec![grant], ttl, None).token);
            Ok(())
        }
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
    let auth = args.security.auth()?;
    let http = args.security.http()?;
    let db = connect(&args).await?;
    berth_store::migrate(&db).await.context("migrating the database")?;
    if let Some(url) = &args.public_url {
        anyhow::ensure!(
            url.starts_with("http://") || url.starts_with("https://"),
            "BERTH_PUBLIC_URL must be an http:// or https:// URL, not {url:?}"
        );
    }
    let listener =
        tokio::net::TcpListener::bind(args.listen).await.with_context(|| format!("binding {}", args.listen))?;
    tracing::info!(address = %listener.local_addr()?, "berthd listening");
    if args.demo {
        berth_app::demo::seed(&db, args.demo_kubernetes.as_deref()).await.context("seeding the demo world")?;
        tokio::spawn(berth_app::demo::trickle(db.clone(), Duration::from_secs(args.demo_interval_seconds.max(1))));
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // The metrics recorder before the controllers: what they count from their first pass.
    berthd::telemetry::metrics_handle();
    let backends = std::sync::Arc::new(
        berth_adapters::Registry::new(args.sim_state_dir.clone())
            .with_service_account_dir(args.kubernetes_service_account_dir.clone()),
    );
    let job_api = auth.verifier.berth.clone().map(|issuer| berth_controllers::JobApiConfig {
        url: args.public_url.clone().unwrap_or_else(|| listen_url(listener.local_addr().unwrap_or(args.listen))),
        issuer,
    });
    let scheduling = berth_controllers::Config {
        cancel_grace: Duration::from_secs(args.cancel_grace_seconds),
        unknown_timeout: Duration::from_secs(args.unknown_timeout_seconds),
        orphan_grace: Duration::from_secs(args.orphan_grace_seconds),
        retention: Duration::from_secs(args.retention_days.saturating_mul(86_400)),
        ..berth_controllers::Config::default()
    };
    let clock = berth_controllers::Clock::default();
    let controllers = args.controllers.then(|| {
        let ctx = berth_controllers::Context {
            db: db.clone(),
            backends: backends.clone(),
            config: scheduling.clone(),
            // Set by the lease for each term.
            epoch: None,
            clock: clock.clone(),
            world: Default::default(),
            dispatch: Default::default(),
            followed: Default::default(),
            job_api,
        };
        let holder = args.replica_id.clone().unwrap_or_else(default_replica_id);
        controllers_runtime(berth_controllers::leader::run(ctx, holder, stopped))
    });
    let state = AppState::from(berthd::state::Shared {
        http,
        backends,
        scheduling,
        clock,
        ..berthd::state::Shared::new(db, auth)
    });
    match args.security.metrics_listen.as_str() {
        "" | "off" => {}
        address => {
            let metrics = tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("binding the metrics address {address}"))?;
            tracing::info!(address = %metrics.local_addr()?, "metrics listening");
            tokio::spawn(axum::serve(metrics, berthd::metrics_router(state.clone())).into_future());
        }
    }
    let limits = state.http.limits;
    berthd::server::serve(listener, berthd::app(state), limits, shutdown()).await.context("serving HTTP")?;
    let _ = stop.send(true);
    if let Some(c) = controllers {
        let _ = tokio::task::spawn_blocking(move || c.join()).await;
    }
    Ok(())
}

/// Runs the controllers on a runtime of their own, on threads of their own, until `run`
/// ends. Their passes hold a thread for long stretches of CPU between awaits (a scheduling
/// cycle over 150,000 pending workloads decodes its new rows and puts a reason to each
/// waiting one), and on the runtime that serves HTTP that held requests behind them: with
/// 2 workers on 2 cores, creates stalled 50-230 ms just before each large cycle's write
/// and their p99 rose with the arrival rate. The operating system interleaves threads; a
/// runtime's worker does not interleave its tasks.
fn controllers_runtime(run: impl Future<Output = ()> + Send + 'static) -> std::thread::JoinHandle<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("berth-controllers")
        .enable_all()
        .build()
        .expect("the controllers' runtime starts");
    std::thread::Builder::new()
        .name("berth-controllers".into())
        .spawn(move || runtime.block_on(run))
        .expect("the controllers' thread starts")
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

/// `http://` and the address berthd listens on, an unspecified one (`0.0.0.0`, `::`) read
/// as loopback.
fn listen_url(address: SocketAddr) -> String {
    let ip = match address.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}", SocketAddr::new(ip, address.port()))
}
