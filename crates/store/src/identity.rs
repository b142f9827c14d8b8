//! SQL for role bindings, service accounts and their tokens.

use berth_core::Error;
use berth_core::auth::{Grant, Role, RoleBinding, ServiceAccount, ServiceAccountToken, service_account_subject};
use chrono::{DateTime, Utc};
use sqlx::PgExecutor;
use uuid::Uuid;

use crate::db_error;

struct BindingRow {
    id: Uuid,
    subject: String,
    issuer: Option<String>,
    role: String,
    team: Option<String>,
    created_at: DateTime<Utc>,
    created_by: String,
}

impl TryFrom<BindingRow> for RoleBinding {
    type Error = Error;

    fn try_from(r: BindingRow) -> Result<Self, Error> {
        let role = Role::parse(&r.role).map_err(Error::Internal)?;
        Ok(Self {
            id: r.id,
            subject: r.subject,
            issuer: r.issuer,
            role,
            team: r.team,
            created_at: r.created_at,
            created_by: r.created_by,
        })
    }
}

/// The team names and their parents' names: the tree access decisions walk.
///
/// # Errors
/// As [`db_error`].
pub async fn team_parents(db: impl PgExecutor<'_>) -> Result<Vec<(String, Option<String>)>, Error> {
    let rows =
        sqlx::query!(r#"SELECT t.name, p.name AS "parent?" FROM teams t LEFT JOIN teams p ON p.uid = t.parent_uid"#)
            .fetch_all(db)
            .await
            .map_err(db_error)?;
    Ok(rows.into_iter().map(|r| (r.name, r.parent)).collect())
}

/// The grants bound to a user: the subject of tokens from `issuer`.
///
/// # Errors
/// As [`db_error`].
pub async fn grants_of_user(db: impl PgExecutor<'_>, issuer: &str, subject: &str) -> Result<Vec<Grant>, Error> {
    let rows = sqlx::query!(
        "SELECT role, team FROM role_bindings WHERE issuer = $1 AND subject = $2 ORDER BY role, team",
        issuer,
        subject
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    rows.into_iter().map(|r| Ok(Grant { role: Role::parse(&r.role).map_err(Error::Internal)?, team: r.team })).collect()
}

/// The grants bound to a service account, by its uid.
///
/// # Errors
/// As [`db_error`].
pub async fn grants_of_account(db: impl PgExecutor<'_>, account: Uuid) -> Result<Vec<Grant>, Error> {
    let rows = sqlx::query!(
        "SELECT role, team FROM role_bindings WHERE service_account_uid = $1 ORDER BY role, team",
        account
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    rows.into_iter().map(|r| Ok(Grant { role: Role::parse(&r.role).map_err(Error::Internal)?, team: r.team })).collect()
}

/// Who a new binding is for: a user of an issuer, or a service account by uid.
pub enum BindingIdentity<'a> {
    User { issuer: &'a str },
    ServiceAccount(Uuid),
}

/// Inserts a role binding; a duplicate (identity, role, team) or an unknown team is a 409.
///
/// # Errors
/// As [`db_error`].
pub async fn role_binding_insert(
    db: impl PgExecutor<'_>,
    b: &RoleBinding,
    identity: BindingIdentity<'_>,
) -> Result<RoleBinding, Error> {
    let (issuer, account) = match identity {
        BindingIdentity::User { issuer } => (Some(issuer), None),
        BindingIdentity::ServiceAccount(uid) => (None, Some(uid)),
    };
    let row = sqlx::query_as!(
        BindingRow,
        r#"INSERT INTO role_bindings (id, subject, issuer, service_account_uid, role, team, created_by)
           VALUES ($1, $2, $3, $4, $5, $6, $7)
           RETURNING id, subject, issuer, role, team, created_at, created_by"#,
        b.id,
        b.subject,
        issuer,
        account,
        b.role.as_str(),
        b.team,
        b.created_by,
    )
    .fetch_one(db)
    .await
    .map_err(db_error)?;
    row.try_into()
}

/// All role bindings, optionally of one subject, ordered by subject.
///
/// # Errors
/// As [`db_error`].
pub async fn role_binding_list(db: impl PgExecutor<'_>, subject: Option<&str>) -> Result<Vec<RoleBinding>, Error> {
    let rows = sqlx::query_as!(
        BindingRow,
        r#"SELECT id, subject, issuer, role, team, created_at, created_by FROM role_bindings
           WHERE ($1::text IS NULL OR subject = $1) ORDER BY subject, role, team, id"#,
        subject,
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    rows.into_iter().map(RoleBinding::try_from).collect()
}

/// # Errors
/// [`Error::NotFound`] when there is no such binding.
pub async fn role_binding_get(db: impl PgExecutor<'_>, id: Uuid) -> Result<RoleBinding, Error> {
    let row = sqlx::query_as!(
        BindingRow,
        "SELECT id, subject, issuer, role, team, created_at, created_by FROM role_bindings WHERE id = $1",
        id
    )
    .fetch_optional(db)
    .await
    .map_err(db_error)?;
    row.ok_or_else(|| Error::NotFound { kind: "role binding", name: id.to_string() })?.try_into()
}

/// # Errors
/// As [`db_error`].
pub async fn role_binding_delete(db: impl PgExecutor<'_>, id: Uuid) -> Result<bool, Error> {
    let done = sqlx::query!("DELETE FROM role_bindings WHERE id = $1", id).execute(db).await.map_err(db_error)?;
    Ok(done.rows_affected() == 1)
}

struct AccountRow {
    uid: Uuid,
    name: String,
    team: Option<String>,
    description: String,
    created_at: DateTime<Utc>,
    created_by: String,
}

impl From<AccountRow> for ServiceAccount {
    fn from(r: AccountRow) -> Self {
        Self {
            uid: r.uid,
            subject: service_account_subject(&r.name),
            name: r.name,
            team: r.team,
            description: r.description,
            created_at: r.created_at,
            created_by: r.created_by,
        }
    }
}

/// Inserts a service account; an existing name or an unknown team is a 409.
///
/// # Errors
/// As [`db_error`].
pub async fn service_account_insert(
    db: impl PgExecutor<'_>,
    name: &str,
    team: Option<&str>,
    description: &str,
    created_by: &str,
) -> Result<ServiceAccount, Error> {
    let row = sqlx::query_as!(
        AccountRow,
        r#"INSERT INTO service_accounts (name, team, description, created_by) VALUES ($1, $2, $3, $4)
           RETURNING uid, name, team, description, created_at, created_by"#,
        name,
        team,
        description,
        created_by,
    )
    .fetch_one(db)
    .await
    .map_err(db_error)?;
    Ok(row.into())
}

/// # Errors
/// [`Error::NotFound`] when there is no such account.
pub async fn service_account_get(db: impl PgExecutor<'_>, name: &str) -> Result<ServiceAccount, Error> {
    let row = sqlx::query_as!(
        AccountRow,
        "SELECT uid, name, team, description, created_at, created_by FROM service_accounts WHERE name = $1",
        name
    )
    .fetch_optional(db)
    .await
    .map_err(db_error)?;
    row.map(Into::into).ok_or_else(|| Error::NotFound { kind: "service account", name: name.to_owned() })
}

/// # Errors
/// As [`db_error`].
pub async fn service_account_list(db: impl PgExecutor<'_>) -> Result<Vec<ServiceAccount>, Error> {
    let rows = sqlx::query_as!(
        AccountRow,
        "SELECT uid, name, team, description, created_at, created_by FROM service_accounts ORDER BY name"
    )
    .fetch_all(db)
    .await
    .map_err(db_error)?;
    Ok(rows.into_iter().map(Into::into).collect())
}

/// Deletes an account; its tokens and role bindings go with it (foreign keys).
///
/// # Errors
/// As [`db_error`].
pub async fn service_account_delete(db: impl PgExecutor<'_>, name: &str) -> Result<bool, Error> {
    let done =
        sqlx::query!("DELETE FROM service_accounts WHERE name = $1", name).execute(db).await.map_err(db_error)?;
    Ok(done.rows_affected() == 1)
}

/// Records a token by the SHA-256 of its text.
///
/// # Errors
/// As [`db_error`].
pub async fn sa_token_insert(
    db: impl PgExecutor<'_>,
    id: Uuid,
    account: &str,
    sha256: &[u8],
    expires_at: DateTime<Utc>,
) -> Result<ServiceAccountToken, Error> {
    sqlx::query_as!(
        ServiceAccountToken,
        r#"INSERT INTO service_account_tokens (id, service_account, token_sha256, expires_at) VALUES ($1, $2, $3, $4)
           RETURNING id, service_account, created_at, expires_at, last_used_at, revoked_at"#,
        id,
        account,
        sha256,
        expires_at,
    )
    .fetch_one(db)
    .await
    .map_err(db_error)
}

/// An account's tokens, newest first.
///
/// # Errors
/// As [`db_error`].
pub async fn sa_token_list(db: impl PgExecutor<'_>, account: &str) -> Result<Vec<ServiceAccountToken>, Error> {
    sqlx::query_as!(
        ServiceAccountToken,
        r#"SELECT id, service_account, created_at, expires_at, last_used_at, revoked_at
           FROM service_account_tokens WHERE service_account = $1 ORDER BY created_at DESC, id"#,
        account
    )
    .fetch_all(db)
    .await
    .map_err(db_error)
}

/// Revokes a token (once; revoking again keeps the first time).
///
/// # Errors
/// [`Error::NotFound`] when the account has no such token.
pub async fn sa_token_revoke(db: impl PgExecutor<'_>, account: &str, id: Uuid) -> Result<ServiceAccountToken, Error> {
    let row = sqlx::query_as!(
        ServiceAccountToken,
        r#"UPDATE service_account_tokens SET revoked_at = coalesce(revoked_at, now())
           WHERE service_account = $1 AND id = $2
           RETURNING id, service_account, created_at, expires_at, last_used_at, revoked_at"#,
        account,
        id
    )
    .fetch_optional(db)
    .await
    .map_err(db_error)?;
    row.ok_or_else(|| Error::NotFound { kind: "token", name: id.to_string() })
}

/// Checks a presented service-account token: it must exist with this hash, be neither
/// revoked nor expired, and belong to `account`. Marks it used (at most once a minute, so
/// a busy tool does not write on every request). Returns the account's uid and owning team
/// when valid.
///
/// # Errors
/// As [`db_error`].
pub async fn sa_token_use(
    db: &sqlx::PgPool,
    account: &str,
    id: Uuid,
    sha256: &[u8],
) -> Result<Option<(Uuid, Option<String>)>, Error> {
    let row = sqlx::query!(
        r#"SELECT a.uid, a.team, t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute' AS "stale!"
           FROM service_account_tokens t JOIN service_accounts a ON a.name = t.service_account
           WHERE t.id = $1 AND t.service_account = $2 AND t.token_sha256 = $3
             AND t.revoked_at IS NULL AND t.expires_at > now()"#,
        id,
        account,
        sha256
    )
    .fetch_optional(db)
    .await
    .map_err(db_error)?;
    let Some(row) = row else { return Ok(None) };
    if row.stale {
        sqlx::query!("UPDATE service_account_tokens SET last_used_at = now() WHERE id = $1", id)
            .execute(db)
            .await
            .map_err(db_error)?;
    }
    Ok(Some((row.uid, row.team)))
}
