//! A database named by several hosts, one of which is the writable primary: libpq's
//! `postgres://u:p@h1:5432,h2:5432/db?target_session_attrs=read-write`. Berth finds the
//! primary when it starts and follows it when a failover promotes another host.
//!
//! sqlx has no multi-host connection strings (its issues #2290 and #3333), so the list is
//! split here into one set of connect options per host.
//! - The pool connects to the host found writable.
//! - Every new connection is asked `pg_is_in_recovery()`. A connection to a server in
//!   recovery (a standby, or a demoted primary) is refused, and the watcher is woken.
//! - The watcher asks the chosen server twice a second, on a connection of its own. When
//!   that server stops answering or turns read-only, the watcher asks the hosts in order,
//!   starting with that one (it may only have dropped the watcher's connection), and
//!   points the pool at the first writable one.
//! - Pooled connections made before a switch are closed when next taken out.
//!
//! Meanwhile requests fail as `Unavailable`, which the API answers 503 with Retry-After.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth_core::Error;
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgConnection, PgPool};

/// How often the watcher asks the chosen server whether it is still the writable primary.
const PROBE_EVERY: Duration = Duration::from_millis(500);

/// What berthd logs when it follows the primary to another host (tests look for it).
pub const PRIMARY_MOVED: &str = "the database primary moved; connecting to the new one";

/// How long one host may take to accept a connection or answer the probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// What a `DATABASE_URL` names.
pub(crate) struct Hosts {
    /// One per host, in the URL's order.
    pub options: Vec<PgConnectOptions>,
    /// Every connection must be to a writable server: the URL lists several hosts, or asks
    /// for `target_session_attrs=read-write` (or `primary`).
    pub read_write: bool,
}

/// Splits a libpq URL that may list several `host[:port]`s.
///
/// # Errors
/// [`Error::Invalid`] on `/DATABASE_URL` for a URL that is not one, or a
/// `target_session_attrs` Berth cannot honour (it writes: `read-only`, `standby` …).
pub(crate) fn parse(url: &str) -> Result<Hosts, Error> {
    let invalid = |m: String| Error::invalid("DATABASE_URL", m);
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(invalid("not a Postgres URL: expected postgres://user:password@host:port/database".into()));
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let mut attrs = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| match p.strip_prefix("target_session_attrs=") {
            Some(value) => {
                attrs = Some(value);
                false
            }
            None => true,
        })
        .collect();
    let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
    let hosts: Vec<&str> = hostlist.split(',').collect();
    let read_write = match attrs {
        None | Some("any") => hosts.len() > 1,
        Some("read-write" | "primary") => true,
        Some(other) => {
            return Err(invalid(format!(
                "target_session_attrs={other} is not supported: Berth writes, so it needs read-write (the default \
                 when several hosts are listed)"
            )));
        }
    };
    if hosts.len() > 1 && hosts.iter().any(|h| h.is_empty()) {
        return Err(invalid("an empty host in the host list".into()));
    }
    let options = hosts
        .iter()
        .map(|host| {
            format!("{scheme}://{userinfo}{host}{path}{query}")
                .parse::<PgConnectOptions>()
                .map_err(|e| invalid(format!("not a valid Postgres URL: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Hosts { options, read_write })
}

/// The hosts and which of them the pool connects to.
pub(crate) struct Primary {
    hosts: Vec<PgConnectOptions>,
    /// The chosen host's index, and when it was chosen.
    chosen: Mutex<(usize, Instant)>,
    wake: tokio::sync::Notify,
}

impl Primary {
    pub fn new(hosts: Vec<PgConnectOptions>) -> Arc<Self> {
        Arc::new(Self { hosts, chosen: Mutex::new((0, Instant::now())), wake: tokio::sync::Notify::new() })
    }

    fn chosen(&self) -> (usize, Instant) {
        *self.chosen.lock().expect("primary lock")
    }

    /// How long ago the pool was pointed at the host it connects to now.
    pub fn chosen_for(&self) -> Duration {
        self.chosen().1.elapsed()
    }

    /// The options of the chosen host.
    pub fn options(&self) -> PgConnectOptions {
        self.hosts[self.chosen().0].clone()
    }

    /// A connection found to be to a server in recovery: look for the primary now.
    pub fn suspect(&self) {
        self.wake.notify_one();
    }

    /// Asks every host (all at once, the answers taken in order from `first`) and chooses
    /// the writable one.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when none is, with what each answered, or when more than one
    /// is: a failed primary started again as a primary beside the promoted standby. A
    /// berthd restarted then took the first writable host listed, the stale one: it
    /// acknowledged writes the surviving primary never had, and its leader dispatched jobs
    /// for them, beside the other replicas' leader.
    pub async fn find(&self, first: usize) -> Result<PgConnection, Error> {
        let n = self.hosts.len();
        let asked: Vec<(usize, tokio::task::JoinHandle<Result<PgConnection, String>>)> = (0..n)
            .map(|k| (first + k) % n)
            .map(|index| (index, tokio::spawn(probe(self.hosts[index].clone()))))
            .collect();
        let mut writable = Vec::new();
        let mut answers = Vec::with_capacity(n);
        for (index, answer) in asked {
            match answer.await.unwrap_or_else(|e| Err(e.to_string())) {
                Ok(conn) => writable.push((index, conn)),
                Err(why) => answers.push(format!("{} {why}", self.name(index))),
            }
        }
        if writable.len() > 1 {
            let names: Vec<String> = writable.iter().map(|(index, _)| self.name(*index)).collect();
            return Err(Error::Unavailable(format!(
                "the database hosts {} all accept writes: two primaries (a failed primary started again as one \
                 beside the promoted standby), or one server listed twice in DATABASE_URL; berthd uses none of \
                 them until one alone does (rebuild the old primary as a standby, or stop it)",
                names.join(" and ")
            )));
        }
        let Some((index, conn)) = writable.pop() else {
            return Err(Error::Unavailable(format!(
                "no writable primary among the database hosts: {}",
                answers.join("; ")
            )));
        };
        let mut chosen = self.chosen.lock().expect("primary lock");
        if chosen.0 != index {
            *chosen = (index, Instant::now());
        }
        Ok(conn)
    }

    /// A host as the logs and errors name it, `host:port`.
    fn name(&self, index: usize) -> String {
        format!("{}:{}", self.hosts[index].get_host(), self.hosts[index].get_port())
    }

    /// Follows the primary until `pool` is closed; `probe` is a connection to the chosen host.
    pub async fn watch(self: Arc<Self>, pool: PgPool, probe: PgConnection) {
        let mut probe = Some(probe);
        loop {
            tokio::select! {
                () = pool.close_event() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
            if let Some(conn) = probe.as_mut()
                && matches!(tokio::time::timeout(PROBE_TIMEOUT, in_recovery(conn)).await, Ok(Ok(false)))
            {
                continue;
            }
            probe = None;
            let (was, _) = self.chosen();
            // The chosen host first: it may only have dropped the probe's connection.
            match self.find(was).await {
                Ok(conn) => {
                    probe = Some(conn);
                    let (now, _) = self.chosen();
                    if now != was {
                        pool.set_connect_options(self.hosts[now].clone());
                        tracing::warn!(from = %self.name(was), to = %self.name(now), "{PRIMARY_MOVED}");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "no writable database host; asking again"),
            }
        }
    }
}

/// A connection to `host` if it is writable, else what it answered.
async fn probe(host: PgConnectOptions) -> Result<PgConnection, String> {
    match tokio::time::timeout(PROBE_TIMEOUT, host.connect()).await {
        Err(_) => Err("did not answer in time".to_owned()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok(mut conn)) => match in_recovery(&mut conn).await {
            Ok(false) => Ok(conn),
            Ok(true) => Err("read-only (in recovery: a standby)".to_owned()),
            Err(e) => Err(e.to_string()),
        },
    }
}

/// Whether the server is in recovery (a standby, read-only).
pub(crate) async fn in_recovery(conn: &mut PgConnection) -> Result<bool, sqlx::Error> {
    sqlx::query_scalar!(r#"SELECT pg_is_in_recovery() AS "in_recovery!""#).fetch_one(conn).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_host_list_becomes_one_set_of_options_per_host() {
        let h = parse(
            "postgres://u:p%40ss@db1:5433,db2,10.0.0.7:6000/berth?sslmode=disable&target_session_attrs=read-write",
        )
        .unwrap();
        assert!(h.read_write);
        let hosts: Vec<(String, u16)> = h.options.iter().map(|o| (o.get_host().to_owned(), o.get_port())).collect();
        assert_eq!(hosts, [("db1".into(), 5433), ("db2".into(), 5432), ("10.0.0.7".into(), 6000)]);
        assert!(h.options.iter().all(|o| o.get_database() == Some("berth") && o.get_username() == "u"));
    }

    #[test]
    fn one_host_keeps_its_url_and_asks_for_writable_only_when_told() {
        let h = parse("postgres://u:p@db:5432/berth").unwrap();
        assert!(!h.read_write);
        assert_eq!(h.options.len(), 1);
        assert!(parse("postgresql://u:p@db/berth?target_session_attrs=primary").unwrap().read_write);
        assert!(parse("postgres://u:p@a,b/berth?target_session_attrs=any").unwrap().read_write);
    }

    #[test]
    fn what_berth_cannot_honour_is_refused_on_the_field() {
        for url in ["postgres://a,b/db?target_session_attrs=read-only", "db1,db2", "postgres://u@a,,b/db"] {
            let e = parse(url).err().unwrap_or_else(|| panic!("{url} accepted"));
            assert!(matches!(&e, Error::Invalid(f) if f[0].field == "DATABASE_URL"), "{url}: {e:?}");
        }
    }
}
