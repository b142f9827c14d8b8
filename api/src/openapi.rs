//! The OpenAPI 3.1 document, generated from the handlers and types. Committed as
//! `openapi/openapi.json`; a test fails when the two differ.

use serde::Deserialize;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};
use utoipa::{IntoParams, Modify};

use crate::problem::PROBLEM_JSON;

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "Berth",
        description = "One declarative control plane for GPUs across Slurm and Kubernetes clusters: \
            flavors, a team quota tree, clusters and workloads.\n\n\
            Every object is `{metadata, spec, status}`. PUT creates or replaces and is idempotent; \
            `generation` moves only when `spec` changes. Clients never write `status`: it is accepted \
            in PUT bodies (so a fetched object can be sent back) and ignored, as are the read-only \
            metadata fields. `ETag` carries `resource_version`; `If-Match` makes a write conditional \
            (412 when stale), and so does `metadata.resource_version` in the body (409 when stale). \
            What the scheduler explains of a pending workload (`status.pending_reason`, \
            `status.queue_position`, `status.estimated_start`) changes as the queue moves, without \
            moving `resource_version`: a conditional write is not refused because the queue moved. \
            Every error is RFC 9457 `application/problem+json`; validation errors list each field as a JSON pointer.",
        license(name = "Apache-2.0"),
    ),
    // Types only query parameters name are not collected from the routes.
    components(schemas(crate::problem::Problem, crate::routes::usage::ReportFormat)),
    tags(
        (name = "flavors", description = "GPU classes and their backend names"),
        (name = "teams", description = "The quota tree"),
        (name = "clusters", description = "Registered backends"),
        (name = "workloads", description = "Declared work and its history"),
        (name = "usage", description = "GPU-hours, cost and budgets"),
        (name = "audit", description = "Who changed what"),
        (name = "controllers", description = "The reconcilers and which replica leads them"),
        (name = "identity", description = "The caller, role bindings and service accounts"),
        (name = "operations", description = "Health, readiness and metrics"),
    ),
)]
pub struct ApiDoc;

/// The `If-Match` header accepted by every write.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Header)]
pub struct IfMatchHeader {
    /// `*` or quoted resource versions (`"42"`; a bare `42` is read as `"42"`); the write
    /// happens only if one matches the current version, else 412 (a weak tag, or a value
    /// naming no version, matches nothing).
    #[serde(rename = "If-Match")]
    #[param(value_type = String, required = false)]
    #[allow(dead_code)]
    if_match: Option<String>,
    /// `*`: create the object, and refuse with 412 if one of this name exists (never
    /// replace it); or resource versions (`"42"`, weak tags too), none of which may be
    /// the current one (else 412). With `If-Match` too, nothing can match (412).
    #[serde(rename = "If-None-Match")]
    #[param(value_type = String, required = false)]
    #[allow(dead_code)]
    if_none_match: Option<String>,
}

/// Declares on every operation the problem responses it can give, so clients know every
/// error shape from the document.
pub(crate) struct ProblemResponses;

impl Modify for ProblemResponses {
    fn modify(&self, openapi: &mut OpenApi) {
        for (path, item) in &mut openapi.paths.paths {
            if !path.starts_with("/api/") {
                continue;
            }
            let ops = [
                (&mut item.get, "get"),
                (&mut item.put, "put"),
                (&mut item.post, "post"),
                (&mut item.delete, "delete"),
            ];
            for (op, method) in ops {
                if let Some(op) = op.as_mut() {
                    declare(op, method, path.contains('{'));
                    constrain_parameters(op);
                    op.security = Some(vec![SecurityRequirement::new(BEARER, Vec::<String>::new())]);
                }
            }
        }
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            BEARER,
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .description(Some(
                        "A JWT from Berth (`berthd token create`, or a service-account token) or from the \
                         configured OIDC provider.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The name of the bearer security scheme.
const BEARER: &str = "bearer";

fn declare(op: &mut Operation, method: &str, has_path_params: bool) {
    let mut codes = vec![
        ("400", "Malformed request: unparsable JSON, path or query parameter"),
        ("401", "No token, or the token was refused (expired, wrong issuer or audience, bad signature, revoked)"),
        ("408", "The request (its body included) took longer than the server allows"),
        ("429", "Too many requests from this caller, or for this team; see Retry-After"),
        ("405", "Method not allowed on this path"),
        ("422", "Invalid request: each broken rule is listed with its field"),
        ("500", "Internal error; the body carries only a request id"),
        ("503", "Database unavailable or busy; retry"),
    ];
    if has_path_params || method != "get" {
        codes.push(("404", "No such object (or team)"));
    }
    if method != "get" {
        codes.push(("403", "The caller may see the object but not make this change"));
        codes.push(("409", "Conflict: stale metadata.resource_version or uid, object in use, or being deleted"));
        codes.push(("412", "If-Match did not match the current resource version"));
    }
    if method == "put" || method == "post" {
        codes.push(("413", "Body larger than 1 MiB"));
        codes.push(("415", "Body is not application/json"));
    }
    for (code, description) in codes {
        op.responses.responses.entry(code.to_owned()).or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(PROBLEM_JSON, ContentBuilder::new().schema(Some(Ref::from_schema_name("Problem"))).build())
                .build()
                .into()
        });
    }
}

/// A DNS-1123 label: every name in a path.
const NAME_PATTERN: &str = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$";
/// Text the server stores: no NUL, which Postgres cannot hold.
const NO_NUL_PATTERN: &str = "^[^\\u0000]*$";

/// States what the server accepts of each path and query parameter that has no rule of
/// its own: names in a path are DNS labels, and no query text holds a NUL.
fn constrain_parameters(op: &mut Operation) {
    use utoipa::openapi::path::ParameterIn;
    use utoipa::openapi::{RefOr, Schema, Type};
    for p in op.parameters.iter_mut().flatten() {
        let pattern = match p.parameter_in {
            ParameterIn::Path if p.name == "name" || p.name == "team" => NAME_PATTERN,
            ParameterIn::Query => NO_NUL_PATTERN,
            _ => continue,
        };
        if let Some(RefOr::T(Schema::Object(o))) = p.schema.as_mut()
            && o.schema_type == Type::String.into()
            && o.pattern.is_none()
            && o.enum_values.is_none()
            && o.format.is_none()
        {
            o.pattern = Some(pattern.to_owned());
            if pattern == NAME_PATTERN {
                o.max_length = Some(63);
            }
        }
    }
}

/// The whole document, as served at `/openapi.json`.
pub fn document() -> OpenApi {
    crate::router_parts().2
}

/// The document as committed: pretty JSON with a trailing newline.
///
/// # Panics
/// Never in practice: the document always serializes.
pub fn document_json() -> String {
    let mut json = document().to_pretty_json().expect("the OpenAPI document serializes");
    json.push('\n');
    json
}
