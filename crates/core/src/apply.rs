//! The rules of declarative apply (PUT = create-or-replace), kept pure so they are tested
//! once for every resource.
//!
//! # Guarantees
//! - Applying the same spec and labels twice changes nothing (no new generation, no new
//!   resource version, no audit record).
//! - `generation` increments exactly when `spec` changes.
//! - A stale `If-Match` fails with 412; a stale `metadata.resource_version` or `uid` in the
//!   body fails with 409. Neither writes anything.

use uuid::Uuid;

use crate::error::Error;
use crate::meta::{ApplyMeta, Labels};
use crate::validation::Validator;

/// A write's precondition: an `If-Match` request header, or `If-None-Match: *`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IfMatch {
    /// `If-Match: *` — the object must exist.
    Any,
    /// `If-None-Match: *` — the object must not exist (create only, never replace).
    Absent,
    /// `If-None-Match` with entity tags: none may match the current version (an object
    /// that does not exist matches none).
    NotVersions(Vec<String>),
    /// One or more strong entity tags (resource versions); one must match.
    Versions(Vec<String>),
}

impl IfMatch {
    /// Reads the header value: `*`, or a comma-separated list of entity tags (`"42"`; a
    /// bare `42` is taken as `"42"`). If-Match compares strongly, so a weak tag (`W/"42"`)
    /// matches nothing, and so does a value that names no version at all: the write is
    /// refused with 412, never made on a guess.
    pub fn parse(value: &str) -> Self {
        let value = value.trim();
        if value == "*" {
            return Self::Any;
        }
        Self::Versions(Self::tags(value, false))
    }

    /// Reads an `If-None-Match` header value: `*` (the object must not exist) or entity
    /// tags compared weakly (`W/"42"` names version 42 too), none of which may match.
    pub fn parse_none_match(value: &str) -> Self {
        let value = value.trim();
        if value == "*" {
            return Self::Absent;
        }
        Self::NotVersions(Self::tags(value, true))
    }

    fn tags(value: &str, weak: bool) -> Vec<String> {
        value
            .split(',')
            .map(str::trim)
            .filter_map(|tag| {
                if weak {
                    Some(tag.strip_prefix("W/").unwrap_or(tag))
                } else {
                    Some(tag).filter(|t| !t.starts_with("W/"))
                }
            })
            .filter(|tag| !tag.is_empty())
            .map(|tag| tag.strip_prefix('"').and_then(|t| t.strip_suffix('"')).unwrap_or(tag).to_owned())
            .collect()
    }

    fn matches(&self, resource_version: i64) -> bool {
        match self {
            Self::Any => true,
            Self::Absent => false,
            Self::Versions(tags) => tags.iter().any(|t| *t == resource_version.to_string()),
            Self::NotVersions(tags) => !tags.iter().any(|t| *t == resource_version.to_string()),
        }
    }
}

/// The stored object, as far as apply needs to know it.
#[derive(Debug, Clone, Copy)]
pub struct Current<'a, S> {
    pub uid: Uuid,
    pub generation: i64,
    pub resource_version: i64,
    pub spec: &'a S,
    pub labels: &'a Labels,
}

/// What an apply must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyAction {
    Create,
    /// Write the new spec and labels; `generation` is the one to store.
    Update {
        generation: i64,
    },
    /// Nothing changed: write nothing.
    Unchanged,
}

/// The outcome reported to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Created,
    Updated,
    Unchanged,
}

/// Checks an apply's preconditions and decides what to write.
///
/// # Errors
/// - [`Error::PreconditionFailed`] when `if_match` does not hold (including `If-Match` on
///   an object that does not exist);
/// - [`Error::Conflict`] when the body's `metadata.resource_version` or `metadata.uid`
///   differs from the stored object's.
pub fn plan<S: PartialEq>(
    current: Option<Current<'_, S>>,
    meta: &ApplyMeta,
    spec: &S,
    labels: &Labels,
    if_match: Option<&IfMatch>,
) -> Result<ApplyAction, Error> {
    let Some(current) = current else {
        if if_match.is_some_and(|m| matches!(m, IfMatch::Any | IfMatch::Versions(_))) {
            return Err(Error::PreconditionFailed("If-Match was given but the object does not exist".into()));
        }
        if meta.resource_version.is_some() {
            return Err(Error::conflict(
                "/metadata/resource_version",
                "the object does not exist; omit resource_version to create it",
            ));
        }
        // A client re-sending its copy of an object deleted meanwhile must not bring it back.
        if meta.uid.is_some() {
            return Err(Error::conflict(
                "/metadata/uid",
                "the object with this uid does not exist (deleted?); omit uid to create a new one",
            ));
        }
        return Ok(ApplyAction::Create);
    };
    if let Some(if_match) = if_match
        && !if_match.matches(current.resource_version)
    {
        return Err(unmatched(if_match, current.resource_version));
    }
    if let Some(rv) = &meta.resource_version
        && *rv != current.resource_version.to_string()
    {
        return Err(Error::conflict(
            "/metadata/resource_version",
            format!("resource_version {rv:?} is stale; the object is now at {}", current.resource_version),
        ));
    }
    if let Some(uid) = meta.uid
        && uid != current.uid
    {
        return Err(Error::conflict(
            "/metadata/uid",
            "uid names a different object than the one stored under this name",
        ));
    }
    let spec_changed = current.spec != spec;
    if !spec_changed && current.labels == labels {
        return Ok(ApplyAction::Unchanged);
    }
    let generation = current.generation + i64::from(spec_changed);
    Ok(ApplyAction::Update { generation })
}

/// Checks a delete's `If-Match` precondition.
///
/// # Errors
/// [`Error::PreconditionFailed`] when it does not hold.
pub fn check_delete(resource_version: i64, if_match: Option<&IfMatch>) -> Result<(), Error> {
    match if_match {
        Some(m) if !m.matches(resource_version) => Err(unmatched(m, resource_version)),
        _ => Ok(()),
    }
}

/// The 412 for a precondition the current version fails.
fn unmatched(m: &IfMatch, resource_version: i64) -> Error {
    Error::PreconditionFailed(match m {
        IfMatch::Absent => "If-None-Match: * was given and the object exists".to_owned(),
        IfMatch::NotVersions(_) => format!("If-None-Match names the current resource version {resource_version}"),
        IfMatch::Any | IfMatch::Versions(_) => {
            format!("If-Match does not match the current resource version {resource_version}")
        }
    })
}

/// Validates the parts of [`ApplyMeta`] common to every resource: the name in the body
/// (if any) must match the path, and labels must be well-formed.
pub fn validate_meta(v: &mut Validator, meta: &ApplyMeta, path_name: &str) {
    v.name("/metadata/name", path_name);
    if let Some(team) = &meta.team {
        v.name("/metadata/team", team);
    }
    if let Some(name) = &meta.name {
        v.check(name == path_name, "/metadata/name", || {
            format!("must match the name in the path ({path_name:?}) or be omitted")
        });
    }
    if let Some(prefix) = &meta.generate_name
        && let Err(message) = crate::validation::check_name_prefix(prefix)
    {
        v.error("/metadata/generate_name", message);
    }
    if let Some(labels) = &meta.labels {
        v.labels("/metadata/labels", labels);
    }
    if let Some(version) = &meta.resource_version {
        let digits = !version.is_empty() && version.len() <= 20 && version.bytes().all(|b| b.is_ascii_digit());
        v.check(digits, "/metadata/resource_version", || {
            "must be a resource version (digits) as the object carries it".into()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current<'a>(spec: &'a u32, labels: &'a Labels) -> Current<'a, u32> {
        Current { uid: Uuid::nil(), generation: 3, resource_version: 17, spec, labels }
    }

    #[test]
    fn same_spec_and_labels_is_unchanged() {
        let labels = Labels::new();
        let action = plan(Some(current(&1, &labels)), &ApplyMeta::default(), &1, &labels, None);
        assert_eq!(action.unwrap(), ApplyAction::Unchanged);
    }

    #[test]
    fn spec_change_bumps_generation_but_label_change_does_not() {
        let labels = Labels::new();
        let new_labels = Labels::from([("a".into(), "b".into())]);
        let meta = ApplyMeta::default();
        assert_eq!(
            plan(Some(current(&1, &labels)), &meta, &2, &labels, None).unwrap(),
            ApplyAction::Update { generation: 4 }
        );
        assert_eq!(
            plan(Some(current(&1, &labels)), &meta, &1, &new_labels, None).unwrap(),
            ApplyAction::Update { generation: 3 }
        );
    }

    #[test]
    fn stale_if_match_is_a_failed_precondition_and_stale_body_version_a_conflict() {
        let labels = Labels::new();
        let absent = plan::<u32>(None, &ApplyMeta::default(), &1, &labels, Some(&IfMatch::Absent));
        assert_eq!(absent.unwrap(), ApplyAction::Create, "If-None-Match: * creates what is not there");
        let exists = plan(Some(current(&1, &labels)), &ApplyMeta::default(), &1, &labels, Some(&IfMatch::Absent));
        assert!(matches!(exists, Err(Error::PreconditionFailed(_))), "and never replaces what is");
        let current_tag = IfMatch::parse_none_match("W/\"17\", \"9\"");
        assert!(plan(Some(current(&1, &labels)), &ApplyMeta::default(), &2, &labels, Some(&current_tag)).is_err());
        let other_tag = IfMatch::parse_none_match("\"9\"");
        assert!(plan(Some(current(&1, &labels)), &ApplyMeta::default(), &2, &labels, Some(&other_tag)).is_ok());
        assert!(plan::<u32>(None, &ApplyMeta::default(), &1, &labels, Some(&other_tag)).is_ok());
        let stale = IfMatch::parse("\"16\"");
        let fresh = IfMatch::parse("\"1\", \"17\"");
        let meta = ApplyMeta::default();
        assert!(matches!(
            plan(Some(current(&1, &labels)), &meta, &2, &labels, Some(&stale)),
            Err(Error::PreconditionFailed(_))
        ));
        assert!(plan(Some(current(&1, &labels)), &meta, &2, &labels, Some(&fresh)).is_ok());
        let stale_body = ApplyMeta { resource_version: Some("16".into()), ..ApplyMeta::default() };
        assert!(matches!(
            plan(Some(current(&1, &labels)), &stale_body, &2, &labels, None),
            Err(Error::Conflict { .. })
        ));
    }

    #[test]
    fn if_match_on_a_missing_object_fails() {
        let labels = Labels::new();
        assert!(matches!(
            plan::<u32>(None, &ApplyMeta::default(), &1, &labels, Some(&IfMatch::Any)),
            Err(Error::PreconditionFailed(_))
        ));
        assert_eq!(plan::<u32>(None, &ApplyMeta::default(), &1, &labels, None).unwrap(), ApplyAction::Create);
    }

    #[test]
    fn a_uid_or_version_of_a_missing_object_is_a_conflict_not_a_create() {
        let labels = Labels::new();
        let uid = ApplyMeta { uid: Some(Uuid::nil()), ..ApplyMeta::default() };
        let version = ApplyMeta { resource_version: Some("3".into()), ..ApplyMeta::default() };
        for (meta, field) in [(uid, "/metadata/uid"), (version, "/metadata/resource_version")] {
            let refused = plan::<u32>(None, &meta, &1, &labels, None);
            assert!(matches!(&refused, Err(Error::Conflict { field: Some(f), .. }) if f == field), "{refused:?}");
        }
    }

    #[test]
    fn if_match_takes_bare_tags_and_weak_or_empty_ones_match_nothing() {
        assert_eq!(IfMatch::parse("\"1\", 2 , W/\"3\""), IfMatch::Versions(vec!["1".into(), "2".into()]));
        assert_eq!(IfMatch::parse("*"), IfMatch::Any);
        for nothing in ["", "W/\"17\"", " , "] {
            let m = IfMatch::parse(nothing);
            assert!(!m.matches(17), "{nothing:?} matches nothing");
        }
    }
}
