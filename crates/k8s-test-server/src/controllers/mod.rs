//! The built-in controllers, run together in one background task: scheduler, fake kubelet, Job
//! and Deployment controllers and the garbage collector.

pub(crate) mod deployments;
pub(crate) mod garbage;
pub(crate) mod jobs;
pub(crate) mod kubelet;
pub(crate) mod scheduler;

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::shared::Shared;

/// Longest wait between passes (time-based transitions are checked this often).
const TICK: Duration = Duration::from_millis(50);
/// Pause after a wake-up, so that a burst of API writes is handled in one pass.
const DEBOUNCE: Duration = Duration::from_millis(2);

/// One pass of every controller, in an order that lets each see the previous ones' work.
fn pass(cluster: &mut Cluster) {
    scheduler::reconcile(cluster);
    kubelet::reconcile(cluster);
    jobs::reconcile(cluster);
    deployments::reconcile(cluster);
    garbage::reconcile(cluster);
}

/// Runs the controllers until the task is aborted: a pass per change (debounced) or per tick.
pub(crate) async fn run(shared: Arc<Shared>) {
    loop {
        pass(&mut shared.lock());
        tokio::select! {
            () = shared.wake.notified() => tokio::time::sleep(DEBOUNCE).await,
            () = tokio::time::sleep(TICK) => {}
        }
    }
}
