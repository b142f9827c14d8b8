//! `berth`: Berth's command-line client. See `berth --help`.

mod apply;
mod client;
mod commands;
mod config;
mod output;
mod submit;

use std::path::PathBuf;

use clap::{CommandFactory, Parser, Subcommand};

use crate::client::{ApiError, Client, exit};
use crate::output::Format;

/// Berth's command-line client: submit work as with sbatch, keep flavors, teams and
/// clusters in files and apply them with a plan, see why work waits.
#[derive(Debug, Parser)]
#[command(name = "berth", version, after_help = EXAMPLES)]
pub struct Cli {
    /// Berth's URL [default: the context's, else http://127.0.0.1:8080]
    #[arg(long, env = "BERTH_SERVER", global = true)]
    server: Option<String>,
    /// Bearer token [default: the context's]
    #[arg(long, env = "BERTH_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// Context of the config file (`berth login` writes them)
    #[arg(long, env = "BERTH_CONTEXT", global = true)]
    context: Option<String>,
    /// Output format
    #[arg(short, long, value_enum, default_value_t = Format::Table, global = true)]
    output: Format,
    #[command(subcommand)]
    command: Command,
}

const EXAMPLES: &str = "Examples:
  berth login --server https://berth.example.org
  berth apply -f teams/ --dry-run          # the plan, and what the scheduler would do
  berth apply -f teams/ --prune -l managed-by=gitops
  berth submit train.sbatch                # an unmodified sbatch script
  berth get workloads --owner me
  berth why train-ab3xk
  berth logs -f train-ab3xk

Exit codes: 0 done; 1 `diff` found differences; 2 bad usage or file; 3 the API refused
the request (its field messages are printed); 4 Berth did not answer or failed.";

#[derive(Debug, Subcommand)]
enum Command {
    /// Store a server and a token as a context of the config file.
    #[command(
        after_help = "Examples:\n  berth login --server https://berth.example.org --token \"$(cat token)\"\n  berth login --context staging --server http://127.0.0.1:8080 --team nlp"
    )]
    Login {
        /// The token; read from standard input when not given
        #[arg(long = "with-token")]
        with_token: Option<String>,
        /// The team commands use when none is given
        #[arg(long)]
        team: Option<String>,
    },
    /// Create or update what the files describe (dependency order: flavors, teams, clusters, role bindings, workloads).
    #[command(
        after_help = "Examples:\n  berth apply -f examples/demo/ --dry-run\n  berth apply -f quota.yaml\n  berth apply -f org/ --prune -l managed-by=gitops"
    )]
    Apply {
        /// Files or directories of YAML or JSON documents (`-` for standard input)
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Show the plan, with the effect of quota changes, and change nothing
        #[arg(long)]
        dry_run: bool,
        /// Delete flavors, teams and clusters that carry the selector's labels and are in no file
        #[arg(long, requires = "selector")]
        prune: bool,
        /// Label selector for --prune (`key=value,...`)
        #[arg(short = 'l', long)]
        selector: Option<String>,
    },
    /// Show what `apply` would change, field by field (exit 1 when anything differs).
    #[command(after_help = "Example:\n  berth diff -f teams/")]
    Diff {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
    },
    /// List objects, or show one.
    #[command(
        after_help = "Examples:\n  berth get teams\n  berth get workloads --owner me --phase Pending\n  berth get workload train --team nlp -o yaml\n  berth get workloads -w"
    )]
    Get(commands::GetArgs),
    /// Everything about one object: status, reason, position, estimate, placement, events.
    #[command(after_help = "Example:\n  berth describe workload train --team nlp")]
    Describe {
        kind: commands::ObjectKind,
        name: String,
        #[arg(long)]
        team: Option<String>,
    },
    /// Submit a batch script, reading its #SBATCH and #BERTH directives.
    #[command(after_help = SUBMIT_HELP)]
    Submit(commands::SubmitArgs),
    /// Run a command in a container image (Kubernetes-style).
    #[command(after_help = "Example:\n  berth run --image ghcr.io/acme/train:1 --gpus 1 -- python train.py --epochs 3")]
    Run(commands::RunArgs),
    /// Cancel a workload and keep its record (as scancel); the name of an array cancels
    /// each of its workloads.
    Cancel {
        name: String,
        #[arg(long)]
        team: Option<String>,
    },
    /// Delete a workload: its job is stopped (with the grace period) and its record removed,
    /// which frees its name; the name of an array deletes each of its workloads.
    Delete {
        name: String,
        #[arg(long)]
        team: Option<String>,
    },
    /// From a job told to stop: say its checkpoint is written, so its job is stopped now
    /// and its GPUs released (instead of at the end of its grace period).
    #[command(after_help = "Example, in a batch script:\n  trap 'save_checkpoint && berth checkpointed' TERM\n\n\
Inside a job, the workload, its team, Berth's URL and the job's own token come from its\n\
environment (BERTH_WORKLOAD, BERTH_TEAM, BERTH_API_URL, BERTH_JOB_TOKEN).")]
    Checkpointed {
        #[arg(env = "BERTH_WORKLOAD")]
        name: String,
        #[arg(long, env = "BERTH_TEAM")]
        team: Option<String>,
    },
    /// Print what a workload's job printed.
    #[command(after_help = "Examples:\n  berth logs train\n  berth logs -f train --task 1")]
    Logs {
        name: String,
        #[arg(long)]
        team: Option<String>,
        /// Keep printing new lines until the task ends
        #[arg(short, long)]
        follow: bool,
        /// Only the last N lines
        #[arg(long)]
        tail: Option<u32>,
        /// The task (0-based)
        #[arg(long)]
        task: Option<u32>,
        /// The attempt [default: the current one]
        #[arg(long)]
        attempt: Option<u32>,
    },
    /// Where a running notebook or inference service answers, and the token that opens a
    /// notebook (its owner and team admins only).
    Endpoint {
        name: String,
        #[arg(long)]
        team: Option<String>,
    },
    /// Why a workload waits, when it should start, and what would let it run; the name of an
    /// array says why each of its waiting workloads waits.
    Why {
        name: String,
        #[arg(long)]
        team: Option<String>,
    },
    /// The pending queue, in the order the scheduler considers it.
    Queue {
        #[arg(long)]
        team: Option<String>,
        /// How many of the first
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
    /// GPUs each team holds now, per flavor, against its guarantee and fair share.
    Top,
    /// GPU-hours and cost over a period, from the accounting ledger (running work up to now).
    #[command(
        after_help = "Examples:\n  berth usage                              (the last 30 days, by team)\n  berth usage --from 2026-11-01 --by team,owner --bucket day\n  berth usage --from 2026-10-01 --to 2026-11-01 --csv > october.csv"
    )]
    Usage {
        /// Start: a date (2026-11-01, midnight UTC) or an RFC 3339 time [default: 30 days before --to]
        #[arg(long)]
        from: Option<String>,
        /// End, not included [default: now]
        #[arg(long)]
        to: Option<String>,
        /// Group rows by: team, owner, flavor, cluster, kind, backend (comma-separated)
        #[arg(long, default_value = "team")]
        by: String,
        /// Cut the period into minute, hour, day, week or month buckets
        #[arg(long, value_parser = ["minute", "hour", "day", "week", "month"])]
        bucket: Option<String>,
        /// Print the rows as CSV (for a spreadsheet)
        #[arg(long)]
        csv: bool,
    },
    /// What a quota change in a file would do, before it is applied.
    #[command(after_help = "Example:\n  berth preview team nlp -f nlp.yaml")]
    Preview {
        #[arg(value_parser = ["team"])]
        kind: String,
        name: String,
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// Shell completion: `berth completion bash > /etc/bash_completion.d/berth`.
    Completion { shell: clap_complete::Shell },
}

const SUBMIT_HELP: &str = "The script's #SBATCH lines are read as sbatch reads them (--job-name, --nodes,
--ntasks, --ntasks-per-node, --gres=gpu[:TYPE]:N, --gpus-per-node, --gpus, --gpus-per-task,
--cpus-per-task, --mem, --mem-per-cpu, --time, --partition, --array); then its #BERTH lines,
which take this command's options; then the command line. TYPE names a flavor by its name or
its Slurm GRES type; a partition names the flavor a cluster's Slurm partition of that name
holds (one no cluster has is refused). --dependency, --begin and --hold are refused: Berth
does not hold a job back. An array is a workload per index, NAME-INDEX, each with
SLURM_ARRAY_TASK_ID (and _MIN, _MAX, _COUNT, _STEP) set and the label berth.dev/array=NAME.

Examples:
  berth submit train.sbatch
  berth submit --team nlp --gpus 8 --nodes 2 --time 4h train.sh
  berth submit --name sweep --array 0-9 sweep.sh   # ten workloads, sweep-0 … sweep-9
  #BERTH --priority 10 --label project=llm     (in the script)";

fn main() {
    // As every Unix tool: a reader that goes away (`berth get workloads | head`) ends the
    // program quietly (Rust ignores SIGPIPE, and printing to a closed pipe panicked).
    // SAFETY: before any thread starts; restores the default disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        // sbatch's -o names a file: `berth submit -o slurm-%j.out job.sh` met Berth's -o
        // (how it prints) with no word of the difference.
        let output = e.get(clap::error::ContextKind::InvalidArg).is_some_and(|a| a.to_string().starts_with("--output"));
        if e.kind() == clap::error::ErrorKind::InvalidValue && output {
            let text = e.render().to_string();
            eprintln!("{}", text.split("\n\n").next().unwrap_or(&text).trim_end());
            eprintln!(
                "hint: Berth's -o/--output is how it prints (table, wide, json, yaml); sbatch's -o (the job's \
                 output file) is not Berth's: read a job's output with berth logs NAME"
            );
            std::process::exit(exit::USAGE);
        }
        e.exit()
    });
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let code = runtime.block_on(run(cli));
    std::process::exit(code);
}

async fn run(cli: Cli) -> i32 {
    match dispatch(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            e.chain().find_map(|c| c.downcast_ref::<ApiError>()).map_or(exit::USAGE, ApiError::exit_code)
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    if let Command::Completion { shell } = cli.command {
        clap_complete::generate(shell, &mut Cli::command(), "berth", &mut std::io::stdout());
        return Ok(0);
    }
    let config = config::Config::load()?;
    if let Some(name) = &cli.context
        && !matches!(cli.command, Command::Login { .. })
        && !config.contexts.contains_key(name)
    {
        anyhow::bail!(
            "no context {name:?} in {} (berth login --context {name} makes one)",
            config::Config::path().display()
        );
    }
    let context = config.context(cli.context.as_deref()).cloned().unwrap_or_default();
    let server = cli.server.clone().or((!context.server.is_empty()).then(|| context.server.clone()));
    let server = server.unwrap_or_else(|| config::DEFAULT_SERVER.to_owned());
    let url = reqwest::Url::parse(&server).ok();
    if !url.is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host()) {
        anyhow::bail!("--server {server:?}: not an http(s) URL (as http://127.0.0.1:8080)");
    }
    let token = cli.token.clone().or(context.token.clone());
    if let Command::Checkpointed { name, team } = &cli.command {
        return commands::checkpointed(&server, token, name, team.clone().or(context.team.clone()), cli.output).await;
    }
    let client = Client::new(&server, token);
    let out = cli.output;
    let env = commands::Env { client: &client, team: context.team.clone(), out };
    match cli.command {
        Command::Login { with_token, team } => {
            commands::login(config, cli.context.as_deref(), &server, with_token.or(cli.token), team).await
        }
        Command::Apply { files, dry_run, prune, selector } => {
            commands::apply(&env, &files, dry_run, prune.then_some(selector.unwrap_or_default())).await
        }
        Command::Diff { files } => commands::diff(&env, &files).await,
        Command::Get(args) => commands::get(&env, args).await,
        Command::Describe { kind, name, team } => commands::describe(&env, kind, &name, team).await,
        Command::Submit(args) => commands::submit(&env, args).await,
        Command::Run(args) => commands::run(&env, args).await,
        Command::Cancel { name, team } => commands::cancel(&env, &name, team).await,
        Command::Delete { name, team } => commands::delete(&env, &name, team).await,
        Command::Checkpointed { .. } => unreachable!("answered above"),
        Command::Logs { name, team, follow, tail, task, attempt } => {
            commands::logs(&env, &name, team, commands::LogOptions { follow, tail, task, attempt }).await
        }
        Command::Why { name, team } => commands::why(&env, &name, team).await,
        Command::Endpoint { name, team } => commands::endpoint(&env, &name, team).await,
        Command::Queue { team, limit } => commands::queue(&env, team, limit).await,
        Command::Top => commands::top(&env).await,
        Command::Usage { from, to, by, bucket, csv } => {
            commands::usage(&env, commands::UsageOptions { from, to, by, bucket, csv }).await
        }
        Command::Preview { name, file, .. } => commands::preview(&env, &name, &file).await,
        Command::Completion { .. } => unreachable!("handled above"),
    }
}
