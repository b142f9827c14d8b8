//! Who is calling (a verified token turned into a principal), and the identity objects:
//! role bindings, service accounts and their tokens. The rules of who may do what are in
//! `berth_core::auth`; the caller of each use case is its [`OpContext`].

use std::time::Duration;

use berth_auth::{AuthError, BerthIssuer, Verified};
use berth_core::Error;
use berth_core::auth::{
    NewRoleBinding, NewServiceAccount, Principal, RoleBinding, ServiceAccount, ServiceAccountToken,
    service_account_subject,
};
use berth_core::event::{Actor, AuditVerb};
use berth_store::PgPool;
use berth_store::audit::{AuditEntry, audit_record};
use berth_store::identity as store;
use chrono::Utc;
use uuid::Uuid;

use crate::context::OpContext;

/// Turns a verified token into a principal: checks a service-account token against the
/// store (revoked, expired, unknown → refused) and adds the subject's role bindings.
///
/// # Errors
/// `Ok(Err(_))` when the token is refused; `Err(_)` when the store fails.
pub async fn principal(db: &PgPool, token: &str, verified: Verified) -> Result<Result<Principal, AuthError>, Error> {
    let mut grants = verified.grants;
    let (mut service_account_team, mut service_account_uid) = (None, None);
    if let Some((account, id)) = &verified.service_account {
        let uid = if verified.subject == service_account_subject(account) {
            store::sa_token_use(db, account, *id, &berth_auth::token_sha256(token)).await?
        } else {
            None
        };
        let Some((uid, team)) = uid else { return Ok(Err(AuthError::Revoked)) };
        service_account_team = team;
        service_account_uid = Some(uid);
        grants.extend(store::grants_of_account(db, uid).await?);
    } else if verified.workload.is_none() {
        // (A workload's own token has no role bindings: it acts for its job alone.)
        grants.extend(crate::access_cache::grants_of_user(db, &verified.issuer, &verified.subject).await?);
    }
    grants.sort();
    grants.dedup();
    Ok(Ok(Principal {
        subject: verified.subject,
        issuer: verified.issuer,
        service_account: verified.service_account.map(|(name, _)| name),
        service_account_uid,
        service_account_team,
        grants,
        workload: verified.workload,
    }))
}

async fn audit(
    tx: &mut berth_store::Tx<'_>,
    actor: &Actor,
    verb: AuditVerb,
    kind: &'static str,
    team: Option<&str>,
    name: &str,
    uid: Uuid,
) -> Result<(), Error> {
    let entry = AuditEntry {
        actor,
        verb,
        kind,
        team,
        name,
        uid,
        generation_before: None,
        generation_after: None,
        spec_change: None,
    };
    audit_record(&mut **tx, &entry).await
}

/// The caller as it is authenticated: anyone may read who they are.
pub fn me(opctx: &OpContext) -> Principal {
    opctx.principal.clone()
}

/// A 422 naming `/team` when the named team does not exist. (For callers who do not read
/// everything, the access check has already answered 404 for a team outside the tree.)
async fn team_must_exist(db: &PgPool, team: Option<&str>) -> Result<(), Error> {
    match team {
        Some(t) if berth_store::team::team_fetch_uid(db, t).await?.is_none() => {
            Err(Error::invalid("/team", format!("team {t:?} does not exist")))
        }
        _ => Ok(()),
    }
}

/// Creates a role binding. A `serviceaccount:{name}` subject binds that account (by its uid,
/// so the binding goes with it); any other subject is a user of `new.issuer`, or of
/// the context's user issuer when the body names none.
///
/// # Errors
/// 422 for a bad body, an unknown team or a service account the caller cannot see, 404/403
/// per the access rules, 409 for a duplicate.
pub async fn role_binding_create(db: &PgPool, opctx: &OpContext, new: &NewRoleBinding) -> Result<RoleBinding, Error> {
    new.validate()?;
    opctx.access().manage_grant(&new.grant())?;
    team_must_exist(db, new.team.as_deref()).await?;
    let issuer = new.issuer.as_deref().unwrap_or(&opctx.user_issuer);
    let identity = match new.service_account() {
        Some(name) => {
            let account = service_account_get(db, opctx, name).await.map_err(|e| match e {
                Error::NotFound { .. } => Error::invalid("/subject", format!("there is no service account {name:?}")),
                e => e,
            })?;
            store::BindingIdentity::ServiceAccount(account.uid)
        }
        None => store::BindingIdentity::User { issuer },
    };
    let mut tx = db.begin().await.map_err(berth_store::db_error)?;
    let binding = store::role_binding_insert(
        &mut *tx,
        &RoleBinding {
            id: Uuid::new_v4(),
            subject: new.subject.clone(),
            issuer: None,
            role: new.role,
            team: new.team.clone(),
            created_at: Utc::now(),
            created_by: opctx.actor.subject.clone(),
        },
        identity,
    )
    .await
    .map_err(|e| match e {
        Error::Conflict { .. } => Error::conflict("/subject", format!("{} holds this role here already", new.subject)),
        e => e,
    })?;
    let name = binding.id.to_string();
    audit(&mut tx, &opctx.actor, AuditVerb::Create, "role-binding", binding.team.as_deref(), &name, binding.id).await?;
    tx.commit().await.map_err(berth_store::db_error)?;
    crate::access_cache::forget(db);
    Ok(binding)
}

/// The role bindings the caller can see: those on teams it can read (global ones for
/// global readers), and always its own.
///
/// # Errors
/// As the store.
pub async fn role_binding_list(
    db: &PgPool,
    opctx: &OpContext,
    subject: Option<&str>,
) -> Result<Vec<RoleBinding>, Error> {
    let all = store::role_binding_list(db, subject).await?;
    let access = opctx.access();
    Ok(all
        .into_iter()
        .filter(|b| b.subject == opctx.principal.subject || access.can_read_owned_by(b.team.as_deref()))
        .collect())
}

/// Deletes a role binding.
///
/// # Errors
/// 404 when missing or invisible, 403 per the access rules.
pub async fn role_binding_delete(db: &PgPool, opctx: &OpContext, id: Uuid) -> Result<RoleBinding, Error> {
    let not_found = || Error::NotFound { kind: "role binding", name: id.to_string() };
    let binding = store::role_binding_get(db, id).await?;
    let access = opctx.access();
    if !(binding.subject == opctx.principal.subject || access.can_read_owned_by(binding.team.as_deref())) {
        return Err(not_found());
    }
    access.manage_grant(&binding.grant())?;
    let mut tx = db.begin().await.map_err(berth_store::db_error)?;
    if !store::role_binding_delete(&mut *tx, id).await? {
        return Err(not_found());
    }
    let name = id.to_string();
    audit(&mut tx, &opctx.actor, AuditVerb::Delete, "role-binding", binding.team.as_deref(), &name, id).await?;
    tx.commit().await.map_err(berth_store::db_error)?;
    crate::access_cache::forget(db);
    Ok(binding)
}

/// Creates a service account.
///
/// # Errors
/// 422 for a bad body or unknown team, 404/403 per the access rules, 409 when the name is
/// taken.
pub async fn service_account_create(
    db: &PgPool,
    opctx: &OpContext,
    new: &NewServiceAccount,
) -> Result<ServiceAccount, Error> {
    new.validate()?;
    opctx.access().manage_owned_by(new.team.as_deref())?;
    team_must_exist(db, new.team.as_deref()).await?;
    let mut tx = db.begin().await.map_err(berth_store::db_error)?;
    let account =
        store::service_account_insert(&mut *tx, &new.name, new.team.as_deref(), &new.description, &opctx.actor.subject)
            .await
            .map_err(|e| match e {
                Error::Conflict { .. } => Error::conflict("/name", format!("service account {:?} exists", new.name)),
                e => e,
            })?;
    audit(
        &mut tx,
        &opctx.actor,
        AuditVerb::Create,
        "service-account",
        account.team.as_deref(),
        &account.name,
        Uuid::nil(),
    )
    .await?;
    tx.commit().await.map_err(berth_store::db_error)?;
    Ok(account)
}

/// The service accounts the caller can see.
///
/// # Errors
/// As the store.
pub async fn service_account_list(db: &PgPool, opctx: &OpContext) -> Result<Vec<ServiceAccount>, Error> {
    let access = opctx.access();
    Ok(store::service_account_list(db)
        .await?
        .into_iter()
        .filter(|a| access.can_read_owned_by(a.team.as_deref()))
        .collect())
}

/// A service account the caller can see.
///
/// # Errors
/// 404 when missing or invisible.
pub async fn service_account_get(db: &PgPool, opctx: &OpContext, name: &str) -> Result<ServiceAccount, Error> {
    let account = store::service_account_get(db, name).await?;
    if opctx.access().can_read_owned_by(account.team.as_deref()) {
        Ok(account)
    } else {
        Err(Error::NotFound { kind: "service account", name: name.to_owned() })
    }
}

/// A service account the caller may manage.
async fn managed_account(db: &PgPool, opctx: &OpContext, name: &str) -> Result<ServiceAccount, Error> {
    let account = service_account_get(db, opctx, name).await?;
    opctx.access().manage_owned_by(account.team.as_deref())?;
    Ok(account)
}

/// Deletes a service account with its tokens and role bindings.
///
/// # Errors
/// 404 when missing or invisible, 403 per the access rules.
pub async fn service_account_delete(db: &PgPool, opctx: &OpContext, name: &str) -> Result<ServiceAccount, Error> {
    let account = managed_account(db, opctx, name).await?;
    let mut tx = db.begin().await.map_err(berth_store::db_error)?;
    store::service_account_delete(&mut *tx, name).await?;
    audit(&mut tx, &opctx.actor, AuditVerb::Delete, "service-account", account.team.as_deref(), name, Uuid::nil())
        .await?;
    tx.commit().await.map_err(berth_store::db_error)?;
    Ok(account)
}

/// A new token and the only copy of its text.
pub struct NewToken {
    pub token: String,
    pub record: ServiceAccountToken,
}

/// The longest a service-account token may live.
pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(366 * 24 * 3600);

/// Mints a token for a service account; only its hash is stored.
///
/// # Errors
/// 422 for a TTL of zero or above [`MAX_TOKEN_TTL`]; 404/403 per the access rules.
pub async fn sa_token_create(
    db: &PgPool,
    opctx: &OpContext,
    issuer: &BerthIssuer,
    name: &str,
    ttl: Duration,
) -> Result<NewToken, Error> {
    if ttl.is_zero() || ttl > MAX_TOKEN_TTL {
        return Err(Error::invalid("/ttl_seconds", format!("must be 1 to {} seconds", MAX_TOKEN_TTL.as_secs())));
    }
    let account = managed_account(db, opctx, name).await?;
    let id = Uuid::new_v4();
    let minted = issuer.mint(&account.subject, Vec::new(), ttl, Some((&account.name, id)));
    let mut tx = db.begin().await.map_err(berth_store::db_error)?;
    let record =
        store::sa_token_insert(&mut *tx, id, name, &berth_auth::token_sha256(&minted.token), minted.expires_at).await?;
    audit(&mut tx, &opctx.actor, AuditVerb::Create, "service-account-token", account.team.as_deref(), name, id).await?;
    tx.commit().await.map_err(berth_store::db_error)?;
    Ok(NewToken { token: minted.token, record })
}

/// A service account's tokens (never their text).
///
/// # Errors
/// 404 when the account is missing or invisible.
pub async fn sa_token_list(db: &PgPool, opctx: &OpContext, name: &str) -> Result<Vec<ServiceAccountToken>, Error> {
    service_account_get(db, opctx, name).await?;
    store::sa_token_list(db, name).await
}

/// Revokes a token at once: the next request bearing it is refused.
///
/// # Errors
/// 404 when the account or token is missing or invisible, 403 per the access rules.
pub async fn sa_token_revoke(
    db: &PgPool,
    opctx: &OpContext,
    name: &str,
    id: Uuid,
) -> Result<ServiceAccountToken, Error> {
    let account = managed_account(db, opctx, name).await?;
    let mut tx = db.begin().await.map_err(berth_store::db_error)?;
    let record = store::sa_token_revoke(&mut *tx, name, id).await?;
    audit(&mut tx, &opctx.actor, AuditVerb::Update, "service-account-token", account.team.as_deref(), name, id).await?;
    tx.commit().await.map_err(berth_store::db_error)?;
    Ok(record)
}
