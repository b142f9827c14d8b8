//! The API verbs on the cluster: get, list, create, replace and patch (delete lives in
//! [`crate::deletion`]). Used by the HTTP layer and by the built-in controllers.

use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::resources::{self, ResourceType};
use crate::selector::Filter;
use crate::status::{ApiError, Cause};
use crate::{defaults, meta, patch, validation};

/// How a PATCH body is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PatchKind {
    /// JSON merge patch (also used for strategic merge patch).
    Merge,
    /// Server-side apply.
    Apply,
}

/// Which part of an object a write targets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// The object itself (its status is kept).
    Object,
    /// The `status` subresource (only the status changes).
    Status,
}

/// Checks that a body is a JSON object whose metadata (if any) is an object; adds empty metadata.
fn check_shape(obj: &mut Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    }
    match obj["metadata"] {
        Value::Null => obj["metadata"] = json!({}),
        Value::Object(_) => {}
        _ => return Err(ApiError::bad_request("metadata must be an object")),
    }
    Ok(())
}

/// Checks (or fills) apiVersion and kind against the path's resource type.
fn check_type(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
    let api_version = rt.api_version();
    for (field, expected) in [("apiVersion", api_version.as_str()), ("kind", rt.kind)] {
        match &obj[field] {
            Value::Null => obj[field] = json!(expected),
            Value::String(actual) if actual == expected => {}
            actual => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({actual}) does not match the expected {field} ({expected})"
                )));
            }
        }
    }
    Ok(())
}

/// Sets (or checks) metadata.namespace and metadata.name from the path.
fn place(rt: &ResourceType, obj: &mut Value, namespace: &str, name: Option<&str>) -> Result<(), ApiError> {
    if rt.namespaced {
        match obj["metadata"]["namespace"].as_str() {
            Some(ns) if !ns.is_empty() && ns != namespace => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => obj["metadata"]["namespace"] = json!(namespace),
        }
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    if let Some(name) = name {
        match obj["metadata"]["name"].as_str() {
            Some(body_name) if !body_name.is_empty() && body_name != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            _ => obj["metadata"]["name"] = json!(name),
        }
    }
    Ok(())
}

impl Cluster {
    /// 404 unless the namespace exists (for namespaced writes).
    fn require_namespace(&self, rt: &ResourceType, namespace: &str) -> Result<(), ApiError> {
        if rt.namespaced && self.store.get(resources::NAMESPACES.plural, "", namespace).is_none() {
            return Err(ApiError::not_found(resources::NAMESPACES, namespace));
        }
        Ok(())
    }

    /// Validates, defaults and normalizes an object about to be stored; on update also rejects
    /// changed immutable fields and bumps the generation.
    fn admit(&self, rt: &ResourceType, old: Option<&Value>, obj: Value) -> Result<Value, ApiError> {
        let name = meta::name(&obj).to_string();
        let invalid = |causes: Vec<Cause>| ApiError::invalid(rt, &name, causes);
        let mut obj = validation::validate(rt, obj).map_err(invalid)?;
        defaults::apply(rt, &mut obj);
        let mut obj = validation::validate(rt, obj).map_err(invalid)?;
        if let Some(old) = old {
            validation::check_immutable(rt, old, &obj).map_err(invalid)?;
            defaults::bump_generation(old, &mut obj);
        }
        Ok(obj)
    }

    /// One object.
    pub fn get(&self, rt: &ResourceType, namespace: &str, name: &str) -> Result<Value, ApiError> {
        self.store.get(rt.plural, namespace, name).cloned().ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// A `<Kind>List` of the selected objects, with the current resourceVersion.
    pub fn list(&self, rt: &ResourceType, filter: &Filter) -> Value {
        let items: Vec<&Value> = self.store.list(rt.plural).filter(|o| filter.matches(o)).collect();
        json!({
            "kind": rt.list_kind(),
            "apiVersion": rt.api_version(),
            "metadata": {"resourceVersion": self.store.resource_version().to_string()},
            "items": items,
        })
    }

    /// Creates an object in `namespace` (ignored for cluster-scoped types).
    pub fn create(&mut self, rt: &'static ResourceType, namespace: &str, mut obj: Value) -> Result<Value, ApiError> {
        check_shape(&mut obj)?;
        check_type(rt, &mut obj)?;
        place(rt, &mut obj, namespace, None)?;
        self.require_namespace(rt, namespace)?;
        let generate = obj["metadata"]["generateName"].as_str().unwrap_or_default().to_string();
        if meta::name(&obj).is_empty() && !generate.is_empty() {
            let prefix: String = generate.chars().take(58).collect();
            let name = loop {
                let candidate = format!("{prefix}{}", meta::random_suffix(5));
                if self.store.get(rt.plural, namespace, &candidate).is_none() {
                    break candidate;
                }
            };
            obj["metadata"]["name"] = json!(name);
        }
        defaults::on_create(rt, &mut obj);
        let mut obj = self.admit(rt, None, obj)?;
        if self.store.get(rt.plural, meta::namespace(&obj), meta::name(&obj)).is_some() {
            return Err(ApiError::already_exists(rt, meta::name(&obj)));
        }
        if rt == resources::SERVICES && obj["spec"]["clusterIP"].is_null() && obj["spec"]["type"] != "ExternalName" {
            let ip = self.next_address("10.96");
            obj["spec"]["clusterIP"] = json!(ip);
            obj["spec"]["clusterIPs"] = json!([ip]);
        }
        Ok(self.store.insert(rt.plural, obj))
    }

    /// Replaces an object (PUT); a set `metadata.resourceVersion` must match the stored one.
    pub fn replace(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        mut obj: Value,
        target: Target,
    ) -> Result<Value, ApiError> {
        check_shape(&mut obj)?;
        check_type(rt, &mut obj)?;
        place(rt, &mut obj, namespace, Some(name))?;
        self.require_namespace(rt, namespace)?;
        let old = self.get(rt, namespace, name)?;
        if let Some(rv) = obj["metadata"]["resourceVersion"].as_str()
            && !rv.is_empty()
            && obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"]
        {
            return Err(ApiError::conflict(
                rt,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        defaults::on_update(&old, &mut obj, target == Target::Status);
        let obj = self.admit(rt, Some(&old), obj)?;
        Ok(self.store.update(rt.plural, obj))
    }

    /// Patches an object; server-side apply creates it when missing. Returns whether it was
    /// created, and the stored object.
    pub fn patch(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        kind: PatchKind,
        body: &Value,
        target: Target,
    ) -> Result<(bool, Value), ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request("the patch must be a JSON object"));
        }
        let old = match self.store.get(rt.plural, namespace, name) {
            Some(old) => old.clone(),
            None if kind == PatchKind::Apply && target == Target::Object => {
                let mut obj = body.clone();
                check_shape(&mut obj)?;
                place(rt, &mut obj, namespace, Some(name))?;
                return Ok((true, self.create(rt, namespace, obj)?));
            }
            None => {
                self.require_namespace(rt, namespace)?;
                return Err(ApiError::not_found(rt, name));
            }
        };
        let mut new = old.clone();
        match kind {
            PatchKind::Merge => {
                if let Some(rv) = body["metadata"]["resourceVersion"].as_str()
                    && rv != meta::resource_version(&old)
                {
                    return Err(ApiError::conflict(
                        rt,
                        name,
                        "the object has been modified; please apply your changes to the latest version and try again",
                    ));
                }
                patch::merge_patch(&mut new, body);
            }
            PatchKind::Apply => {
                let mut applied = body.clone();
                check_shape(&mut applied)?;
                if applied["apiVersion"].is_null() || applied["kind"].is_null() {
                    return Err(ApiError::bad_request("apiVersion and kind must be set in an apply patch"));
                }
                if let Some(m) = applied["metadata"].as_object_mut() {
                    m.remove("resourceVersion");
                }
                patch::apply_merge(&mut new, &applied);
            }
        }
        check_shape(&mut new)?;
        check_type(rt, &mut new)?;
        place(rt, &mut new, namespace, Some(name))?;
        defaults::on_update(&old, &mut new, target == Target::Status);
        let new = self.admit(rt, Some(&old), new)?;
        Ok((false, self.store.update(rt.plural, new)))
    }
}
