//! An inference service's load read from Prometheus: an instant query
//! (`GET {url}/api/v1/query?query=…`), its value the sum of the samples it returns (or the
//! scalar it returns).

use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;

use crate::BackendError;

/// How long a query may take.
const TIMEOUT: Duration = Duration::from_secs(10);

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| reqwest::Client::builder().timeout(TIMEOUT).build().expect("an HTTP client"))
}

/// The value of `query`; `None` when it returns no sample (the service reports nothing
/// yet).
///
/// # Errors
/// [`BackendError::Unreachable`] when Prometheus does not answer; [`BackendError::Rejected`]
/// when it refuses the query (its error) or answers what is not a query result.
pub async fn instant(url: &str, query: &str) -> Result<Option<f64>, BackendError> {
    let endpoint = format!("{}/api/v1/query", url.trim_end_matches('/'));
    let answer = client()
        .get(&endpoint)
        .query(&[("query", query)])
        .send()
        .await
        .map_err(|e| BackendError::Unreachable(format!("Prometheus at {url}: {e}")))?;
    let status = answer.status();
    let body: Value = answer.json().await.map_err(|e| {
        BackendError::Rejected(format!("Prometheus at {url} answered {status} with no query result: {e}"))
    })?;
    if body["status"] != "success" {
        let why = body["error"].as_str().unwrap_or("no reason given");
        return Err(BackendError::Rejected(format!("Prometheus refused the query ({status}): {why}")));
    }
    let sample = |v: &Value| v.get(1).and_then(Value::as_str).and_then(|s| s.parse::<f64>().ok());
    let data = &body["data"];
    match data["resultType"].as_str() {
        Some("scalar") => Ok(sample(&data["result"]).filter(|v| v.is_finite())),
        Some("vector") => {
            let values: Vec<f64> = data["result"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| sample(&s["value"]))
                .filter(|v| v.is_finite())
                .collect();
            Ok((!values.is_empty()).then(|| values.iter().sum()))
        }
        other => Err(BackendError::Rejected(format!(
            "the query must give a scalar or an instant vector, not {}",
            other.unwrap_or("nothing")
        ))),
    }
}
