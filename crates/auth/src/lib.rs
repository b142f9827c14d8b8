//! Bearer-token verification and minting.
//!
//! Two kinds of issuer can be configured together:
//! - **Berth** itself: HS256 tokens signed with a shared secret from configuration, minted
//!   by `berthd token create` (bootstrap; they may carry grants) and by the API for service
//!   accounts (they carry the account's name and a token id, checked against the store).
//! - An **OIDC provider**: RS256/ES256 tokens verified against its JWKS ([`jwks`]).
//!
//! The issuer is chosen by the token's `iss`; each issuer has its own algorithm allow-list
//! (so an HS256 token can never be checked against an RSA public key), its audience, and
//! the required claims `exp`, `iss`, `aud` and `sub`. `nbf` is honoured, with at most 60 s
//! leeway. No error message ever contains the token.

pub mod jwks;

use std::time::Duration;

use berth_core::auth::{Grant, WorkloadScope};
use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use sha2::Digest;
use uuid::Uuid;

pub use jwks::{Jwks, OidcConfig};

/// The longest `sub` accepted (OpenID Connect's is at most 255 ASCII characters).
pub const MAX_SUBJECT_CHARS: usize = 256;

/// Whether a token's subject is one [`Verifier::verify`] accepts: what a minted token must
/// name, or the server refuses it as malformed.
///
/// # Errors
/// Says what is wrong with it.
pub fn check_subject(subject: &str) -> Result<(), String> {
    // RFC 8725 3.10: a subject must name someone; an empty one would match nothing and
    // audit as no one.
    if subject.trim().is_empty() {
        return Err("must name someone".into());
    }
    // It is stored (audit records, bindings' authors) and shown: text of a bounded size,
    // without control characters (a NUL cannot even be stored).
    if subject.chars().count() > MAX_SUBJECT_CHARS {
        return Err(format!("must be at most {MAX_SUBJECT_CHARS} characters"));
    }
    if subject.chars().any(char::is_control) {
        return Err("must not contain control characters".into());
    }
    Ok(())
}

/// The most clock skew accepted on `exp` and `nbf`.
pub const MAX_LEEWAY: Duration = Duration::from_secs(60);

/// Claims Berth reads. Berth's own tokens may add `grants` (bootstrap tokens), `sa`
/// (service-account tokens, with `jti`) or `workload` (a workload's own token, given to its
/// job; nothing else).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    pub sub: String,
    pub aud: String,
    pub exp: i64,
    pub iat: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sa: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadScope>,
}

/// The subject of a workload's own token.
pub fn workload_subject(uid: Uuid) -> String {
    format!("workload:{uid}")
}

/// Why a token was refused. Messages name the rule, never the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token: send `Authorization: Bearer <token>`")]
    Missing,
    #[error("the token is malformed")]
    Malformed,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token's issuer is not trusted")]
    UnknownIssuer,
    #[error("the token is not meant for this audience")]
    WrongAudience,
    #[error("the token's algorithm is not allowed for its issuer")]
    Algorithm,
    #[error("the token's signature is invalid")]
    BadSignature,
    #[error("the token's signing key is unknown")]
    UnknownKey,
    #[error("the token lacks a required claim")]
    MissingClaim,
    #[error("the service-account token is revoked, expired or unknown")]
    Revoked,
    #[error("the identity provider's keys cannot be fetched")]
    KeysUnavailable,
    #[error("the token names critical header parameters (`crit`) this server does not understand")]
    Critical,
    #[error("the token was issued in the future")]
    IssuedInFuture,
    #[error("send one Authorization header, not several")]
    SeveralAuthorizations,
}

impl AuthError {
    /// A short, stable code for logs and metrics.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::UnknownIssuer => "unknown_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::Algorithm => "algorithm",
            Self::BadSignature => "bad_signature",
            Self::UnknownKey => "unknown_key",
            Self::MissingClaim => "missing_claim",
            Self::Revoked => "revoked",
            Self::KeysUnavailable => "keys_unavailable",
            Self::Critical => "critical_header",
            Self::IssuedInFuture => "issued_in_future",
            Self::SeveralAuthorizations => "several_authorizations",
        }
    }
}

fn refused(e: &jsonwebtoken::errors::Error) -> AuthError {
    use jsonwebtoken::errors::ErrorKind as K;
    match e.kind() {
        K::ExpiredSignature => AuthError::Expired,
        K::ImmatureSignature => AuthError::NotYetValid,
        K::InvalidIssuer => AuthError::UnknownIssuer,
        K::InvalidAudience => AuthError::WrongAudience,
        K::InvalidAlgorithm | K::InvalidAlgorithmName | K::MissingAlgorithm => AuthError::Algorithm,
        K::InvalidSignature => AuthError::BadSignature,
        K::MissingRequiredClaim(_) => AuthError::MissingClaim,
        _ => AuthError::Malformed,
    }
}

/// Berth's own issuer: name, audience and HS256 secret.
#[derive(Clone)]
pub struct BerthIssuer {
    pub issuer: String,
    pub audience: String,
    secret: Vec<u8>,
}

impl std::fmt::Debug for BerthIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BerthIssuer").field("issuer", &self.issuer).field("audience", &self.audience).finish()
    }
}

/// The shortest secret accepted for HS256 (256 bits).
pub const MIN_SECRET_BYTES: usize = 32;

impl BerthIssuer {
    /// # Errors
    /// When the secret is shorter than [`MIN_SECRET_BYTES`].
    pub fn new(issuer: impl Into<String>, audience: impl Into<String>, secret: &[u8]) -> Result<Self, String> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(format!("the token signing secret must be at least {MIN_SECRET_BYTES} bytes"));
        }
        Ok(Self { issuer: issuer.into(), audience: audience.into(), secret: secret.to_vec() })
    }

    /// Signs a token for `sub`, valid for `ttl` from now.
    ///
    /// # Panics
    /// Never: HS256 signing of serializable claims cannot fail.
    pub fn mint(&self, sub: &str, grants: Vec<Grant>, ttl: Duration, sa: Option<(&str, Uuid)>) -> Minted {
        let now = Utc::now();
        let expires_at = now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(3650));
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: sub.to_owned(),
            aud: self.audience.clone(),
            exp: expires_at.timestamp(),
            iat: now.timestamp(),
            nbf: None,
            jti: sa.map(|(_, id)| id.to_string()),
            grants,
            sa: sa.map(|(name, _)| name.to_owned()),
            workload: None,
        };
        self.sign(&claims, expires_at)
    }

    /// Signs the token a workload's job is given for `scope` (its attempt), valid for
    /// `ttl`: it carries no grants, and lets the job only acknowledge its own checkpoint.
    pub fn mint_workload(&self, scope: WorkloadScope, ttl: Duration) -> Minted {
        let now = Utc::now();
        let expires_at = now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::days(3650));
        let claims = Claims {
            iss: self.issuer.clone(),
            sub: workload_subject(scope.uid),
            aud: self.audience.clone(),
            exp: expires_at.timestamp(),
            iat: now.timestamp(),
            nbf: None,
            jti: None,
            grants: Vec::new(),
            sa: None,
            workload: Some(scope),
        };
        self.sign(&claims, expires_at)
    }

    /// The token that opens a notebook's attempt (its `JUPYTER_TOKEN`): derived from the
    /// secret (HMAC-SHA256), so Berth stores none and shows it to whoever may open it.
    pub fn notebook_token(&self, scope: WorkloadScope) -> String {
        use base64::Engine as _;
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&self.secret).expect("HMAC takes any key length");
        mac.update(format!("berth notebook token\0{}\0{}", scope.uid, scope.attempt).as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
    }

    fn sign(&self, claims: &Claims, expires_at: DateTime<Utc>) -> Minted {
        let token =
            jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(&self.secret))
                .expect("HS256 signing does not fail");
        Minted { token, expires_at }
    }

    fn validation(&self, leeway: Duration) -> Validation {
        validation(Algorithm::HS256, &self.issuer, &self.audience, leeway)
    }
}

/// A freshly signed token.
pub struct Minted {
    pub token: String,
    pub expires_at: DateTime<Utc>,
}

/// Accepts exactly `alg` (the library refuses a list mixing key families).
fn validation(alg: Algorithm, iss: &str, aud: &str, leeway: Duration) -> Validation {
    let mut v = Validation::new(alg);
    v.set_issuer(&[iss]);
    v.set_audience(&[aud]);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    v.validate_nbf = true;
    v.leeway = leeway.min(MAX_LEEWAY).as_secs();
    v
}

/// A token that passed signature and claim checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub issuer: String,
    pub subject: String,
    /// Grants carried by a Berth-issued bootstrap token (never by an external token).
    pub grants: Vec<Grant>,
    /// For a service-account token: the account and the token id, still to be checked
    /// against the store (revocation).
    pub service_account: Option<(String, Uuid)>,
    /// For a workload's own token: the attempt it speaks for.
    pub workload: Option<WorkloadScope>,
    pub expires_at: DateTime<Utc>,
}

/// Verifies bearer tokens against the configured issuers.
#[derive(Clone, Debug)]
pub struct Verifier {
    pub berth: Option<BerthIssuer>,
    pub oidc: Option<Jwks>,
    pub leeway: Duration,
}

impl Verifier {
    /// The issuer of users' tokens where a role binding names none: the OIDC provider's
    /// when one is configured, else Berth's own.
    pub fn user_issuer(&self) -> Option<&str> {
        self.oidc.as_ref().map(|o| o.config.issuer.as_str()).or(self.berth.as_ref().map(|b| b.issuer.as_str()))
    }

    /// What verification depends on besides the token and the clock: it changes each time
    /// an OIDC issuer's key set is fetched again (a key may have been withdrawn).
    pub fn keys_version(&self) -> u64 {
        self.oidc.as_ref().map_or(0, Jwks::key_sets_fetched)
    }

    /// Checks a token's header, issuer, signature and claims.
    ///
    /// # Errors
    /// Why it was refused.
    pub async fn verify(&self, token: &str) -> Result<Verified, AuthError> {
        let verified = self.verify_signed(token).await?;
        if verified.subject.trim().is_empty() {
            return Err(AuthError::MissingClaim);
        }
        if check_subject(&verified.subject).is_err() {
            return Err(AuthError::Malformed);
        }
        Ok(verified)
    }

    async fn verify_signed(&self, token: &str) -> Result<Verified, AuthError> {
        // The header's `alg` must parse (`none` does not) before anything else is read.
        let header = jsonwebtoken::decode_header(token).map_err(|e| refused(&e))?;
        // RFC 7515 4.1.11: a recipient that does not understand every critical extension
        // must refuse the token. Berth understands none.
        if header_names_crit(token) {
            return Err(AuthError::Critical);
        }
        // Only to choose the issuer: nothing is trusted until the signature is checked.
        let unverified: serde_json::Value =
            jsonwebtoken::dangerous::insecure_decode_claims(token).map_err(|_| AuthError::Malformed)?;
        let iss = unverified.get("iss").and_then(serde_json::Value::as_str).ok_or(AuthError::MissingClaim)?;
        if let Some(berth) = self.berth.as_ref().filter(|b| b.issuer == iss) {
            let data = jsonwebtoken::decode::<Claims>(
                token,
                &DecodingKey::from_secret(&berth.secret),
                &berth.validation(self.leeway),
            )
            .map_err(|e| refused(&e))?;
            self.check_issued_at(Some(data.claims.iat))?;
            return berth_claims(data.claims);
        }
        if let Some(oidc) = self.oidc.as_ref().filter(|o| o.config.issuer == iss) {
            if !oidc.config.algorithms.contains(&header.alg) {
                return Err(AuthError::Algorithm);
            }
            let kid = header.kid.as_deref().ok_or(AuthError::UnknownKey)?;
            let key = oidc.key(kid).await?;
            let v = validation(header.alg, iss, &oidc.config.audience, self.leeway);
            let data = jsonwebtoken::decode::<ExternalClaims>(token, &key, &v).map_err(|e| refused(&e))?;
            self.check_issued_at(data.claims.iat)?;
            return Ok(Verified {
                issuer: data.claims.iss,
                subject: data.claims.sub,
                grants: Vec::new(),
                service_account: None,
                workload: None,
                expires_at: timestamp(data.claims.exp)?,
            });
        }
        Err(AuthError::UnknownIssuer)
    }

    /// A token issued later than now (beyond the leeway) was minted by a clock that
    /// cannot be trusted, or to outlive its stated lifetime.
    fn check_issued_at(&self, iat: Option<i64>) -> Result<(), AuthError> {
        let leeway = i64::try_from(self.leeway.min(MAX_LEEWAY).as_secs()).unwrap_or(0);
        match iat {
            Some(iat) if iat > Utc::now().timestamp() + leeway => Err(AuthError::IssuedInFuture),
            _ => Ok(()),
        }
    }
}

/// Whether the token's protected header carries `crit` (read from the raw header, which
/// the JWT library does not keep).
fn header_names_crit(token: &str) -> bool {
    use base64::Engine as _;
    let Some(segment) = token.split('.').next() else { return false };
    let Ok(bytes) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(segment.trim_end_matches('=')) else {
        return false;
    };
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes).is_ok_and(|h| h.contains_key("crit"))
}

fn berth_claims(c: Claims) -> Result<Verified, AuthError> {
    let service_account = match (c.sa, c.jti) {
        (Some(name), Some(jti)) => Some((name, Uuid::parse_str(&jti).map_err(|_| AuthError::Malformed)?)),
        (None, _) => None,
        (Some(_), None) => return Err(AuthError::MissingClaim),
    };
    // A workload's token is nothing else: no grants, no account, and its own subject.
    if let Some(scope) = &c.workload
        && (service_account.is_some() || !c.grants.is_empty() || c.sub != workload_subject(scope.uid))
    {
        return Err(AuthError::Malformed);
    }
    Ok(Verified {
        issuer: c.iss,
        subject: c.sub,
        // A service account's rights come only from its role bindings.
        grants: if service_account.is_some() { Vec::new() } else { c.grants },
        service_account,
        workload: c.workload,
        expires_at: timestamp(c.exp)?,
    })
}

/// The claims read from an external token: its grants come from role bindings only.
#[derive(Deserialize)]
struct ExternalClaims {
    iss: String,
    sub: String,
    exp: i64,
    #[serde(default)]
    iat: Option<i64>,
}

fn timestamp(secs: i64) -> Result<DateTime<Utc>, AuthError> {
    DateTime::from_timestamp(secs, 0).ok_or(AuthError::Malformed)
}

/// The SHA-256 of a token's text: what the store keeps of a service-account token.
pub fn token_sha256(token: &str) -> Vec<u8> {
    sha2::Sha256::digest(token.as_bytes()).to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier() -> Verifier {
        Verifier { berth: Some(BerthIssuer::new("berth", "berth", &[7; 32]).unwrap()), oidc: None, leeway: MAX_LEEWAY }
    }

    #[tokio::test]
    async fn berth_tokens_round_trip_and_carry_their_grants() {
        let v = verifier();
        let grants = vec![Grant { role: berth_core::auth::Role::Member, team: Some("nlp".into()) }];
        let minted = v.berth.as_ref().unwrap().mint("alice", grants.clone(), Duration::from_secs(60), None);
        let ok = v.verify(&minted.token).await.unwrap();
        assert_eq!((ok.subject.as_str(), ok.grants), ("alice", grants));
    }

    #[tokio::test]
    async fn a_short_secret_or_another_issuer_is_refused() {
        assert!(BerthIssuer::new("berth", "berth", b"short").is_err());
        let other = BerthIssuer::new("elsewhere", "berth", &[7; 32]).unwrap();
        let token = other.mint("mallory", Vec::new(), Duration::from_secs(60), None).token;
        assert_eq!(verifier().verify(&token).await, Err(AuthError::UnknownIssuer));
        assert_eq!(verifier().verify("not.a.token").await, Err(AuthError::Malformed));
    }

    #[tokio::test]
    async fn service_account_tokens_carry_no_grants() {
        let v = verifier();
        let id = Uuid::new_v4();
        let grants = vec![Grant { role: berth_core::auth::Role::PlatformAdmin, team: None }];
        let t = v.berth.as_ref().unwrap().mint("serviceaccount:ci", grants, Duration::from_secs(60), Some(("ci", id)));
        let ok = v.verify(&t.token).await.unwrap();
        assert_eq!(ok.service_account, Some(("ci".to_owned(), id)));
        assert!(ok.grants.is_empty());
    }

    /// A workload's token is that and nothing else: one that also carries grants, names an
    /// account or another subject was not minted by Berth and is refused.
    #[tokio::test]
    async fn a_workload_token_speaks_for_its_attempt_and_carries_nothing_else() {
        let v = verifier();
        let berth = v.berth.as_ref().unwrap();
        let scope = WorkloadScope { uid: Uuid::now_v7(), attempt: 2, team: Some("nlp".into()) };
        let ok = v.verify(&berth.mint_workload(scope.clone(), Duration::from_secs(60)).token).await.unwrap();
        assert_eq!(
            (ok.workload, ok.subject, ok.grants),
            (Some(scope.clone()), workload_subject(scope.uid), Vec::new())
        );
        let forged = |edit: &dyn Fn(&mut Claims)| {
            let mut claims = Claims {
                iss: "berth".into(),
                sub: workload_subject(scope.uid),
                aud: "berth".into(),
                exp: Utc::now().timestamp() + 60,
                iat: Utc::now().timestamp(),
                nbf: None,
                jti: None,
                grants: Vec::new(),
                sa: None,
                workload: Some(scope.clone()),
            };
            edit(&mut claims);
            berth.sign(&claims, Utc::now()).token
        };
        let admin = Grant { role: berth_core::auth::Role::PlatformAdmin, team: None };
        for token in [
            forged(&|c| c.grants = vec![admin.clone()]),
            forged(&|c| (c.sa, c.jti) = (Some("ci".into()), Some(Uuid::nil().to_string()))),
            forged(&|c| c.sub = "alice".into()),
        ] {
            assert_eq!(v.verify(&token).await, Err(AuthError::Malformed));
        }
        assert!(v.verify(&forged(&|_| {})).await.is_ok(), "the same claims, unedited, pass");
    }
}
