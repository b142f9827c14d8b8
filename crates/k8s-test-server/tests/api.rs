//! The REST surface through a real kube client: discovery, CRUD, Status errors, server-side
//! apply, auth and the raw watch protocol.

mod common;

use std::time::Duration;

use berth_k8s_test_server::{Config, TestApiServer};
use common::{indexed_job, pod, start};
use futures_util::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
    WatchEvent, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Discovery, ResourceExt};
use serde_json::json;

/// The Status carried by an API error.
fn status(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(status) => status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn discovery_describes_the_served_resources() {
    let (_server, client) = start(Config { serve_jobsets: true, ..Config::default() }).await;
    let version = client.apiserver_version().await.unwrap();
    assert_eq!((version.major.as_str(), version.minor.as_str()), ("1", "34"));
    assert_eq!(version.git_version, "v1.34.0-berth-test");
    assert_eq!(client.list_core_api_versions().await.unwrap().versions, vec!["v1"]);
    let groups: Vec<String> = client.list_api_groups().await.unwrap().groups.into_iter().map(|g| g.name).collect();
    assert_eq!(groups, vec!["batch", "apps", "rbac.authorization.k8s.io", "policy", "jobset.x-k8s.io"]);
    let batch = client.list_api_group_resources("batch/v1").await.unwrap();
    let jobs = batch.resources.iter().find(|r| r.name == "jobs").unwrap();
    assert!(jobs.namespaced && jobs.kind == "Job" && jobs.verbs.contains(&"watch".to_string()));
    let core = client.list_core_api_resources("v1").await.unwrap();
    let nodes = core.resources.iter().find(|r| r.name == "nodes").unwrap();
    assert!(!nodes.namespaced);

    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    assert!(discovery.has_group("jobset.x-k8s.io"));
    let (ar, _) = discovery.resolve_gvk(&GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet")).unwrap();
    assert_eq!(ar.plural, "jobsets");

    let err = client.list_api_group_resources("jobset.x-k8s.io/v1beta1").await.unwrap_err();
    let st = status(err);
    assert_eq!((st.code, st.reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn jobsets_are_absent_unless_enabled() {
    let (_server, client) = start(Config::default()).await;
    let groups = client.list_api_groups().await.unwrap().groups;
    assert!(groups.iter().all(|g| g.name != "jobset.x-k8s.io"));
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"), "jobsets");
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &ar);
    let st = status(api.list(&ListParams::default()).await.unwrap_err());
    assert_eq!(st.code, 404);
}

#[tokio::test]
async fn crud_and_status_errors_match_the_real_server() {
    let (server, client) = start(common::gpu_cluster()).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let created =
        pods.create(&PostParams::default(), &pod("p1", "busybox", &[("FAKE_RUN_SECONDS", "60")], 0)).await.unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.is_some() && meta.creation_timestamp.is_some());
    assert_eq!(meta.generation, Some(1));
    let rv: u64 = meta.resource_version.as_deref().unwrap().parse().unwrap();
    assert!(rv > 0);
    assert_eq!(pods.get("p1").await.unwrap().uid(), created.uid());

    let list = pods.list(&ListParams::default().labels("app=test")).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let list_rv: u64 = list.metadata.resource_version.unwrap().parse().unwrap();
    assert!(list_rv >= rv);
    assert!(pods.list(&ListParams::default().labels("app notin (test)")).await.unwrap().items.is_empty());
    assert!(pods.list(&ListParams::default().fields("metadata.name=p2")).await.unwrap().items.is_empty());

    let st = status(pods.create(&PostParams::default(), &pod("p1", "busybox", &[], 0)).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (409, "AlreadyExists"));
    let st = status(pods.get("nope").await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (404, "NotFound"));
    assert_eq!(st.message, "pods \"nope\" not found");

    let st = status(pods.create(&PostParams::default(), &pod("Bad_Name", "busybox", &[], 0)).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    let causes = st.details.unwrap().causes;
    assert_eq!(causes[0].field, "metadata.name");

    let mut no_containers = pod("p3", "busybox", &[], 0);
    no_containers.spec.as_mut().unwrap().containers.clear();
    let st = status(pods.create(&PostParams::default(), &no_containers).await.unwrap_err());
    assert_eq!(st.code, 422);
    assert_eq!(st.details.unwrap().causes[0].field, "spec.containers");

    let elsewhere: Api<Pod> = Api::namespaced(client.clone(), "missing");
    let st = status(elsewhere.create(&PostParams::default(), &pod("p1", "busybox", &[], 0)).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (404, "NotFound"));

    // A job with restartPolicy Always is invalid, as on the real server.
    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let mut job = indexed_job("j1", 1, 0, &[], json!({}));
    job.spec.as_mut().unwrap().template.spec.as_mut().unwrap().restart_policy = Some("Always".into());
    let st = status(jobs.create(&PostParams::default(), &job).await.unwrap_err());
    assert_eq!(st.code, 422);
    assert_eq!(st.details.unwrap().causes[0].field, "spec.template.spec.restartPolicy");

    // Replace with a stale resourceVersion conflicts.
    let mut stale = created.clone();
    pods.patch("p1", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})))
        .await
        .unwrap();
    stale.labels_mut().insert("y".into(), "2".into());
    let st = status(pods.replace("p1", &PostParams::default(), &stale).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (409, "Conflict"));
    let mut fresh = pods.get("p1").await.unwrap();
    fresh.labels_mut().insert("y".into(), "2".into());
    let replaced = pods.replace("p1", &PostParams::default(), &fresh).await.unwrap();
    assert_eq!(replaced.labels()["y"], "2");
    assert_eq!(replaced.labels()["x"], "1");

    // Merge patch of a missing object is 404; delete of a missing object is 404.
    let st = status(pods.patch("nope", &PatchParams::default(), &Patch::Merge(json!({}))).await.unwrap_err());
    assert_eq!(st.code, 404);
    let st = status(pods.delete("nope", &DeleteParams::default()).await.unwrap_err());
    assert_eq!(st.code, 404);

    // generateName.
    let mut generated = pod("", "busybox", &[], 0);
    generated.metadata.name = None;
    generated.metadata.generate_name = Some("gen-".into());
    let generated = pods.create(&PostParams::default(), &generated).await.unwrap();
    let name = generated.name_any();
    assert!(name.starts_with("gen-") && name.len() == 9, "{name}");

    // Services get a cluster IP; everything shows up in objects().
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
        "spec": {"selector": {"app": "test"}, "ports": [{"port": 80}]}
    }))
    .unwrap();
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    assert!(svc.spec.unwrap().cluster_ip.is_some());
    assert_eq!(server.objects("services").len(), 1);
    assert_eq!(server.objects("nodes").len(), 2);
    assert!(server.requests("POST", "pods", false) >= 5);
    assert!(server.requests("GET", "pods", false) >= 4);
}

#[tokio::test]
async fn raw_requests_get_bad_request_and_apply_needs_a_field_manager() {
    let (_server, client) = start(Config::default()).await;
    let body =
        serde_json::to_vec(&json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "x"}})).unwrap();
    let request = axum::http::Request::post("/api/v1/namespaces/default/pods")
        .header("content-type", "application/json")
        .body(body)
        .unwrap();
    let st = status(client.request_text(request).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (400, "BadRequest"));

    let body =
        serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})).unwrap();
    let request = axum::http::Request::patch("/api/v1/namespaces/x")
        .header("content-type", "application/apply-patch+yaml")
        .body(body)
        .unwrap();
    let st = status(client.request_text(request).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));

    let request = axum::http::Request::get("/apis/extensions/v1beta1/ingresses").body(vec![]).unwrap();
    let st = status(client.request_text(request).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (404, "NotFound"));
}

#[tokio::test]
async fn server_side_apply_creates_merges_and_guards_immutable_fields() {
    let (_server, client) = start(Config::default()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ssa = PatchParams::apply("berth-test").force();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"a": "1"}}});
    let created = namespaces.patch("team-a", &ssa, &Patch::Apply(&ns)).await.unwrap();
    let again = namespaces.patch("team-a", &ssa, &Patch::Apply(&ns)).await.unwrap();
    assert_eq!(created.resource_version(), again.resource_version());
    assert_eq!(again.labels()["kubernetes.io/metadata.name"], "team-a");

    let changed =
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a", "labels": {"b": "2"}}});
    let merged = namespaces.patch("team-a", &ssa, &Patch::Apply(&changed)).await.unwrap();
    assert_ne!(merged.resource_version(), again.resource_version());
    assert_eq!((merged.labels()["a"].as_str(), merged.labels()["b"].as_str()), ("1", "2"));

    let jobs: Api<Job> = Api::namespaced(client.clone(), "team-a");
    // Suspended, so that the job controller does not touch its status between the applies.
    let job = indexed_job("train", 1, 0, &[("FAKE_RUN_SECONDS", "60")], json!({"suspend": true}));
    let applied = jobs.patch("train", &ssa, &Patch::Apply(&job)).await.unwrap();
    assert_eq!(applied.metadata.generation, Some(1));
    let reapplied = jobs.patch("train", &ssa, &Patch::Apply(&job)).await.unwrap();
    assert_eq!(applied.resource_version(), reapplied.resource_version());

    let mut other = job.clone();
    other.spec.as_mut().unwrap().template.spec.as_mut().unwrap().containers[0].image = Some("other".into());
    let st = status(jobs.patch("train", &ssa, &Patch::Apply(&other)).await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (422, "Invalid"));
    assert_eq!(st.details.unwrap().causes[0].field, "spec.template");

    let mut more = job.clone();
    more.spec.as_mut().unwrap().completions = Some(2);
    more.spec.as_mut().unwrap().parallelism = Some(2);
    let st = status(jobs.patch("train", &ssa, &Patch::Apply(&more)).await.unwrap_err());
    assert_eq!(st.details.unwrap().causes[0].field, "spec.completions");
}

#[tokio::test]
async fn bearer_token_is_required_and_the_kubeconfig_carries_it() {
    let (server, anonymous) = start(Config { token: Some("s3cret".into()), ..Config::default() }).await;
    let st = status(anonymous.apiserver_version().await.unwrap_err());
    assert_eq!((st.code, st.reason.as_str()), (401, "Unauthorized"));

    let kubeconfig = Kubeconfig::from_yaml(&server.kubeconfig()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.unwrap();
    assert_eq!(config.cluster_url.to_string(), format!("{}/", server.url()));
    let client = Client::try_from(config).unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    let names: Vec<String> =
        namespaces.list(&ListParams::default()).await.unwrap().iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, vec!["default"]);

    let open = TestApiServer::start(Config::default()).await.unwrap();
    assert!(Kubeconfig::from_yaml(&open.kubeconfig()).is_ok());
}

/// A pod's in-cluster identity: a TokenRequest for a service account yields a token the
/// server accepts while the account exists; an unknown token, or one of a deleted account,
/// is refused; no token is issued for an account that does not exist.
#[tokio::test]
async fn a_service_account_token_is_accepted_while_its_account_exists() {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let (server, _) = start(Config { token: Some("admin".into()), ..Config::default() }).await;
    let as_token = |token: &str| {
        let mut config = kube::Config::new(server.url().parse().unwrap());
        config.auth_info.token = Some(token.to_owned().into());
        Client::try_from(config).unwrap()
    };
    let admin = as_token("admin");
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let account = serde_json::from_value(json!({"metadata": {"name": "berthd"}})).unwrap();
    accounts.create(&PostParams::default(), &account).await.unwrap();
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let issued = accounts.create_token_request("berthd", &PostParams::default(), &request).await.unwrap();
    let token = issued.status.expect("a status").token;
    let nodes = |client: Client| async move {
        Api::<k8s_openapi::api::core::v1::Node>::all(client).list(&ListParams::default()).await
    };
    assert!(nodes(as_token(&token)).await.is_ok(), "the issued token is accepted");
    let refused = status(nodes(as_token("sa.default.berthd.forged")).await.unwrap_err());
    assert_eq!(refused.code, 401);
    let missing = status(accounts.create_token_request("nobody", &PostParams::default(), &request).await.unwrap_err());
    assert_eq!(missing.code, 404);
    accounts.delete("berthd", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(nodes(as_token(&token)).await.unwrap_err()).code, 401, "the account is gone");
}

#[tokio::test]
async fn namespaces_are_deleted_with_their_contents() {
    let (server, client) = start(Config::default()).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "scratch"}})).unwrap();
    let ns = namespaces.create(&PostParams::default(), &ns).await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), "scratch");
    pods.create(&PostParams::default(), &pod("p", "busybox", &[], 0)).await.unwrap();
    namespaces.delete("scratch", &DeleteParams::default()).await.unwrap();
    assert!(server.objects("pods").is_empty());
    let st = status(namespaces.get("scratch").await.unwrap_err());
    assert_eq!(st.code, 404);
}

#[tokio::test]
async fn jobsets_are_stored_as_json_with_a_required_spec() {
    let (server, client) = start(Config { serve_jobsets: true, ..Config::default() }).await;
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("jobset.x-k8s.io", "v1alpha2", "JobSet"), "jobsets");
    let api: Api<DynamicObject> = Api::namespaced_with(client, "default", &ar);
    let js: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "js"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2}]}
    }))
    .unwrap();
    let created = api.create(&PostParams::default(), &js).await.unwrap();
    assert_eq!(created.data["spec"]["replicatedJobs"][0]["replicas"], 2);
    assert_eq!(api.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let no_spec: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "bad"}
    }))
    .unwrap();
    let st = status(api.create(&PostParams::default(), &no_spec).await.unwrap_err());
    assert_eq!(st.code, 422);
    assert_eq!(server.objects("jobsets").len(), 1);
}

#[tokio::test]
async fn watch_replays_history_sends_bookmarks_and_expires_after_compaction() {
    let (server, client) = start(Config { bookmark_interval: Duration::from_millis(100), ..Config::default() }).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let before = pods.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    pods.create(&PostParams::default(), &pod("w1", "missing.invalid/x", &[], 0)).await.unwrap();

    // Resuming from `before` replays the creation, then bookmarks arrive.
    let mut stream = pods.watch(&WatchParams::default().timeout(10), &before).await.unwrap().boxed();
    let mut added = false;
    let mut bookmark = false;
    while !(added && bookmark) {
        match tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap() {
            Some(Ok(WatchEvent::Added(p))) if p.name_any() == "w1" => added = true,
            Some(Ok(WatchEvent::Bookmark(b))) => {
                assert!(added, "history comes before bookmarks");
                assert!(b.metadata.resource_version.parse::<u64>().unwrap() > before.parse().unwrap());
                bookmark = true;
            }
            Some(Ok(_)) => {}
            other => panic!("unexpected watch item {other:?}"),
        }
    }

    // A label-filtered watch from "0" starts with synthetic ADDED events.
    let mut filtered = pods.watch(&WatchParams::default().labels("app=test").timeout(10), "0").await.unwrap().boxed();
    match filtered.next().await {
        Some(Ok(WatchEvent::Added(p))) => assert_eq!(p.name_any(), "w1"),
        other => panic!("expected ADDED, got {other:?}"),
    }

    // drop_watches ends open streams.
    server.drop_watches();
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(item) = stream.next().await {
            item.unwrap();
        }
    })
    .await;
    assert!(end.is_ok(), "stream ended after drop_watches");

    // After compaction an old resourceVersion is gone.
    server.compact();
    let mut expired = pods.watch(&WatchParams::default(), &before).await.unwrap().boxed();
    match expired.next().await {
        Some(Ok(WatchEvent::Error(status))) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
            assert!(status.message.starts_with(&format!("too old resource version: {before}")));
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    assert!(expired.next().await.is_none());

    // Timeouts end the stream.
    let current = pods.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut short = pods.watch(&WatchParams::default().timeout(1), &current).await.unwrap().boxed();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(item) = short.next().await {
            assert!(matches!(item, Ok(WatchEvent::Bookmark(_))), "only bookmarks happen");
        }
    })
    .await;
    assert!(ended.is_ok(), "stream ended after timeoutSeconds");

    // DELETED carries the last state.
    let mut live = pods.watch(&WatchParams::default().timeout(10), &current).await.unwrap().boxed();
    pods.delete("w1", &DeleteParams::default()).await.unwrap();
    let deleted = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match live.next().await {
                Some(Ok(WatchEvent::Deleted(p))) => break p,
                Some(Ok(_)) => {}
                other => panic!("unexpected watch item {other:?}"),
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(deleted.name_any(), "w1");
    assert!(server.requests("GET", "pods", true) >= 5);
}

#[tokio::test]
async fn dropping_the_server_stops_it() {
    let (server, client) = start(Config::default()).await;
    let pods: Api<Pod> = Api::namespaced(client, "default");
    let mut open_watch = pods.watch(&WatchParams::default(), "0").await.unwrap().boxed();
    let url = server.url();
    drop(server);
    let ended =
        tokio::time::timeout(Duration::from_secs(5), async { while open_watch.next().await.is_some() {} }).await;
    assert!(ended.is_ok(), "open watches end when the server is dropped");
    common::eventually("the port to close", || {
        let url = url.clone();
        async move {
            let client = Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
            client.apiserver_version().await.is_err().then_some(())
        }
    })
    .await;
}
