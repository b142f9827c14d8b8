//! The built-in controllers, run together in one background task: scheduler, fake kubelet, Job
//! and Deployment controllers and the garbage collector.

pub(crate) mod deployments;
pub(crate) mod garbage;
pub(crate) mod jobs;
pub(crate) mod kubelet;
pub(crate) mod scheduler;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cluster::Cluster;
use crate::shared::Shared;

/// Pause after a wake-up, so that a burst of API writes is handled in one pass.
const DEBOUNCE: Duration = Duration::from_millis(2);

/// One pass of every controller, in an order that lets each see the previous ones' work.
/// Returns when the next change that time alone brings is due.
fn pass(cluster: &mut Cluster) -> Option<Instant> {
    scheduler::reconcile(cluster);
    let pods = kubelet::reconcile(cluster);
    let jobs = jobs::reconcile(cluster);
    deployments::reconcile(cluster);
    garbage::reconcile(cluster);
    sooner(pods, jobs)
}

/// The earlier of two due times, either of which may be none.
pub(crate) fn sooner(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    a.into_iter().chain(b).min()
}

/// Runs the controllers until the task is aborted: a pass per change (debounced), and one
/// when a time-based change is due; none while nothing changes.
pub(crate) async fn run(shared: Arc<Shared>) {
    loop {
        let due = pass(&mut shared.lock());
        let timer = async {
            match due {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shared.wake.notified() => tokio::time::sleep(DEBOUNCE).await,
            () = timer => {}
        }
    }
}
