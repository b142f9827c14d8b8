//! What the controllers report.

use berth_core::Error;
use berth_core::controller::{ControllerReport, ControllersOverview, Leader};
use berth_store::{PgPool, controller as store};

/// The leader and every controller's last pass.
///
/// # Errors
/// Store errors.
pub async fn controllers_overview(db: &PgPool) -> Result<ControllersOverview, Error> {
    let leader = store::leader_fetch(db).await?.map(|(holder, since, renewed_at)| Leader { holder, since, renewed_at });
    let controllers = store::controller_status_list(db)
        .await?
        .into_iter()
        .map(|(name, holder, status, updated_at)| ControllerReport { name, holder, updated_at, status })
        .collect();
    Ok(ControllersOverview { leader, controllers })
}
