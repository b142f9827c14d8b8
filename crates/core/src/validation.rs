//! Field-level validation. Errors name the offending field as a JSON pointer into the
//! request body (`/spec/tasks/count`), or the query parameter name for query input.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::Error;

/// One broken rule, naming the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FieldError {
    /// JSON pointer (RFC 6901) into the request body, or the query parameter's name.
    #[schema(example = "/spec/quotas/0/limit")]
    pub field: String,
    /// What is wrong, in plain words.
    #[schema(example = "limit (4) must not be below guaranteed (8)")]
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// Collects field errors; [`Validator::finish`] turns them into [`Error::Invalid`].
#[derive(Debug, Default)]
pub struct Validator {
    errors: Vec<FieldError>,
}

pub const NAME_MAX: usize = 63;
const LABEL_MAX: usize = 64;
const LABEL_PART_MAX: usize = 63;
const LABEL_PREFIX_MAX: usize = 253;

impl Validator {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(FieldError::new(field, message));
    }

    /// Records an error when `ok` is false.
    pub fn check(&mut self, ok: bool, field: impl Into<String>, message: impl FnOnce() -> String) {
        if !ok {
            self.error(field, message());
        }
    }

    /// A DNS-1123 label: lower-case alphanumerics and '-', starting and ending with an
    /// alphanumeric, at most 63 characters. Every object name is one.
    pub fn name(&mut self, field: &str, value: &str) {
        if let Err(message) = check_dns_label(value) {
            self.error(field, message);
        }
    }

    /// Labels as in Kubernetes: `[prefix/]name` keys and short values.
    pub fn labels(&mut self, field: &str, labels: &BTreeMap<String, String>) {
        if labels.len() > LABEL_MAX {
            self.error(field, format!("at most {LABEL_MAX} labels are allowed"));
        }
        for (key, value) in labels {
            let at = format!("{field}/{}", escape_pointer(key));
            if let Err(message) = check_label_key(key) {
                self.error(&at, message);
            }
            if let Err(message) = check_label_value(value) {
                self.error(&at, message);
            }
        }
    }

    /// A string no longer than `max` characters and free of control characters.
    pub fn text(&mut self, field: &str, value: &str, max: usize) {
        if value.chars().count() > max {
            self.error(field, format!("must be at most {max} characters"));
        } else if value.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            self.error(field, "must not contain control characters");
        }
    }

    /// Ends validation.
    ///
    /// # Errors
    /// [`Error::Invalid`] listing every recorded field error, if there was any.
    pub fn finish(self) -> Result<(), Error> {
        if self.errors.is_empty() { Ok(()) } else { Err(Error::Invalid(self.errors)) }
    }
}

/// Escapes one JSON-pointer reference token (RFC 6901: `~` → `~0`, `/` → `~1`).
pub fn escape_pointer(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// Checks a DNS-1123 label.
///
/// The longest `generate_name` prefix: with the 5 characters added, a name of 63.
pub const MAX_NAME_PREFIX: usize = 58;

/// A `generate_name` prefix: what starts a DNS-1123 label (the random end finishes it).
///
/// # Errors
/// A message saying what is wrong with it.
pub fn check_name_prefix(prefix: &str) -> Result<(), String> {
    let ok = !prefix.is_empty()
        && prefix.len() <= MAX_NAME_PREFIX
        && prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !prefix.starts_with('-');
    ok.then_some(()).ok_or_else(|| {
        format!(
            "must be 1 to {MAX_NAME_PREFIX} lower-case letters, digits and '-', not starting with '-' (5 random \
             characters are added)"
        )
    })
}

/// A search within names: what a DNS-1123 label may contain.
///
/// # Errors
/// A message saying what is wrong with it.
pub fn check_name_part(part: &str) -> Result<(), String> {
    let ok = !part.is_empty()
        && part.len() <= NAME_MAX
        && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    ok.then_some(())
        .ok_or_else(|| format!("must be 1 to {NAME_MAX} lower-case letters, digits and '-' (names have no others)"))
}

/// # Errors
/// A message saying what is wrong with it.
pub fn check_dns_label(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.len() > NAME_MAX {
        return Err(format!("must be at most {NAME_MAX} characters"));
    }
    let bytes = value.as_bytes();
    let ok = bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err("must be a DNS-1123 label: lower-case letters, digits and '-', starting and ending with a letter or digit"
            .into())
    }
}

fn is_label_part(value: &str) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= LABEL_PART_MAX
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
}

fn is_dns_subdomain(value: &str) -> bool {
    !value.is_empty() && value.len() <= LABEL_PREFIX_MAX && value.split('.').all(|part| check_dns_label(part).is_ok())
}

/// Checks a label key: `name` or `prefix/name`.
///
/// # Errors
/// A message saying what is wrong with it.
pub fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if prefix.is_some_and(|p| !is_dns_subdomain(p)) {
        return Err("label key prefix must be a DNS subdomain".into());
    }
    if !is_label_part(name) {
        return Err("label key must be 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into());
    }
    Ok(())
}

/// Checks a label value: empty, or like a label key's name part.
///
/// # Errors
/// A message saying what is wrong with it.
pub fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_part(value) {
        Ok(())
    } else {
        Err("label value must be empty or 1-63 characters of letters, digits, '-', '_' or '.', starting and ending with a letter or digit".into())
    }
}

/// An `Idempotency-Key`: 1 to 255 visible ASCII characters (a UUID is the usual choice).
///
/// # Errors
/// The reason, in words.
pub fn check_idempotency_key(key: &str) -> Result<(), String> {
    if key.is_empty() || key.len() > 255 || !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("must be 1 to 255 visible ASCII characters (a UUID, say)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels_accept_only_lowercase_alphanumerics_and_inner_dashes() {
        for good in ["a", "nlp", "team-1", "0abc", &"a".repeat(63)] {
            assert!(check_dns_label(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "é", "a b", "drop table;", &"a".repeat(64)] {
            assert!(check_dns_label(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_keys_allow_a_dns_prefix() {
        assert!(check_label_key("berth.dev/tier").is_ok());
        assert!(check_label_key("tier").is_ok());
        assert!(check_label_key("Bad_Prefix/x").is_err());
        assert!(check_label_key("x/").is_err());
        assert!(check_label_value("").is_ok());
        assert!(check_label_value("on-demand").is_ok());
        assert!(check_label_value("'; drop").is_err());
    }

    #[test]
    fn label_errors_point_at_the_escaped_key() {
        let mut v = Validator::new();
        v.labels("/metadata/labels", &BTreeMap::from([("a/b/c".into(), "x".into())]));
        let Err(Error::Invalid(errors)) = v.finish() else { panic!("expected invalid") };
        assert_eq!(errors[0].field, "/metadata/labels/a~1b~1c");
    }
}
