//! What the controllers report.

use berth_core::Error;
use berth_core::controller::{ControllerReport, ControllersOverview, Leader};
use berth_store::{PgPool, controller as store};

use crate::context::OpContext;

/// The leader and every controller's last pass.
///
/// # Errors
/// Store errors.
pub async fn controllers_overview(db: &PgPool, opctx: &OpContext) -> Result<ControllersOverview, Error> {
    opctx.access().read_catalogue()?;
    let leader = store::leader_fetch(db).await?.map(|(holder, since, renewed_at, epoch)| Leader {
        holder,
        since,
        renewed_at,
        epoch,
    });
    let controllers = store::controller_status_list(db)
        .await?
        .into_iter()
        .map(|(name, holder, status, updated_at)| ControllerReport { name, holder, updated_at, status })
        .collect();
    Ok(ControllersOverview { leader, controllers })
}
