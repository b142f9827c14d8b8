//! Deletion: graceful pod deletion, owner deletion with propagation (Foreground, Background,
//! Orphan), namespace deletion, and the options a DELETE request carries.

use std::collections::HashMap;
use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::DeleteOptions as K8sDeleteOptions;
use serde_json::{Value, json};

use crate::cluster::Cluster;
use crate::meta;
use crate::resources::{self, ResourceType};
use crate::status::ApiError;

/// The finalizer that keeps an owner until its dependents are gone.
pub(crate) const FOREGROUND_FINALIZER: &str = "foregroundDeletion";

/// How the dependents of a deleted owner are treated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Propagation {
    /// Dependents are deleted first; the owner is removed once they are gone.
    Foreground,
    /// The owner is removed now; the garbage collector deletes the dependents afterwards.
    Background,
    /// Dependents lose their ownerReference and stay.
    Orphan,
}

/// The options of a DELETE request (body `DeleteOptions` and/or query parameters).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct DeleteOptions {
    /// `propagationPolicy`; Background when absent.
    pub propagation: Option<Propagation>,
    /// `gracePeriodSeconds`; the pod's terminationGracePeriodSeconds when absent.
    pub grace_seconds: Option<i64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
}

impl DeleteOptions {
    /// Reads the options from a (possibly empty) JSON body and the query parameters.
    pub fn parse(body: &[u8], query: &HashMap<String, String>) -> Result<Self, ApiError> {
        let from_body: K8sDeleteOptions = if body.iter().all(u8::is_ascii_whitespace) {
            K8sDeleteOptions::default()
        } else {
            serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
        };
        let policy = query
            .get("propagationPolicy")
            .cloned()
            .or(from_body.propagation_policy)
            .or_else(|| from_body.orphan_dependents.filter(|o| *o).map(|_| "Orphan".to_string()));
        let propagation = match policy.as_deref() {
            None => None,
            Some("Foreground") => Some(Propagation::Foreground),
            Some("Background") => Some(Propagation::Background),
            Some("Orphan") => Some(Propagation::Orphan),
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "propagationPolicy: Unsupported value: {other:?}: supported values: \"Foreground\", \"Background\", \"Orphan\""
                )));
            }
        };
        let grace_seconds = match query.get("gracePeriodSeconds") {
            Some(g) => Some(g.parse().map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?),
            None => from_body.grace_period_seconds,
        };
        let preconditions = from_body.preconditions.unwrap_or_default();
        Ok(Self {
            propagation,
            grace_seconds,
            uid: preconditions.uid,
            resource_version: preconditions.resource_version,
        })
    }
}

/// Marks an object as being deleted (keeping an earlier mark).
fn mark_deleting(obj: &mut Value, grace: i64) {
    if !meta::is_deleting(obj) {
        obj["metadata"]["deletionTimestamp"] = json!(meta::timestamp_in(grace));
        obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
    }
}

impl Cluster {
    /// Deletes an object as a DELETE request does; returns the object (its last state, or its
    /// state while it is being deleted).
    pub fn delete(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        options: &DeleteOptions,
    ) -> Result<Value, ApiError> {
        let obj = self.get(rt, namespace, name)?;
        let precondition_failed = |what: &str, expected: &str, actual: &str| {
            ApiError::conflict(
                rt,
                name,
                &format!("Precondition failed: {what} in precondition: {expected}, {what} in object meta: {actual}"),
            )
        };
        if let Some(uid) = &options.uid
            && uid != meta::uid(&obj)
        {
            return Err(precondition_failed("UID", uid, meta::uid(&obj)));
        }
        if let Some(rv) = &options.resource_version
            && rv != meta::resource_version(&obj)
        {
            return Err(precondition_failed("ResourceVersion", rv, meta::resource_version(&obj)));
        }
        let result = if rt == resources::NAMESPACES {
            self.delete_namespace(name)
        } else {
            let propagation = options.propagation.unwrap_or(Propagation::Background);
            self.delete_object(rt, namespace, name, propagation, options.grace_seconds)
        };
        Ok(result.unwrap_or(obj))
    }

    /// Deletes a namespaced or cluster-scoped object (not a namespace): pods gracefully, owners
    /// with `propagation`.
    pub fn delete_object(
        &mut self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        propagation: Propagation,
        grace: Option<i64>,
    ) -> Option<Value> {
        if rt == resources::PODS {
            return self.delete_pod(namespace, name, grace);
        }
        let obj = self.store.get(rt.plural, namespace, name)?.clone();
        let uid = meta::uid(&obj).to_string();
        match propagation {
            Propagation::Background => self.remove_or_mark(rt, namespace, name),
            Propagation::Orphan => {
                for (dep_rt, dep_ns, dep_name) in self.dependents(&uid) {
                    self.store.modify(dep_rt.plural, &dep_ns, &dep_name, |dep| {
                        if let Some(refs) = dep["metadata"]["ownerReferences"].as_array_mut() {
                            refs.retain(|r| r["uid"] != uid.as_str());
                        }
                        if dep["metadata"]["ownerReferences"].as_array().is_some_and(Vec::is_empty)
                            && let Some(m) = dep["metadata"].as_object_mut()
                        {
                            m.remove("ownerReferences");
                        }
                    });
                }
                self.remove_or_mark(rt, namespace, name)
            }
            Propagation::Foreground => {
                self.store.modify(rt.plural, namespace, name, |o| {
                    mark_deleting(o, 0);
                    if !meta::finalizers(o).iter().any(|f| f == FOREGROUND_FINALIZER) {
                        let mut finalizers = meta::finalizers(o);
                        finalizers.push(FOREGROUND_FINALIZER.to_string());
                        o["metadata"]["finalizers"] = json!(finalizers);
                    }
                });
                for (dep_rt, dep_ns, dep_name) in self.dependents(&uid) {
                    self.delete_object(dep_rt, &dep_ns, &dep_name, Propagation::Foreground, grace);
                }
                self.store.get(rt.plural, namespace, name).cloned()
            }
        }
    }

    /// Deletes a pod: an unbound or finished pod (or grace 0) goes at once; a running one gets
    /// deletionTimestamp and its containers are stopped by the fake kubelet.
    pub fn delete_pod(&mut self, namespace: &str, name: &str, grace: Option<i64>) -> Option<Value> {
        let pod = self.store.get(resources::PODS.plural, namespace, name)?.clone();
        let finished = matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
        let unbound = pod["spec"]["nodeName"].as_str().is_none_or(str::is_empty);
        if grace == Some(0) || finished || unbound {
            return self.remove_or_mark(resources::PODS, namespace, name);
        }
        if meta::is_deleting(&pod) {
            // As the API server: a shorter grace period replaces the one that runs (the
            // kubelet kills the containers when the shorter one ends).
            let current = pod["metadata"]["deletionGracePeriodSeconds"].as_i64().unwrap_or(0);
            if let Some(shorter) = grace.filter(|g| *g < current).map(|g| g.max(0)) {
                let now = Instant::now();
                let clock = self.pod_clocks.entry(meta::uid(&pod).to_string()).or_default();
                let kill_by = now + std::time::Duration::from_secs(shorter.unsigned_abs());
                let running =
                    clock.stop_requested.map(|at| at + std::time::Duration::from_secs(current.unsigned_abs()));
                clock.kill_by = Some(clock.kill_by.or(running).map_or(kill_by, |k| k.min(kill_by)));
                self.store.modify(resources::PODS.plural, namespace, name, |p| {
                    p["metadata"]["deletionTimestamp"] = json!(meta::timestamp_in(shorter));
                    p["metadata"]["deletionGracePeriodSeconds"] = json!(shorter);
                });
                return self.store.get(resources::PODS.plural, namespace, name).cloned();
            }
            return Some(pod);
        }
        let grace = grace.or_else(|| pod["spec"]["terminationGracePeriodSeconds"].as_i64()).unwrap_or(30).max(0);
        self.pod_clocks.entry(meta::uid(&pod).to_string()).or_default().stop_requested = Some(Instant::now());
        self.store.modify(resources::PODS.plural, namespace, name, |p| mark_deleting(p, grace));
        self.store.get(resources::PODS.plural, namespace, name).cloned()
    }

    /// Removes an object now unless it has finalizers, in which case it is only marked deleted.
    pub fn remove_or_mark(&mut self, rt: &'static ResourceType, namespace: &str, name: &str) -> Option<Value> {
        let obj = self.store.get(rt.plural, namespace, name)?;
        if meta::finalizers(obj).is_empty() {
            return self.store.remove(rt.plural, namespace, name);
        }
        self.store.modify(rt.plural, namespace, name, |o| mark_deleting(o, 0));
        self.store.get(rt.plural, namespace, name).cloned()
    }

    /// The objects with an ownerReference to `uid`, as `(type, namespace, name)`.
    pub fn dependents(&self, uid: &str) -> Vec<(&'static ResourceType, String, String)> {
        resources::ALL
            .into_iter()
            .filter(|rt| rt.namespaced)
            .flat_map(|rt| {
                self.store
                    .list(rt.plural)
                    .filter(|o| meta::is_owned_by(o, uid))
                    .map(move |o| (rt, meta::namespace(o).to_string(), meta::name(o).to_string()))
            })
            .collect()
    }

    /// Removes a namespace and everything in it.
    fn delete_namespace(&mut self, name: &str) -> Option<Value> {
        for rt in resources::ALL.into_iter().filter(|rt| rt.namespaced) {
            let names: Vec<String> = self
                .store
                .list(rt.plural)
                .filter(|o| meta::namespace(o) == name)
                .map(|o| meta::name(o).to_string())
                .collect();
            for obj_name in names {
                self.store.remove(rt.plural, name, &obj_name);
            }
        }
        self.store.remove(resources::NAMESPACES.plural, "", name)
    }
}
