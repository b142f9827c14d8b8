//! Authentication of `/api/v1`: every request carries a bearer token, verified by
//! `berth_auth`, turned into a [`Principal`] (with the subject's role bindings), and put in
//! the request's extensions for the [`crate::extract::OpCtx`] extractor. Requests are
//! rate-limited per principal (reads and changes each with their own budget) and per team
//! (the team a path names, for a caller who may read it, and the team owning a service
//! account or a workload token's workload), so that more accounts or jobs buy no more
//! requests.
//!
//! Failures are logged with a reason code and never with the token.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use berth_auth::{AuthError, Verified, Verifier};
use berth_core::auth::Principal;
use chrono::Utc;
use governor::clock::Clock;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::problem::Problem;
use crate::state::AppState;

/// How requests are authenticated and limited.
#[derive(Clone)]
pub struct Auth {
    pub verifier: Verifier,
    verified: Arc<VerifiedTokens>,
    writes: Option<Limiter>,
    reads: Option<Limiter>,
    teams: Option<Limiter>,
    /// Budgets asked for so far, to prune the limiters every [`PRUNE_EVERY`].
    asked: Arc<AtomicU64>,
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
        Self {
            verifier,
            verified: Arc::default(),
            writes: limiter(limits.writes),
            reads: limiter(limits.reads),
            teams: limiter(limits.teams),
            asked: Arc::default(),
        }
    }

    /// Verifies a token, or takes it at its word if it passed within
    /// [`VERIFIED_KEPT_FOR`] and has not expired since: a client sends the same token with
    /// every request, and checking it again took a tenth of a `GET`'s time.
    async fn verify(&self, token: &str) -> Result<Verified, AuthError> {
        let keys = self.verifier.keys_version();
        if let Some(verified) = self.verified.get(token, keys) {
            return Ok(verified);
        }
        let verified = self.verifier.verify(token).await?;
        self.verified.keep(token, keys, &verified);
        Ok(verified)
    }

    /// The seconds to wait when the caller is over its own budget (reads and changes each
    /// have one). Asked first: a request it refuses costs no team anything.
    fn caller_over_limit(&self, method: &Method, principal: &Principal) -> Option<u64> {
        let read = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let l = if read { self.reads.as_ref() } else { self.writes.as_ref() }?;
        self.wait(l, format!("{} {}", principal.issuer, principal.subject))
    }

    /// The seconds to wait when one of `teams` (from [`counted_teams`]) is over its budget.
    fn teams_over_limit(&self, teams: Vec<String>) -> Option<u64> {
        let l = self.teams.as_ref()?;
        teams.into_iter().filter_map(|t| self.wait(l, t)).max()
    }

    fn limits_teams(&self) -> bool {
        self.teams.is_some()
    }

    /// The seconds `key` must wait for `limiter`, or `None` when a request is allowed now.
    fn wait(&self, limiter: &Limiter, key: String) -> Option<u64> {
        if self.asked.fetch_add(1, Ordering::Relaxed) % PRUNE_EVERY == PRUNE_EVERY - 1 {
            self.prune();
        }
        limiter.check_key(&key).err().map(|not_until| {
            let wait = not_until.wait_time_from(limiter.clock().now());
            wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
        })
    }

    /// Forgets every key whose budget is whole again (a key not kept has a whole budget).
    fn prune(&self) {
        for l in [&self.writes, &self.reads, &self.teams].into_iter().flatten() {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    /// Keys kept by the limiters (callers and teams that spent some of their budget lately).
    #[cfg(test)]
    fn kept(&self) -> usize {
        [&self.writes, &self.reads, &self.teams].into_iter().flatten().map(|l| l.len()).sum()
    }
}

/// Budgets asked for between two prunings of the limiters. Each caller and each team is a
/// key of its limiter, and a workload's job has a caller of its own (its token's subject):
/// unpruned, a key stayed for every job that ever called, for as long as berthd ran.
const PRUNE_EVERY: u64 = 10_000;

/// The teams whose budgets pay for the request, each once: the team owning the caller (a
/// service account's, a workload token's workload's), and the team the path names where
/// the caller may read it. A caller outside a team (answered 404, as for a team that does
/// not exist) spends only its own budget: before, anyone could spend a team's budget and
/// lock its members out with 429s. Only teams that exist count: the limiter keeps a key
/// for every name it counts.
async fn counted_teams(state: &AppState, principal: &Principal, path: &str) -> Result<Vec<String>, Response> {
    if !state.auth.limits_teams() {
        return Ok(Vec::new());
    }
    let owning = principal.service_account_team.iter().chain(principal.workload.as_ref().and_then(|w| w.team.as_ref()));
    let mut teams: Vec<String> = owning.cloned().collect();
    if let Some(team) = path_team(path) {
        let tree = berth_app::access_cache::team_tree(&state.db)
            .await
            .map_err(|e| crate::problem::ApiError::from(e).into_response())?;
        if tree.contains(&team) && (berth_core::auth::Access { principal, tree: &tree }).can_read_team(&team) {
            teams.push(team);
        }
    }
    teams.sort();
    teams.dedup();
    Ok(teams)
}

/// The longest a verified token is taken at its word (never past its expiry). A key its
/// issuer withdrew (a JWKS rotation) is noticed within this time.
const VERIFIED_KEPT_FOR: Duration = Duration::from_secs(10);

/// The most tokens kept; past it the cache starts over.
const MOST_VERIFIED_KEPT: usize = 10_000;

/// Tokens that passed [`Verifier::verify`], by their text, with when they stop being taken
/// at their word and the [`Verifier::keys_version`] they were verified with: once keys
/// were fetched again, every token is verified again.
#[derive(Default)]
struct VerifiedTokens(Mutex<HashMap<Box<str>, (Instant, u64, Verified)>>);

impl VerifiedTokens {
    fn get(&self, token: &str, keys: u64) -> Option<Verified> {
        let kept = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        kept.get(token)
            .filter(|(until, version, _)| Instant::now() < *until && *version == keys)
            .map(|(_, _, verified)| verified.clone())
    }

    fn keep(&self, token: &str, keys: u64, verified: &Verified) {
        let Ok(left) = (verified.expires_at - Utc::now()).to_std() else { return };
        let until = Instant::now() + left.min(VERIFIED_KEPT_FOR);
        let mut kept = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if kept.len() >= MOST_VERIFIED_KEPT {
            kept.clear();
        }
        kept.insert(token.into(), (until, keys, verified.clone()));
    }
}

/// The team a path is about: `/api/v1/teams/{team}/...`, decoded as the router decodes it
/// (so `%62ravo` is bravo's).
fn path_team(path: &str) -> Option<String> {
    let segment = path.strip_prefix("/api/v1/teams/")?.split('/').next().filter(|t| !t.is_empty())?;
    percent_encoding::percent_decode_str(segment).decode_utf8().ok().map(std::borrow::Cow::into_owned)
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
    if let Some(seconds) = state.auth.caller_over_limit(request.method(), &principal) {
        tracing::info!(subject = %principal.subject, "rate limit reached");
        return too_many_requests(seconds);
    }
    let teams = match counted_teams(&state, &principal, request.uri().path()).await {
        Ok(teams) => teams,
        Err(response) => return response,
    };
    if let Some(seconds) = state.auth.teams_over_limit(teams) {
        tracing::info!(subject = %principal.subject, "team rate limit reached");
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
    let verified = state.auth.verify(&token).await.map_err(Refusal::Token)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn verified(expires_in: chrono::TimeDelta) -> Verified {
        Verified {
            issuer: "berth".into(),
            subject: "ada".into(),
            grants: Vec::new(),
            service_account: None,
            workload: None,
            expires_at: Utc::now() + expires_in,
        }
    }

    #[test]
    fn a_kept_token_is_taken_at_its_word_until_it_expires_or_keys_change() {
        let tokens = VerifiedTokens::default();
        tokens.keep("a", 1, &verified(chrono::TimeDelta::milliseconds(300)));
        tokens.keep("expired", 1, &verified(chrono::TimeDelta::seconds(-1)));
        assert_eq!(tokens.get("a", 1).map(|v| v.subject), Some("ada".into()));
        assert_eq!(tokens.get("a", 2), None, "keys were fetched again since");
        assert_eq!(tokens.get("expired", 1), None, "an expired token is not kept");
        assert_eq!(tokens.get("other", 1), None);
        std::thread::sleep(std::time::Duration::from_millis(400));
        assert_eq!(tokens.get("a", 1), None, "not past its expiry");
    }

    /// Each workload's job calls as a caller of its own: callers that come and go (a
    /// million jobs over a month) must not each leave a key behind.
    #[test]
    fn callers_whose_budget_is_whole_again_are_forgotten() {
        // One request every 100 ms.
        let limit = RateLimit { per_second: NonZeroU32::new(10).unwrap(), burst: NonZeroU32::new(1).unwrap() };
        let verifier = Verifier { berth: None, oidc: None, leeway: Duration::ZERO };
        let auth = Auth::with_limits(verifier, RateLimits { writes: Some(limit), reads: Some(limit), teams: None });
        let job = |i: u64| berth_core::auth::Principal {
            subject: format!("workload:{i}"),
            issuer: "berth".into(),
            service_account: None,
            service_account_uid: None,
            service_account_team: None,
            grants: Vec::new(),
            workload: None,
        };
        let ask = |i: u64| auth.caller_over_limit(&Method::GET, &job(i));
        for i in 0..PRUNE_EVERY - 1 {
            assert_eq!(ask(i), None);
        }
        assert_eq!(auth.kept(), usize::try_from(PRUNE_EVERY).unwrap() - 1, "each caller is a key until pruned");
        // A caller's whole budget (one request) comes back in 100 ms; governor forgets a key
        // once twice that has passed.
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(ask(0), None, "caller 0's budget is whole again");
        assert_eq!(ask(0), Some(1), "and spent again at once");
        assert_eq!(auth.kept(), 1, "pruned at the {PRUNE_EVERY}th budget asked: only caller 0 has spent lately");
    }
}
