//! Patch semantics: JSON merge patch (RFC 7386) and the simplified server-side apply merge.

use serde_json::{Map, Value};

/// Applies a JSON merge patch (RFC 7386) to `target`: objects merge recursively, `null` removes
/// a key, everything else replaces.
pub(crate) fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(target) = target else {
        return;
    };
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

/// Merges an applied configuration into `target` for server-side apply: maps merge recursively,
/// arrays and scalars replace.
pub(crate) fn apply_merge(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(target), Value::Object(applied)) => {
            for (key, value) in applied {
                match target.get_mut(key) {
                    Some(existing) => apply_merge(existing, value),
                    None => {
                        target.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (target, applied) => *target = applied.clone(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7386() {
        let mut target = json!({"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]});
        merge_patch(&mut target, &json!({"a": "z", "c": {"f": null}, "list": [3]}));
        assert_eq!(target, json!({"a": "z", "c": {"d": "e"}, "list": [3]}));
    }

    #[test]
    fn apply_merges_maps_and_replaces_arrays() {
        let mut target = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"x": [1, 2], "y": 1}});
        apply_merge(&mut target, &json!({"metadata": {"labels": {"b": "2"}}, "spec": {"x": [3]}}));
        assert_eq!(target, json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"x": [3], "y": 1}}));
    }
}
