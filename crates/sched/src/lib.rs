//! Berth's scheduler, as pure functions of a snapshot: no IO, no clock, no randomness, so
//! it can be unit- and property-tested, benchmarked alone, and re-run as a what-if.
//!
//! - [`snapshot`]: the input (teams and quotas, clusters and nodes, running and pending work);
//! - [`schedule`]: one cycle, snapshot in, [`plan::Plan`] out (the rules are in [`cycle`]);
//! - [`fair_share`]: hierarchical fair share per flavor;
//! - [`feasible`]: what can never run as submitted (it claims no fair share);
//! - [`nodes`]: per-GPU bookkeeping and gang bin packing;
//! - [`fragmentation`]: packing against fragmentation, for clusters that choose it;
//! - [`check`]: the invariants every plan must hold, for tests and trace replay;
//! - [`what_if`]: a change applied to a snapshot, and how the plan differs;
//! - [`estimate`]: when pending work should start, the scheduler run forward in time.

pub mod check;
pub mod cycle;
pub mod estimate;
pub mod fair_share;
pub mod feasible;
pub mod fragmentation;
pub mod nodes;
pub mod plan;
pub mod snapshot;
pub mod what_if;

pub use cycle::schedule;
pub use plan::Plan;
pub use snapshot::Snapshot;
