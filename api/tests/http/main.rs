//! HTTP-level tests: the real router served over real TCP, against a fresh Postgres
//! database per test (`#[sqlx::test]`; DATABASE_URL must point at a server that lets the
//! role create databases — scripts/test sets that up).

mod auth;
mod clusters;
mod common;
mod flavors;
mod lifecycle;
mod malformed;
mod observability;
mod security;
mod teams;
mod usage;
mod workloads;
