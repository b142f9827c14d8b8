//! kube-runtime's watcher and reflector against the server: resuming after dropped
//! connections without relisting, and relisting after 410 Gone.

mod common;

use std::time::Duration;

use berth_k8s_test_server::Config;
use common::{eventually, pod, start};
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::json;

#[tokio::test]
async fn reflector_resumes_after_dropped_watches_and_relists_after_compaction() {
    let (server, client) = start(Config {
        // No bookmarks during the test: the watcher's resourceVersion is its last pod event.
        bookmark_interval: Duration::from_secs(3600),
        ..common::gpu_cluster()
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("before", "busybox", &[("FAKE_RUN_SECONDS", "60")], 0)).await.unwrap();

    let (reader, writer) = reflector::store::<Pod>();
    let stream = reflector(writer, watcher(pods.clone(), watcher::Config::default())).applied_objects();
    let driver = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        // Errors (the 410 below) are retried by the watcher itself.
        while stream.next().await.is_some() {}
    });
    let has = |names: &'static [&'static str]| {
        let reader = reader.clone();
        move || {
            let reader = reader.clone();
            async move {
                let present: Vec<String> = reader.state().iter().map(|p| p.metadata.name.clone().unwrap()).collect();
                names.iter().all(|n| present.iter().any(|p| p == n)).then_some(())
            }
        }
    };
    eventually("the initial list", has(&["before"])).await;
    // Running status arrives through the watch.
    eventually("the running state", || {
        let reader = reader.clone();
        async move {
            reader
                .state()
                .iter()
                .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .then_some(())
        }
    })
    .await;
    let lists = server.requests("GET", "pods", false);
    let watches = server.requests("GET", "pods", true);
    assert_eq!(lists, 1);
    assert!(watches >= 1);

    // A dropped connection: the watcher re-watches from its resourceVersion, no relist.
    server.drop_watches();
    pods.create(&PostParams::default(), &pod("after-drop", "busybox", &[("FAKE_RUN_SECONDS", "60")], 0)).await.unwrap();
    eventually("the pod created after the drop", has(&["before", "after-drop"])).await;
    assert_eq!(server.requests("GET", "pods", false), lists, "no relist after a dropped watch");
    assert!(server.requests("GET", "pods", true) > watches, "the watch was reopened");

    // Move the resourceVersion past the watcher's (a change it does not watch), then compact
    // and drop: resuming gets 410 Gone, and the watcher relists.
    eventually("both pods running", || {
        let reader = reader.clone();
        async move {
            let state = reader.state();
            (state.len() == 2
                && state.iter().all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")))
            .then_some(())
        }
    })
    .await;
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service =
        serde_json::from_value(json!({"metadata": {"name": "bump"}, "spec": {"ports": [{"port": 80}]}})).unwrap();
    services.create(&PostParams::default(), &svc).await.unwrap();
    server.compact();
    server.drop_watches();
    eventually("a relist", || async { (server.requests("GET", "pods", false) > lists).then_some(()) }).await;

    // The reflector still converges: deletions and creations after the relist arrive.
    pods.delete("before", &DeleteParams::default().grace_period(0)).await.unwrap();
    pods.create(&PostParams::default(), &pod("after-relist", "busybox", &[("FAKE_RUN_SECONDS", "60")], 0))
        .await
        .unwrap();
    eventually("the reflector to converge", || {
        let reader = reader.clone();
        async move {
            let mut names: Vec<String> = reader.state().iter().map(|p| p.metadata.name.clone().unwrap()).collect();
            names.sort();
            (names == ["after-drop", "after-relist"]).then_some(())
        }
    })
    .await;
    driver.abort();
}

#[tokio::test]
async fn streaming_list_watcher_gets_initial_events_and_live_changes() {
    let (server, client) = start(common::gpu_cluster()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &pod("first", "busybox", &[("FAKE_RUN_SECONDS", "60")], 0)).await.unwrap();
    let (reader, writer) = reflector::store::<Pod>();
    let config = watcher::Config::default().streaming_lists().labels("app=test");
    let stream = reflector(writer, watcher(pods.clone(), config)).applied_objects();
    let driver = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while stream.next().await.is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.state().len(), 1);
    pods.create(&PostParams::default(), &pod("second", "busybox", &[("FAKE_RUN_SECONDS", "60")], 0)).await.unwrap();
    eventually("the live creation", || {
        let reader = reader.clone();
        async move { (reader.state().len() == 2).then_some(()) }
    })
    .await;
    assert_eq!(server.requests("GET", "pods", false), 0, "streaming lists never list");
    driver.abort();
}
