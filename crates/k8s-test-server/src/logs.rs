//! Pod logs (`GET /api/v1/namespaces/{ns}/pods/{name}/log`), as a kubelet serves them. A
//! fake container prints the lines of its `FAKE_LOG` env, spread evenly over its run time
//! (the first at its start), until it terminates. `container` (required when the pod has
//! several), `tailLines` and `follow` (the answer streams until the container has
//! terminated or the pod is gone) work as on a real cluster; so do the errors (404 for a
//! missing pod, 400 for a container that has not started or is not named).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use k8s_openapi::api::core::v1::Pod;

use crate::cluster::Cluster;
use crate::controllers::kubelet;
use crate::shared::Shared;
use crate::status::ApiError;
use crate::{meta, resources};

/// How often a followed log looks for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(50);

/// What a log request asks for.
pub(crate) struct LogQuery {
    container: Option<String>,
    tail: Option<usize>,
    follow: bool,
}

impl LogQuery {
    pub(crate) fn parse(query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let tail = match query.get("tailLines") {
            Some(t) => Some(t.parse().map_err(|_| ApiError::bad_request(format!("invalid tailLines: {t}")))?),
            None => None,
        };
        Ok(Self {
            container: query.get("container").cloned(),
            tail,
            follow: matches!(query.get("follow").map(String::as_str), Some("true" | "1")),
        })
    }
}

/// The container's lines printed so far, and whether it has terminated.
fn printed(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    wanted: Option<&str>,
) -> Result<(Vec<String>, bool), ApiError> {
    let obj = cluster
        .store
        .get(resources::PODS.plural, namespace, name)
        .ok_or_else(|| ApiError::not_found(resources::PODS, name))?;
    let pod = meta::typed::<Pod>(obj).ok_or_else(|| ApiError::bad_request("the pod cannot be read"))?;
    let containers = pod.spec.map(|s| s.containers).unwrap_or_default();
    let container = match wanted {
        Some(c) => containers
            .iter()
            .find(|x| x.name == c)
            .ok_or_else(|| ApiError::bad_request(format!("container {c} is not valid for pod {name}")))?,
        None if containers.len() == 1 => &containers[0],
        None => {
            let names: Vec<&str> = containers.iter().map(|c| c.name.as_str()).collect();
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                names.join(" ")
            )));
        }
    };
    let clock = cluster.pod_clocks.get(meta::uid(obj));
    let Some(started) = clock.and_then(|c| c.started) else {
        return Err(ApiError::bad_request(format!(
            "container \"{}\" in pod \"{name}\" is waiting to start: ContainerCreating",
            container.name
        )));
    };
    let terminated = obj["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["name"] == container.name.as_str() && s["state"]["terminated"].is_object());
    let until = clock.and_then(|c| c.terminated.get(&container.name).copied()).unwrap_or_else(Instant::now);
    let runs_forever = meta::controller_kind(obj) == Some("Deployment");
    let run = kubelet::run_time(container, cluster.default_run_seconds, runs_forever);
    let text = kubelet::env_value(container, "FAKE_LOG").unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let count = lines.len() as u32;
    let lines = lines
        .into_iter()
        .enumerate()
        .filter(|(i, _)| {
            let at = run.map_or(Duration::ZERO, |run| run * (*i as u32) / count.max(1));
            started + at <= until
        })
        .map(|(_, line)| format!("{line}\n"))
        .collect();
    Ok((lines, terminated))
}

fn text_response(body: Body) -> Response {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("text/plain"));
    response
}

/// Serves a pod's log.
pub(crate) fn respond(shared: &Arc<Shared>, namespace: &str, name: &str, q: LogQuery) -> Result<Response, ApiError> {
    let (lines, terminated) = printed(&shared.lock(), namespace, name, q.container.as_deref())?;
    let skip = q.tail.map_or(0, |t| lines.len().saturating_sub(t));
    let first: String = lines[skip..].concat();
    if !q.follow || terminated {
        return Ok(text_response(Body::from(first)));
    }
    // Follow: what was printed so far, then each new line as it is printed, until the
    // container terminates or the pod is gone.
    let state = (shared.clone(), namespace.to_owned(), name.to_owned(), q.container, lines.len(), Some(first));
    let stream = futures_util::stream::unfold(state, |(shared, ns, name, container, sent, first)| async move {
        if let Some(first) = first {
            return Some((Ok::<_, Infallible>(first), (shared, ns, name, container, sent, None)));
        }
        loop {
            let now = printed(&shared.lock(), &ns, &name, container.as_deref());
            let Ok((lines, terminated)) = now else { return None };
            if lines.len() > sent {
                let chunk = lines[sent..].concat();
                return Some((Ok(chunk), (shared, ns, name, container, lines.len(), None)));
            }
            if terminated {
                return None;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    });
    Ok(text_response(Body::from_stream(stream)))
}
