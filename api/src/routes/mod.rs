//! The `/api/v1` routes, one file per resource. Handlers are thin: extract, call one
//! `berth_app` function, shape the response.

pub mod cluster;
pub mod controller;
pub mod flavor;
pub mod history;
pub mod identity;
pub mod team;
pub mod usage;
pub mod workload;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use berth_core::apply::Applied;
use berth_core::meta::ObjectMeta;
use berth_core::page::Page;
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;

use crate::state::AppState;

/// All `/api/v1` routes with their OpenAPI descriptions.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(flavor::router())
        .merge(team::router())
        .merge(cluster::router())
        .merge(workload::router())
        .merge(history::router())
        .merge(usage::router())
        .merge(controller::router())
        .merge(identity::router())
}

/// The `ETag` of an object: its resource version, quoted.
fn etag(meta: &ObjectMeta) -> HeaderValue {
    HeaderValue::from_str(&format!("\"{}\"", meta.resource_version)).expect("resource versions are digits")
}

/// An object with its `ETag`.
fn object<T: Serialize>(status: StatusCode, meta: &ObjectMeta, body: &T) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    response.headers_mut().insert(header::ETAG, etag(meta));
    response
}

/// The response to a PUT: 201 with `Location` when created, else 200.
fn applied<T: Serialize>(applied: Applied, location: &str, meta: &ObjectMeta, body: &T) -> Response {
    if applied == Applied::Created {
        let mut response = object(StatusCode::CREATED, meta, body);
        if let Ok(location) = HeaderValue::from_str(location) {
            response.headers_mut().insert(header::LOCATION, location);
        }
        response
    } else {
        object(StatusCode::OK, meta, body)
    }
}

/// Declares a list type `{items, next}` for the OpenAPI document.
macro_rules! list_type {
    ($name:ident, $item:ty) => {
        #[doc = concat!("A page of ", stringify!($item), "s. Pass `next` as `cursor` to get the following page.")]
        #[derive(Debug, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        pub struct $name {
            pub items: Vec<$item>,
            /// Cursor of the next page; absent on the last page.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub next: Option<String>,
        }

        impl From<berth_core::page::Page<$item>> for $name {
            fn from(page: berth_core::page::Page<$item>) -> Self {
                Self { items: page.items, next: page.next }
            }
        }
    };
}
pub(crate) use list_type;

/// `limit` and `cursor`, shared by every list.
#[derive(Debug, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// Items per page, 1 to 500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `next` value of the previous page.
    #[param(pattern = "^[A-Za-z0-9_-]*$")]
    pub cursor: Option<String>,
}

fn list<T, L: From<Page<T>> + Serialize>(page: Page<T>) -> Response {
    axum::Json(L::from(page)).into_response()
}

/// `?dry_run=true`: every check of the write, and the answer it would give, with nothing
/// written.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct WriteParams {
    /// Check the request and answer what it would do, without writing anything.
    #[serde(default)]
    pub dry_run: bool,
}
