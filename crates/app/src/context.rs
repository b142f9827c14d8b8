//! The operation context every use case takes first, as omicron's `opctx`: who is calling
//! (the principal and its grants), the team tree its access is decided on, the audit actor,
//! and what the caller may not read.
//!
//! Authorization has this one home: each use case in this crate asks its `OpContext`
//! before it reads or writes anything, and redacts what it returns through
//! [`OpContext::redactor`]. HTTP handlers decide nothing, so a use case without a check
//! stands out in review, and a test walks every route as a caller with no grants.

use std::sync::Arc;

use berth_core::Error;
use berth_core::auth::{Access, Grant, Principal, Role, TeamTree};
use berth_core::event::Actor;
use berth_core::redact::Redactor;
use berth_store::PgPool;

/// The caller of one operation.
#[derive(Debug, Clone)]
pub struct OpContext {
    pub principal: Principal,
    /// The team tree; left empty for platform admins (every decision allows them).
    pub tree: Arc<TeamTree>,
    pub actor: Actor,
    /// The issuer of users' tokens where a role binding names none.
    pub user_issuer: String,
}

impl OpContext {
    /// The context of an authenticated request.
    ///
    /// # Errors
    /// As the store.
    pub async fn for_request(
        db: &PgPool,
        principal: Principal,
        request_id: Option<String>,
        user_issuer: &str,
    ) -> Result<Self, Error> {
        let admin = Access { principal: &principal, tree: &TeamTree::default() }.is_platform_admin();
        let tree = if admin { Arc::default() } else { crate::access_cache::team_tree(db).await? };
        let actor = Actor::new(principal.owner().subject, request_id);
        Ok(Self { principal, tree, actor, user_issuer: user_issuer.to_owned() })
    }

    /// Berth acting on its own behalf (the demo world, benchmarks, tests): a platform
    /// admin whose audit records name `subject`.
    pub fn system(subject: &str) -> Self {
        let principal = Principal {
            subject: subject.to_owned(),
            issuer: "berth".into(),
            service_account: None,
            service_account_uid: None,
            service_account_team: None,
            grants: vec![Grant { role: Role::PlatformAdmin, team: None }],
            workload: None,
        };
        Self { principal, tree: Arc::default(), actor: Actor::new(subject, None), user_issuer: "berth".into() }
    }

    pub fn access(&self) -> Access<'_> {
        Access { principal: &self.principal, tree: &self.tree }
    }

    /// The teams the caller can see, as a list for a query; `None`: all.
    pub fn visible_teams(&self) -> Option<Vec<String>> {
        self.access().visible_teams().map(|t| t.into_iter().collect())
    }

    /// What the caller may not read: every team it cannot read, those above its own
    /// teams named as ancestors.
    pub fn redactor(&self) -> Redactor {
        let access = self.access();
        if access.reads_all() {
            return Redactor::none();
        }
        let readable: Vec<&str> = self.tree.names().filter(|t| access.can_read_team(t)).collect();
        let ancestors: std::collections::BTreeSet<&str> =
            readable.iter().flat_map(|t| self.tree.chain(t).into_iter().skip(1)).collect();
        Redactor::hiding(
            self.tree
                .names()
                .filter(|t| !access.can_read_team(t))
                .map(|t| (t.to_owned(), ancestors.contains(t)))
                .collect::<Vec<_>>(),
        )
    }
}
