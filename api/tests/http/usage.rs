//! The usage report: sums against hand-computed values (buckets, a run crossing a day
//! boundary, one starting before the period, one still running), cost from prices, CSV,
//! and what each caller may see.

use berth_core::auth::Role;
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{Server, TeamBody, token};

/// A ledger record: (team and ancestors, owner, GPUs, start, end, borrowed, cluster,
/// backend, price).
type Record<'a> = (&'a [&'a str], &'a str, f64, &'a str, &'a str, bool, &'a str, &'a str, Option<f64>);

async fn record(s: &Server, (teams, owner, gpus, start, end, borrowed, cluster, backend, price): Record<'_>) {
    sqlx::query(
        "INSERT INTO usage_ledger (workload_uid, attempt, team, teams, team_uids, workload, owner, flavor, cluster,
                                   backend, kind, gpus, borrowed, started_at, ended_at, outcome, price)
         VALUES (gen_random_uuid(), 0, $1[1], $1,
                 ARRAY(SELECT t.uid FROM unnest($1::text[]) WITH ORDINALITY AS n (name, i)
                       JOIN teams t ON t.name = n.name ORDER BY n.i),
                 'w', $2, 'h100', $3, $4, 'training', $5, $6, $7::timestamptz, $8::timestamptz, 'succeeded', $9)",
    )
    .bind(teams.iter().map(|t| (*t).to_owned()).collect::<Vec<_>>())
    .bind(owner)
    .bind(cluster)
    .bind(backend)
    .bind(gpus)
    .bind(borrowed)
    .bind(start)
    .bind(end)
    .bind(price)
    .execute(&s.db)
    .await
    .unwrap();
}

/// research (16 h100) → nlp (8), vision (0); other (top level); a week of records.
async fn fixture(s: &Server) {
    s.seed().await;
    s.put_ok("/api/v1/teams/vision", &TeamBody::new().parent("research").json(), 201).await;
    s.put_ok("/api/v1/teams/other", &TeamBody::new().json(), 201).await;
    let records: [Record; 5] = [
        // 4 GPUs 22:00–02:00 across midnight: 8 GPU-hours each day, at 2.
        (
            &["nlp", "research"],
            "alice",
            4.0,
            "2026-11-02T22:00:00Z",
            "2026-11-03T02:00:00Z",
            false,
            "alpha",
            "slurm",
            Some(2.0),
        ),
        // 2 GPUs for 3 hours, admitted as borrowed, at 0.5 on spot: 6 GPU-hours, cost 3;
        // nlp (guaranteed 8) held nothing else meanwhile, so they count in quota.
        (
            &["nlp", "research"],
            "bob",
            2.0,
            "2026-11-03T10:00:00Z",
            "2026-11-03T13:00:00Z",
            true,
            "spot",
            "kubernetes",
            Some(0.5),
        ),
        // 8 GPUs from an hour before the period: 1 hour counts, unpriced.
        (
            &["vision", "research"],
            "carol",
            8.0,
            "2026-11-01T23:00:00Z",
            "2026-11-02T01:00:00Z",
            false,
            "alpha",
            "slurm",
            None,
        ),
        (&["other"], "dave", 1.0, "2026-11-02T05:00:00Z", "2026-11-02T06:00:00Z", false, "alpha", "slurm", Some(1.0)),
        // Ended before the period.
        (
            &["nlp", "research"],
            "alice",
            4.0,
            "2026-11-01T00:00:00Z",
            "2026-11-01T05:00:00Z",
            false,
            "alpha",
            "slurm",
            Some(2.0),
        ),
    ];
    for r in records {
        record(s, r).await;
    }
    // The teams have existed since October: their guarantees count over the whole period.
    sqlx::query("UPDATE teams SET created_at = '2026-10-01T00:00:00Z'").execute(&s.db).await.unwrap();
}

const PERIOD: &str = "from=2026-11-02T00:00:00Z&to=2026-11-04T00:00:00Z";

fn near(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-6)
}

fn team<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["teams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["team"] == name)
        .unwrap_or_else(|| panic!("{name} in {report}"))
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_report_adds_up_buckets_departments_cost_and_idle_guarantees(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    fixture(&s).await;
    let r = s.get(&format!("/api/v1/usage/report?{PERIOD}&group_by=team&bucket=day")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let b = &r.body;
    let t = &b["totals"];
    assert!(near(&t["gpu_hours"], 31.0) && near(&t["borrowed_gpu_hours"], 0.0) && near(&t["cost"], 36.0), "{t}");
    assert!(near(&t["in_quota_gpu_hours"], 31.0), "{t}");
    // Rows by day, then team: day 1 nlp 8, other 1, vision 8; day 2 nlp 8 + 6.
    let rows: Vec<(String, String, f64)> = b["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["bucket"].as_str().unwrap()[..10].to_owned(),
                r["team"].as_str().unwrap().to_owned(),
                r["gpu_hours"].as_f64().unwrap(),
            )
        })
        .collect();
    let expected = [
        ("2026-11-02", "nlp", 8.0),
        ("2026-11-02", "other", 1.0),
        ("2026-11-02", "vision", 8.0),
        ("2026-11-03", "nlp", 14.0),
    ];
    assert_eq!(rows.len(), expected.len(), "{rows:?}");
    for ((day, team, h), (eday, eteam, eh)) in rows.iter().zip(expected) {
        assert!(day == eday && team == eteam && (h - eh).abs() < 1e-6, "{rows:?}");
    }
    // The department adds up its subtree; each team its own.
    let research = team(b, "research");
    assert!(near(&research["subtree"]["gpu_hours"], 30.0) && near(&research["own"]["gpu_hours"], 0.0), "{research}");
    assert!(near(&research["subtree"]["cost"], 35.0), "{research}");
    assert!(near(&team(b, "nlp")["own"]["gpu_hours"], 22.0));
    assert_eq!(team(b, "nlp")["parent"], "research");
    // Guarantees over the 2 days (past: all of it counts): research 16 × 48 h, its subtree
    // never used more than 16 at once, so idle is guaranteed minus used; nlp 8 × 48 h
    // minus its 22.
    assert!(near(&research["guaranteed_gpu_hours"], 768.0), "{research}");
    assert!(near(&research["idle_guarantee_gpu_hours"], 768.0 - 30.0), "{research}");
    assert!(near(&team(b, "nlp")["idle_guarantee_gpu_hours"], 384.0 - 22.0), "{}", team(b, "nlp"));
    assert!(near(&team(b, "other")["guaranteed_gpu_hours"], 0.0));

    // By backend: one report over Slurm and Kubernetes.
    let r = s.get(&format!("/api/v1/usage/report?{PERIOD}&group_by=backend")).await;
    let by: Vec<(&str, f64)> = r.body["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["backend"].as_str().unwrap(), r["gpu_hours"].as_f64().unwrap()))
        .collect();
    assert_eq!(by, [("kubernetes", 6.0), ("slurm", 25.0)]);
}

/// Work admitted beyond its team's own guarantee is borrowed only while the team's own
/// work holds more than it: research (guaranteed 16, its child nlp 8 of those, so 8 its
/// own) ran 8 GPUs admitted as borrowed 10:00–12:00 while the teams below it held 14 until
/// 11:00 (vision 12, nlp's bob 2). What the teams below held is theirs to answer for: its
/// own 8 were within its own 8, all 16 GPU-hours in quota, for a platform admin and for
/// research's team admin alike (settled against research's whole guarantee, as the
/// scheduler once counted, 6 were borrowed). A member of research, who may not read the
/// teams below it, sees the work as it was admitted.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn borrowed_hours_follow_what_the_team_held_for_those_who_may_read_it(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    fixture(&s).await;
    let own =
        (&["research"][..], "rita", 8.0, "2026-11-03T10:00:00Z", "2026-11-03T12:00:00Z", true, "alpha", "slurm", None);
    record(&s, own).await;
    // vision (guaranteed 0) borrows 12 GPUs 10:00–11:00.
    let below = (
        &["vision", "research"][..],
        "vic",
        12.0,
        "2026-11-03T10:00:00Z",
        "2026-11-03T11:00:00Z",
        true,
        "alpha",
        "slurm",
        None,
    );
    record(&s, below).await;
    // vision (guaranteed 0) borrows 2 GPUs 11:00–12:00, within research's 16.
    let lent = (
        &["vision", "research"][..],
        "vera",
        2.0,
        "2026-11-03T11:00:00Z",
        "2026-11-03T12:00:00Z",
        true,
        "alpha",
        "slurm",
        None,
    );
    record(&s, lent).await;
    let q = format!("/api/v1/usage/report?{PERIOD}&group_by=owner");
    let callers = [
        (token("admin", &[(Role::PlatformAdmin, None)]), 0.0, true),
        (token("ra", &[(Role::TeamAdmin, Some("research"))]), 0.0, true),
        (token("dm", &[(Role::Member, Some("research"))]), 16.0, false),
    ];
    for (t, borrowed, whole) in callers {
        let r = s.send_as(Some(&t), Method::GET, &q, None).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let rita = r.body["rows"].as_array().unwrap().iter().find(|r| r["owner"] == "rita").expect("rita's row");
        assert!(near(&rita["borrowed_gpu_hours"], borrowed), "{rita}");
        assert!(near(&rita["in_quota_gpu_hours"], 16.0 - borrowed), "{rita}");
        // The department's subtree borrowed what it held beyond its 16: 6 GPU-hours (its
        // teams' sum said 14: vision's borrowing was partly within research's guarantee).
        let research = r.body["teams"].as_array().unwrap().iter().find(|t| t["team"] == "research").unwrap();
        if whole {
            assert!(near(&research["subtree"]["borrowed_gpu_hours"], 6.0), "{research}");
        }
    }
}

/// Found from outside: a member of a team whose only team below was deleted read the team
/// as a team with none below it, and its report settled the team's borrowed work against
/// its own work alone (the deleted team's is not in what a member reads): in quota for the
/// member, borrowed for an admin, with an idle guarantee only the member was shown.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_team_whose_team_below_was_deleted_is_not_read_whole_by_its_member(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    fixture(&s).await;
    s.put_ok("/api/v1/teams/kid", &TeamBody::new().parent("nlp").json(), 201).await;
    let (from, to) = ("2026-11-03T14:00:00Z", "2026-11-03T16:00:00Z");
    record(&s, (&["kid", "nlp", "research"][..], "kim", 8.0, from, to, false, "alpha", "slurm", None)).await;
    record(&s, (&["nlp", "research"][..], "nina", 4.0, from, to, true, "alpha", "slurm", None)).await;
    let gone = s.delete("/api/v1/teams/kid").await;
    assert!(gone.status.is_success(), "{}", gone.body);
    let q = format!("/api/v1/usage/report?{PERIOD}&group_by=owner");
    for (t, whole) in
        [(token("admin", &[(Role::PlatformAdmin, None)]), true), (token("nm", &[(Role::Member, Some("nlp"))]), false)]
    {
        let r = s.send_as(Some(&t), Method::GET, &q, None).await;
        assert_eq!(r.status, 200, "{}", r.body);
        // nina's 4 were admitted beyond nlp's guarantee of 8 (kid's 8 ran below it). Settled
        // for the admin against nlp's own work, they were within it; the member sees them
        // as admitted.
        let nina = r.body["rows"].as_array().unwrap().iter().find(|r| r["owner"] == "nina").expect("nina's row");
        assert!(near(&nina["borrowed_gpu_hours"], if whole { 0.0 } else { 8.0 }), "{nina}");
        let nlp = r.body["teams"].as_array().unwrap().iter().find(|t| t["team"] == "nlp").expect("nlp");
        assert_eq!(nlp["idle_guarantee_gpu_hours"].is_number(), whole, "{nlp}");
    }
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn running_work_counts_up_to_now(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    fixture(&s).await;
    s.put_ok(
        "/api/v1/flavors/h100",
        &json!({"spec": {"price": {"per_gpu_hour": 2.0, "clusters": {"spot": 0.5}}}}),
        200,
    )
    .await;
    let body =
        json!({"spec": {"kind": "training", "tasks": {"count": 2, "resources": {"flavors": ["h100"], "gpus": 4}}}});
    s.put_ok("/api/v1/teams/nlp/workloads/live", &body, 201).await;
    // It has run for two hours on spot (the controllers are not running here: its status
    // is written as they would).
    let started = chrono::Utc::now() - chrono::TimeDelta::hours(2);
    sqlx::query(
        "UPDATE workloads SET phase = 'Running',
                status = jsonb_build_object('phase', 'Running', 'started_at', $1::text,
                    'admission', jsonb_build_object('cluster', 'spot', 'flavor', 'h100', 'borrowed', false))
         WHERE name = 'live'",
    )
    .bind(started.to_rfc3339())
    .execute(&s.db)
    .await
    .unwrap();
    let from = (started - chrono::TimeDelta::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let to = (started + chrono::TimeDelta::hours(4)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let r = s.get(&format!("/api/v1/usage/report?from={from}&to={to}&group_by=owner,cluster")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let rows = r.body["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{}", r.body);
    assert_eq!((rows[0]["owner"].as_str(), rows[0]["cluster"].as_str()), (Some("admin"), Some("spot")));
    // 8 GPUs for 2 hours (and the seconds this test took), at the spot price.
    let h = rows[0]["gpu_hours"].as_f64().unwrap();
    assert!((16.0..16.1).contains(&h), "{h}");
    assert!((rows[0]["cost"].as_f64().unwrap() - h * 0.5).abs() < 1e-9, "{}", rows[0]);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn csv_parses_and_each_caller_sees_only_what_it_may(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    fixture(&s).await;
    let csv = reqwest::Client::new()
        .get(s.url(&format!("/api/v1/usage/report?{PERIOD}&group_by=team,owner&bucket=day&format=csv")))
        .bearer_auth(token("admin", &[(Role::PlatformAdmin, None)]))
        .send()
        .await
        .unwrap();
    assert_eq!(csv.status(), 200);
    assert_eq!(csv.headers()["content-type"], "text/csv; charset=utf-8");
    assert!(csv.headers()["content-disposition"].to_str().unwrap().starts_with("attachment; filename=\"berth-usage-"));
    let text = csv.text().await.unwrap();
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("bucket,team,owner,gpu_hours,in_quota_gpu_hours,borrowed_gpu_hours,cost,unpriced_gpu_hours")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.iter().all(|r| r.len() == 8), "{text}");
    // carol's work had no price: apart, not at a cost of nothing.
    assert!(rows.iter().any(|r| r[2] == "carol" && r[6] == "0.000000" && r[7] == "8.000000"), "{text}");
    let sum: f64 = rows.iter().map(|r| r[3].parse::<f64>().unwrap()).sum();
    assert!((sum - 31.0).abs() < 1e-4, "{text}");
    assert!(
        rows.iter().any(|r| r[0] == "2026-11-03T00:00:00Z" && r[1] == "nlp" && r[2] == "bob" && r[3] == "6.000000"),
        "{text}"
    );

    // A department's admin sees its subtree (a team deleted since included), a member its
    // own team, a viewer of another team only that one.
    let report = |t: String| {
        let s = &s;
        async move {
            s.send_as(Some(&t), Method::GET, &format!("/api/v1/usage/report?{PERIOD}&group_by=team"), None).await.body
        }
    };
    s.delete("/api/v1/teams/vision").await;
    let admin = report(token("ra", &[(Role::TeamAdmin, Some("research"))])).await;
    assert!(near(&admin["totals"]["gpu_hours"], 30.0), "{admin}");
    let names: Vec<&str> = admin["teams"].as_array().unwrap().iter().map(|t| t["team"].as_str().unwrap()).collect();
    assert_eq!(names, ["nlp", "research", "vision"]);
    let member = report(token("m", &[(Role::Member, Some("nlp"))])).await;
    assert!(near(&member["totals"]["gpu_hours"], 22.0), "{member}");
    let names: Vec<&str> = member["teams"].as_array().unwrap().iter().map(|t| t["team"].as_str().unwrap()).collect();
    assert_eq!(names, ["nlp"], "a member of nlp does not see its department's totals");
    // nlp has no team below it: its member sees how much of its guarantee lay idle.
    assert!(near(&member["teams"][0]["guaranteed_gpu_hours"], 384.0), "{member}");
    // A member of the department sees its own work only: not its department's use, so
    // not how much of its guarantee lay idle either.
    let dept_member = report(token("dm", &[(Role::Member, Some("research"))])).await;
    let names: Vec<&str> =
        dept_member["teams"].as_array().unwrap().iter().map(|t| t["team"].as_str().unwrap()).collect();
    assert_eq!(names, Vec::<&str>::new(), "research ran nothing of its own: {dept_member}");
    let viewer = report(token("v", &[(Role::Viewer, Some("other"))])).await;
    assert!(near(&viewer["totals"]["gpu_hours"], 1.0), "{viewer}");
    // vision's name is free again: a team-admin of nlp names a new team of its own so.
    // The old vision's history stays the department's, not the new team's.
    let nlp_admin = token("na", &[(Role::TeamAdmin, Some("nlp"))]);
    let body = TeamBody::new().parent("nlp").json();
    let created = s.send_as(Some(&nlp_admin), Method::PUT, "/api/v1/teams/vision", Some(&body)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let reused = report(nlp_admin).await;
    assert!(near(&reused["totals"]["gpu_hours"], 22.0), "{reused}");
    assert!(!reused.to_string().contains("carol"), "{reused}");
    // Now that nlp has a team below it, that depends on work its member may not read: not
    // shown (it read 0, as if nlp had no guarantee). Its admin sees it.
    let member = report(token("m", &[(Role::Member, Some("nlp"))])).await;
    let nlp = &member["teams"][0];
    assert_eq!(nlp["team"], "nlp", "{member}");
    assert_eq!((nlp.get("guaranteed_gpu_hours"), nlp.get("idle_guarantee_gpu_hours")), (None, None), "{member}");
    assert!(near(&reused["teams"][0]["guaranteed_gpu_hours"], 384.0), "{reused}");
    let admin = report(token("ra", &[(Role::TeamAdmin, Some("research"))])).await;
    assert!(near(&admin["totals"]["gpu_hours"], 30.0), "{admin}");
    let nobody = report(token("n", &[])).await;
    assert!(near(&nobody["totals"]["gpu_hours"], 0.0) && nobody["rows"].as_array().unwrap().is_empty(), "{nobody}");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn bad_reports_prices_and_budgets_name_their_field(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let get = |q: &'static str| {
        let s = &s;
        async move { s.get(&format!("/api/v1/usage/report?{q}")).await }
    };
    get("group_by=team,colour").await.assert_problem(422, Some("group_by"));
    get("from=2026-11-04T00:00:00Z&to=2026-11-02T00:00:00Z").await.assert_problem(422, Some("to"));
    get("from=2024-01-01T00:00:00Z&to=2026-11-02T00:00:00Z").await.assert_problem(422, Some("from"));
    // Without `to`, the report ends now: a start in the future is the start's fault.
    get("from=2999-01-01T00:00:00Z").await.assert_problem(422, Some("from"));
    get("from=2026-01-01T00:00:00Z&to=2026-11-02T00:00:00Z&bucket=hour").await.assert_problem(422, Some("bucket"));
    get("bucket=fortnight").await.assert_problem(400, Some("bucket"));
    get("format=xml").await.assert_problem(400, Some("format"));
    get("from=yesterday").await.assert_problem(400, Some("from"));
    // A date alone, or an offset whose + became a space, is told how a time is written.
    for q in ["from=2026-12-01", "to=2026-12-01T00:00:00+05:30"] {
        let refused = get(q).await;
        refused.assert_problem(400, Some(q.split('=').next().unwrap()));
        assert!(
            refused.body["errors"][0]["message"].as_str().unwrap().contains("RFC 3339: 2026-12-01T00:00:00Z"),
            "{q}: {}",
            refused.body
        );
    }
    let before = s.table_counts().await;
    s.put("/api/v1/flavors/h100", &json!({"spec": {"price": {"per_gpu_hour": -1}}}))
        .await
        .assert_problem(422, Some("/spec/price/per_gpu_hour"));
    s.put("/api/v1/flavors/h100", &json!({"spec": {"price": {"per_gpu_hour": 1, "clusters": {"Bad Name": 1}}}}))
        .await
        .assert_problem(422, Some("/spec/price/clusters/Bad Name"));
    let budgets = |b: Value| json!({"spec": {"parent": "research", "quotas": [{"flavor": "h100", "guaranteed": 8}], "budgets": b}});
    s.put("/api/v1/teams/nlp", &budgets(json!([{"gpu_hours": -5, "period": "month"}])))
        .await
        .assert_problem(422, Some("/spec/budgets/0/gpu_hours"));
    s.put("/api/v1/teams/nlp", &budgets(json!([{"gpu_hours": 5, "period": "month", "flavor": "tpu"}])))
        .await
        .assert_problem(422, Some("/spec/budgets/0/flavor"));
    s.put("/api/v1/teams/nlp", &budgets(json!([{"gpu_hours": 5, "period": "year"}]))).await.assert_problem(422, None);
    assert_eq!(s.table_counts().await, before, "nothing was written");
    let ok =
        s.put("/api/v1/teams/nlp", &budgets(json!([{"gpu_hours": 5, "period": "week", "action": "stop_new"}]))).await;
    assert_eq!(ok.status, 200, "{}", ok.body);
    assert_eq!(ok.body["spec"]["budgets"][0]["action"], "stop_new");
    // A flavor a budget names stays while the budget does.
    s.put_ok("/api/v1/teams/nlp", &budgets(json!([{"gpu_hours": 5, "period": "week", "flavor": "a100"}])), 200).await;
    let refused = s.delete("/api/v1/flavors/a100").await;
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(refused.body.to_string().contains("team nlp"), "{}", refused.body);
}
