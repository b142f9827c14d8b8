//! What every handler can reach.

use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue, Method, header};
use berth_adapters::Registry;
use berth_store::PgPool;
use metrics_exporter_prometheus::PrometheusHandle;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::auth::Auth;

/// What every handler can reach, behind one handle: it is cloned for every request (each
/// extractor and middleware takes its own), so a clone is one counter, not one per part.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(db: PgPool, auth: Auth) -> Self {
        Self::from(Shared::new(db, auth))
    }
}

impl From<Shared> for AppState {
    fn from(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    pub db: PgPool,
    pub metrics: PrometheusHandle,
    pub auth: Auth,
    pub http: HttpConfig,
    /// The clusters' backends (logs are read through them); berthd shares them with its
    /// controllers.
    pub backends: Arc<Registry>,
    /// The controllers' settings as berthd runs them: what the quota preview's scheduler
    /// runs with.
    pub scheduling: berth_controllers::Config,
    /// The time as the controllers read it.
    pub clock: berth_controllers::Clock,
}

impl Shared {
    /// The defaults: no CORS, `/metrics` beside the API, no backends configured.
    pub fn new(db: PgPool, auth: Auth) -> Self {
        Self {
            db,
            metrics: crate::telemetry::metrics_handle(),
            auth,
            http: HttpConfig::default(),
            backends: Arc::new(Registry::new(None)),
            scheduling: berth_controllers::Config::default(),
            clock: berth_controllers::Clock::default(),
        }
    }
}

/// Settings of the HTTP surface.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Origins whose browsers may call the API (CORS); none: no CORS headers at all.
    pub cors_origins: Vec<HeaderValue>,
    /// Whether `/metrics` is served beside the API (off when it has its own address or is
    /// turned off).
    pub metrics_here: bool,
    /// The dashboard's build (`web/dist`); none or not built: a page saying how to build it.
    pub web_dir: Option<std::path::PathBuf>,
    /// How long connections and requests may take.
    pub limits: crate::server::ConnectionLimits,
    /// What `GET /auth/config` tells clients about signing in.
    pub login: crate::ops::LoginConfig,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            cors_origins: Vec::new(),
            metrics_here: true,
            web_dir: None,
            limits: crate::server::ConnectionLimits::default(),
            login: crate::ops::LoginConfig::default(),
        }
    }
}

impl HttpConfig {
    /// The CORS layer for the configured origins, if any.
    pub fn cors(&self) -> Option<CorsLayer> {
        (!self.cors_origins.is_empty()).then(|| {
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(self.cors_origins.clone()))
                .allow_methods([Method::GET, Method::PUT, Method::POST, Method::DELETE])
                .allow_headers([
                    header::AUTHORIZATION,
                    header::CONTENT_TYPE,
                    header::IF_MATCH,
                    HeaderName::from_static("idempotency-key"),
                ])
                .expose_headers([
                    header::ETAG,
                    header::LOCATION,
                    header::RETRY_AFTER,
                    HeaderName::from_static("idempotent-replayed"),
                ])
        })
    }
}
