//! The object store: current objects, the global resourceVersion, retained change history and
//! the broadcast of changes to open watches.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::{Notify, broadcast};

use crate::meta;

/// How many changes an open watch may fall behind before it is ended (it then resumes from history).
const BROADCAST_CAPACITY: usize = 16_384;

/// Kind of a change, as written in a watch event's `type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeKind {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

impl ChangeKind {
    /// The watch event `type`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change to one object.
#[derive(Debug)]
pub(crate) struct Change {
    /// The resourceVersion the change produced.
    pub rv: u64,
    /// Plural of the object's resource type.
    pub plural: &'static str,
    /// What happened.
    pub kind: ChangeKind,
    /// The object after the change (its last state for deletions).
    pub object: Arc<Value>,
    /// The object before the change (for modifications).
    pub previous: Option<Arc<Value>>,
}

/// Where retained history starts: watches from an older resourceVersion get 410 Gone.
#[derive(Debug)]
pub(crate) struct Expired {
    /// The oldest resourceVersion a watch may resume from.
    pub oldest: u64,
}

/// Objects keyed by `(namespace, name)`; namespace is empty for cluster-scoped objects.
type Objects = BTreeMap<(String, String), Value>;

/// The object store.
pub(crate) struct Store {
    rv: u64,
    objects: HashMap<&'static str, Objects>,
    history: VecDeque<Arc<Change>>,
    /// The oldest resourceVersion a watch can resume from.
    floor: u64,
    history_limit: usize,
    changes: broadcast::Sender<Arc<Change>>,
    wake: Arc<Notify>,
}

impl Store {
    /// An empty store; `wake` is notified on every change.
    pub fn new(history_limit: usize, wake: Arc<Notify>) -> Self {
        let (changes, _) = broadcast::channel(BROADCAST_CAPACITY);
        Self { rv: 0, objects: HashMap::new(), history: VecDeque::new(), floor: 0, history_limit, changes, wake }
    }

    /// The current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// One object.
    pub fn get(&self, plural: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.get(plural)?.get(&(namespace.to_string(), name.to_string()))
    }

    /// All objects of a resource type, ordered by namespace then name.
    pub fn list(&self, plural: &str) -> impl Iterator<Item = &Value> {
        self.objects.get(plural).into_iter().flat_map(BTreeMap::values)
    }

    /// Clones of all objects of a resource type (for controllers that modify while iterating).
    pub fn snapshot(&self, plural: &str) -> Vec<Value> {
        self.list(plural).cloned().collect()
    }

    /// Clones of the objects of a resource type that `keep` selects: the controllers pass
    /// every tick, and cloning what they skip (every finished pod) cost an idle cluster a
    /// fifth of a core.
    pub fn snapshot_where(&self, plural: &str, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
        self.list(plural).filter(|o| keep(o)).cloned().collect()
    }

    /// Stores a new object (the caller checked it does not exist) and returns it as stored.
    pub fn insert(&mut self, plural: &'static str, mut obj: Value) -> Value {
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        let key = (meta::namespace(&obj).to_string(), meta::name(&obj).to_string());
        self.objects.entry(plural).or_default().insert(key, obj.clone());
        self.record(rv, plural, ChangeKind::Added, &obj, None);
        obj
    }

    /// Replaces an existing object if it differs (ignoring its resourceVersion) and returns it as
    /// stored; an unchanged object keeps its resourceVersion and produces no event. An object
    /// that no longer exists is not brought back.
    pub fn update(&mut self, plural: &'static str, mut obj: Value) -> Value {
        let key = (meta::namespace(&obj).to_string(), meta::name(&obj).to_string());
        let Some(old) = self.objects.get(plural).and_then(|m| m.get(&key)) else {
            return obj;
        };
        obj["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if obj == *old {
            return obj;
        }
        let previous = Arc::new(old.clone());
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.objects.entry(plural).or_default().insert(key, obj.clone());
        self.record(rv, plural, ChangeKind::Modified, &obj, Some(previous));
        obj
    }

    /// Applies `change` to a copy of an object and stores it if it changed (nothing happens
    /// when the object does not exist).
    pub fn modify(&mut self, plural: &'static str, namespace: &str, name: &str, change: impl FnOnce(&mut Value)) {
        if let Some(mut obj) = self.get(plural, namespace, name).cloned() {
            change(&mut obj);
            self.update(plural, obj);
        }
    }

    /// Removes an object; the DELETED event carries its last state with a new resourceVersion.
    pub fn remove(&mut self, plural: &'static str, namespace: &str, name: &str) -> Option<Value> {
        let mut obj = self.objects.get_mut(plural)?.remove(&(namespace.to_string(), name.to_string()))?;
        let rv = self.bump();
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        self.record(rv, plural, ChangeKind::Deleted, &obj, None);
        Some(obj)
    }

    /// A receiver of every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }

    /// Retained changes after `rv`, or [`Expired`] when changes after `rv` were forgotten.
    pub fn changes_since(&self, rv: u64) -> Result<impl Iterator<Item = &Arc<Change>>, Expired> {
        if rv < self.floor {
            return Err(Expired { oldest: self.floor });
        }
        Ok(self.history.iter().filter(move |c| c.rv > rv))
    }

    /// Forgets all retained changes: only the current resourceVersion can be resumed from.
    pub fn compact(&mut self) {
        self.history.clear();
        self.floor = self.rv;
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    fn record(&mut self, rv: u64, plural: &'static str, kind: ChangeKind, obj: &Value, previous: Option<Arc<Value>>) {
        let change = Arc::new(Change { rv, plural, kind, object: Arc::new(obj.clone()), previous });
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.floor = dropped.rv;
            }
        }
        // No open watch is not an error.
        let _ = self.changes.send(change);
        self.wake.notify_one();
    }
}
