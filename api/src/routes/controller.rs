//! `/api/v1/controllers`

use axum::Json;
use axum::extract::State;
use berth_app::controller as app;
use berth_core::controller::ControllersOverview;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::extract::OpCtx;
use crate::problem::ApiError;
use crate::state::AppState;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_controllers))
}

/// Which replica leads the controllers, and what each controller did in its last pass.
#[utoipa::path(get, path = "/api/v1/controllers", tag = "controllers",
    responses((status = 200, description = "The leader and the controllers' statuses", body = ControllersOverview)))]
async fn get_controllers(
    State(s): State<AppState>,
    OpCtx(opctx): OpCtx,
) -> Result<Json<ControllersOverview>, ApiError> {
    Ok(Json(app::controllers_overview(&s.db, &opctx).await?))
}
