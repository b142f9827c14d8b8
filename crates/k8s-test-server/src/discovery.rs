//! Discovery documents: `/version`, `/api`, `/apis` and the per-group-version resource lists.

use serde_json::{Value, json};

use crate::resources::{self, ResourceType};

/// The verbs every served resource supports.
const VERBS: [&str; 7] = ["create", "delete", "get", "list", "patch", "update", "watch"];

/// `GET /version`.
pub(crate) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "34",
        "gitVersion": "v1.34.0-berth-test",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-08-27T00:00:00Z",
        "goVersion": "go1.24.6",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `GET /api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

/// `GET /apis`.
pub(crate) fn groups(serve_jobsets: bool) -> Value {
    let groups: Vec<Value> = resources::group_versions(serve_jobsets)
        .into_iter()
        .map(|(group, version)| {
            let gv = json!({"groupVersion": format!("{group}/{version}"), "version": version});
            json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

fn resource_entries(rt: &ResourceType) -> [Value; 2] {
    [
        json!({
            "name": rt.plural,
            "singularName": rt.kind.to_ascii_lowercase(),
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": VERBS,
        }),
        json!({
            "name": format!("{}/status", rt.plural),
            "singularName": "",
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": ["get", "patch", "update"],
        }),
    ]
}

/// `GET /api/v1` or `GET /apis/{group}/{version}`; None when the group version is not served.
pub(crate) fn resource_list(group: &str, version: &str, serve_jobsets: bool) -> Option<Value> {
    let types = resources::in_group_version(group, version, serve_jobsets);
    if types.is_empty() {
        return None;
    }
    let group_version = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    let entries: Vec<Value> = types.into_iter().flat_map(resource_entries).collect();
    Some(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    }))
}
