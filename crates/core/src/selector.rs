//! Equality-based label selectors, as in Kubernetes: `a=b,c!=d,e,!f`.

use crate::error::Error;
use crate::meta::Labels;
use crate::validation::{check_label_key, check_label_value};

/// A parsed selector; an object matches when every requirement holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    /// `key=value` (or `key==value`).
    pub equals: Labels,
    /// `key!=value`: the key is absent or has another value.
    pub not_equals: Labels,
    /// `key`: the key is present.
    pub exists: Vec<String>,
    /// `!key`: the key is absent.
    pub not_exists: Vec<String>,
}

impl LabelSelector {
    /// Parses a selector; `field` names the query parameter in errors.
    ///
    /// # Errors
    /// [`Error::Invalid`] naming `field` when a requirement is malformed.
    pub fn parse(field: &str, input: &str) -> Result<Self, Error> {
        let mut selector = Self::default();
        // Split at commas, a set (`env in (a,b)`) would read as pieces of requirements.
        if input.contains(['(', ')']) {
            return Err(Error::invalid(
                field,
                "set-based requirements (key in (a,b), key notin (a,b)) are not supported: use key=value, \
                 key!=value, key and !key, joined by commas"
                    .to_owned(),
            ));
        }
        for term in input.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let bad = |m: String| Error::invalid(field, format!("requirement {term:?}: {m}"));
            if let Some((key, value)) = term.split_once("!=") {
                let (key, value) = (key.trim(), value.trim());
                check_label_key(key).and_then(|()| check_label_value(value)).map_err(bad)?;
                selector.not_equals.insert(key.into(), value.into());
            } else if let Some((key, value)) = term.split_once('=') {
                let (key, value) = (key.trim(), value.trim_start_matches('=').trim());
                check_label_key(key).and_then(|()| check_label_value(value)).map_err(bad)?;
                selector.equals.insert(key.into(), value.into());
            } else if let Some(key) = term.strip_prefix('!') {
                check_label_key(key.trim()).map_err(bad)?;
                selector.not_exists.push(key.trim().into());
            } else {
                check_label_key(term).map_err(bad)?;
                selector.exists.push(term.into());
            }
        }
        Ok(selector)
    }

    /// Whether `labels` satisfies every requirement.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.equals.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.not_equals.iter().all(|(k, v)| labels.get(k) != Some(v))
            && self.exists.iter().all(|k| labels.contains_key(k))
            && self.not_exists.iter().all(|k| !labels.contains_key(k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_four_requirement_kinds() {
        let s = LabelSelector::parse("labels", "tier=spot, region != eu,gpu,!legacy").unwrap();
        assert_eq!(s.equals.get("tier").map(String::as_str), Some("spot"));
        assert_eq!(s.not_equals.get("region").map(String::as_str), Some("eu"));
        assert_eq!(s.exists, vec!["gpu".to_string()]);
        assert_eq!(s.not_exists, vec!["legacy".to_string()]);
        let labels = Labels::from([("tier".into(), "spot".into()), ("gpu".into(), String::new())]);
        assert!(s.matches(&labels));
        assert!(!s.matches(&Labels::new()));
    }

    #[test]
    fn rejects_malformed_requirements_naming_the_parameter() {
        let Err(Error::Invalid(e)) = LabelSelector::parse("labels", "a=b c") else { panic!() };
        assert_eq!(e[0].field, "labels");
        assert!(LabelSelector::parse("labels", "'; drop table x; --").is_err());
        let Err(Error::Invalid(e)) = LabelSelector::parse("labels", "env in (prod,dev)") else { panic!() };
        assert!(e[0].message.starts_with("set-based requirements (key in (a,b)"), "{}", e[0].message);
    }
}
