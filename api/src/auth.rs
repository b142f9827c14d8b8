//! Authentication of `/api/v1`: every request carries a bearer token, verified by
//! `berth_auth`, turned into a [`Principal`] (with the subject's role bindings), and put in
//! the request's extensions for the [`crate::extract::OpCtx`] extractor. Requests are
//! rate-limited per principal (reads and changes each with their own budget) and per team
//! (the team a path names, and the team owning a service account), so that creating more
//! service accounts buys no more requests.
//!
//! Failures are logged with a reason code and never with the token.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_auth::{AuthError, Verifier};
use berth_core::auth::Principal;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::problem::Problem;
use crate::state::AppState;

/// How requests are authenticated and limited.
#[derive(Clone)]
pub struct Auth {
    pub verifier: Verifier,
    writes: Option<Limiter>,
    reads: Option<Limiter>,
    teams: Option<Limiter>,
}

type Limiter = Arc<DefaultKeyedRateLimiter<String>>;

/// Requests allowed to one key: a sustained rate and a burst.
#[derive(Debug, Clone, Copy)]
pub struct RateLimit {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

/// Every budget; `None`: that one is not limited.
#[derive(Debug, Clone, Copy, Default)]
pub struct RateLimits {
    /// Changes per principal.
    pub writes: Option<RateLimit>,
    /// Reads per principal.
    pub reads: Option<RateLimit>,
    /// Requests of any kind per team: on its paths, and by its service accounts.
    pub teams: Option<RateLimit>,
}

fn limiter(limit: Option<RateLimit>) -> Option<Limiter> {
    limit.map(|r| Arc::new(RateLimiter::keyed(Quota::per_second(r.per_second).allow_burst(r.burst))))
}

impl Auth {
    /// Limits changes per principal only (reads and teams unlimited).
    pub fn new(verifier: Verifier, rate_limit: Option<RateLimit>) -> Self {
        Self::with_limits(verifier, RateLimits { writes: rate_limit, ..RateLimits::default() })
    }

    pub fn with_limits(verifier: Verifier, limits: RateLimits) -> Self {
        Self { verifier, writes: limiter(limits.writes), reads: limiter(limits.reads), teams: limiter(limits.teams) }
    }

    /// The seconds to wait when the principal, or a team the request counts against, is
    /// over its budget.
    fn over_limit(&self, method: &Method, principal: &Principal, path: &str) -> Option<u64> {
        let read = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let caller = format!("{} {}", principal.issuer, principal.subject);
        let mut keys: Vec<(&Limiter, String)> = Vec::new();
        if let Some(l) = if read { &self.reads } else { &self.writes } {
            keys.push((l, caller));
        }
        if let Some(l) = &self.teams {
            let teams = path_team(path).into_iter().chain(principal.service_account_team.as_deref());
            keys.extend(teams.map(|t| (l, t.to_owned())));
        }
        keys.iter()
            .filter_map(|(l, key)| l.check_key(key).err().map(|not_until| (l, not_until)))
            .map(|(l, not_until)| {
                let wait = not_until.wait_time_from(l.clock().now());
                wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
            })
            .max()
    }
}

/// The team a path is about: `/api/v1/teams/{team}/...`.
fn path_team(path: &str) -> Option<&str> {
    path.strip_prefix("/api/v1/teams/")?.split('/').next().filter(|t| !t.is_empty())
}

/// The middleware on every `/api/v1` route.
pub async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let token = bearer(request.headers()).map(str::to_owned);
    let principal = match principal(&state, token).await {
        Ok(p) => p,
        Err(Refusal::Token(e)) => {
            tracing::info!(reason = e.code(), path = %request.uri().path(), "authentication refused");
            return unauthorized(&e);
        }
        Err(Refusal::Store(e)) => return crate::problem::ApiError::from(e).into_response(),
    };
    if let Some(seconds) = state.auth.over_limit(request.method(), &principal, request.uri().path()) {
        tracing::info!(subject = %principal.subject, "rate limit reached");
        return too_many_requests(seconds);
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

/// Whether the request carries a valid token of a caller who reads everything (a platform
/// admin, a global viewer): what `/metrics` asks before it names teams.
pub async fn reads_all(state: &AppState, headers: &HeaderMap) -> bool {
    let token = bearer(headers).map(str::to_owned);
    principal(state, token).await.is_ok_and(|p| {
        berth_core::auth::Access { principal: &p, tree: &berth_core::auth::TeamTree::default() }.reads_all()
    })
}

enum Refusal {
    Token(AuthError),
    Store(berth_core::Error),
}

async fn principal(state: &AppState, token: Result<String, AuthError>) -> Result<Principal, Refusal> {
    let token = token.map_err(Refusal::Token)?;
    let verified = state.auth.verifier.verify(&token).await.map_err(Refusal::Token)?;
    berth_app::identity::principal(&state.db, &token, verified).await.map_err(Refusal::Store)?.map_err(Refusal::Token)
}

fn bearer(headers: &HeaderMap) -> Result<&str, AuthError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or(AuthError::Missing)?;
    // Two credentials are ambiguous: a proxy and the server could each pick another one.
    if values.next().is_some() {
        return Err(AuthError::SeveralAuthorizations);
    }
    let value = value.to_str().map_err(|_| AuthError::Malformed)?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(token.trim())
}

fn unauthorized(e: &AuthError) -> Response {
    let mut response =
        Problem::new(StatusCode::UNAUTHORIZED, "unauthenticated", "Authentication required", e.to_string())
            .into_response();
    let challenge = if *e == AuthError::Missing { "Bearer" } else { "Bearer error=\"invalid_token\"" };
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    unread_body(response)
}

/// A refusal sent before the request's body was read: the server will not read the rest
/// of the body, so it closes the connection, and says so, so the client does not send its
/// next request into a closing socket.
fn unread_body(mut response: Response) -> Response {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn too_many_requests(seconds: u64) -> Response {
    let mut response = Problem::new(
        StatusCode::TOO_MANY_REQUESTS,
        "rate-limited",
        "Too many requests",
        format!("too many requests from this principal or for this team; retry in {seconds} s"),
    )
    .into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    unread_body(response)
}
