//! Who may do what: roles, role bindings, service accounts and the pure access rules.
//!
//! A [`Principal`] carries its grants (role + optional team scope). Decisions about a team
//! need that team's chain of ancestors, which [`TeamTree`] gives; nothing here does IO.
//!
//! - `platform-admin` (global only): everything.
//! - `team-admin` of team T: T's subtree — its workloads, its role bindings and service
//!   accounts, and the teams *below* T (their quotas, creating and deleting them). T's own
//!   quota belongs to whoever administers T's parent.
//! - `member` of team T: T's workloads (create, read, update, delete); read T.
//! - `viewer` (global, or of a subtree): read only.
//!
//! A team the principal cannot read answers 404, exactly as a team that does not exist, so
//! names cannot be probed; a write the principal may not make on a team it can read
//! answers 403.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::Error;
use crate::meta::Owner;
use crate::validation::Validator;

/// A role. Grants it names are scoped to a team subtree, or global when no team is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    PlatformAdmin,
    TeamAdmin,
    Member,
    Viewer,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PlatformAdmin => "platform-admin",
            Self::TeamAdmin => "team-admin",
            Self::Member => "member",
            Self::Viewer => "viewer",
        }
    }

    /// Parses the kebab-case name.
    ///
    /// # Errors
    /// The list of valid names, for an unknown one.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "platform-admin" => Ok(Self::PlatformAdmin),
            "team-admin" => Ok(Self::TeamAdmin),
            "member" => Ok(Self::Member),
            "viewer" => Ok(Self::Viewer),
            other => Err(format!("unknown role {other:?}: use platform-admin, team-admin, member or viewer")),
        }
    }
}

/// A role, global or over a team's subtree.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    pub role: Role,
    /// The team whose subtree the role covers (a `member` covers that team only); absent:
    /// global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub team: Option<String>,
}

impl Grant {
    /// Checks the grant's shape: `platform-admin` is global only; `member` and
    /// `team-admin` need a team.
    pub fn validate(&self, v: &mut Validator, field: &str) {
        match (self.role, &self.team) {
            (Role::PlatformAdmin, Some(_)) => v.error(format!("{field}/team"), "platform-admin is global: omit team"),
            (Role::TeamAdmin | Role::Member, None) => {
                v.error(format!("{field}/team"), format!("{} needs a team", self.role.as_str()));
            }
            (_, Some(team)) => v.name(&format!("{field}/team"), team),
            (_, None) => {}
        }
    }
}

/// How a subject names a service account.
pub const SERVICE_ACCOUNT_PREFIX: &str = "serviceaccount:";

/// The subject a service account acts as, in audit records and role bindings.
pub fn service_account_subject(name: &str) -> String {
    format!("{SERVICE_ACCOUNT_PREFIX}{name}")
}

/// Who is calling, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct Principal {
    /// The user's `sub`, or `serviceaccount:{name}`.
    pub subject: String,
    /// The issuer of the token (`berth` for Berth's own tokens).
    pub issuer: String,
    /// The service account, when the token is one of its tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// That account's uid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account_uid: Option<Uuid>,
    /// The team owning that service account (absent for global accounts and users).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account_team: Option<String>,
    /// Every grant: those carried by a Berth-issued token and the role bindings of the
    /// subject.
    pub grants: Vec<Grant>,
    /// For a workload's own token (in its job's environment): the attempt it speaks for.
    /// Such a token carries no grants; it may only acknowledge that attempt's checkpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadScope>,
}

/// The one attempt of one workload a workload token speaks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WorkloadScope {
    pub uid: Uuid,
    pub attempt: u32,
    /// The workload's team, whose request budget the token's requests count against (so
    /// that a team's many jobs buy it no more requests). Tokens minted before it was
    /// carried count against no team.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl WorkloadScope {
    /// The workload's current attempt.
    pub fn of(w: &crate::workload::Workload) -> Self {
        Self { uid: w.metadata.uid, attempt: w.status.attempt, team: w.metadata.team.clone() }
    }
}

impl Principal {
    /// The owner recorded on what this principal submits: its subject and issuer, except
    /// that a user whose `sub` reads like a service account's (any issuer may send any
    /// `sub`) is marked as a user, so nothing a user does is ever shown as an account's.
    pub fn owner(&self) -> Owner {
        let subject = if self.service_account.is_none() && self.subject.starts_with(SERVICE_ACCOUNT_PREFIX) {
            format!("user:{}", self.subject)
        } else {
            self.subject.clone()
        };
        Owner { subject, issuer: self.issuer.clone(), service_account_uid: self.service_account_uid }
    }
}

/// Team names and their parents: enough to find any team's ancestors.
#[derive(Debug, Clone, Default)]
pub struct TeamTree {
    parents: BTreeMap<String, Option<String>>,
}

impl TeamTree {
    pub fn new(teams: impl IntoIterator<Item = (String, Option<String>)>) -> Self {
        Self { parents: teams.into_iter().collect() }
    }

    pub fn contains(&self, team: &str) -> bool {
        self.parents.contains_key(team)
    }

    /// The team, its parent, and so on to the root; empty for an unknown team.
    pub fn chain<'a>(&'a self, team: &'a str) -> Vec<&'a str> {
        let mut chain = Vec::new();
        let mut next = self.parents.get_key_value(team).map(|(k, _)| k.as_str());
        while let Some(t) = next {
            if chain.contains(&t) {
                break; // the store forbids cycles; never loop on bad data
            }
            chain.push(t);
            next = self.parents.get(t).and_then(|p| p.as_deref());
        }
        chain
    }

    /// The parent of a known team.
    pub fn parent(&self, team: &str) -> Option<&str> {
        self.parents.get(team).and_then(|p| p.as_deref())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.parents.keys().map(String::as_str)
    }
}

/// What a principal may do, decided against the team tree.
/// Roles on a team that read its whole subtree.
const SUBTREE_READERS: [Role; 2] = [Role::TeamAdmin, Role::Viewer];

pub struct Access<'a> {
    pub principal: &'a Principal,
    pub tree: &'a TeamTree,
}

impl Access<'_> {
    fn has_global(&self, roles: &[Role]) -> bool {
        self.principal.grants.iter().any(|g| g.team.is_none() && roles.contains(&g.role))
    }

    /// Whether a grant of one of `roles` covers `team`'s subtree position: a grant on the
    /// team or on any ancestor.
    fn covers(&self, team: &str, roles: &[Role]) -> bool {
        let chain = self.tree.chain(team);
        self.principal
            .grants
            .iter()
            .any(|g| roles.contains(&g.role) && g.team.as_deref().is_some_and(|t| chain.contains(&t)))
    }

    fn is_member_of(&self, team: &str) -> bool {
        self.principal.grants.iter().any(|g| g.role == Role::Member && g.team.as_deref() == Some(team))
    }

    pub fn is_platform_admin(&self) -> bool {
        self.has_global(&[Role::PlatformAdmin])
    }

    /// Reads everything (platform admins and global viewers).
    pub fn reads_all(&self) -> bool {
        self.has_global(&[Role::PlatformAdmin, Role::Viewer])
    }

    /// Whether the principal can see `team` (and its workloads).
    pub fn can_read_team(&self, team: &str) -> bool {
        self.reads_all()
            || (self.tree.contains(team) && (self.covers(team, &SUBTREE_READERS) || self.is_member_of(team)))
    }

    /// The teams on which the principal holds a role that reads their whole subtree
    /// (team-admin, viewer).
    pub fn covering_teams(&self) -> Vec<String> {
        let roles = SUBTREE_READERS;
        self.principal.grants.iter().filter(|g| roles.contains(&g.role)).filter_map(|g| g.team.clone()).collect()
    }

    /// Whether the principal reads `team`'s whole subtree: everything, or a team-admin or
    /// viewer grant on the team or an ancestor.
    pub fn reads_subtree(&self, team: &str) -> bool {
        self.reads_all() || self.covers(team, &SUBTREE_READERS)
    }

    /// The teams the principal can see; `None` means all.
    pub fn visible_teams(&self) -> Option<BTreeSet<String>> {
        if self.reads_all() {
            return None;
        }
        Some(self.tree.names().filter(|t| self.can_read_team(t)).map(str::to_owned).collect())
    }

    /// 404 unless the principal can see `team`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for the team, the same answer as for a team that does not exist.
    pub fn read_team(&self, team: &str) -> Result<(), Error> {
        if self.can_read_team(team) { Ok(()) } else { Err(Error::NotFound { kind: "team", name: team.to_owned() }) }
    }

    /// 404 unless visible, 403 unless the principal may write the team's workloads.
    ///
    /// # Errors
    /// As described.
    pub fn write_workloads(&self, team: &str) -> Result<(), Error> {
        self.read_team(team)?;
        if self.is_platform_admin() || self.covers(team, &[Role::TeamAdmin]) || self.is_member_of(team) {
            Ok(())
        } else {
            Err(forbidden(format!("you may not change workloads of team {team:?}")))
        }
    }

    /// 404 unless visible; 403 unless the principal may change, cancel or delete a workload
    /// of `team` owned by `owner`: its owner (a member or above), a team-admin over the
    /// team, a platform admin. A workload without a recorded owner is the admins'.
    ///
    /// # Errors
    /// As described.
    pub fn change_workload(&self, team: &str, owner: Option<&Owner>) -> Result<(), Error> {
        self.write_workloads(team)?;
        if self.administers(team) || owner.is_some_and(|o| *o == self.principal.owner()) {
            return Ok(());
        }
        Err(forbidden(match owner {
            Some(o) => format!(
                "this workload is {}'s: only its owner or an admin of team {team:?} may change or cancel it",
                o.subject
            ),
            None => {
                format!("this workload has no recorded owner: only an admin of team {team:?} may change or cancel it")
            }
        }))
    }

    /// As [`Self::change_workload`] (its owner, a team-admin over the team, a platform
    /// admin), for opening a workload's endpoint, and said so.
    ///
    /// # Errors
    /// As described.
    pub fn open_endpoint(&self, team: &str, owner: Option<&Owner>) -> Result<(), Error> {
        self.change_workload(team, owner).map_err(|e| match e {
            Error::Forbidden(_) => {
                forbidden(format!("only the workload's owner or an admin of team {team:?} may open its endpoint"))
            }
            e => e,
        })
    }

    /// Whether the principal administers the subtree of `team` (the team included).
    pub fn administers(&self, team: &str) -> bool {
        self.is_platform_admin() || (self.tree.contains(team) && self.covers(team, &[Role::TeamAdmin]))
    }

    /// May the principal create, change or delete `team` placed under `parent`? Platform
    /// admins may; a team admin may when the parent is in its subtree (so never its own
    /// team, nor a root team). `team` need not exist yet.
    ///
    /// # Errors
    /// 403 when the principal administers no team at all, whether `team` exists or not
    /// (before, a member or viewer told the two apart: 404 for a team out of its sight, 403
    /// for a free name); else 404 when an existing `team` is invisible, 403 otherwise.
    pub fn manage_team(&self, team: &str, parent: Option<&str>) -> Result<(), Error> {
        if self.is_platform_admin() {
            return Ok(());
        }
        let admin_of =
            |g: &Grant| g.role == Role::TeamAdmin && g.team.as_deref().is_some_and(|t| self.tree.contains(t));
        if !self.principal.grants.iter().any(admin_of) {
            return Err(forbidden(format!("only a team admin or a platform admin may manage team {team:?}")));
        }
        if self.tree.contains(team) {
            self.read_team(team)?;
        }
        match parent {
            Some(p) if self.administers(p) => Ok(()),
            Some(p) => Err(forbidden(format!(
                "team {team:?} under team {p:?}: only an admin of team {p:?} or of a team above it (or a platform \
                 admin) may create, change, move or delete the teams under it"
            ))),
            None => Err(forbidden(format!("only a platform admin may manage the root team {team:?}"))),
        }
    }

    /// May the principal create or replace `team`, placing it under `new_parent`? For an
    /// existing team, it must also manage the team where it is now.
    ///
    /// # Errors
    /// As [`Access::manage_team`].
    pub fn apply_team(&self, team: &str, new_parent: Option<&str>) -> Result<(), Error> {
        if self.tree.contains(team) {
            self.manage_team(team, self.tree.parent(team))?;
        }
        self.manage_team(team, new_parent)
    }

    /// May the principal delete `team`?
    ///
    /// # Errors
    /// 404 for a team it cannot see (or that does not exist), 403 as [`Access::manage_team`].
    pub fn delete_team(&self, team: &str) -> Result<(), Error> {
        if self.is_platform_admin() {
            return Ok(());
        }
        self.read_team(team)?;
        self.manage_team(team, self.tree.parent(team))
    }

    /// The rule for the platform's shared facts: flavors, clusters (spec, status and
    /// nodes) and the controllers' report. Every authenticated principal reads them:
    /// they are what anyone submits against, a cluster names its credential only by
    /// reference (never its value), and nodes carry GPU counts, never workload names.
    ///
    /// # Errors
    /// Never; a `Result` so that every use case asks in the same way.
    pub fn read_catalogue(&self) -> Result<(), Error> {
        Ok(())
    }

    /// 403 unless a platform admin.
    ///
    /// # Errors
    /// As described.
    pub fn platform_admin(&self, what: &str) -> Result<(), Error> {
        if self.is_platform_admin() { Ok(()) } else { Err(forbidden(format!("only a platform admin may {what}"))) }
    }

    /// May the principal give (or take away) `grant`? Platform admins may give any; a
    /// team admin may give team-scoped roles other than platform-admin within its subtree.
    ///
    /// # Errors
    /// 404 for a team it cannot see, 403 otherwise.
    pub fn manage_grant(&self, grant: &Grant) -> Result<(), Error> {
        if self.is_platform_admin() {
            return Ok(());
        }
        match &grant.team {
            Some(team) => {
                self.read_team(team)?;
                if self.administers(team) {
                    Ok(())
                } else {
                    Err(forbidden(format!("only an admin of team {team:?} may manage its role bindings")))
                }
            }
            None => Err(forbidden("only a platform admin may manage global role bindings".into())),
        }
    }

    /// May the principal manage service accounts owned by `team` (global ones: `None`)?
    ///
    /// # Errors
    /// 404 for a team it cannot see, 403 otherwise.
    pub fn manage_owned_by(&self, team: Option<&str>) -> Result<(), Error> {
        match team {
            Some(team) => {
                self.read_team(team)?;
                if self.administers(team) {
                    Ok(())
                } else {
                    Err(forbidden(format!("only an admin of team {team:?} may manage its service accounts")))
                }
            }
            None => self.platform_admin("manage global service accounts"),
        }
    }

    /// Whether the principal can see something owned by `team` (global: `None`).
    pub fn can_read_owned_by(&self, team: Option<&str>) -> bool {
        match team {
            Some(team) => self.can_read_team(team),
            None => self.reads_all(),
        }
    }
}

fn forbidden(message: String) -> Error {
    Error::Forbidden(message)
}

/// A role binding: an identity holds a role, global or over a team's subtree.
///
/// A binding refers to the identity, never to a reusable name: a service account's binding
/// goes with the account (a new account of the same name starts with none), and a user's
/// binding holds only for tokens of its issuer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RoleBinding {
    pub id: Uuid,
    /// A user's `sub` as its identity provider sends it, or `serviceaccount:{name}`.
    pub subject: String,
    /// The issuer whose tokens carry `subject` (users only; absent for service accounts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    pub role: Role,
    /// The team whose subtree the role covers (a `member` covers that team only); absent:
    /// global.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
}

impl RoleBinding {
    pub fn grant(&self) -> Grant {
        Grant { role: self.role, team: self.team.clone() }
    }
}

/// The body that creates a role binding.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewRoleBinding {
    /// A user's `sub`, or `serviceaccount:{name}` for an existing service account.
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*[^\\s\\u0000-\\u001F\\u007F-\\u009F][^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$"
    )]
    pub subject: String,
    /// The issuer of the user's tokens (its `iss`); default: the OIDC issuer when one is
    /// configured, else Berth's own. Not for service accounts.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 512, pattern = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$")]
    pub issuer: Option<String>,
    pub role: Role,
    /// The team whose subtree the role covers; absent: global (platform-admin only
    /// global; member and team-admin need a team).
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub team: Option<String>,
}

impl NewRoleBinding {
    pub fn grant(&self) -> Grant {
        Grant { role: self.role, team: self.team.clone() }
    }

    /// The service account the subject names, if it names one.
    pub fn service_account(&self) -> Option<&str> {
        self.subject.strip_prefix(SERVICE_ACCOUNT_PREFIX)
    }

    /// # Errors
    /// [`Error::Invalid`] naming each bad field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut v = Validator::default();
        v.check(!self.subject.trim().is_empty(), "/subject", || "must not be empty".into());
        v.text("/subject", &self.subject, 256);
        // A token's `sub` with a line break is refused as malformed: no binding names one.
        v.check(!self.subject.contains(['\n', '\t']), "/subject", || "must not contain control characters".into());
        if let Some(issuer) = &self.issuer {
            v.check(self.service_account().is_none(), "/issuer", || {
                "a service account's tokens are Berth's own: omit issuer".into()
            });
            v.check(!issuer.trim().is_empty(), "/issuer", || "must not be empty".into());
            v.text("/issuer", issuer, 512);
        }
        self.grant().validate(&mut v, "");
        v.finish()
    }
}

/// A service account: an identity for an internal tool, owned by a team or global.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServiceAccount {
    /// Stable identity: role bindings refer to it, so an account created later under the
    /// same name inherits nothing.
    pub uid: Uuid,
    pub name: String,
    /// The subject its tokens act as: `serviceaccount:{name}`.
    pub subject: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    pub description: String,
    pub created_at: DateTime<Utc>,
    pub created_by: String,
}

/// The body that creates a service account.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewServiceAccount {
    /// DNS-1123 label.
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub name: String,
    /// The owning team; team admins manage accounts owned by their subtree. Absent:
    /// global (platform admins only).
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]
    pub team: Option<String>,
    #[serde(default)]
    #[schema(max_length = 1024, pattern = "^[^\\u0000-\\u0008\\u000B-\\u001F\\u007F-\\u009F]*$")]
    pub description: String,
}

impl NewServiceAccount {
    /// # Errors
    /// [`Error::Invalid`] naming each bad field.
    pub fn validate(&self) -> Result<(), Error> {
        let mut v = Validator::default();
        v.name("/name", &self.name);
        if let Some(team) = &self.team {
            v.name("/team", team);
        }
        v.text("/description", &self.description, 1024);
        v.finish()
    }
}

/// A service account's token, without the secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServiceAccountToken {
    pub id: Uuid,
    pub service_account: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_used_at: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<DateTime<Utc>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> TeamTree {
        TeamTree::new([
            ("research".into(), None),
            ("nlp".into(), Some("research".into())),
            ("llm".into(), Some("nlp".into())),
            ("vision".into(), Some("research".into())),
            ("ops".into(), None),
        ])
    }

    fn principal(grants: &[(Role, Option<&str>)]) -> Principal {
        Principal {
            subject: "u".into(),
            issuer: "berth".into(),
            service_account: None,
            service_account_uid: None,
            service_account_team: None,
            grants: grants.iter().map(|(role, team)| Grant { role: *role, team: team.map(str::to_owned) }).collect(),
            workload: None,
        }
    }

    #[test]
    fn chains_walk_to_the_root() {
        assert_eq!(tree().chain("llm"), ["llm", "nlp", "research"]);
        assert!(tree().chain("nope").is_empty());
    }

    #[test]
    fn team_admins_manage_below_their_team_but_not_their_own_quota() {
        let (t, p) = (tree(), principal(&[(Role::TeamAdmin, Some("nlp"))]));
        let a = Access { principal: &p, tree: &t };
        assert!(a.apply_team("llm", Some("nlp")).is_ok());
        assert!(a.delete_team("llm").is_ok());
        assert!(matches!(a.delete_team("nlp"), Err(Error::Forbidden(_))));
        assert!(matches!(a.delete_team("ghost"), Err(Error::NotFound { .. })));
        assert!(matches!(a.apply_team("llm", Some("vision")), Err(Error::Forbidden(_))), "moving out of the subtree");
        assert!(a.manage_team("new", Some("llm")).is_ok());
        assert!(matches!(a.manage_team("nlp", Some("research")), Err(Error::Forbidden(_))));
        // Moving a team it manages under one it does not: the refusal names where it would go.
        let Err(Error::Forbidden(moved)) = a.apply_team("llm", Some("vision")) else { panic!("not forbidden") };
        assert!(moved.starts_with("team \"llm\" under team \"vision\": only an admin of team \"vision\""), "{moved}");
        assert!(matches!(a.manage_team("vision", Some("research")), Err(Error::NotFound { .. })));
        assert!(a.write_workloads("llm").is_ok());
        assert_eq!(a.visible_teams().unwrap(), BTreeSet::from(["llm".to_owned(), "nlp".to_owned()]));
    }

    #[test]
    fn members_write_only_their_team_and_viewers_write_nothing() {
        let t = tree();
        let m = principal(&[(Role::Member, Some("nlp"))]);
        let a = Access { principal: &m, tree: &t };
        assert!(a.write_workloads("nlp").is_ok());
        assert!(matches!(a.write_workloads("llm"), Err(Error::NotFound { .. })));
        assert!(matches!(
            a.manage_grant(&Grant { role: Role::Member, team: Some("nlp".into()) }),
            Err(Error::Forbidden(_))
        ));
        let v = principal(&[(Role::Viewer, Some("research"))]);
        let a = Access { principal: &v, tree: &t };
        assert!(a.can_read_team("llm") && !a.can_read_team("ops"));
        assert!(matches!(a.write_workloads("llm"), Err(Error::Forbidden(_))));
        let g = principal(&[(Role::Viewer, None)]);
        let a = Access { principal: &g, tree: &t };
        assert!(a.visible_teams().is_none());
        assert!(matches!(a.platform_admin("x"), Err(Error::Forbidden(_))));
    }

    /// A caller who administers no team gets one answer for any team it would manage,
    /// there or not, so it cannot tell the names out of its sight from free ones.
    #[test]
    fn callers_who_administer_no_team_cannot_tell_hidden_teams_from_free_names() {
        let t = tree();
        for grants in [
            &[(Role::Member, Some("nlp"))][..],
            &[(Role::Viewer, Some("nlp"))],
            &[(Role::Member, Some("llm")), (Role::Viewer, Some("llm"))],
        ] {
            let p = principal(grants);
            let a = Access { principal: &p, tree: &t };
            for (team, parent) in [("vision", None), ("ghost", None), ("vision", Some("nlp")), ("ghost", Some("nlp"))] {
                let answer = a.apply_team(team, parent);
                assert!(matches!(answer, Err(Error::Forbidden(_))), "{grants:?} {team} under {parent:?}: {answer:?}");
            }
        }
    }

    #[test]
    fn grants_are_checked_for_shape() {
        let binding = |subject: &str, issuer: Option<&str>, role, team: Option<&str>| NewRoleBinding {
            subject: subject.into(),
            issuer: issuer.map(Into::into),
            role,
            team: team.map(Into::into),
        };
        assert!(binding("a", None, Role::PlatformAdmin, Some("x")).validate().is_err());
        let Err(Error::Invalid(errors)) = binding(" ", None, Role::Member, None).validate() else { panic!() };
        assert_eq!(errors.len(), 2);
        let Err(Error::Invalid(errors)) =
            binding("serviceaccount:ci", Some("https://idp"), Role::Viewer, None).validate()
        else {
            panic!()
        };
        assert_eq!(errors[0].field, "/issuer");
    }
}
