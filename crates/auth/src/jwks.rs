//! An OIDC provider's signing keys (JWKS), fetched with reqwest and cached.
//!
//! The key set is fetched on first use, again every `refresh_every` (so a retired key stops
//! being accepted), and again when a token names an unknown `kid` (so a rotated-in key is
//! accepted without a restart) — but never more often than once per `min_refresh`, so a
//! flood of tokens with bogus `kid`s cannot hammer the provider. One fetch at a time.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::AuthError;

/// An external issuer.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    /// The `iss` its tokens carry.
    pub issuer: String,
    /// The `aud` Berth's tokens from it must carry.
    pub audience: String,
    /// Where its JWKS is; `None`: discovered from `{issuer}/.well-known/openid-configuration`.
    pub jwks_url: Option<String>,
    /// Accepted algorithms; asymmetric ones only (RS256, ES256, …).
    pub algorithms: Vec<Algorithm>,
    /// Least time between two fetches.
    pub min_refresh: Duration,
    /// Greatest age of the cached key set.
    pub refresh_every: Duration,
}

impl OidcConfig {
    /// # Errors
    /// When an algorithm is symmetric (HS*) or the list is empty.
    pub fn check(&self) -> Result<(), String> {
        if self.algorithms.is_empty() {
            return Err("the OIDC issuer needs at least one algorithm".into());
        }
        if let Some(a) =
            self.algorithms.iter().find(|a| matches!(a, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512))
        {
            return Err(format!("{a:?} is symmetric: an OIDC issuer's tokens must be verified with its public keys"));
        }
        Ok(())
    }
}

#[derive(Default)]
struct Cache {
    keys: HashMap<String, DecodingKey>,
    fetched_at: Option<Instant>,
    jwks_url: Option<String>,
}

/// The cached key set of one issuer.
#[derive(Clone)]
pub struct Jwks {
    pub config: Arc<OidcConfig>,
    http: reqwest::Client,
    cache: Arc<Mutex<Cache>>,
    /// How many times the key set was fetched: what a token was verified against changes
    /// with it.
    fetches: Arc<AtomicU64>,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwks").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Jwks {
    /// # Panics
    /// When the HTTP client cannot be built (no TLS backend), which is a build error.
    pub fn new(config: OidcConfig) -> Self {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client with default settings builds");
        Self { config: Arc::new(config), http, cache: Arc::default(), fetches: Arc::default() }
    }

    /// How many times the key set was fetched (each may have withdrawn keys).
    pub fn key_sets_fetched(&self) -> u64 {
        self.fetches.load(Ordering::Acquire)
    }

    /// The key of `kid`, fetching the key set when it is stale or lacks that key.
    ///
    /// # Errors
    /// [`AuthError::UnknownKey`] when the (fresh enough) set has no such key;
    /// [`AuthError::KeysUnavailable`] when there is no key set and it cannot be fetched.
    pub async fn key(&self, kid: &str) -> Result<DecodingKey, AuthError> {
        let mut cache = self.cache.lock().await;
        let age = cache.fetched_at.map(|t| t.elapsed());
        let stale = age.is_none_or(|a| a >= self.config.refresh_every);
        let may_fetch = age.is_none_or(|a| a >= self.config.min_refresh);
        if stale || (!cache.keys.contains_key(kid) && may_fetch) {
            match self.fetch(&mut cache).await {
                Ok(keys) => {
                    cache.keys = keys;
                    self.fetches.fetch_add(1, Ordering::Release);
                }
                Err(e) => {
                    tracing::warn!(issuer = %self.config.issuer, error = %e, "fetching the issuer's JWKS failed");
                    if cache.fetched_at.is_none() {
                        return Err(AuthError::KeysUnavailable);
                    }
                }
            }
            cache.fetched_at = Some(Instant::now());
        }
        cache.keys.get(kid).cloned().ok_or(AuthError::UnknownKey)
    }

    async fn fetch(&self, cache: &mut Cache) -> Result<HashMap<String, DecodingKey>, String> {
        let url = match (&self.config.jwks_url, &cache.jwks_url) {
            (Some(url), _) | (None, Some(url)) => url.clone(),
            (None, None) => {
                let discovery =
                    format!("{}/.well-known/openid-configuration", self.config.issuer.trim_end_matches('/'));
                let doc: Discovery = self.get_json(&discovery).await?;
                cache.jwks_url = Some(doc.jwks_uri.clone());
                doc.jwks_uri
            }
        };
        let set: JwkSet = self.get_json(&url).await?;
        let keys: HashMap<_, _> = set
            .keys
            .iter()
            .filter_map(|jwk| Some((jwk.common.key_id.clone()?, DecodingKey::from_jwk(jwk).ok()?)))
            .collect();
        tracing::info!(issuer = %self.config.issuer, keys = keys.len(), "fetched the issuer's JWKS");
        Ok(keys)
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> Result<T, String> {
        let response = self.http.get(url).send().await.map_err(|e| format!("GET {url}: {e}"))?;
        let response = response.error_for_status().map_err(|e| format!("GET {url}: {e}"))?;
        response.json().await.map_err(|e| format!("GET {url}: {e}"))
    }
}

#[derive(Deserialize)]
struct Discovery {
    jwks_uri: String,
}
