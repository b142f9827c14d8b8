//! Request extractors whose every failure is a problem+json naming what was wrong.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use berth_app::context::OpContext;
use berth_core::apply::IfMatch;
use berth_core::auth::Principal;
use serde::de::DeserializeOwned;

use crate::problem::{ApiError, Problem};
use crate::state::AppState;

/// Largest accepted request body.
pub const BODY_LIMIT: usize = 1024 * 1024;

/// A JSON body: `application/json`, uncompressed, at most 1 MiB, no unknown fields (the
/// types deny them). Syntax errors are 400; type errors and unknown fields are 422 naming
/// the field; another media type or a content coding is 415.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let mime = content_type.split(';').next().unwrap_or("").trim();
        if !mime.eq_ignore_ascii_case("application/json") {
            let mut p = Problem::for_status(StatusCode::UNSUPPORTED_MEDIA_TYPE);
            p.detail = Some(format!("send the body as application/json, not {:?}", content_type));
            return Err(p.into());
        }
        // A compressed body would be read as JSON and refused as malformed (RFC 9110 15.5.16).
        let coding = req.headers().get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).unwrap_or("identity");
        if !coding.trim().eq_ignore_ascii_case("identity") {
            let mut p = Problem::for_status(StatusCode::UNSUPPORTED_MEDIA_TYPE);
            p.detail = Some(format!("send the body uncompressed: Content-Encoding {coding:?} is not taken"));
            return Err(p.into());
        }
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let mut p = Problem::for_status(rejection.status());
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                p.detail = Some(format!("the body must be at most {BODY_LIMIT} bytes"));
            } else {
                p.detail = Some("the body could not be read".into());
            }
            p
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parses a JSON document, naming the field at fault on error.
///
/// # Errors
/// 400 for malformed JSON, 422 for a valid document of the wrong shape.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Postgres stores no NUL in text: refused here, naming where it is, rather than as a
    // server fault when the write fails. The rare body with the escape is parsed twice.
    if has_nul_escape(bytes)
        && let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes)
        && let Some(field) = nul_at(&value, String::new())
    {
        return Err(berth_core::Error::invalid(field, "must not contain NUL characters").into());
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(crate::strict::Strict(&mut de)).map_err(|e| {
        let field = pointer(e.path(), &e.inner().to_string());
        json_problem(bytes, field, e.into_inner())
    })?;
    de.end().map_err(|e| json_problem(bytes, String::new(), e))?;
    Ok(value)
}

/// Whether a JSON text holds the escape `\u0000` (a raw NUL cannot appear in valid JSON).
fn has_nul_escape(bytes: &[u8]) -> bool {
    let mut backslashes = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'\\' {
            backslashes += 1;
            continue;
        }
        if backslashes % 2 == 1 && b == b'u' && bytes.get(i + 1..i + 5) == Some(b"0000") {
            return true;
        }
        backslashes = 0;
    }
    false
}

/// The JSON pointer of the first string or key holding a NUL.
fn nul_at(value: &serde_json::Value, at: String) -> Option<String> {
    use berth_core::validation::escape_pointer;
    match value {
        serde_json::Value::String(s) if s.contains('\0') => Some(at),
        serde_json::Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| nul_at(v, format!("{at}/{i}"))),
        serde_json::Value::Object(fields) => fields.iter().find_map(|(k, v)| {
            let here = format!("{at}/{}", escape_pointer(k));
            if k.contains('\0') { Some(here) } else { nul_at(v, here) }
        }),
        _ => None,
    }
}

/// 422 naming the field for a well-formed document of the wrong shape, else 400. serde's
/// reader reports some wrong types as syntax (a `null` where a name of a kind belongs:
/// "expected value"), so a syntax error in a document that parses is a wrong shape too.
fn json_problem(bytes: &[u8], field: String, e: serde_json::Error) -> ApiError {
    let well_formed = || serde_json::from_slice::<serde_json::Value>(bytes).ok();
    let message = if e.is_data() {
        Some(plain_types(&strip_position(&e.to_string())))
    } else {
        e.is_syntax().then(well_formed).flatten().map(|document| match document.pointer(&field) {
            Some(serde_json::Value::Null) => "must not be null".to_owned(),
            _ => format!("invalid value: {}", strip_position(&e.to_string())),
        })
    };
    // What a client sent (an unknown key, a value) is echoed only in part: a 900 KB key
    // made a 900 KB error.
    let field = clip(field, 256);
    match message {
        Some(message) => berth_core::Error::invalid(field, clip(message, 512)).into(),
        None => Problem::bad_request(Some(field).filter(|f| !f.is_empty()), clip(format!("malformed JSON: {e}"), 512))
            .into(),
    }
}

/// `text` cut to at most `max` characters (marked with an ellipsis when cut).
fn clip(text: String, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// The JSON pointer of a serde path. For an unknown or missing field, serde reports the
/// path of the object holding it, so the field's own name is appended from the message.
fn pointer(path: &serde_path_to_error::Path, message: &str) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("/{index}")),
            Segment::Map { key } => out.push_str(&format!("/{}", berth_core::validation::escape_pointer(key))),
            Segment::Enum { variant } => out.push_str(&format!("/{}", berth_core::validation::escape_pointer(variant))),
            Segment::Unknown => {}
        }
    }
    if let Some(field) = unknown_field(message).or_else(|| missing_field(message))
        && !out.ends_with(&format!("/{field}"))
    {
        out.push('/');
        out.push_str(&berth_core::validation::escape_pointer(field));
    }
    out
}

fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

fn unknown_field(message: &str) -> Option<&str> {
    message.strip_prefix("unknown field `")?.split('`').next()
}

/// serde's message with the Rust type it expected said as JSON's (`expected u32`: a whole
/// number from 0 to 4294967295; `expected struct TeamSpec`: an object).
fn plain_types(message: &str) -> String {
    let Some(at) = message.rfind("expected ") else { return message.to_owned() };
    let (head, wanted) = message.split_at(at + "expected ".len());
    let plain = match wanted {
        "u8" => "a whole number from 0 to 255".to_owned(),
        "u16" => "a whole number from 0 to 65535".to_owned(),
        "u32" => "a whole number from 0 to 4294967295".to_owned(),
        "u64" | "usize" => "a whole number from 0 to 18446744073709551615".to_owned(),
        "i8" | "i16" | "i32" | "i64" | "isize" => "a whole number".to_owned(),
        "f32" | "f64" => "a number".to_owned(),
        "a map" => "an object".to_owned(),
        _ if wanted.starts_with("struct ") || wanted.starts_with("internally tagged enum ") => "an object".to_owned(),
        _ if wanted.starts_with("tuple struct ") => "an array".to_owned(),
        _ if wanted.starts_with("enum ") => "one of the names the field takes".to_owned(),
        _ => return message.to_owned(),
    };
    format!("{head}{plain}")
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Query parameters; a malformed or unknown parameter is a 400 naming it.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        if let Some((key, _)) =
            form_urlencoded::parse(query.as_bytes()).find(|(k, v)| k.contains('\0') || v.contains('\0'))
        {
            let key = key.replace('\0', "");
            return Err(
                Problem::bad_request(Some(key), "query parameters must not contain NUL characters".into()).into()
            );
        }
        let de = serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(de).map(ApiQuery).map_err(|e| {
            let message = e.inner().to_string();
            let field = e
                .path()
                .iter()
                .next_back()
                .map(ToString::to_string)
                .or_else(|| unknown_field(&message).map(str::to_owned));
            Problem::bad_request(field, format!("invalid query parameter: {message}{}", time_hint(&message))).into()
        })
    }
}

/// What to write instead, after the words of a time that did not parse (chrono's say only
/// what went wrong: "premature end of input" for a date without a time).
fn time_hint(message: &str) -> &'static str {
    const CHRONO: [&str; 5] = [
        "premature end of input",
        "input contains invalid characters",
        "trailing input",
        "input is out of range",
        "input is not enough for unique date and time",
    ];
    if CHRONO.contains(&message) {
        " (a time is RFC 3339: 2026-12-01T00:00:00Z, or with an offset, +05:30 written %2B05:30)"
    } else {
        ""
    }
}

/// Path parameters; a malformed one is a 400.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if parts.uri.path().to_ascii_lowercase().contains("%00") {
            return Err(Problem::bad_request(None, "the path must not contain NUL characters".into()).into());
        }
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|rejection| Problem::bad_request(None, format!("invalid path: {}", rejection.body_text())).into())
    }
}

/// The `If-Match` header, or `If-None-Match: *` (create only), when sent.
pub struct Preconditions(pub Option<IfMatch>);

impl<S: Send + Sync> FromRequestParts<S> for Preconditions {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        if let Some(value) = parts.headers.get(header::IF_NONE_MATCH) {
            // With If-Match too, both would have to hold; Berth takes one precondition, so
            // such a write matches nothing (412) rather than half of what was asked.
            if parts.headers.contains_key(header::IF_MATCH) {
                return Ok(Self(Some(IfMatch::Versions(Vec::new()))));
            }
            return Ok(Self(Some(IfMatch::parse_none_match(value.to_str().unwrap_or("")))));
        }
        let Some(value) = parts.headers.get(header::IF_MATCH) else { return Ok(Self(None)) };
        // Bytes that are no text name no version: they match nothing (412).
        Ok(Self(Some(IfMatch::parse(value.to_str().unwrap_or("")))))
    }
}

/// The operation context of the authenticated caller, which every use case takes and
/// asks before it does anything (the [`crate::auth::authenticate`] middleware put the
/// principal in the request).
pub struct OpCtx(pub OpContext);

impl FromRequestParts<AppState> for OpCtx {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let principal = parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
            berth_core::Error::Internal("a route outside the authentication layer asked for the caller".into())
        })?;
        let request_id =
            parts.headers.get(crate::telemetry::REQUEST_ID).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let user_issuer = state.auth.verifier.user_issuer().unwrap_or("berth");
        Ok(Self(OpContext::for_request(&state.db, principal, request_id, user_issuer).await?))
    }
}

/// The query parameters each operation of the OpenAPI document declares, by path (as
/// routed: `/api/v1/teams/{team}`) and method.
#[derive(Clone, Default)]
pub struct DeclaredQuery(std::sync::Arc<std::collections::HashMap<String, Vec<Declared>>>);

/// An operation's method and the names of its query parameters.
type Declared = (axum::http::Method, Vec<String>);

impl DeclaredQuery {
    pub fn of(document: &utoipa::openapi::OpenApi) -> Self {
        use axum::http::Method;
        use utoipa::openapi::path::ParameterIn;
        let mut declared = std::collections::HashMap::<String, Vec<_>>::new();
        for (path, item) in &document.paths.paths {
            let operations = [
                (Method::GET, &item.get),
                (Method::PUT, &item.put),
                (Method::POST, &item.post),
                (Method::DELETE, &item.delete),
                (Method::PATCH, &item.patch),
                (Method::HEAD, &item.head),
            ];
            for (method, operation) in operations {
                let Some(operation) = operation else { continue };
                let names = operation
                    .parameters
                    .iter()
                    .flatten()
                    .filter(|p| p.parameter_in == ParameterIn::Query)
                    .map(|p| p.name.clone())
                    .collect();
                declared.entry(path.clone()).or_default().push((method, names));
            }
        }
        Self(std::sync::Arc::new(declared))
    }
}

/// Refuses, with a 400 naming it, a query parameter the operation does not declare or one
/// given twice. An option the operation does not have must not be ignored while it goes
/// ahead: `?dry_run=true` on a team, cluster or flavor write (only workload writes have a
/// dry run) created, changed or deleted it for real.
pub async fn refuse_undeclared_query(
    axum::extract::State(declared): axum::extract::State<DeclaredQuery>,
    matched: Option<axum::extract::MatchedPath>,
    req: Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let (Some(query), Some(matched)) = (req.uri().query(), matched) else { return next.run(req).await };
    let mut operations = declared.0.get(matched.as_str()).into_iter().flatten();
    let Some((_, names)) = operations.find(|(method, _)| method == req.method()) else {
        return next.run(req).await;
    };
    let mut seen = Vec::new();
    for (key, _) in form_urlencoded::parse(query.as_bytes()) {
        let key = key.replace('\0', "");
        let refused = if !names.contains(&key) {
            let takes = if names.is_empty() {
                "this operation takes none".to_owned()
            } else {
                format!(
                    "this operation takes {}",
                    names.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                )
            };
            Some(format!("unknown query parameter `{key}`: {takes}"))
        } else if seen.contains(&key) {
            Some(format!("query parameter `{key}` is given more than once"))
        } else {
            None
        };
        if let Some(detail) = refused {
            return ApiError::from(Problem::bad_request(Some(key), detail)).into_response();
        }
        seen.push(key);
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::plain_types;

    #[test]
    fn rust_type_names_are_said_as_json_ones() {
        let cases = [
            (
                "invalid type: string \"8\", expected u32",
                "invalid type: string \"8\", expected a whole number from 0 to 4294967295",
            ),
            (
                "invalid value: integer `-1`, expected u64",
                "invalid value: integer `-1`, expected a whole number from 0 to 18446744073709551615",
            ),
            ("invalid type: string \"x\", expected f64", "invalid type: string \"x\", expected a number"),
            ("invalid type: sequence, expected struct TeamSpec", "invalid type: sequence, expected an object"),
            ("invalid type: integer `1`, expected a map", "invalid type: integer `1`, expected an object"),
            ("invalid type: integer `1`, expected a string", "invalid type: integer `1`, expected a string"),
            ("unknown variant `x`, expected one of `a`, `b`", "unknown variant `x`, expected one of `a`, `b`"),
        ];
        for (serde, plain) in cases {
            assert_eq!(plain_types(serde), plain);
        }
    }
}
