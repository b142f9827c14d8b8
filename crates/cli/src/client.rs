//! The REST API as the CLI calls it: JSON in and out, a bearer token, and the API's
//! problems (RFC 9457) kept whole so they can be shown field by field.

use std::fmt;

use reqwest::{Method, StatusCode};
use serde_json::Value;

/// Exit codes scripts can rely on.
pub mod exit {
    /// `berth diff`: the files and the server differ.
    pub const DIFFERENT: i32 = 1;
    /// Bad usage, or a file that cannot be read.
    pub const USAGE: i32 = 2;
    /// The API refused the request (4xx): the problem is printed.
    pub const REFUSED: i32 = 3;
    /// Berth did not answer, or failed (5xx).
    pub const UNAVAILABLE: i32 = 4;
}

/// A failed call.
#[derive(Debug)]
pub enum ApiError {
    /// The API answered with a problem.
    Problem { status: u16, title: String, detail: String, errors: Vec<(String, String)> },
    /// No answer.
    Unreachable(String),
}

impl ApiError {
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Problem { status, .. } => Some(*status),
            Self::Unreachable(_) => None,
        }
    }

    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Problem { status, .. } if *status < 500 => exit::REFUSED,
            _ => exit::UNAVAILABLE,
        }
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unreachable(why) => write!(f, "Berth did not answer: {why}"),
            Self::Problem { status, title, detail, errors } => {
                write!(f, "{status} {title}")?;
                if !detail.is_empty() && errors.is_empty() {
                    write!(f, ": {detail}")?;
                }
                // The same refusal of many items of a batch (an array's) is said once.
                let mut said: Vec<(String, &str, &str, usize)> = Vec::new();
                for (field, message) in errors {
                    let key = any_item(field);
                    match said.iter().position(|(k, _, m, _)| *k == key && *m == message.as_str()) {
                        Some(i) => said[i].3 += 1,
                        None => said.push((key, field, message, 1)),
                    }
                }
                for (key, field, message, times) in said {
                    match times {
                        1 => write!(f, "\n  {field}: {message}")?,
                        // A few are named each.
                        2 | 3 => {
                            for (other, _) in errors.iter().filter(|(g, m)| m.as_str() == message && any_item(g) == key)
                            {
                                write!(f, "\n  {other}: {message}")?;
                            }
                        }
                        n => write!(f, "\n  {field} (and {} more items alike): {message}", n - 1)?,
                    }
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for ApiError {}

/// A field of an item of a batch as of any item (`/items/7/spec` → `/items/*/spec`).
fn any_item(field: &str) -> String {
    field
        .strip_prefix("/items/")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(index, _)| index.parse::<usize>().is_ok())
        .map_or_else(|| field.to_owned(), |(_, after)| format!("/items/*/{after}"))
}

/// How many times a request the server refused for its rate (429), or could not serve for a
/// moment (503: its database), is sent again.
const RATE_LIMITED_TRIES: u32 = 5;

#[derive(Clone)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    pub fn new(server: &str, token: Option<String>) -> Self {
        let http = reqwest::Client::builder().user_agent(concat!("berth-cli/", env!("CARGO_PKG_VERSION"))).build();
        Self { base: server.trim_end_matches('/').to_owned(), token, http: http.expect("an HTTP client") }
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Sends and reads the JSON answer (`Null` for an empty one). Asked to slow down (429:
    /// nothing was done), it waits the `Retry-After` the server gave and asks again, a few
    /// times: cancelling an array of 1,000 is 1,000 changes, beyond a caller's rate. So it
    /// does for a 503 (the server lost its database for a moment) of a request that may be
    /// sent twice (GET, PUT, DELETE, or one with an `Idempotency-Key`): under database
    /// failovers, 15 of 20 `berth submit`s gave up at once, each fine when run again.
    pub async fn send(&self, mut req: reqwest::RequestBuilder) -> Result<Value, ApiError> {
        let idempotent = req.try_clone().and_then(|r| r.build().ok()).is_some_and(|r| {
            matches!(*r.method(), Method::GET | Method::HEAD | Method::PUT | Method::DELETE)
                || r.headers().contains_key("idempotency-key")
        });
        let mut tries = 0;
        let response = loop {
            let again = req.try_clone();
            let response = req.send().await.map_err(|e| ApiError::Unreachable(e.to_string()))?;
            let wait = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
            let status = response.status();
            let may_retry =
                status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE && idempotent;
            match (wait, again) {
                (Some(wait), Some(again)) if may_retry && tries < RATE_LIMITED_TRIES => {
                    tries += 1;
                    tokio::time::sleep(std::time::Duration::from_secs(wait.clamp(1, 30))).await;
                    req = again;
                }
                _ => break response,
            }
        };
        let status = response.status();
        let problem_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .is_some_and(|t| t.as_bytes().starts_with(b"application/problem+json"));
        let text = response.text().await.map_err(|e| ApiError::Unreachable(e.to_string()))?;
        if !status.is_success() {
            // Berth answers every refusal with a problem: anything else (a proxy's 404, a
            // load balancer's 502) is not Berth refusing, and no answer from it.
            if !problem_type {
                return Err(ApiError::Unreachable(format!(
                    "{} answered {status} without a problem body: is it Berth's API?",
                    self.base
                )));
            }
            return Err(problem(status, &text));
        }
        Ok(if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::String(text)) })
    }

    pub async fn get(&self, path: &str) -> Result<Value, ApiError> {
        self.send(self.request(Method::GET, path)).await
    }

    /// `None` for a 404.
    pub async fn get_opt(&self, path: &str) -> Result<Option<Value>, ApiError> {
        match self.get(path).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The items of a list that is not paged (role bindings).
    pub async fn items(&self, path: &str) -> Result<Vec<Value>, ApiError> {
        Ok(self.get(path).await?["items"].as_array().cloned().unwrap_or_default())
    }

    /// Every item of a paged list.
    pub async fn list(&self, path: &str) -> Result<Vec<Value>, ApiError> {
        let mut items = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let sep = if path.contains('?') { '&' } else { '?' };
            let mut url = format!("{path}{sep}limit=500");
            if let Some(c) = &cursor {
                url.push_str(&format!("&cursor={c}"));
            }
            let page = self.get(&url).await?;
            items.extend(page["items"].as_array().cloned().unwrap_or_default());
            match page["next"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => return Ok(items),
            }
        }
    }

    pub async fn put(&self, path: &str, body: &Value, if_match: Option<&str>) -> Result<Value, ApiError> {
        let mut req = self.request(Method::PUT, path).json(body);
        if let Some(v) = if_match {
            req = req.header("If-Match", format!("\"{v}\""));
        }
        self.send(req).await
    }

    pub async fn post(&self, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let mut req = self.request(Method::POST, path);
        if let Some(b) = body {
            req = req.json(b);
        }
        self.send(req).await
    }

    pub async fn delete(&self, path: &str, if_match: Option<&str>) -> Result<Value, ApiError> {
        let mut req = self.request(Method::DELETE, path);
        if let Some(v) = if_match {
            req = req.header("If-Match", format!("\"{v}\""));
        }
        self.send(req).await
    }
}

/// A problem from its answer; a body that is not one is its detail.
pub fn problem(status: StatusCode, text: &str) -> ApiError {
    let body: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let errors = body["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| (e["field"].as_str().unwrap_or("").to_owned(), e["message"].as_str().unwrap_or("").to_owned()))
                .collect()
        })
        .unwrap_or_default();
    ApiError::Problem {
        status: status.as_u16(),
        title: body["title"].as_str().unwrap_or(status.canonical_reason().unwrap_or("")).to_owned(),
        detail: body["detail"]
            .as_str()
            .map_or_else(|| if body.is_null() { text.to_owned() } else { String::new() }, str::to_owned),
        errors,
    }
}

/// A path segment, escaped.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_503_is_asked_again_only_of_what_may_be_sent_twice() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        // The server's database is away for the first answer of each path.
        let seen = Arc::new(AtomicUsize::new(0));
        let app = axum::Router::new().fallback({
            let seen = seen.clone();
            move || async move {
                if seen.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
                    let problem = r#"{"type":"urn:berth:problem:unavailable","title":"Unavailable","status":503}"#;
                    (
                        StatusCode::SERVICE_UNAVAILABLE,
                        [("content-type", "application/problem+json"), ("retry-after", "1")],
                        problem,
                    )
                } else {
                    (StatusCode::OK, [("content-type", "application/json"), ("retry-after", "1")], "{}")
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let client = Client::new(&url, None);
        assert!(client.get("/a").await.is_ok(), "a GET is asked again");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert!(client.put("/b", &serde_json::json!({}), None).await.is_ok(), "a PUT is asked again");
        assert_eq!(seen.load(Ordering::SeqCst), 4);
        let posted = client.post("/c", None).await;
        assert_eq!(posted.err().and_then(|e| e.status()), Some(503), "a POST may have been done: not asked again");
        assert_eq!(seen.load(Ordering::SeqCst), 5);
    }

    #[test]
    fn the_same_refusal_of_many_items_is_said_once_and_of_a_few_each() {
        let problem = |n: usize| ApiError::Problem {
            status: 422,
            title: "The request is invalid".into(),
            detail: String::new(),
            errors: (0..n)
                .map(|i| (format!("/items/{i}/spec/priority"), "must be between -1000 and 1000".into()))
                .chain([("/items/0/metadata/name".into(), "taken".into())])
                .collect(),
        };
        assert_eq!(
            problem(5).to_string(),
            "422 The request is invalid\n  /items/0/spec/priority (and 4 more items alike): must be between -1000 and 1000\n  /items/0/metadata/name: taken"
        );
        assert_eq!(problem(2).to_string().matches("/spec/priority: must be").count(), 2, "{}", problem(2));
    }
}
