//! `berth submit SCRIPT`: a batch script becomes a workload. Its `#SBATCH` lines are read
//! as sbatch reads them (so an existing script submits unchanged), then its `#BERTH`
//! lines (the `berth submit` options), then the command line; a later one wins.
//!
//! | sbatch | Berth |
//! | --- | --- |
//! | `--job-name`, `-J` | the name (made a DNS label; `generate_name` when it is not one) |
//! | `--nodes`, `-N` | one task per node, unless tasks are given (more nodes than tasks: as many as tasks, as Slurm) |
//! | `--ntasks`, `-n`; `--ntasks-per-node` (`--tasks-per-node`) | `tasks.count` (tasks and tasks a node without nodes: as many nodes as that takes) |
//! | `--gres=gpu[:TYPE]:N` (one GPU type; `none`), `--gpus-per-node` | N GPUs per node, split over its tasks; TYPE names a flavor by its name or its `slurm.gres_type` |
//! | `--gpus`, `-G`; `--gpus-per-task`; `--tres-per-task=cpu=N,gres/gpu[:TYPE]:N` | GPUs in all, or per task |
//! | `--cpus-per-task`, `-c`; `--mem` (per node; `0`: all of it); `--mem-per-cpu`; `--cpus-per-gpu`, `--mem-per-gpu` | `cpus`, `memory_mib` per task |
//! | `--export=[ALL,]NAME=value,NAME` | the job's environment: the values given, and a bare name's value where `berth submit` runs (not the whole environment: said) |
//! | `--gpus-per-socket`, `--ntasks-per-gpu`, `--wrap` | refused, saying what to give instead |
//! | `--time`, `-t` (`0` in any format, `UNLIMITED`, `INFINITE`: none) | `max_runtime_seconds` |
//! | `--partition`, `-p` (a list: the first a cluster has) | the flavor a cluster's Slurm partition of that name holds; one no cluster has is refused |
//! | `--dependency`, `-d`; `--begin`, `-b`; `--hold`, `-H` | refused: Berth does not hold or defer a job, and left out it would start at once |
//! | `--array`, `-a` (`0-15`, `1,3,5`, `0-15:4`) | a workload per index, named `NAME-INDEX`, each with `SLURM_ARRAY_TASK_ID` (and `_MIN`, `_MAX`, `_COUNT`, `_STEP`) in its environment and the label `berth.dev/array=NAME`; a `%N` limit on how many run at once is not kept (Berth's quotas decide) |
//!
//! | `--test-only` | checked, and what would be submitted shown: nothing is submitted |
//! | `--parsable` | only the name is printed (an array's name) |
//! | `--wait`, `-W` | refused: `berth submit` does not wait for the job's end |
//!
//! Other `#SBATCH` options are listed on standard error and left out. The same options
//! work on `berth submit`'s command line, before the script ([`CommandLine`]), and win
//! over the script's.

use anyhow::{Result, bail};
use serde_json::{Value, json};

/// What a script and the command line ask for, before it is a spec.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Request {
    pub name: Option<String>,
    pub team: Option<String>,
    pub nodes: Option<u32>,
    pub tasks: Option<u32>,
    pub tasks_per_node: Option<u32>,
    pub gpus_per_node: Option<f64>,
    pub gpus_per_task: Option<f64>,
    pub gpus_total: Option<f64>,
    /// A GRES type or flavor name.
    pub gpu_type: Option<String>,
    pub partition: Option<String>,
    pub flavor: Option<String>,
    pub cpus_per_task: Option<u32>,
    pub cpus_per_gpu: Option<u32>,
    pub mem_per_node_mib: Option<u64>,
    pub mem_per_cpu_mib: Option<u64>,
    pub mem_per_gpu_mib: Option<u64>,
    /// `--export`'s `NAME=value`s, and the names it passes on with their values here.
    pub env: Vec<(String, String)>,
    /// What was read otherwise than sbatch reads it, said on standard error.
    pub notes: Vec<String>,
    pub time_seconds: Option<u64>,
    pub priority: Option<i32>,
    pub preemptible: Option<bool>,
    pub image: Option<String>,
    pub kind: Option<String>,
    pub sim_seconds: Option<f64>,
    pub labels: Vec<(String, String)>,
    pub array: Option<Array>,
    /// `#SBATCH` options Berth does not read.
    pub ignored: Vec<String>,
    /// sbatch's `--test-only`: check it and say what would be submitted, submit nothing.
    pub test_only: bool,
    /// sbatch's `--parsable`: print only the name (sbatch prints only the job id).
    pub parsable: bool,
}

/// `berth submit`'s words after its own options, as sbatch's command line has them.
#[derive(Debug, Default, PartialEq)]
pub struct CommandLine {
    /// sbatch's options: they win over the script's `#SBATCH` and `#BERTH` lines.
    pub sbatch: Vec<String>,
    /// `berth submit`'s own options given among them (`--team`, `--sim-seconds` …).
    pub berth: Vec<String>,
    /// The batch script (`-`: standard input).
    pub script: String,
    /// What follows the script but Berth's options: sbatch would pass it to the script.
    pub args: Vec<String>,
    /// Berth's `-o`/`--output` after the script (before it, among sbatch's options, it is
    /// sbatch's `--output`, a file).
    pub output: Option<String>,
}

impl CommandLine {
    /// Splits `words`: sbatch's options, the script, then what follows it, where Berth's
    /// options are still Berth's (`berth submit job.sh -o json`). `own` says whether an
    /// option is one of `berth submit`'s and whether it takes a value (`None`: not one).
    ///
    /// # Errors
    /// No script; a value missing.
    pub fn split(words: &[String], own: impl Fn(&str) -> Option<bool>) -> Result<Self> {
        let words = &unbundled(words);
        let mut line = Self::default();
        let mut script = None;
        let mut i = 0;
        while i < words.len() {
            let w = &words[i];
            // The end of the options, as getopt reads it.
            if script.is_none() && w == "--" {
                i += 1;
                if let Some(w) = words.get(i) {
                    script = Some(w.clone());
                    i += 1;
                }
                continue;
            }
            if script.is_none() && (!w.starts_with('-') || w == "-") {
                script = Some(w.clone());
                i += 1;
                continue;
            }
            let (opt, inline) = match w.split_once('=') {
                Some((o, _)) if o.starts_with("--") => (o, true),
                _ if !w.starts_with("--") && w.len() > 2 && w.is_char_boundary(2) => (&w[..2], true),
                _ => (w.as_str(), false),
            };
            let value = |i: &mut usize| -> Result<String> {
                *i += 1;
                words.get(*i).cloned().ok_or_else(|| anyhow::anyhow!("{opt}: a value is missing"))
            };
            match (own(opt), script.is_some()) {
                (Some(takes), _) => {
                    line.berth.push(w.clone());
                    if takes && !inline {
                        let v = value(&mut i)?;
                        line.berth.push(v);
                    }
                }
                (None, true) if w.starts_with('-') && ["-o", "--output"].contains(&opt) => {
                    line.output = Some(match w.split_once('=') {
                        Some((_, v)) => v.to_owned(),
                        None if inline => w[2..].to_owned(),
                        None => value(&mut i)?,
                    });
                }
                (None, true) => line.args.push(w.clone()),
                (None, false) => {
                    line.sbatch.push(w.clone());
                    if sbatch_takes_value(opt) && !inline {
                        let v = value(&mut i)?;
                        line.sbatch.push(v);
                    }
                }
            }
            i += 1;
        }
        if script.is_none() && line.sbatch.iter().any(|w| w.starts_with("--wrap")) {
            bail!(
                "--wrap: Berth runs a batch script: put the command in one (or run a container: berth run --image \
                 IMG -- CMD)"
            );
        }
        line.script = script.ok_or_else(|| {
            anyhow::anyhow!("no batch script: give its path after the options (- for standard input)")
        })?;
        Ok(line)
    }
}

/// What sbatch refuses of a script as a whole, refused the same: an empty one, one whose
/// first line names no interpreter, one with DOS line breaks.
///
/// # Errors
/// Each in sbatch's words, with what to do.
pub fn check_script(script: &str) -> Result<()> {
    if script.trim().is_empty() {
        bail!("the batch script is empty");
    }
    if !script.starts_with("#!") {
        bail!(
            "this does not look like a batch script: the first line must start with #! followed by the path to an \
             interpreter, as sbatch requires (for instance #!/bin/bash)"
        );
    }
    if script.contains("\r\n") {
        bail!(
            "the batch script has DOS line breaks (\\r\\n) instead of UNIX ones (\\n), as sbatch refuses: convert it (dos2unix)"
        );
    }
    Ok(())
}

/// The `#SBATCH` words of a script, line by line, and its `#BERTH` words, in order (up to
/// its first command, as sbatch reads them). Unlike sbatch, which reads all `#SBATCH` words
/// as one command line, an option's value must be on its line: a bare `#SBATCH -J` is
/// refused rather than named after the next line's option.
pub fn directives(script: &str) -> (Vec<Vec<String>>, Vec<String>) {
    let (mut sbatch, mut berth) = (Vec::new(), Vec::new());
    for (i, line) in script.lines().enumerate() {
        let t = line.trim();
        if i == 0 && t.starts_with("#!") {
            continue;
        }
        if let Some(rest) = t.strip_prefix("#SBATCH") {
            sbatch.push(words(rest));
        } else if let Some(rest) = t.strip_prefix("#BERTH") {
            berth.extend(words(rest));
        } else if !(t.is_empty() || t.starts_with('#')) {
            break;
        }
    }
    (sbatch, berth)
}

/// Splits on whitespace, keeping quoted words whole; a `#` after a space starts a comment.
fn words(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in s.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, '#') if cur.is_empty() => break,
            (None, c) if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            (None, c) => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// sbatch's short options Berth reads, as their long names.
fn long_name(opt: &str) -> &str {
    match opt {
        "-J" => "--job-name",
        "-N" => "--nodes",
        "-n" => "--ntasks",
        "-c" => "--cpus-per-task",
        "-t" => "--time",
        "-p" => "--partition",
        "-G" => "--gpus",
        "-a" => "--array",
        "-d" => "--dependency",
        "-b" => "--begin",
        "-H" => "--hold",
        "-W" => "--wait",
        // sbatch's other name for it.
        "--tasks-per-node" => "--ntasks-per-node",
        other => other,
    }
}

/// The options Berth reads that take a value.
const TAKES_VALUE: [&str; 24] = [
    "--job-name",
    "--nodes",
    "--ntasks",
    "--ntasks-per-node",
    "--cpus-per-task",
    "--time",
    "--partition",
    "--gpus",
    "--gres",
    "--gpus-per-node",
    "--gpus-per-task",
    "--mem",
    "--mem-per-cpu",
    "--priority",
    "--array",
    "--dependency",
    "--begin",
    "--cpus-per-gpu",
    "--mem-per-gpu",
    "--tres-per-task",
    "--export",
    "--gpus-per-socket",
    "--ntasks-per-gpu",
    "--wrap",
];

/// sbatch's options that take no value (or one only as `--option=value`); every other
/// option of sbatch takes one (`--account proj`, `-q high`).
const NO_VALUE: [&str; 33] = [
    "--contiguous",
    "--exclusive",
    "--get-user-env",
    "--hold",
    "--ignore-pbs",
    "--no-kill",
    "--no-requeue",
    "--overcommit",
    "--oversubscribe",
    "--parsable",
    "--quiet",
    "--reboot",
    "--requeue",
    "--spread-job",
    "--test-only",
    "--use-min-nodes",
    "--verbose",
    "--wait",
    "--help",
    "--usage",
    "--version",
    "--nice",
    "--propagate",
    "--x11",
    "-H",
    "-k",
    "-O",
    "-s",
    "-Q",
    "-v",
    "-W",
    "-h",
    "-V",
];

/// Short options written together (`-QN2`, `-vv`): the ones that take no value, each as a
/// word of its own, then the rest (`-Q`, `-N2`), as sbatch's getopt reads them.
fn unbundled(words: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(words.len());
    for w in words {
        let mut w = w.clone();
        while !w.starts_with("--")
            && w.len() > 2
            && w.starts_with('-')
            && w.is_char_boundary(2)
            && NO_VALUE.contains(&&w[..2])
        {
            out.push(w[..2].to_owned());
            w = format!("-{}", &w[2..]);
        }
        out.push(w);
    }
    out
}

/// Whether sbatch's option `opt` (as written, without `=value`) takes the next word as its
/// value on sbatch's command line.
pub fn sbatch_takes_value(opt: &str) -> bool {
    TAKES_VALUE.contains(&long_name(opt)) || !(NO_VALUE.contains(&opt) || NO_VALUE.contains(&long_name(opt)))
}

/// Reads the options of one `#SBATCH` line (`from`: `"#SBATCH "`), or of sbatch's command
/// line (`from`: `""`), into `r`.
pub fn read_sbatch(words: &[String], r: &mut Request, from: &str) -> Result<()> {
    let words = &unbundled(words);
    let mut i = 0;
    while i < words.len() {
        let w = &words[i];
        let (opt, inline) = match w.split_once('=') {
            Some((o, v)) if o.starts_with("--") => (o.to_owned(), Some(v.to_owned())),
            // A short option's value may follow it at once (`-a1-3`, `-Jtrain`).
            _ if !w.starts_with("--") && w.len() > 2 && w.starts_with('-') && w.is_char_boundary(2) => {
                (w[..2].to_owned(), Some(w[2..].to_owned()))
            }
            _ => (w.clone(), None),
        };
        let long = long_name(&opt);
        let takes = TAKES_VALUE.contains(&long);
        // A short option that takes no value, or is not read, stays one word (`-vv`).
        let (long, inline) =
            if inline.is_some() && opt.len() == 2 && !takes { (w.as_str(), None) } else { (long, inline) };
        let value = if !takes {
            None
        } else if inline.is_some() {
            inline
        } else {
            i += 1;
            Some(words.get(i).cloned().ok_or_else(|| anyhow::anyhow!("{from}{opt}: a value is missing"))?)
        };
        let v = value.as_deref().unwrap_or_default();
        let bad = |what: &str| anyhow::anyhow!("{from}{long}={v}: {what}");
        match long {
            "--job-name" => r.name = Some(v.to_owned()),
            "--nodes" => {
                r.nodes = Some(v.split('-').next().unwrap_or(v).parse().map_err(|_| bad("not a number of nodes"))?)
            }
            "--ntasks" => r.tasks = Some(v.parse().map_err(|_| bad("not a number of tasks"))?),
            "--ntasks-per-node" => r.tasks_per_node = Some(v.parse().map_err(|_| bad("not a number of tasks"))?),
            "--cpus-per-task" => r.cpus_per_task = Some(v.parse().map_err(|_| bad("not a number of CPUs"))?),
            "--time" if no_time_limit(v) => r.time_seconds = None,
            "--time" => {
                r.time_seconds =
                    Some(slurm_time(v).ok_or_else(|| bad("not a Slurm time (minutes, HH:MM:SS, D-HH:MM…)"))?)
            }
            "--partition" => r.partition = Some(v.to_owned()),
            // sbatch's way of saying none (a site's default GRES is not Berth's).
            "--gres" if v.trim() == "none" => (r.gpu_type, r.gpus_per_node) = (None, None),
            "--gres" => {
                let (ty, n) = gres(v).ok_or_else(|| bad("not gpu[:TYPE]:COUNT (one GPU type a job)"))?;
                r.gpu_type = ty.or(r.gpu_type.take());
                r.gpus_per_node = Some(n);
            }
            "--gpus" | "--gpus-per-node" | "--gpus-per-task" => {
                let (ty, n) = match v.rsplit_once(':') {
                    Some((t, n)) => (Some(t.to_owned()), n),
                    None => (None, v),
                };
                let n: f64 = n.parse().map_err(|_| bad("not a number of GPUs"))?;
                r.gpu_type = ty.or(r.gpu_type.take());
                match long {
                    "--gpus" => r.gpus_total = Some(n),
                    "--gpus-per-node" => r.gpus_per_node = Some(n),
                    _ => r.gpus_per_task = Some(n),
                }
            }
            // `--mem=0`: all of a node's memory, so no request of a size.
            "--mem" => {
                r.mem_per_node_mib = Some(mib(v).ok_or_else(|| bad("not a size (e.g. 32G)"))?).filter(|&m| m > 0)
            }
            "--mem-per-cpu" => r.mem_per_cpu_mib = Some(mib(v).ok_or_else(|| bad("not a size (e.g. 4G)"))?),
            "--mem-per-gpu" => r.mem_per_gpu_mib = Some(mib(v).ok_or_else(|| bad("not a size (e.g. 40G)"))?),
            "--cpus-per-gpu" => r.cpus_per_gpu = Some(v.parse().map_err(|_| bad("not a number of CPUs"))?),
            // `cpu=4,gres/gpu:h100:2` (each task's).
            "--tres-per-task" => {
                for item in v.split(',') {
                    let gpu = item.strip_prefix("gres/gpu").or_else(|| item.strip_prefix("gres:gpu"));
                    match (item.split_once('='), gpu) {
                        (Some(("cpu", n)), _) => {
                            r.cpus_per_task = Some(n.parse().map_err(|_| bad("cpu=N: not a number of CPUs"))?)
                        }
                        (_, Some(rest)) => {
                            let (ty, n) = gres(&format!("gpu{}", rest.replace('=', ":")))
                                .ok_or_else(|| bad("not gres/gpu[:TYPE]:COUNT"))?;
                            r.gpu_type = ty.or(r.gpu_type.take());
                            r.gpus_per_task = Some(n);
                        }
                        _ => return Err(bad(&format!("{item}: Berth reads cpu=N and gres/gpu[:TYPE]:N here"))),
                    }
                }
            }
            // Counts Berth cannot turn into its tasks' GPUs: refused rather than dropped
            // (a job of other GPUs than asked).
            "--gpus-per-socket" => bail!(
                "{from}{long}={v}: Berth does not place GPUs by socket: ask per node (--gpus-per-node) or per task \
                 (--gpus-per-task)"
            ),
            "--ntasks-per-gpu" => {
                bail!("{from}{long}={v}: give the tasks (--ntasks) and each one's GPUs (--gpus-per-task) instead")
            }
            "--wrap" => bail!(
                "{from}--wrap: Berth runs a batch script: put the command in one (or run a container: berth run \
                 --image IMG -- CMD)"
            ),
            "--export" => export(v, r),
            "--priority" => r.priority = Some(v.parse().map_err(|_| bad("not a number"))?),
            "--array" => r.array = Some(Array::parse(v).map_err(|e| bad(&e))?),
            // What says when a job may start: left out, the job would start at once (a
            // pipeline's steps out of order), so it is refused.
            "--dependency" => bail!(
                "{from}{long}={v}: Berth does not hold a job until others end; submit it once they have \
                 (or remove the option)"
            ),
            "--begin" => bail!("{from}{long}={v}: Berth does not defer a job's start; submit it when it should run"),
            "--hold" => bail!("{from}--hold: Berth does not hold a job; submit it when it should run"),
            // Left out, a pipeline that waits for the job's end would go on at once.
            "--wait" => bail!(
                "{from}--wait: berth submit does not wait for the job to end; follow it with berth logs -f NAME, \
                 which ends when the job does"
            ),
            // Left out, a check would submit the job.
            "--test-only" => r.test_only = true,
            "--parsable" => r.parsable = true,
            _ => r.ignored.push(w.clone()),
        }
        i += 1;
    }
    Ok(())
}

/// sbatch's `--export`: `NAME=value` is set in the job's environment, a bare `NAME` passes
/// this shell's value on; `ALL` (sbatch's default: the whole submitting environment) and
/// `NONE` pass nothing more here, which is said.
fn export(v: &str, r: &mut Request) {
    for item in v.split(',').filter(|i| !i.is_empty()) {
        match item.split_once('=') {
            Some((name, value)) => r.env.push((name.to_owned(), value.to_owned())),
            None if ["ALL", "NONE", "NIL"].contains(&item) => {
                if item == "ALL" {
                    r.notes.push(
                        "--export=ALL: the job gets only the variables named (NAME=value, or NAME for this shell's \
                         value), not this shell's whole environment"
                            .into(),
                    );
                }
            }
            None => match std::env::var(item) {
                Ok(value) => r.env.push((item.to_owned(), value)),
                Err(_) => r.notes.push(format!("--export={item}: {item} is not set here, so the job has none")),
            },
        }
    }
}

/// Reads sbatch's command line into `r`, over what the script asked: a GPU count given
/// there replaces the script's (`-G 4` over `#SBATCH --gres=gpu:8`), as a memory size does.
///
/// # Errors
/// As [`read_sbatch`].
pub fn read_command_line(words: &[String], r: &mut Request) -> Result<()> {
    let given = |names: &[&str]| {
        words.iter().any(|w| {
            let opt = w.split_once('=').map_or(w.as_str(), |(o, _)| o);
            let opt = if opt.starts_with("--") { opt } else { opt.get(..2).unwrap_or(opt) };
            names.contains(&long_name(opt))
        })
    };
    if given(&["--gres", "--gpus", "--gpus-per-node", "--gpus-per-task", "--tres-per-task"]) {
        (r.gpus_per_node, r.gpus_per_task, r.gpus_total) = (None, None, None);
    }
    if given(&["--mem", "--mem-per-cpu", "--mem-per-gpu"]) {
        (r.mem_per_node_mib, r.mem_per_cpu_mib, r.mem_per_gpu_mib) = (None, None, None);
    }
    read_sbatch(words, r, "")
}

/// A job array: sbatch's `--array` (`0-15`, `1,3,5-7`, `0-15:4`, `0-99%10`).
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    /// The indices, ascending, each once.
    pub indices: Vec<u32>,
    /// The step of a single stepped range (`0-15:4`), else 1 (as Slurm's `SLURM_ARRAY_TASK_STEP`).
    pub step: u32,
    /// How many may run at once (`%N`): read so it can be said that it is not kept.
    pub at_once: Option<u32>,
}

impl Array {
    /// The most indices of one array: what one batch of workloads holds.
    pub const MOST: usize = 1000;

    /// Reads sbatch's `--array` value.
    ///
    /// # Errors
    /// What is wrong with it, in words.
    pub fn parse(v: &str) -> std::result::Result<Self, String> {
        let (list, at_once) = match v.split_once('%') {
            Some((list, n)) => {
                (list, Some(n.parse::<u32>().ok().filter(|&n| n > 0).ok_or("%N: not a positive number")?))
            }
            None => (v, None),
        };
        let number = |s: &str| s.trim().parse::<u32>().map_err(|_| format!("{s:?} is not an index"));
        let mut indices = std::collections::BTreeSet::new();
        let mut steps = Vec::new();
        for item in list.split(',') {
            // The item named where there are several.
            let at = |what: &str| if list.contains(',') { format!("{item}: {what}") } else { what.to_owned() };
            let (range, step) = match item.split_once(':') {
                Some((range, step)) => {
                    (range, step.parse::<u32>().ok().filter(|&s| s > 0).ok_or_else(|| at("not a positive step"))?)
                }
                None => (item, 1),
            };
            let (first, last) = match range.split_once('-') {
                Some((a, b)) => (number(a)?, number(b)?),
                None => (number(range)?, number(range)?),
            };
            if first > last {
                return Err(at("the range ends before it starts"));
            }
            steps.push(step);
            let mut i = first;
            while i <= last {
                indices.insert(i);
                if indices.len() > Self::MOST {
                    return Err(format!("more than {} indices: submit it in parts", Self::MOST));
                }
                i = match i.checked_add(step) {
                    Some(next) => next,
                    None => break,
                };
            }
        }
        let step = if steps.len() == 1 { steps[0] } else { 1 };
        Ok(Self { indices: indices.into_iter().collect(), step, at_once })
    }

    /// What Slurm tells an array's task about the array (`SLURM_ARRAY_JOB_ID`, Slurm's id
    /// of the whole array, has no counterpart: each index is a workload of its own).
    pub fn environment(&self, index: u32) -> Vec<(&'static str, String)> {
        let (min, max) = (self.indices[0], self.indices[self.indices.len() - 1]);
        vec![
            ("SLURM_ARRAY_TASK_ID", index.to_string()),
            ("SLURM_ARRAY_TASK_MIN", min.to_string()),
            ("SLURM_ARRAY_TASK_MAX", max.to_string()),
            ("SLURM_ARRAY_TASK_COUNT", self.indices.len().to_string()),
            ("SLURM_ARRAY_TASK_STEP", self.step.to_string()),
        ]
    }
}

/// `gpu:h100:2`, `gpu:2` → (type, count).
fn gres(v: &str) -> Option<(Option<String>, f64)> {
    // One GPU request: a job's tasks have one shape (two GPU types in one job are refused).
    let mut gpus = v.split(',').filter(|g| g.starts_with("gpu"));
    let first = gpus.next().filter(|_| gpus.next().is_none())?;
    let parts: Vec<&str> = first.split(':').collect();
    match parts.as_slice() {
        ["gpu"] => Some((None, 1.0)),
        ["gpu", n] if n.parse::<f64>().is_ok() => Some((None, n.parse().ok()?)),
        ["gpu", t] => Some((Some((*t).to_owned()), 1.0)),
        ["gpu", t, n] => Some((Some((*t).to_owned()), n.parse().ok()?)),
        _ => None,
    }
}

/// No time limit, as sbatch reads `--time`: `0` (in any of its formats: `00:00:00`),
/// `UNLIMITED`, `INFINITE`.
pub fn no_time_limit(v: &str) -> bool {
    ["unlimited", "infinite"].contains(&v.trim().to_ascii_lowercase().as_str()) || slurm_time(v) == Some(0)
}

/// Slurm's time formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`; also `4h`,
/// `30m`, `2d` as `berth submit --time` takes them.
pub fn slurm_time(v: &str) -> Option<u64> {
    let v = v.trim();
    if let Some(n) = v.strip_suffix('d') {
        return n.parse::<u64>().ok().map(|n| n * 86_400);
    }
    if let Some(n) = v.strip_suffix('h') {
        return n.parse::<u64>().ok().map(|n| n * 3600);
    }
    if let Some(n) = v.strip_suffix('m') {
        return n.parse::<u64>().ok().map(|n| n * 60);
    }
    if let Some(n) = v.strip_suffix('s') {
        return n.parse::<u64>().ok();
    }
    let (days, rest) = match v.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().ok()?, Some(r)),
        None => (0, None),
    };
    let nums: Vec<u64> = rest.unwrap_or(v).split(':').map(|p| p.parse().ok()).collect::<Option<_>>()?;
    let secs = match (rest.is_some(), nums.as_slice()) {
        (false, [m]) => m * 60,
        (false, [m, s]) => m * 60 + s,
        (_, [h, m, s]) => h * 3600 + m * 60 + s,
        (true, [h]) => h * 3600,
        (true, [h, m]) => h * 3600 + m * 60,
        _ => return None,
    };
    Some(days * 86_400 + secs)
}

/// `32G`, `500M`, `1T`, `4096` (MiB, as Slurm) → MiB.
fn mib(v: &str) -> Option<u64> {
    let v = v.trim();
    let (n, unit) = v.find(|c: char| c.is_ascii_alphabetic()).map_or((v, ""), |i| v.split_at(i));
    let n: u64 = n.parse().ok()?;
    Some(match unit.to_ascii_uppercase().as_str() {
        "" | "M" | "MB" => n,
        "K" | "KB" => n.div_ceil(1024),
        "G" | "GB" => n * 1024,
        "T" | "TB" => n * 1024 * 1024,
        _ => return None,
    })
}

/// A DNS label from a job name (its first 63 characters), or `None` when it has no letter
/// or digit.
pub fn dns_label(name: &str) -> Option<String> {
    let s: String =
        name.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).collect();
    let s = shortened(s.trim_matches('-'), 63).to_owned();
    (!s.is_empty()).then_some(s)
}

/// A DNS label's first `most` characters, without a `-` at the end.
pub fn shortened(label: &str, most: usize) -> &str {
    label[..label.len().min(most)].trim_end_matches('-')
}

/// The workload spec: `flavor` is the flavor the request's GPU type or partition named
/// (resolved by the caller against the server's flavors and clusters).
pub fn spec(r: &Request, flavor: &str, script: &str) -> Result<Value> {
    // More nodes than tasks: as Slurm ("can't run 1 processes on 2 nodes, setting nnodes
    // to 1"); asking a node's GPUs of nodes no task runs on would ask for more.
    // Tasks and tasks a node without nodes: as many nodes as that takes, as Slurm.
    let nodes = match (r.nodes, r.tasks, r.tasks_per_node) {
        (Some(n), t, _) => n.max(1).min(t.unwrap_or(u32::MAX).max(1)),
        (None, Some(t), Some(per)) if per > 0 => t.div_ceil(per).max(1),
        _ => 1,
    };
    let tasks = match (r.tasks, r.tasks_per_node) {
        (Some(n), _) => n,
        (None, Some(per)) => per * nodes,
        (None, None) => nodes,
    };
    if tasks == 0 {
        bail!("a workload has at least one task");
    }
    let per_node_tasks = f64::from(tasks) / f64::from(nodes);
    let gpus = match (r.gpus_per_task, r.gpus_per_node, r.gpus_total) {
        (Some(g), ..) => g,
        (None, Some(g), _) => g / per_node_tasks,
        (None, None, Some(g)) => g / f64::from(tasks),
        (None, None, None) => 0.0,
    };
    // Each task gets whole GPUs, or a share of one in hundredths: a node's or the job's GPUs
    // that do not split so over its tasks are refused here, naming what was asked.
    let hundredths = gpus * 100.0;
    if r.gpus_per_task.is_none()
        && (gpus > 1.0 && gpus.fract() != 0.0 || (hundredths - hundredths.round()).abs() > 1e-9)
    {
        let (asked, over) = match r.gpus_per_node {
            Some(g) => (format!("{g} GPUs a node"), format!("{per_node_tasks} tasks a node")),
            None => (format!("{} GPUs", r.gpus_total.unwrap_or_default()), format!("{tasks} tasks")),
        };
        bail!(
            "{asked} over {over} is {gpus:.2} GPUs a task; a task gets whole GPUs or a share of one: \
             ask for a multiple of the tasks, or give --gpus-per-task"
        );
    }
    let mut resources = json!({"flavors": [flavor], "gpus": gpus});
    // Per GPU: a task's share of them (rounded up for CPUs).
    let cpus = r.cpus_per_task.or(r.cpus_per_gpu.map(|c| (f64::from(c) * gpus).ceil() as u32).filter(|&c| c > 0));
    if let Some(c) = cpus {
        resources["cpus"] = json!(c);
    }
    let memory = match (r.mem_per_node_mib, r.mem_per_cpu_mib, r.mem_per_gpu_mib) {
        (Some(m), ..) => Some((m as f64 / per_node_tasks).floor() as u64),
        (None, Some(m), _) => Some(m * u64::from(cpus.unwrap_or(1))),
        (None, None, Some(m)) => Some((m as f64 * gpus).floor() as u64).filter(|&m| m > 0),
        _ => None,
    };
    if let Some(m) = memory {
        resources["memory_mib"] = json!(m);
    }
    let kind = r.kind.clone().unwrap_or_else(|| if tasks > 1 { "training".into() } else { "batch".into() });
    let mut spec = json!({
        "kind": kind,
        "tasks": {"count": tasks, "resources": resources},
        "run": {"script": script},
    });
    if let Some(t) = r.time_seconds {
        spec["max_runtime_seconds"] = json!(t);
    }
    if let Some(p) = r.priority {
        spec["priority"] = json!(p);
    }
    if let Some(p) = r.preemptible {
        spec["preemptible"] = json!(p);
    }
    if let Some(image) = &r.image {
        spec["run"]["image"] = json!(image);
    }
    if let Some(s) = r.sim_seconds {
        spec["sim"] = json!({"duration_seconds": s});
    }
    for (k, v) in &r.env {
        spec["run"]["env"][k] = json!(v);
    }
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(script: &str) -> Request {
        let (sbatch, _) = directives(script);
        let mut r = Request::default();
        for line in &sbatch {
            read_sbatch(line, &mut r, "#SBATCH ").unwrap();
        }
        r
    }

    #[test]
    fn an_sbatch_script_reads_as_sbatch_reads_it() {
        let script = "#!/bin/bash\n#SBATCH --job-name=Train_LLM\n#SBATCH --gres=gpu:h100:2 --nodes=2\n#SBATCH -t 01:00:00\n#SBATCH --mem=64G -c 8 --mail-type=END # a comment\n\nsrun python train.py\n#SBATCH --nodes=9\n";
        let r = read(script);
        assert_eq!(r.name.as_deref(), Some("Train_LLM"));
        assert_eq!((r.nodes, r.gpus_per_node, r.gpu_type.as_deref()), (Some(2), Some(2.0), Some("h100")));
        assert_eq!(r.time_seconds, Some(3600));
        assert_eq!((r.mem_per_node_mib, r.cpus_per_task), (Some(65_536), Some(8)));
        assert_eq!(r.ignored, ["--mail-type=END"], "the directive after the first command is not read");
        let spec = spec(&r, "h100", script).unwrap();
        assert_eq!(
            spec["tasks"],
            json!({"count": 2, "resources": {"flavors": ["h100"], "gpus": 2.0, "cpus": 8, "memory_mib": 65_536}})
        );
        assert_eq!((spec["kind"].as_str(), spec["max_runtime_seconds"].as_u64()), (Some("training"), Some(3600)));
        assert_eq!(dns_label("Train_LLM").as_deref(), Some("train-llm"));
    }

    #[test]
    fn an_array_reads_as_sbatch_reads_it() {
        let a = |v: &str| Array::parse(v).unwrap();
        assert_eq!(a("0-15:4"), Array { indices: vec![0, 4, 8, 12], step: 4, at_once: None });
        assert_eq!(a("1,3,5-7%2"), Array { indices: vec![1, 3, 5, 6, 7], step: 1, at_once: Some(2) });
        assert_eq!(a("4-6,5,1").indices, [1, 4, 5, 6], "ascending, each once");
        assert_eq!(a("0-999").indices.len(), 1000);
        assert_eq!(
            a("7").environment(7)[..3],
            [
                ("SLURM_ARRAY_TASK_ID", "7".into()),
                ("SLURM_ARRAY_TASK_MIN", "7".into()),
                ("SLURM_ARRAY_TASK_MAX", "7".into())
            ]
        );
        for (bad, says) in [
            ("0-1000", "more than 1000 indices"),
            ("3-1", "ends before it starts"),
            ("1-9:0", "not a positive step"),
            ("1-9%0", "%N: not a positive number"),
            ("", "is not an index"),
            ("1,,2", "is not an index"),
            ("-3", "is not an index"),
        ] {
            let err = Array::parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        assert_eq!(Array::parse("1-9:0").unwrap_err(), "not a positive step", "said once with the option");
        assert_eq!(Array::parse("1,9-3").unwrap_err(), "9-3: the range ends before it starts");
        let r = read("#SBATCH -a 2-3 --job-name=x\n");
        assert_eq!((r.array.map(|a| a.indices), r.ignored.len()), (Some(vec![2, 3]), 0));
        // A short option's value may follow it at once, as getopt reads it.
        let r = read("#SBATCH -a1-2 -Jsweep -N2 -vv\n");
        assert_eq!(
            (r.array.map(|a| a.indices), r.name.as_deref(), r.nodes),
            (Some(vec![1, 2]), Some("sweep"), Some(2))
        );
        assert_eq!(r.ignored, ["-v", "-v"]);
        // Short options written together, as getopt reads them: -Q takes no value.
        let r = read("#SBATCH -QN2 -vJx\n");
        assert_eq!(
            (r.nodes, r.name.as_deref(), r.ignored),
            (Some(2), Some("x"), vec!["-Q".to_owned(), "-v".to_owned()])
        );
        // A value is on its option's line: a bare option does not take the next line's.
        let (sbatch, _) = directives("#SBATCH -J\n#SBATCH --array=0-3\n");
        let mut r = Request::default();
        let err = read_sbatch(&sbatch[0], &mut r, "#SBATCH ").unwrap_err().to_string();
        assert_eq!(err, "#SBATCH -J: a value is missing");
        // A long name is shortened to a DNS label, not dropped.
        assert_eq!(dns_label(&"B".repeat(70)), Some("b".repeat(63)));
        assert_eq!(shortened("ab-cd", 3), "ab");
    }

    #[test]
    fn no_time_limit_all_memory_and_gpus_that_do_not_split_over_the_tasks() {
        for unlimited in ["0", "UNLIMITED", "infinite"] {
            let r = read(&format!("#SBATCH -t 1:00:00\n#SBATCH --time={unlimited} --mem=0\n"));
            assert_eq!((r.time_seconds, r.mem_per_node_mib), (None, None), "{unlimited}");
            let spec = spec(&r, "h100", "").unwrap();
            assert!(
                spec.get("max_runtime_seconds").is_none() && spec["tasks"]["resources"].get("memory_mib").is_none()
            );
        }
        // Zero in any format is no limit, as sbatch reads it (a limit of 0 was refused).
        assert!(
            no_time_limit(" Infinite") && no_time_limit("00:00:00") && no_time_limit("0-0") && !no_time_limit("0:01")
        );
        // More nodes than tasks: Slurm takes as many nodes as tasks, so a node's GPUs and
        // memory are asked once a task (-N2 -n1 asked for 8 GPUs and 128 GiB).
        let one = spec(&read("#SBATCH -N2 -n1 --gres=gpu:h100:4 --mem=64G\n"), "h100", "").unwrap();
        assert_eq!(
            one["tasks"],
            json!({"count": 1, "resources": {"flavors": ["h100"], "gpus": 4.0, "memory_mib": 65536}})
        );
        let two = spec(&read("#SBATCH -N4 -n2 --gres=gpu:h100:4\n"), "h100", "").unwrap();
        assert_eq!((two["tasks"]["count"].as_u64(), two["tasks"]["resources"]["gpus"].as_f64()), (Some(2), Some(4.0)));
        // --gres=none asks for none; two GPU types in one job are refused, not one dropped.
        let none = read("#SBATCH --gres=gpu:h100:2\n#SBATCH --gres=none\n");
        assert_eq!(
            (none.gpus_per_node, spec(&none, "h100", "").unwrap()["tasks"]["resources"]["gpus"].as_f64()),
            (None, Some(0.0))
        );
        let mut two_types = Request::default();
        let err =
            read_sbatch(&words("--gres=gpu:h100:2,gpu:a100:1"), &mut two_types, "#SBATCH ").unwrap_err().to_string();
        assert!(err.contains("one GPU type a job"), "{err}");
        let err = spec(&read("#SBATCH --ntasks=3 --gres=gpu:h100:8\n"), "h100", "").unwrap_err().to_string();
        assert!(err.starts_with("8 GPUs a node over 3 tasks a node is 2.67 GPUs a task"), "{err}");
        let err = spec(&read("#SBATCH -n 3 --gpus=2\n"), "h100", "").unwrap_err().to_string();
        assert!(err.starts_with("2 GPUs over 3 tasks"), "{err}");
        let even = spec(&read("#SBATCH --ntasks=4 --gres=gpu:8\n"), "h100", "").unwrap();
        assert_eq!(even["tasks"], json!({"count": 4, "resources": {"flavors": ["h100"], "gpus": 2.0}}));
        let shared = spec(&read("#SBATCH --ntasks=4 --gres=gpu:1\n"), "h100", "").unwrap();
        assert_eq!(shared["tasks"]["resources"]["gpus"], 0.25);
    }

    #[test]
    fn tasks_split_a_nodes_gpus_and_times_read_every_slurm_format() {
        let r = read("#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=8\n");
        let spec = spec(&r, "a100", "x").unwrap();
        assert_eq!(
            (spec["tasks"]["count"].as_u64(), spec["tasks"]["resources"]["gpus"].as_f64()),
            (Some(8), Some(2.0))
        );
        for (t, s) in [
            ("30", 1800),
            ("5:30", 330),
            ("2:00:00", 7200),
            ("1-0", 86_400),
            ("1-2:30", 95_400),
            ("1-00:00:10", 86_410),
            ("4h", 14_400),
        ] {
            assert_eq!(slurm_time(t), Some(s), "{t}");
        }
        assert_eq!(slurm_time("soon"), None);
        assert_eq!(gres("gpu"), Some((None, 1.0)));
        assert_eq!(gres("gpu:4"), Some((None, 4.0)));
        assert!(read_sbatch(&["--nodes".into()], &mut Request::default(), "#SBATCH ").is_err());
        assert_eq!(words(r#"--job-name="a b" -N 1 # note"#), ["--job-name=a b", "-N", "1"]);
    }

    #[test]
    fn what_would_hold_a_job_back_is_refused_not_left_out() {
        let refused = |line: &str| {
            let mut r = Request::default();
            read_sbatch(&words(line), &mut r, "#SBATCH ").map(|()| r.ignored).unwrap_err().to_string()
        };
        for (line, says) in [
            ("--dependency=afterok:12", "#SBATCH --dependency=afterok:12: Berth does not hold a job until others end"),
            ("-d afterany:3", "#SBATCH --dependency=afterany:3: Berth does not hold"),
            ("--begin=now+1hour", "#SBATCH --begin=now+1hour: Berth does not defer"),
            ("-b 16:00", "#SBATCH --begin=16:00: Berth does not defer"),
            ("--hold", "#SBATCH --hold: Berth does not hold a job"),
            ("-H", "#SBATCH --hold: Berth does not hold a job"),
        ] {
            let err = refused(line);
            assert!(err.starts_with(says), "{line}: {err}");
        }
        // What does not change when a job starts is still only left out.
        let r = read("#SBATCH --mail-type=END -p gpu,debug\n");
        assert_eq!((r.ignored, r.partition.as_deref()), (vec!["--mail-type=END".to_owned()], Some("gpu,debug")));
    }

    #[test]
    fn sbatch_options_on_the_command_line_split_from_berths_own_and_the_script() {
        let own = |o: &str| match o {
            "--team" | "-a" => Some(true),
            "--dry-run" => Some(false),
            _ => None,
        };
        let w = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let line =
            CommandLine::split(&w("-J x --team nlp --exclusive -t 30 --qos high -Jy --dry-run -a0-3 job.sh a -b"), own)
                .unwrap();
        assert_eq!(line.sbatch, w("-J x --exclusive -t 30 --qos high -Jy"));
        assert_eq!(line.berth, w("--team nlp --dry-run -a0-3"));
        assert_eq!((line.script.as_str(), line.args, line.output), ("job.sh", w("a -b"), None));
        // After the script, Berth's options are still Berth's, -o too (before it, sbatch's).
        let line = CommandLine::split(&w("-o out.txt job.sh --team nlp -o json"), own).unwrap();
        assert_eq!((line.sbatch, line.berth), (w("-o out.txt"), w("--team nlp")));
        assert_eq!((line.args.len(), line.output.as_deref()), (0, Some("json")));
        assert_eq!(CommandLine::split(&w("-N 2 -"), own).unwrap().script, "-", "standard input");
        let no_script = CommandLine::split(&w("-J x"), own).unwrap_err().to_string();
        assert!(no_script.starts_with("no batch script"), "{no_script}");
        assert_eq!(CommandLine::split(&w("-J"), own).unwrap_err().to_string(), "-J: a value is missing");
    }

    #[test]
    fn the_command_line_wins_over_the_script_and_replaces_its_gpu_count_and_memory() {
        let mut r = read("#!/bin/bash\n#SBATCH --gres=gpu:h100:8 --mem=64G -n 2 -J a\nhostname\n");
        read_command_line(&words("-G 4 --mem-per-cpu=1G -J b"), &mut r).unwrap();
        assert_eq!((r.gpus_per_node, r.gpus_total, r.gpu_type.as_deref()), (None, Some(4.0), Some("h100")));
        assert_eq!(
            (r.mem_per_node_mib, r.mem_per_cpu_mib, r.tasks, r.name.as_deref()),
            (None, Some(1024), Some(2), Some("b"))
        );
        let mut r = Request::default();
        read_command_line(&words("--test-only --parsable"), &mut r).unwrap();
        assert!(r.test_only && r.parsable);
        let wait = read_command_line(&words("-W"), &mut r).unwrap_err().to_string();
        assert!(wait.starts_with("--wait: berth submit does not wait"), "{wait}");
        let err = read_command_line(&words("-t soon"), &mut r).unwrap_err().to_string();
        assert!(err.starts_with("--time=soon: not a Slurm time"), "{err}");
        let err = read_sbatch(&words("-t soon"), &mut r, "#SBATCH ").unwrap_err().to_string();
        assert!(err.starts_with("#SBATCH --time=soon: "), "{err}");
    }

    #[test]
    fn options_that_change_the_count_are_read_as_sbatch_reads_them_or_refused() {
        let spec = |script: &str| spec(&read(script), "h100", "").unwrap();
        let tasks = |s: &Value| (s["tasks"]["count"].as_u64(), s["tasks"]["resources"]["gpus"].as_f64());
        // Tasks and tasks a node give the nodes (4 × 1 task × 2 GPUs): it was 4 tasks of half
        // a GPU on one node.
        let ddp = spec("#SBATCH --ntasks=4 --ntasks-per-node=1 --gres=gpu:h100:2 --mem=200G\n");
        assert_eq!(
            (tasks(&ddp), ddp["tasks"]["resources"]["memory_mib"].as_u64()),
            ((Some(4), Some(2.0)), Some(204_800))
        );
        let alias = spec("#SBATCH -n 16 --tasks-per-node=8 --gres=gpu:8\n");
        assert_eq!(tasks(&alias), (Some(16), Some(1.0)), "--tasks-per-node is --ntasks-per-node");
        // Each task's TRES, and per GPU CPUs and memory.
        let tres = spec("#SBATCH -n 2 --tres-per-task=cpu=4,gres/gpu:a100:2\n");
        assert_eq!((tasks(&tres), tres["tasks"]["resources"]["cpus"].as_f64()), ((Some(2), Some(2.0)), Some(4.0)));
        assert_eq!(read("#SBATCH --tres-per-task=gres/gpu:a100:2\n").gpu_type.as_deref(), Some("a100"));
        let per_gpu = spec("#SBATCH -G 2 --cpus-per-gpu=8 --mem-per-gpu=40G\n");
        assert_eq!(per_gpu["tasks"]["resources"]["cpus"].as_f64(), Some(16.0));
        assert_eq!(per_gpu["tasks"]["resources"]["memory_mib"].as_u64(), Some(81_920));
        // --export: NAME=value set, a bare NAME passed on with this shell's value.
        let exported = spec("#SBATCH --export=ALL,LR=0.1,PATH\n");
        assert_eq!(exported["run"]["env"]["LR"], "0.1");
        assert_eq!(exported["run"]["env"]["PATH"].as_str(), std::env::var("PATH").ok().as_deref());
        assert!(read("#SBATCH --export=ALL\n").notes[0].starts_with("--export=ALL: the job gets only"));
        // What Berth cannot turn into GPUs a task is refused, not dropped.
        for (line, says) in [
            ("--gpus-per-socket=h100:4", "does not place GPUs by socket"),
            ("--ntasks-per-gpu=2", "give the tasks"),
            ("--tres-per-task=license/x:1", "Berth reads cpu=N and gres/gpu"),
            ("--wrap=hostname", "Berth runs a batch script"),
        ] {
            let err = read_sbatch(&words(line), &mut Request::default(), "#SBATCH ").unwrap_err().to_string();
            assert!(err.contains(says), "{line}: {err}");
        }
    }

    #[test]
    fn the_command_line_ends_its_options_at_a_double_dash_and_says_what_wrap_needs() {
        let own = |_: &str| None;
        let w = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        let line = CommandLine::split(&w("-N 2 -- job.sh"), own).unwrap();
        assert_eq!((line.sbatch, line.script.as_str()), (w("-N 2"), "job.sh"));
        let line = CommandLine::split(&w("-vN 2 job.sh"), own).unwrap();
        assert_eq!((line.sbatch, line.script.as_str()), (w("-v -N 2"), "job.sh"), "bundled short options");
        let wrap = CommandLine::split(&w("--wrap=hostname"), own).unwrap_err().to_string();
        assert!(wrap.starts_with("--wrap: Berth runs a batch script"), "{wrap}");
    }
}
