//! Watch responses: newline-delimited JSON events, replayed from history or synthesized from the
//! current objects, then live, with bookmarks, timeouts and forced ends.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::TryRecvError};
use tokio::time::{Instant, Interval, MissedTickBehavior};

use crate::resources::ResourceType;
use crate::selector::Filter;
use crate::shared::Shared;
use crate::status;
use crate::store::{Change, ChangeKind};

/// What a watch request asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct WatchParams {
    /// `resourceVersion`: replay changes after it (None or 0: start with the current objects).
    pub resource_version: Option<u64>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// `sendInitialEvents` (streaming list): current objects, then a bookmark marking their end.
    pub send_initial_events: bool,
}

fn event(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({"type": kind, "object": object}).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn bookmark(rt: &ResourceType, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event("BOOKMARK", &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": metadata}))
}

/// The event a watcher with `filter` sees for a change, if any: a modification moving an object
/// into the selection is ADDED, out of it DELETED.
fn event_for(rt: &ResourceType, filter: &Filter, change: &Change) -> Option<Bytes> {
    if change.plural != rt.plural {
        return None;
    }
    let now = filter.matches(&change.object);
    let kind = match change.kind {
        ChangeKind::Modified => {
            let before = change.previous.as_deref().is_some_and(|p| filter.matches(p));
            match (before, now) {
                (true, true) => ChangeKind::Modified,
                (false, true) => ChangeKind::Added,
                (true, false) => ChangeKind::Deleted,
                (false, false) => return None,
            }
        }
        kind if now => kind,
        _ => return None,
    };
    Some(event(kind.as_str(), &change.object))
}

/// An open watch.
struct Watch {
    shared: Arc<Shared>,
    rt: &'static ResourceType,
    filter: Filter,
    pending: VecDeque<Bytes>,
    changes: broadcast::Receiver<Arc<Change>>,
    /// Every change up to this resourceVersion has been sent (or filtered out).
    sent_rv: u64,
    bookmarks: Option<Interval>,
    deadline: Option<Instant>,
    epoch: tokio::sync::watch::Receiver<u64>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    ended: bool,
}

impl Watch {
    fn take(&mut self, change: &Change) {
        if change.rv > self.sent_rv {
            self.sent_rv = change.rv;
            if let Some(ev) = event_for(self.rt, &self.filter, change) {
                self.pending.push_back(ev);
            }
        }
    }

    /// Queues every change up to the current resourceVersion, then a bookmark at it.
    fn queue_bookmark(&mut self) {
        let shared = self.shared.clone();
        let cluster = shared.lock();
        // Changes are broadcast under this lock, so everything up to `current` is queued.
        let current = cluster.store.resource_version();
        loop {
            match self.changes.try_recv() {
                Ok(change) => self.take(&change),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Lagged(_) | TryRecvError::Closed) => {
                    self.ended = true;
                    return;
                }
            }
        }
        drop(cluster);
        self.sent_rv = self.sent_rv.max(current);
        self.pending.push_back(bookmark(self.rt, self.sent_rv, false));
    }

    /// The next chunk of the response, or None when the watch ends.
    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some((Ok(chunk), self));
            }
            if self.ended {
                return None;
            }
            let deadline = self.deadline;
            let bookmarks = self.bookmarks.as_mut();
            tokio::select! {
                biased;
                _ = self.epoch.changed() => return None,
                _ = self.shutdown.changed() => return None,
                () = async {
                    match deadline {
                        Some(d) => tokio::time::sleep_until(d).await,
                        None => std::future::pending().await,
                    }
                } => return None,
                received = self.changes.recv() => match received {
                    Ok(change) => self.take(&change),
                    // Fell behind or the store is gone: end; the client resumes from history.
                    Err(_) => return None,
                },
                _ = async {
                    match bookmarks {
                        Some(interval) => interval.tick().await,
                        None => std::future::pending().await,
                    }
                } => self.queue_bookmark(),
            }
        }
    }
}

/// Starts a watch of `rt` objects selected by `filter`.
pub(crate) fn respond(
    shared: Arc<Shared>,
    rt: &'static ResourceType,
    filter: Filter,
    params: &WatchParams,
) -> Response {
    let epoch = shared.watch_epoch.subscribe();
    let shutdown = shared.shutdown.subscribe();
    let mut pending = VecDeque::new();
    let (changes, current) = {
        let cluster = shared.lock();
        let changes = cluster.store.subscribe();
        let current = cluster.store.resource_version();
        match params.resource_version {
            Some(rv) if rv > 0 && !params.send_initial_events => match cluster.store.changes_since(rv) {
                Ok(history) => pending.extend(history.filter_map(|c| event_for(rt, &filter, c))),
                Err(expired) => {
                    let error = event("ERROR", &status::expired(rv, expired.oldest));
                    let once = futures_util::stream::iter([Ok::<_, Infallible>(error)]);
                    return stream_response(Body::from_stream(once));
                }
            },
            _ => {
                pending.extend(cluster.store.list(rt.plural).filter(|o| filter.matches(o)).map(|o| event("ADDED", o)));
                if params.send_initial_events {
                    pending.push_back(bookmark(rt, current, true));
                }
            }
        }
        (changes, current)
    };
    let bookmarks = params.bookmarks.then(|| {
        let period = shared.bookmark_interval.max(Duration::from_millis(10));
        let mut interval = tokio::time::interval_at(Instant::now() + period, period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        interval
    });
    let watch = Watch {
        rt,
        filter,
        pending,
        changes,
        sent_rv: current,
        bookmarks,
        deadline: params.timeout.map(|t| Instant::now() + t),
        epoch,
        shutdown,
        ended: false,
        shared,
    };
    stream_response(Body::from_stream(futures_util::stream::unfold(watch, Watch::next)))
}

fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}
