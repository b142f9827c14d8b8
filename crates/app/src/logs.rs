//! A workload's logs: what its job printed. Simulated and Kubernetes jobs serve their
//! output through their backend (a Kubernetes pod's log, followed as it grows if asked). A
//! Slurm job writes its output to a file on the cluster (`status.backend_ref.output`);
//! berthd reads it where it can (a shared filesystem, as on the dev clusters) and otherwise
//! says where it is.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use berth_adapters::{BackendError, JobKey, LogRequest, LogStream, Registry};
use berth_core::Error;
use berth_core::cluster::ClusterKind;
use futures_util::StreamExt;

use crate::context::OpContext;
use crate::workload::not_found;

/// The most of a Slurm output file one answer carries: its last MiB.
pub const MAX_BYTES: u64 = 1 << 20;

/// Which output a caller wants.
#[derive(Debug, Clone, Default)]
pub struct LogsQuery {
    /// The task (0-based); 0 by default.
    pub task: u32,
    /// The attempt; the current one by default.
    pub attempt: Option<u32>,
    /// Only the last this many lines.
    pub tail: Option<u32>,
    /// Keep sending lines as they are printed, until the task ends.
    pub follow: bool,
}

/// What a task of the workload's job printed: all of it (a Slurm file up to its last
/// [`MAX_BYTES`]), or its last `tail` lines, and with `follow` each new line until the task
/// ends (a Slurm file: what it gains, read every second until the attempt has ended).
///
/// # Errors
/// [`Error::NotFound`]; [`Error::Invalid`] for an attempt the workload has not reached or a
/// task it does not have; [`Error::Conflict`] when the workload has no job yet, or its
/// output cannot be read here (the message says why and where it is);
/// [`Error::Unavailable`] when its cluster does not answer; store errors.
pub async fn workload_logs(
    db: &sqlx::PgPool,
    opctx: &OpContext,
    backends: &Registry,
    team: &str,
    name: &str,
    query: &LogsQuery,
) -> Result<LogStream, Error> {
    opctx.access().read_team(team)?;
    let workload = berth_store::workload::workload_fetch(db, team, name).await?.ok_or_else(|| not_found(team, name))?;
    let current = workload.status.attempt;
    let attempt = query.attempt.unwrap_or(current);
    if attempt > current {
        return Err(Error::invalid("attempt", format!("{team}/{name} is on attempt {current}")));
    }
    if query.task >= workload.spec.tasks.count {
        let count = workload.spec.tasks.count;
        let tasks = if count == 1 { "1 task (0)".to_owned() } else { format!("{count} tasks (0 to {})", count - 1) };
        return Err(Error::invalid("task", format!("{team}/{name} has {tasks}")));
    }
    let job = workload.status.backend_ref.as_ref();
    let Some(cluster_name) = job.map(|j| j.cluster.clone()).or(workload.status.admission.map(|a| a.cluster)) else {
        return Err(Error::conflict(
            "status.backend_ref",
            format!(
                "{team}/{name} has no job on a cluster yet (phase {}), so nothing to read",
                workload.status.phase.as_str()
            ),
        ));
    };
    let cluster = berth_store::cluster::cluster_fetch(db, &cluster_name)
        .await?
        .ok_or_else(|| Error::conflict("status.admission.cluster", format!("cluster {cluster_name} is gone")))?;
    if cluster.spec.kind == ClusterKind::Slurm {
        let job = job.filter(|_| attempt == current);
        let (text, end) = slurm_output(job, query.tail).await?;
        let first = futures_util::stream::once(async move { Ok(text) });
        return Ok(match (query.follow && !workload.status.phase.is_final(), job.and_then(|j| j.output.clone())) {
            (true, Some(path)) => {
                first.chain(follow_output(db.clone(), workload.metadata.uid, current, path, end)).boxed()
            }
            _ => first.boxed(),
        });
    }
    let backend = backends.backend(&cluster).map_err(|e| unreadable(&cluster_name, &e))?;
    let key = JobKey { workload: workload.metadata.uid, attempt };
    let request = LogRequest { task: query.task, tail: query.tail, follow: query.follow };
    backend.logs(key, request).await.map_err(|e| unreadable(&cluster_name, &e))
}

fn unreadable(cluster: &str, e: &BackendError) -> Error {
    match e {
        BackendError::Unreachable(m) => Error::Unavailable(format!("cluster {cluster} did not answer: {m}")),
        BackendError::Rejected(m) | BackendError::Unsupported(m) => {
            Error::conflict("status.backend_ref", format!("cluster {cluster} has no logs to give: {m}"))
        }
    }
}

/// How often a followed Slurm output file is read again.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// What a Slurm job's output file gains from `offset` on, read every [`FOLLOW_EVERY`] until
/// the workload's `attempt` has ended (then once more). Slurm serves no output, so this is
/// `tail -f` of the file berthd reads.
fn follow_output(
    db: sqlx::PgPool,
    uid: uuid::Uuid,
    attempt: u32,
    path: String,
    offset: u64,
) -> impl futures_util::Stream<Item = Result<String, BackendError>> {
    futures_util::stream::unfold(Some(offset), move |offset| {
        let (db, path) = (db.clone(), path.clone());
        async move {
            let mut offset = offset?;
            loop {
                tokio::time::sleep(FOLLOW_EVERY).await;
                // Asked before the read, so that what the job printed last is read after it ended.
                let ended = match berth_store::workload::workload_fetch_many(&db, &[uid]).await {
                    Ok(found) => found.first().is_none_or(|w| w.status.phase.is_final() || w.status.attempt != attempt),
                    Err(e) => return Some((Err(BackendError::Unreachable(e.to_string())), None)),
                };
                let read = {
                    let path = path.clone();
                    tokio::task::spawn_blocking(move || read_from(&path, offset)).await
                };
                let (text, end) = match read {
                    Ok(Ok(read)) => read,
                    Ok(Err(why)) => return Some((Err(BackendError::Rejected(why)), None)),
                    Err(e) => return Some((Err(BackendError::Rejected(e.to_string())), None)),
                };
                offset = end;
                let next = (!ended).then_some(offset);
                if !text.is_empty() || ended {
                    return (!text.is_empty() || next.is_some()).then_some((Ok(text), next));
                }
            }
        }
    })
}

/// A Slurm job's output file, read here where the filesystem is shared with the cluster,
/// and where it ended then.
async fn slurm_output(
    job: Option<&berth_core::workload::BackendRef>,
    tail: Option<u32>,
) -> Result<(String, u64), Error> {
    let Some(job) = job else {
        return Err(Error::conflict(
            "attempt",
            "Berth knows where the output of the current attempt of a Slurm job is only".to_owned(),
        ));
    };
    let Some(path) = job.output.clone() else {
        return Err(Error::conflict(
            "status.backend_ref.output",
            format!("job {} on cluster {} keeps no output file Berth can read", job.job_id, job.cluster),
        ));
    };
    let read = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || read_output(&path, tail))
            .await
            .map_err(|e| Error::Internal(format!("reading logs: {e}")))?
    };
    read.map_err(|why| {
        Error::conflict(
            "status.backend_ref.output",
            format!(
                "job {} wrote its output to {path} on cluster {}, which berthd cannot read ({why}); read it there",
                job.job_id, job.cluster
            ),
        )
    })
}

/// Reads a job's output file (its last [`MAX_BYTES`]), and where it ended. The job's own
/// user can replace it, so it must still be a regular file when opened, not a link (which
/// could point at berthd's secrets) or a FIFO (which would block).
fn read_output(path: &str, tail: Option<u32>) -> Result<(String, u64), String> {
    let (mut file, len) = open_output(path)?;
    let start = len.saturating_sub(MAX_BYTES);
    let (text, end) = read_span(&mut file, start)?;
    Ok((
        match tail {
            None => text,
            Some(n) => {
                let lines: Vec<&str> = text.split_inclusive('\n').collect();
                lines[lines.len().saturating_sub(n as usize)..].concat()
            }
        },
        end,
    ))
}

/// What the output file holds from `offset` on (at most [`MAX_BYTES`]), and where that ends.
fn read_from(path: &str, offset: u64) -> Result<(String, u64), String> {
    let (mut file, len) = open_output(path)?;
    // A file cut shorter (the job's user truncated it) is read from its start again.
    read_span(&mut file, if len < offset { 0 } else { offset })
}

fn read_span(file: &mut std::fs::File, start: u64) -> Result<(String, u64), String> {
    file.seek(SeekFrom::Start(start)).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_BYTES).read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    Ok((String::from_utf8_lossy(&bytes).into_owned(), start + bytes.len() as u64))
}

/// The output file opened safely, and its length.
fn open_output(path: &str) -> Result<(std::fs::File, u64), String> {
    let file =
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path).map_err(
            |e| match e.raw_os_error() {
                Some(libc::ELOOP) => "it is a symbolic link".to_owned(),
                _ => e.to_string(),
            },
        )?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("it is not a regular file".into());
    }
    // Hard links to another user's file: only a file with one name is the job's own.
    if meta.nlink() != 1 {
        return Err("it has more than one name".into());
    }
    Ok((file, meta.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_of_its_own_is_read_and_tail_keeps_the_last_lines() {
        let dir = std::env::temp_dir().join(format!("berth-logs-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir(&dir).unwrap();
        let out = dir.join("slurm-1.out");
        std::fs::write(&out, "one\ntwo\nthree\n").unwrap();
        let path = out.to_str().unwrap();
        assert_eq!(read_output(path, None).unwrap(), ("one\ntwo\nthree\n".to_owned(), 14));
        assert_eq!(read_output(path, Some(2)).unwrap().0, "two\nthree\n");
        assert_eq!(read_output(path, Some(9)).unwrap().0, "one\ntwo\nthree\n");
        // Followed: what it gains after where the last read ended; from the start again
        // when it was cut shorter.
        std::fs::write(&out, "one\ntwo\nthree\nfour\n").unwrap();
        assert_eq!(read_from(path, 14).unwrap(), ("four\n".to_owned(), 19));
        assert_eq!(read_from(path, 19).unwrap(), (String::new(), 19));
        std::fs::write(&out, "new\n").unwrap();
        assert_eq!(read_from(path, 19).unwrap(), ("new\n".to_owned(), 4));

        let secret = dir.join("secret");
        std::fs::write(&secret, "jwt signing key").unwrap();
        let link = dir.join("slurm-2.out");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert_eq!(read_output(link.to_str().unwrap(), None).unwrap_err(), "it is a symbolic link");
        let hard = dir.join("slurm-3.out");
        std::fs::hard_link(&secret, &hard).unwrap();
        assert_eq!(read_output(hard.to_str().unwrap(), None).unwrap_err(), "it has more than one name");
        assert_eq!(read_output(dir.to_str().unwrap(), None).unwrap_err(), "it is not a regular file");
        assert!(read_output(dir.join("missing").to_str().unwrap(), None).is_err());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
