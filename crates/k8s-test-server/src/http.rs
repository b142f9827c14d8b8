//! The HTTP surface: path routing, request parsing and responses (JSON only; Status objects for
//! every error).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::deletion::DeleteOptions;
use crate::discovery;
use crate::operations::{PatchKind, Target};
use crate::resources::{self, ResourceType};
use crate::selector::{FieldQuery, Filter, LabelQuery};
use crate::shared::Shared;
use crate::status::{ApiError, Cause};
use crate::watch::{self, WatchParams};

/// Largest accepted request body.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// A JSON response.
pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response {
    let mut response = (code, body.to_string()).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    response
}

/// What a request path names.
#[derive(Debug, PartialEq)]
enum Route {
    Version,
    CoreVersions,
    Groups,
    Resources {
        group: String,
        version: String,
    },
    Collection {
        rt: &'static ResourceType,
        namespace: Option<String>,
    },
    Object {
        rt: &'static ResourceType,
        namespace: String,
        name: String,
        target: Target,
    },
    PodLog {
        namespace: String,
        name: String,
    },
    /// `serviceaccounts/{name}/token`: a TokenRequest.
    Token {
        namespace: String,
        name: String,
    },
}

impl Route {
    fn parse(path: &str, serve_jobsets: bool) -> Result<Self, ApiError> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let unknown = || ApiError::unknown_path(path);
        let (group, version, rest) = match segments.as_slice() {
            ["version"] => return Ok(Self::Version),
            ["api"] => return Ok(Self::CoreVersions),
            ["apis"] => return Ok(Self::Groups),
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return Err(unknown()),
        };
        let types = resources::in_group_version(group, version, serve_jobsets);
        if types.is_empty() {
            return Err(unknown());
        }
        let find = |plural: &str, namespaced: bool| {
            types.iter().copied().find(|rt| rt.plural == plural && (rt.namespaced || !namespaced)).ok_or_else(unknown)
        };
        let object = |rt, namespace: &str, name: &str, target| Self::Object {
            rt,
            namespace: namespace.to_string(),
            name: name.to_string(),
            target,
        };
        match rest {
            [] => Ok(Self::Resources { group: group.to_string(), version: version.to_string() }),
            [plural] => Ok(Self::Collection { rt: find(plural, false)?, namespace: None }),
            ["namespaces", ns, "status"] => Ok(object(find("namespaces", false)?, "", ns, Target::Status)),
            ["namespaces", ns, plural] => {
                Ok(Self::Collection { rt: find(plural, true)?, namespace: Some((*ns).to_string()) })
            }
            ["namespaces", ns, plural, name] => Ok(object(find(plural, true)?, ns, name, Target::Object)),
            ["namespaces", ns, plural, name, "status"] => Ok(object(find(plural, true)?, ns, name, Target::Status)),
            ["namespaces", ns, "pods", name, "log"] if group.is_empty() => {
                Ok(Self::PodLog { namespace: (*ns).to_string(), name: (*name).to_string() })
            }
            ["namespaces", ns, "serviceaccounts", name, "token"] if group.is_empty() => {
                Ok(Self::Token { namespace: (*ns).to_string(), name: (*name).to_string() })
            }
            [plural, name] | [plural, name, "status"] => {
                let rt = find(plural, false)?;
                if rt.namespaced {
                    return Err(unknown());
                }
                let target = if rest.len() == 3 { Target::Status } else { Target::Object };
                Ok(object(rt, "", name, target))
            }
            _ => Err(unknown()),
        }
    }

    /// The plural requests are counted under (the path for non-resource requests).
    fn counted_as(&self) -> String {
        match self {
            Self::Collection { rt, .. } | Self::Object { rt, .. } => rt.plural.to_string(),
            Self::PodLog { .. } => "pods/log".to_string(),
            Self::Token { .. } => "serviceaccounts/token".to_string(),
            Self::Version => "/version".to_string(),
            Self::CoreVersions => "/api".to_string(),
            Self::Groups => "/apis".to_string(),
            Self::Resources { group, version } if group.is_empty() => format!("/api/{version}"),
            Self::Resources { group, version } => format!("/apis/{group}/{version}"),
        }
    }
}

fn is_true(query: &HashMap<String, String>, key: &str) -> bool {
    matches!(query.get(key).map(String::as_str), Some("true" | "1"))
}

fn filter(namespace: Option<String>, query: &HashMap<String, String>) -> Result<Filter, ApiError> {
    let labels = match query.get("labelSelector") {
        Some(s) => {
            LabelQuery::parse(s).map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?
        }
        None => LabelQuery::default(),
    };
    let fields = match query.get("fieldSelector") {
        Some(s) => FieldQuery::parse(s).map_err(ApiError::bad_request)?,
        None => FieldQuery::default(),
    };
    Ok(Filter { namespace, labels, fields })
}

fn watch_params(query: &HashMap<String, String>) -> Result<WatchParams, ApiError> {
    let resource_version = match query.get("resourceVersion").map(String::as_str) {
        None | Some("") => None,
        Some(rv) => Some(rv.parse().map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv}")))?),
    };
    let timeout = match query.get("timeoutSeconds") {
        Some(t) => Some(Duration::from_secs(
            t.parse().map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds: {t}")))?,
        )),
        None => None,
    };
    Ok(WatchParams {
        resource_version,
        bookmarks: is_true(query, "allowWatchBookmarks"),
        timeout,
        send_initial_events: is_true(query, "sendInitialEvents"),
    })
}

fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase()
}

/// Serves one parsed request.
fn serve(
    shared: &Arc<Shared>,
    route: Route,
    method: &Method,
    headers: &HeaderMap,
    query: &HashMap<String, String>,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let ok = |value: Value| json_response(StatusCode::OK, &value);
    match (route, method) {
        (Route::Version, &Method::GET) => Ok(ok(discovery::version())),
        (Route::CoreVersions, &Method::GET) => Ok(ok(discovery::core_versions(&shared.address.to_string()))),
        (Route::Groups, &Method::GET) => Ok(ok(discovery::groups(shared.serve_jobsets))),
        (Route::Resources { group, version }, &Method::GET) => {
            discovery::resource_list(&group, &version, shared.serve_jobsets)
                .map(ok)
                .ok_or_else(|| ApiError::unknown_path(&format!("/apis/{group}/{version}")))
        }
        (Route::Collection { rt, namespace }, &Method::GET) => {
            let filter = filter(namespace, query)?;
            if is_true(query, "watch") {
                return Ok(watch::respond(shared.clone(), rt, filter, &watch_params(query)?));
            }
            Ok(ok(shared.lock().list(rt, &filter)))
        }
        (Route::Collection { rt, namespace: Some(namespace) }, &Method::POST) => {
            let obj = parse_json(body)?;
            let created = shared.lock().create(rt, &namespace, obj)?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Route::Collection { rt, namespace: None }, &Method::POST) if !rt.namespaced => {
            let created = shared.lock().create(rt, "", parse_json(body)?)?;
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Route::PodLog { namespace, name }, &Method::GET) => {
            crate::logs::respond(shared, &namespace, &name, crate::logs::LogQuery::parse(query)?)
        }
        (Route::Token { namespace, name }, &Method::POST) => {
            let request = parse_json(body)?;
            let seconds = request["spec"]["expirationSeconds"].as_i64().unwrap_or(3600);
            shared.lock().get(resources::SERVICE_ACCOUNTS, &namespace, &name)?;
            let token = shared.issue_token(&namespace, &name);
            let reply = json!({
                "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "metadata": {"name": name, "namespace": namespace, "creationTimestamp": crate::meta::now()},
                "spec": {"audiences": request["spec"]["audiences"].clone(), "expirationSeconds": seconds},
                "status": {"token": token, "expirationTimestamp": crate::meta::timestamp_in(seconds)},
            });
            Ok(json_response(StatusCode::CREATED, &reply))
        }
        (Route::Object { rt, namespace, name, .. }, &Method::GET) => {
            Ok(ok(shared.lock().get(rt, &namespace, &name)?))
        }
        (Route::Object { rt, namespace, name, target }, &Method::PUT) => {
            Ok(ok(shared.lock().replace(rt, &namespace, &name, parse_json(body)?, target)?))
        }
        (Route::Object { rt, namespace, name, target }, &Method::PATCH) => {
            let kind = match content_type(headers).as_str() {
                "application/apply-patch+yaml" => {
                    if query.get("fieldManager").is_none_or(String::is_empty) {
                        return Err(ApiError::invalid(
                            rt,
                            &name,
                            vec![Cause::new("fieldManager", "Required value: is required for apply patch")],
                        ));
                    }
                    PatchKind::Apply
                }
                "application/merge-patch+json" | "application/strategic-merge-patch+json" => PatchKind::Merge,
                other => return Err(ApiError::unsupported_media_type(other)),
            };
            let patch = parse_json(body)?;
            let (created, obj) = shared.lock().patch(rt, &namespace, &name, kind, &patch, target)?;
            let code = if created { StatusCode::CREATED } else { StatusCode::OK };
            Ok(json_response(code, &obj))
        }
        (Route::Object { rt, namespace, name, target: Target::Object }, &Method::DELETE) => {
            let options = DeleteOptions::parse(body, query)?;
            Ok(ok(shared.lock().delete(rt, &namespace, &name, &options)?))
        }
        (_, method) => Err(ApiError::method_not_allowed(method.as_str())),
    }
}

/// Parses the query string into a map (last value wins).
fn query_map(uri: &Uri) -> Result<HashMap<String, String>, ApiError> {
    Query::<HashMap<String, String>>::try_from_uri(uri)
        .map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let route = Route::parse(parts.uri.path(), shared.serve_jobsets);
    let query = query_map(&parts.uri);
    let watch = query.as_ref().is_ok_and(|q| is_true(q, "watch"));
    let counted_as = route.as_ref().map_or_else(|_| parts.uri.path().to_string(), Route::counted_as);
    shared.count(parts.method.as_str(), &counted_as, watch);
    // A hung server answers no request until it is not hung (watches already open are not
    // held: a test that hangs the server changes nothing meanwhile).
    let _ = shared.hung.subscribe().wait_for(|hung| !*hung).await;
    let result = async {
        shared.authorize(&parts.headers)?;
        let route = route?;
        let query = query?;
        let body = axum::body::to_bytes(body, MAX_BODY)
            .await
            .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
        serve(&shared, route, &parts.method, &parts.headers, &query, &body)
    }
    .await;
    match result {
        Ok(response) => response,
        Err(err) => {
            tracing::debug!(method = %parts.method, uri = %parts.uri, code = err.code, message = %err.message, "request failed");
            err.into_response()
        }
    }
}

/// The router serving every path.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_route_like_kubernetes() {
        let parse = |p| Route::parse(p, true);
        assert_eq!(
            parse("/api/v1/namespaces/ns/pods/p").unwrap(),
            Route::Object { rt: resources::PODS, namespace: "ns".into(), name: "p".into(), target: Target::Object }
        );
        assert_eq!(
            parse("/api/v1/namespaces/ns").unwrap(),
            Route::Object {
                rt: resources::NAMESPACES,
                namespace: String::new(),
                name: "ns".into(),
                target: Target::Object
            }
        );
        assert_eq!(parse("/apis/batch/v1/jobs").unwrap(), Route::Collection { rt: resources::JOBS, namespace: None });
        assert_eq!(
            parse("/apis/jobset.x-k8s.io/v1alpha2/namespaces/a/jobsets").unwrap(),
            Route::Collection { rt: resources::JOBSETS, namespace: Some("a".into()) }
        );
        assert!(Route::parse("/apis/jobset.x-k8s.io/v1alpha2/jobsets", false).is_err());
        assert!(parse("/api/v1/pods/p").is_err());
        assert!(parse("/apis/extensions/v1beta1").is_err());
        assert!(parse("/api/v1/namespaces/ns/widgets").is_err());
    }
}
