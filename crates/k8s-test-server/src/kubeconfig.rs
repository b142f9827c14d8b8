//! A kubeconfig pointing at the test server.

/// Quotes a string for YAML (a JSON string is a valid YAML double-quoted scalar).
fn quote(s: &str) -> String {
    serde_json::Value::from(s).to_string()
}

/// A kubeconfig with one cluster (`server`), one user (with `token`, if any) and one context,
/// which is the current one.
pub(crate) fn render(server: &str, token: Option<&str>) -> String {
    let user = match token {
        Some(token) => format!("\n    token: {}", quote(token)),
        None => " {}".to_string(),
    };
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: berth-test
  cluster:
    server: {server}
users:
- name: berth-test
  user:{user}
contexts:
- name: berth-test
  context:
    cluster: berth-test
    user: berth-test
current-context: berth-test
preferences: {{}}
",
        server = quote(server),
    )
}
