//! Label and field selectors: the query-string forms of list/watch and the structured
//! `LabelSelector` of workload specs.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::meta;

/// One requirement of a label selector query.
#[derive(Clone, Debug, PartialEq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

impl LabelRequirement {
    fn parse(term: &str) -> Result<Self, String> {
        let term = term.trim();
        if let Some(open) = term.find('(') {
            let close = term
                .rfind(')')
                .filter(|close| *close > open)
                .ok_or_else(|| format!("unbalanced parenthesis in {term:?}"))?;
            let mut head = term[..open].split_whitespace();
            let (Some(key), Some(op), None) = (head.next(), head.next(), head.next()) else {
                return Err(format!("couldn't parse the selector term {term:?}"));
            };
            let values =
                term[open + 1..close].split(',').map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).collect();
            return match op {
                "in" => Ok(Self::In(key.to_string(), values)),
                "notin" => Ok(Self::NotIn(key.to_string(), values)),
                _ => Err(format!("unknown operator {op:?} in {term:?}")),
            };
        }
        if let Some((key, value)) = term.split_once("!=") {
            return Ok(Self::NotEquals(key.trim().to_string(), value.trim().to_string()));
        }
        if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
            return Ok(Self::Equals(key.trim().to_string(), value.trim().to_string()));
        }
        if let Some(key) = term.strip_prefix('!') {
            return Ok(Self::NotExists(key.trim().to_string()));
        }
        if term.is_empty() || term.contains(char::is_whitespace) {
            return Err(format!("couldn't parse the selector term {term:?}"));
        }
        Ok(Self::Exists(term.to_string()))
    }

    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Equals(k, v) => labels.get(k) == Some(v),
            Self::NotEquals(k, v) => labels.get(k) != Some(v),
            Self::Exists(k) => labels.contains_key(k),
            Self::NotExists(k) => !labels.contains_key(k),
            Self::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Self::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
        }
    }
}

/// Splits a selector at the commas that are not inside parentheses.
fn split_terms(selector: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms.into_iter().filter(|t| !t.trim().is_empty()).collect()
}

/// A parsed `labelSelector` query parameter.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct LabelQuery(Vec<LabelRequirement>);

impl LabelQuery {
    /// Parses `app=x,tier!=db,env in (a,b),!legacy`.
    pub fn parse(selector: &str) -> Result<Self, String> {
        split_terms(selector).into_iter().map(LabelRequirement::parse).collect::<Result<_, _>>().map(Self)
    }

    /// Whether an object's labels satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = meta::labels(obj);
        self.0.iter().all(|r| r.matches(&labels))
    }
}

/// The fields a field selector may name.
const SELECTABLE_FIELDS: [&str; 4] = ["metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"];

/// One `field=value` or `field!=value` requirement.
#[derive(Clone, Debug, PartialEq)]
struct FieldRequirement {
    field: &'static str,
    value: String,
    equal: bool,
}

/// A parsed `fieldSelector` query parameter.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct FieldQuery(Vec<FieldRequirement>);

impl FieldQuery {
    /// Parses `spec.nodeName=n1,status.phase!=Failed`.
    pub fn parse(selector: &str) -> Result<Self, String> {
        split_terms(selector)
            .into_iter()
            .map(|term| {
                let (field, value, equal) = if let Some((f, v)) = term.split_once("!=") {
                    (f, v, false)
                } else if let Some((f, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                    (f, v, true)
                } else {
                    return Err(format!("invalid field selector term {term:?}"));
                };
                let field = SELECTABLE_FIELDS
                    .into_iter()
                    .find(|known| *known == field.trim())
                    .ok_or_else(|| format!("field label not supported: {}", field.trim()))?;
                Ok(FieldRequirement { field, value: value.trim().to_string(), equal })
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether an object's fields satisfy every requirement (a missing field reads as "").
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = r.field.split('.').fold(obj, |v, segment| &v[segment]).as_str().unwrap_or_default();
            (actual == r.value) == r.equal
        })
    }
}

/// What a list or watch selects: a namespace (from the path), labels and fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Filter {
    /// Only objects in this namespace; all when `None`.
    pub namespace: Option<String>,
    /// The `labelSelector`.
    pub labels: LabelQuery,
    /// The `fieldSelector`.
    pub fields: FieldQuery,
}

impl Filter {
    /// Whether an object is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        self.namespace.as_deref().is_none_or(|ns| meta::namespace(obj) == ns)
            && self.labels.matches(obj)
            && self.fields.matches(obj)
    }
}

/// Whether labels satisfy a structured `LabelSelector` (matchLabels and matchExpressions).
pub(crate) fn label_selector_matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let expressions_ok = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|l| values.contains(l)),
            "NotIn" => labels.get(&e.key).is_none_or(|l| !values.contains(l)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}})
    }

    #[test]
    fn label_query_supports_every_operator() {
        let obj = pod(json!({"app": "web", "tier": "front"}));
        for (selector, expected) in [
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app in (db, web)", true),
            ("app notin (db,web)", false),
            ("missing notin (x)", true),
            ("app=web,tier in (back)", false),
            ("app in (web),tier=front", true),
        ] {
            let query = LabelQuery::parse(selector).unwrap();
            assert_eq!(query.matches(&obj), expected, "{selector}");
        }
        assert!(LabelQuery::parse("app in (a").is_err());
    }

    #[test]
    fn field_query_reads_supported_fields() {
        let obj = pod(json!({}));
        assert!(FieldQuery::parse("spec.nodeName=n1,status.phase!=Failed").unwrap().matches(&obj));
        assert!(!FieldQuery::parse("metadata.name=q").unwrap().matches(&obj));
        assert!(FieldQuery::parse("metadata.namespace==ns").unwrap().matches(&obj));
        assert!(FieldQuery::parse("spec.hostname=x").is_err());
    }
}
