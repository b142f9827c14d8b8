//! Berth's scheduler, as pure functions of a snapshot: no IO, no clock, no randomness, so
//! it can be unit- and property-tested, benchmarked alone, and re-run as a what-if.
//!
//! Built so far: hierarchical fair share ([`fair_share`]). Placement, admission, reclaim
//! and the plan follow (issue 4).

pub mod fair_share;
