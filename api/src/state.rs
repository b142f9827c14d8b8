//! What every handler can reach.

use berth_store::PgPool;
use metrics_exporter_prometheus::PrometheusHandle;

#[derive(Clone)]
pub struct AppState {
    pub db: PgPool,
    pub metrics: PrometheusHandle,
}

impl AppState {
    pub fn new(db: PgPool) -> Self {
        Self { db, metrics: crate::telemetry::metrics_handle() }
    }
}
