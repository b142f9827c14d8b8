use berth_core::auth::Role;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{
    Server, TeamBody, WorkloadBody, check_declarative_contract, collect_pages, token, two_teams_on_one_cluster,
};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn team_keeps_the_declarative_contract(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let v1 = TeamBody::new().parent("research").quota("h100", 2, None, 1).json();
    let v2 = TeamBody::new().parent("research").quota("h100", 4, Some(8), 3).json();
    check_declarative_contract(&s, "/api/v1/teams/vision", &v1, &v2, 200).await;
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn team_list_pages_and_filters_by_parent(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    for name in ["t3", "t1", "t2"] {
        s.put_ok(&format!("/api/v1/teams/{name}"), &TeamBody::new().parent("research").json(), 201).await;
    }
    let all = collect_pages(&s, "/api/v1/teams", 2).await;
    assert_eq!(all, ["nlp", "research", "t1", "t2", "t3"]);
    let children = collect_pages(&s, "/api/v1/teams?parent=research", 1).await;
    assert_eq!(children, ["nlp", "t1", "t2", "t3"]);
    assert!(collect_pages(&s, "/api/v1/teams?parent=nlp", 10).await.is_empty());
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn team_rules_are_enforced_naming_the_field(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let before = s.table_counts().await;
    let cases = [
        // A flavor that does not exist.
        (TeamBody::new().quota("tpu", 1, None, 1).json(), "/spec/quotas/0/flavor"),
        // Limit below guaranteed.
        (TeamBody::new().quota("h100", 4, Some(2), 1).json(), "/spec/quotas/0/limit"),
        // Two quotas for one flavor.
        (TeamBody::new().quota("h100", 1, None, 1).quota("h100", 1, None, 1).json(), "/spec/quotas/1/flavor"),
        // research guarantees 16 and nlp already holds 8: 9 more do not fit.
        (TeamBody::new().parent("research").quota("h100", 9, None, 1).json(), "/spec/quotas/0/guaranteed"),
        // A parent that does not exist.
        (TeamBody::new().parent("nobody").json(), "/spec/parent"),
        // The parent has no a100 guarantee at all.
        (TeamBody::new().parent("research").quota("a100", 1, None, 1).json(), "/spec/quotas/0/guaranteed"),
    ];
    for (body, field) in cases {
        s.put("/api/v1/teams/newteam", &body).await.assert_problem(422, Some(field));
    }
    // Its own parent, and a cycle research -> nlp -> research.
    s.put("/api/v1/teams/nlp", &TeamBody::new().parent("nlp").json()).await.assert_problem(422, Some("/spec/parent"));
    let cycle = s.put("/api/v1/teams/research", &TeamBody::new().parent("nlp").quota("h100", 16, None, 1).json()).await;
    cycle.assert_problem(422, Some("/spec/parent"));
    assert!(cycle.body["detail"].as_str().unwrap().contains("cycle"), "{}", cycle.body);
    // A parent cannot shrink its guarantee below what its children hold.
    s.put("/api/v1/teams/research", &TeamBody::new().quota("h100", 7, None, 1).json())
        .await
        .assert_problem(422, Some("/spec/quotas/0/guaranteed"));
    // A min runtime under a top-level team that sets none protects nothing: refused.
    let with_min_runtime = |body: Value, seconds: u32| {
        let mut body = body;
        body["spec"]["preemption"] = json!({"min_runtime_seconds": seconds});
        body
    };
    let child = |seconds| with_min_runtime(TeamBody::new().parent("research").json(), seconds);
    s.put("/api/v1/teams/newteam", &child(600)).await.assert_problem(422, Some("/spec/preemption/min_runtime_seconds"));
    assert_eq!(s.table_counts().await, before, "rejected writes leave the database unchanged");
    // Once research allows an hour, a team below may ask for less, not more.
    let research = with_min_runtime(TeamBody::new().quota("h100", 16, None, 1).json(), 3600);
    assert_eq!(s.put("/api/v1/teams/research", &research).await.status, 200);
    let above = s.put("/api/v1/teams/newteam", &child(7200)).await;
    above.assert_problem(422, Some("/spec/preemption/min_runtime_seconds"));
    assert!(above.body.to_string().contains("at most 3600"), "{}", above.body);
    assert_eq!(s.put("/api/v1/teams/newteam", &child(600)).await.status, 201);
    // Two levels down, the lowest allowance on the way up holds (newteam's, not research's).
    let grandchild = |seconds| with_min_runtime(TeamBody::new().parent("newteam").json(), seconds);
    let deeper = s.put("/api/v1/teams/deeper", &grandchild(1200)).await;
    deeper.assert_problem(422, Some("/spec/preemption/min_runtime_seconds"));
    assert!(
        deeper.body.to_string().contains("at most 600") && deeper.body.to_string().contains("newteam"),
        "{}",
        deeper.body
    );
    assert_eq!(s.put("/api/v1/teams/deeper", &grandchild(300)).await.status, 201);
    // A team admin low in the tree learns what research allows, not its name: it cannot
    // read research.
    assert_eq!(s.put("/api/v1/teams/open", &TeamBody::new().parent("research").json()).await.status, 201);
    let admin = token("ada", &[(Role::TeamAdmin, Some("open"))]);
    let kid = TeamBody::new().parent("open").json();
    assert_eq!(s.send_as(Some(&admin), Method::PUT, "/api/v1/teams/kid", Some(&kid)).await.status, 201);
    let longer = with_min_runtime(kid, 7200);
    for (method, path) in [(Method::PUT, "/api/v1/teams/kid"), (Method::POST, "/api/v1/teams/kid/preview")] {
        let refused = s.send_as(Some(&admin), method, path, Some(&longer)).await;
        refused.assert_problem(422, Some("/spec/preemption/min_runtime_seconds"));
        let said = refused.body.to_string();
        assert!(said.contains("at most 3600") && said.contains("an ancestor team"), "{path}: {said}");
        assert!(!said.contains("research"), "{path} names a team the caller cannot read: {said}");
    }
}

/// A member or viewer, who may manage no team, gets the same answer for a team out of its
/// sight as for a free name, on PUT and on the preview: before, 404 "does not exist" for the
/// one and 403 for the other told it every team's name.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn callers_who_manage_no_team_cannot_probe_team_names(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    s.put_ok("/api/v1/teams/vision", &TeamBody::new().parent("research").json(), 201).await;
    let before = s.table_counts().await;
    let body = TeamBody::new().parent("nlp").json();
    for grant in [(Role::Member, Some("nlp")), (Role::Viewer, Some("nlp"))] {
        let caller = token("probe", &[grant]);
        for path in ["/api/v1/teams/vision", "/api/v1/teams/free-name"] {
            for (method, path) in [(Method::PUT, path.to_owned()), (Method::POST, format!("{path}/preview"))] {
                let answer = s.send_as(Some(&caller), method, &path, Some(&body)).await;
                assert_eq!(answer.status, 403, "{grant:?} {path}: {}", answer.body);
            }
        }
    }
    assert_eq!(s.table_counts().await, before);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_team_with_children_or_live_workloads_cannot_be_deleted(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let refused = s.delete("/api/v1/teams/research").await;
    refused.assert_problem(409, None);
    assert!(refused.body["detail"].as_str().unwrap().contains("nlp"));

    s.put_ok("/api/v1/teams/nlp/workloads/train", &WorkloadBody::new().json(), 201).await;
    let refused = s.delete("/api/v1/teams/nlp").await;
    refused.assert_problem(409, None);
    assert!(refused.body["detail"].as_str().unwrap().contains("train"));

    assert_eq!(s.delete("/api/v1/teams/nlp/workloads/train").await.status, 202);
    assert_eq!(s.delete("/api/v1/teams/nlp").await.status, 200);
    assert_eq!(s.delete("/api/v1/teams/research").await.status, 200);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_quota_preview_tells_what_the_scheduler_would_do_and_saves_nothing(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let ctx = two_teams_on_one_cluster(&s, 0).await;
    // b borrows the whole cluster (16 GPUs); a, guaranteed nothing, waits for 8.
    for name in ["b1", "b2"] {
        let mut body = WorkloadBody::new().gpus(8.0).json();
        body["spec"]["preemptible"] = json!(true);
        s.put_ok(&format!("/api/v1/teams/b/workloads/{name}"), &body, 201).await;
    }
    let cycle = berth_controllers::scheduler::reconcile(&ctx).await.expect("cycle");
    assert_eq!(cycle.admitted, 2);
    s.put_ok("/api/v1/teams/a/workloads/a1", &WorkloadBody::new().gpus(8.0).json(), 201).await;
    let team_before = s.get("/api/v1/teams/a").await;

    // What if a were guaranteed 8? It would reclaim them from one of b's workloads.
    let raise = TeamBody::new().quota("h100", 8, None, 1).json();
    let preview = s.send(Method::POST, "/api/v1/teams/a/preview", Some(&raise), &[]).await;
    assert_eq!(preview.status, 200, "{}", preview.body);
    let p = &preview.body;
    let preempted = p["preempted"].as_array().expect("preempted");
    assert_eq!(preempted.len(), 1, "{p}");
    assert_eq!(preempted[0]["team"], "b");
    assert!(["b1", "b2"].contains(&preempted[0]["name"].as_str().unwrap()), "{p}");
    assert_eq!(preempted[0]["gpus"], 8.0);
    let summary: Vec<&str> = p["summary"].as_array().unwrap().iter().map(|l| l.as_str().unwrap()).collect();
    assert!(summary.contains(&"1 workload would be preempted (8 GPUs: b)"), "{summary:?}");
    // a's and b's fair shares stay 8 each (equal weights, both want more): none listed.
    assert_eq!(p["fair_shares"], json!([]), "{p}");

    // The same quota again: nothing would change.
    let same = TeamBody::new().quota("h100", 0, None, 1).json();
    let nothing = s.send(Method::POST, "/api/v1/teams/a/preview", Some(&same), &[]).await;
    assert_eq!(nothing.status, 200);
    assert_eq!(nothing.body["summary"], json!([]), "{}", nothing.body);
    assert_eq!(nothing.body["over_limit"], json!([]), "{}", nothing.body);

    // A limit below what b runs preempts nothing, and the preview says so: b keeps 16.
    let lower = TeamBody::new().quota("h100", 0, Some(8), 1).json();
    let p = s.send(Method::POST, "/api/v1/teams/b/preview", Some(&lower), &[]).await.body;
    assert_eq!(p["preempted"], json!([]), "{p}");
    assert_eq!(p["over_limit"], json!([{"team": "b", "flavor": "h100", "holds": 16.0, "limit": 8}]), "{p}");
    let said = p["summary"].to_string();
    assert!(said.contains("b would run 16 GPUs of h100, above its limit of 8: nothing is preempted"), "{said}");
    // So does a move under a department whose limit b's work would exceed.
    s.put_ok("/api/v1/teams/dept", &TeamBody::new().quota("h100", 0, Some(12), 1).json(), 201).await;
    let moved = TeamBody::new().parent("dept").quota("h100", 0, None, 1).json();
    let p = s.send(Method::POST, "/api/v1/teams/b/preview", Some(&moved), &[]).await.body;
    assert_eq!(p["over_limit"], json!([{"team": "dept", "flavor": "h100", "holds": 16.0, "limit": 12}]), "{p}");
    let before = s.table_counts().await;

    // The PUT's rules and permissions: a bad body names the field; a viewer may not.
    let bad = TeamBody::new().quota("h100", 8, Some(4), 1).json();
    s.send(Method::POST, "/api/v1/teams/a/preview", Some(&bad), &[])
        .await
        .assert_problem(422, Some("/spec/quotas/0/limit"));
    s.send(Method::POST, "/api/v1/teams/ghost/preview", Some(&raise), &[]).await.assert_problem(404, None);
    let viewer = token("v", &[(Role::Viewer, None)]);
    let refused = s.send_as(Some(&viewer), Method::POST, "/api/v1/teams/a/preview", Some(&raise)).await;
    assert_eq!(refused.status, 403, "{}", refused.body);

    assert_eq!(s.table_counts().await, before, "a preview writes nothing");
    assert_eq!(s.get("/api/v1/teams/a").await.body, team_before.body);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn usage_history_follows_the_schedulers_allocations(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let ctx = two_teams_on_one_cluster(&s, 4).await;
    s.put_ok("/api/v1/teams/b/workloads/b1", &WorkloadBody::new().gpus(6.0).json(), 201).await;
    let started = chrono::Utc::now();
    assert_eq!(berth_controllers::scheduler::reconcile(&ctx).await.expect("cycle").admitted, 1);
    // A cycle that changes nothing records nothing.
    berth_controllers::scheduler::reconcile(&ctx).await.expect("cycle");
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM usage_history").fetch_one(&s.db).await.unwrap();
    assert_eq!(rows, 1);

    let history = s.get("/api/v1/usage/history").await;
    assert_eq!(history.status, 200, "{}", history.body);
    let series = history.body["series"].as_array().unwrap();
    assert_eq!(series.len(), 1, "only b ever held GPUs: {}", history.body);
    assert_eq!((series[0]["team"].as_str(), series[0]["flavor"].as_str()), (Some("b"), Some("h100")));
    let point = &series[0]["points"][0];
    assert_eq!((point["allocated"].as_f64(), point["borrowed"].as_f64()), (Some(6.0), Some(2.0)));
    let at: chrono::DateTime<chrono::Utc> = serde_json::from_value(point["at"].clone()).unwrap();
    assert!(at >= started - chrono::TimeDelta::seconds(1), "{at} {started}");

    // Asked from just after that point, b's value then opens the series.
    let later = (at + chrono::TimeDelta::microseconds(1)).to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let from_later = s.get(&format!("/api/v1/usage/history?since={later}&flavor=h100")).await;
    assert_eq!(from_later.body["series"][0]["points"][0]["allocated"], 6.0, "{}", from_later.body);
    assert_eq!(from_later.body["series"][0]["points"].as_array().unwrap().len(), 1);
    assert_eq!(s.get("/api/v1/usage/history?flavor=a100").await.body["series"], json!([]));

    // A member of a sees only a's history (none).
    let member = token("m", &[(Role::Member, Some("a"))]);
    let as_member = s.send_as(Some(&member), Method::GET, "/api/v1/usage/history", None).await;
    assert_eq!(as_member.body["series"], json!([]), "{}", as_member.body);
    // Bad input names the field.
    // A start before the retention window reads from its beginning.
    let old = s.get("/api/v1/usage/history?since=2000-01-01T00:00:00Z").await;
    assert_eq!(old.status, 200, "{}", old.body);
    let since: chrono::DateTime<chrono::Utc> = serde_json::from_value(old.body["since"].clone()).unwrap();
    assert!(since > chrono::Utc::now() - chrono::TimeDelta::days(31), "clamped: {since}");
    assert_eq!(old.body["series"][0]["team"], "b");
    s.get("/api/v1/usage/history?since=yesterday").await.assert_problem(400, Some("since"));

    // Pruning keeps each series' value at the cut-off.
    sqlx::query("INSERT INTO usage_history (team_uid, flavor, at, allocated, borrowed) SELECT team_uid, flavor, now() - make_interval(days => d), d, 0 FROM usage_history, generate_series(40, 45) d")
        .execute(&s.db)
        .await
        .unwrap();
    let pruned =
        berth_store::usage::usage_prune(&s.db, chrono::Utc::now() - chrono::TimeDelta::days(30)).await.unwrap();
    assert_eq!(pruned, 5, "the rows 41–45 days old go; 40 days old is the value at the cut-off");
    let kept: Vec<f64> =
        sqlx::query_scalar("SELECT allocated FROM usage_history ORDER BY at").fetch_all(&s.db).await.unwrap();
    assert_eq!(kept, [40.0, 6.0]);
}

/// `spec.fair_sharing` belongs to a top-level team, with a half-life of an hour to 90
/// days; only a platform admin sets it (a top-level team's admin may not change its own).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn fair_sharing_over_time_is_set_on_a_top_level_team_by_a_platform_admin(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let with = |parent: Option<&str>, seconds: u32| {
        let mut body = TeamBody::new().quota("h100", if parent.is_some() { 8 } else { 16 }, None, 1).json();
        if let Some(p) = parent {
            body["spec"]["parent"] = json!(p);
        }
        body["spec"]["fair_sharing"] = json!({"usage_half_life_seconds": seconds});
        body
    };
    s.put_ok("/api/v1/teams/research", &with(None, 604_800), 200).await;
    let research = s.get("/api/v1/teams/research").await;
    assert_eq!(research.body["spec"]["fair_sharing"], json!({"usage_half_life_seconds": 604_800}));

    s.put("/api/v1/teams/nlp", &with(Some("research"), 604_800)).await.assert_problem(422, Some("/spec/fair_sharing"));
    s.put("/api/v1/teams/research", &with(None, 60))
        .await
        .assert_problem(422, Some("/spec/fair_sharing/usage_half_life_seconds"));
    let admin = token("carol", &[(Role::TeamAdmin, Some("research"))]);
    let plain = TeamBody::new().quota("h100", 16, None, 1).json();
    let refused = s.send_as(Some(&admin), Method::PUT, "/api/v1/teams/research", Some(&plain)).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert_eq!(s.get("/api/v1/teams/research").await.body["spec"], research.body["spec"]);
}
