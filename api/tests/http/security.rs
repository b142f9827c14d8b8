//! The attacks of the black-box security review (issue 20), each reproduced through the
//! API and shown refused: privilege escalation through a reused name, secrets through a
//! cluster's credential reference, issuer confusion, and the JWT rules of RFC 8725.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use berth_core::auth::Role;
use jsonwebtoken::{Algorithm, EncodingKey};
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{self, Server, TeamBody, token};

async fn post(s: &Server, token: Option<&str>, path: &str, body: &Value) -> crate::common::Reply {
    s.send_as(token, Method::POST, path, Some(body)).await
}

/// The review's escalation: an account of a team is granted platform-admin; the team is
/// deleted; a team admin elsewhere creates an account of the same name and mints a token
/// for it. Before, the new account held every binding of the old one.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_service_account_created_again_under_an_old_name_inherits_nothing(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    s.put_ok("/api/v1/teams/tools", &TeamBody::new().parent("research").quota("h100", 1, Some(2), 1).json(), 201).await;
    let admin = token("admin", &[(Role::PlatformAdmin, None)]);
    let sa = post(&s, Some(&admin), "/api/v1/service-accounts", &json!({"name": "deployer", "team": "tools"})).await;
    assert_eq!(sa.status, 201, "{}", sa.body);
    let global = json!({"subject": "serviceaccount:deployer", "role": "platform-admin"});
    assert_eq!(post(&s, Some(&admin), "/api/v1/role-bindings", &global).await.status, 201);
    let on_nlp = json!({"subject": "serviceaccount:deployer", "role": "member", "team": "nlp"});
    assert_eq!(post(&s, Some(&admin), "/api/v1/role-bindings", &on_nlp).await.status, 201);
    // It submits work to nlp.
    let first = post(&s, Some(&admin), "/api/v1/service-accounts/deployer/tokens", &json!({"ttl_seconds": 600})).await;
    let first = first.body["token"].as_str().unwrap().to_owned();
    let work = crate::common::WorkloadBody::new().json();
    let put = s.send_as(Some(&first), Method::PUT, "/api/v1/teams/nlp/workloads/deployed", Some(&work)).await;
    assert_eq!(put.status, 201, "{}", put.body);
    assert_eq!(put.body["metadata"]["owner"]["service_account_uid"], sa.body["uid"], "{}", put.body);

    // The team goes, and its account with it; so do the account's bindings elsewhere.
    assert_eq!(s.delete("/api/v1/teams/tools").await.status, 200);
    let left = s.get("/api/v1/role-bindings?subject=serviceaccount:deployer").await;
    assert_eq!(left.body["items"], json!([]), "bindings outlived their account: {}", left.body);

    // A team admin of nlp makes an account of the same name and uses it.
    let bob = token("bob", &[(Role::TeamAdmin, Some("nlp"))]);
    let again = post(&s, Some(&bob), "/api/v1/service-accounts", &json!({"name": "deployer", "team": "nlp"})).await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_ne!(again.body["uid"], sa.body["uid"]);
    let minted = post(&s, Some(&bob), "/api/v1/service-accounts/deployer/tokens", &json!({"ttl_seconds": 600})).await;
    assert_eq!(minted.status, 201, "{}", minted.body);
    let stolen = minted.body["token"].as_str().unwrap();
    let me = s.send_as(Some(stolen), Method::GET, "/api/v1/me", None).await;
    assert_eq!(me.body["grants"], json!([]), "the new account inherited grants: {}", me.body);
    let flavor = s.send_as(Some(stolen), Method::PUT, "/api/v1/flavors/l40s", Some(&common::flavor("l40s"))).await;
    flavor.assert_problem(403, None);

    // A binding made now goes to the new account, and works.
    assert_eq!(post(&s, Some(&bob), "/api/v1/role-bindings", &on_nlp).await.status, 201);
    assert_eq!(s.send_as(Some(stolen), Method::GET, "/api/v1/teams/nlp/workloads", None).await.status, 200);
    // The old account's work is not the new one's: a member changes only its own.
    let mut changed = work.clone();
    changed["spec"]["priority"] = json!(7);
    let path = "/api/v1/teams/nlp/workloads/deployed";
    s.send_as(Some(stolen), Method::PUT, path, Some(&changed)).await.assert_problem(403, None);
    s.send_as(Some(stolen), Method::POST, &format!("{path}/cancel"), None).await.assert_problem(403, None);
    s.send_as(Some(stolen), Method::DELETE, path, None).await.assert_problem(403, None);
}

/// A user whose subject reads `serviceaccount:NAME` (any issuer may send any `sub`) holds
/// none of that account's rights, and a user's binding is not for another issuer's tokens.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_user_named_like_a_service_account_holds_none_of_its_rights(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    assert_eq!(s.send(Method::POST, "/api/v1/service-accounts", Some(&json!({"name": "ci"})), &[]).await.status, 201);
    let bind = json!({"subject": "serviceaccount:ci", "role": "viewer"});
    assert_eq!(s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await.status, 201);
    let impostor = token("serviceaccount:ci", &[]);
    s.send_as(Some(&impostor), Method::GET, "/api/v1/teams/nlp", None).await.assert_problem(404, None);
    // With rights of its own, what it changes is audited as a user's, never as the account's.
    let impostor = token("serviceaccount:ci", &[(Role::Member, Some("nlp"))]);
    let put = crate::common::WorkloadBody::new().json();
    let r = s.send_as(Some(&impostor), Method::PUT, "/api/v1/teams/nlp/workloads/posing", Some(&put)).await;
    assert_eq!(r.status, 201, "{}", r.body);
    let audit = s.get("/api/v1/audit?name=posing").await;
    assert_eq!(audit.body["items"][0]["actor"], "user:serviceaccount:ci", "{}", audit.body);

    // Binding a user names the issuer of its tokens; another issuer's same `sub` gets nothing.
    let bind = json!({"subject": "dora", "issuer": "https://idp.example", "role": "member", "team": "nlp"});
    let made = s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await;
    assert_eq!(made.status, 201, "{}", made.body);
    assert_eq!(made.body["issuer"], "https://idp.example");
    let dora = token("dora", &[]);
    s.send_as(Some(&dora), Method::GET, "/api/v1/teams/nlp", None).await.assert_problem(404, None);
    let bind = json!({"subject": "dora", "role": "member", "team": "nlp"});
    let made = s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await;
    assert_eq!(made.body["issuer"], "berth", "without an OIDC issuer, users are Berth's: {}", made.body);
    assert_eq!(s.send_as(Some(&dora), Method::GET, "/api/v1/teams/nlp", None).await.status, 200);

    // Binding an account that does not exist is refused, not kept for a later namesake.
    let ghost = json!({"subject": "serviceaccount:ghost", "role": "viewer"});
    s.send(Method::POST, "/api/v1/role-bindings", Some(&ghost), &[]).await.assert_problem(422, Some("/subject"));
    let issuer = json!({"subject": "serviceaccount:ci", "issuer": "berth", "role": "viewer"});
    s.send(Method::POST, "/api/v1/role-bindings", Some(&issuer), &[]).await.assert_problem(422, Some("/issuer"));
}

/// The review read `BERTH_JWT_SECRET` through a cluster's status; now a cluster can name
/// only a credential given to berthd for clusters.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_cluster_cannot_name_any_setting_but_a_cluster_credential(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let before = s.table_counts().await;
    for name in ["BERTH_JWT_SECRET", "DATABASE_URL", "BERTH_JWT_SECRET_FILE", "HOME", "BERTH_CREDENTIAL_"] {
        let body = json!({"spec": {"kind": "kubernetes", "endpoint": "https://k8s.internal:6443", "credentials_ref": name,
                                   "kubernetes": {"flavors": [{"flavor": "h100", "product": "NVIDIA-H100"}]}}});
        s.put("/api/v1/clusters/k", &body).await.assert_problem(422, Some("/spec/credentials_ref"));
    }
    assert_eq!(s.table_counts().await, before, "nothing was written");
    let body = json!({"spec": {"kind": "kubernetes", "endpoint": "https://k8s.internal:6443",
                               "credentials_ref": "BERTH_CREDENTIAL_K8S",
                               "kubernetes": {"flavors": [{"flavor": "h100", "product": "NVIDIA-H100"}]}}});
    s.put_ok("/api/v1/clusters/k", &body, 201).await;
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn claims(sub: &str) -> Value {
    json!({"iss": "berth", "sub": sub, "aud": "berth", "exp": now() + 600, "iat": now(),
           "grants": [{"role": "platform-admin"}]})
}

fn signed(header: &Value, claims: &Value) -> String {
    let b64 = |v: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap());
    let input = format!("{}.{}", b64(header), b64(claims));
    let key = EncodingKey::from_secret(common::SECRET);
    let signature = jsonwebtoken::crypto::sign(input.as_bytes(), &key, Algorithm::HS256).unwrap();
    format!("{input}.{signature}")
}

/// RFC 8725's rules: every token here is correctly signed with the server's own secret,
/// and each is refused for the rule it breaks.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn tokens_breaking_the_jwt_rules_are_refused_though_correctly_signed(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let hs256 = json!({"alg": "HS256", "typ": "JWT"});
    let good = signed(&hs256, &claims("eve"));
    assert_eq!(s.send_as(Some(&good), Method::GET, "/api/v1/me", None).await.status, 200, "the control passes");

    let crit = signed(&json!({"alg": "HS256", "typ": "JWT", "crit": ["exp-v2"], "exp-v2": 1}), &claims("eve"));
    let mut future = claims("eve");
    future["iat"] = json!(now() + 3600);
    let mut empty = claims("");
    empty["sub"] = json!("");
    let mut blank = claims("   ");
    blank["sub"] = json!("   ");
    let nul = claims("a\u{0}b");
    let long = claims(&"x".repeat(300));
    for (what, token) in [
        ("an unknown critical header", crit),
        ("issued an hour from now", signed(&hs256, &future)),
        ("an empty subject", signed(&hs256, &empty)),
        ("a blank subject", signed(&hs256, &blank)),
        ("a NUL in the subject (a server fault before)", signed(&hs256, &nul)),
        ("a 300-character subject", signed(&hs256, &long)),
    ] {
        let r = s.send_as(Some(&token), Method::GET, "/api/v1/me", None).await;
        assert_eq!(r.status, 401, "{what}: {}", r.body);
        r.assert_problem(401, None);
    }
}

/// Two `Authorization` headers are ambiguous (a proxy may read one, the server another):
/// refused, even when both are valid; and a refusal sent before the body is read says the
/// connection closes.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_request_with_two_authorization_headers_is_refused(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    let admin = format!("Bearer {}", token("admin", &[(Role::PlatformAdmin, None)]));
    let viewer = format!("Bearer {}", token("vic", &[(Role::Viewer, None)]));
    let r = reqwest::Client::new()
        .get(s.url("/api/v1/me"))
        .header("authorization", &viewer)
        .header("authorization", &admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let body: Value = r.json().await.unwrap();
    assert!(body["detail"].as_str().unwrap().contains("one Authorization header"), "{body}");

    let r = reqwest::Client::new()
        .put(s.url("/api/v1/flavors/x"))
        .header("content-type", "application/json")
        .body(vec![b' '; 512 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers().get("connection").and_then(|v| v.to_str().ok()), Some("close"));
}

/// Routes any authenticated caller may use, with the answer they give: the platform's
/// shared facts (flavors, clusters, the controllers' report), the caller itself, and lists
/// that hold only what the caller can see.
const OPEN_TO_EVERY_CALLER: [(&str, &str); 15] = [
    ("GET", "/api/v1/clusters"),
    ("GET", "/api/v1/clusters/{name}"),
    ("GET", "/api/v1/clusters/{name}/nodes"),
    ("GET", "/api/v1/controllers"),
    ("GET", "/api/v1/flavors"),
    ("GET", "/api/v1/flavors/{name}"),
    ("GET", "/api/v1/me"),
    ("GET", "/api/v1/queue"),
    ("GET", "/api/v1/role-bindings"),
    ("GET", "/api/v1/service-accounts"),
    ("GET", "/api/v1/teams"),
    ("GET", "/api/v1/usage/history"),
    ("GET", "/api/v1/usage/report"),
    ("GET", "/api/v1/workloads"),
    ("GET", "/api/v1/workloads/summary"),
];

/// Every operation of the OpenAPI document, called by a member of `nlp` on team `vision`
/// (on which it holds no grant) and on objects of vision's: each answers 404 or 403, or is
/// one of the routes open to every caller, which answer without a trace of vision. A route
/// added without a check fails here.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn every_route_refuses_a_caller_with_no_grant_on_the_team(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    s.put_ok("/api/v1/teams/vision", &TeamBody::new().parent("research").quota("h100", 4, Some(16), 1).json(), 201)
        .await;
    s.put_ok("/api/v1/teams/vision/workloads/vision-train", &crate::common::WorkloadBody::new().json(), 201).await;
    s.put_ok("/api/v1/clusters/east", &common::sim_cluster("h100"), 201).await;
    let sa = s
        .send(Method::POST, "/api/v1/service-accounts", Some(&json!({"name": "vision-bot", "team": "vision"})), &[])
        .await;
    assert_eq!(sa.status, 201, "{}", sa.body);
    let bind = json!({"subject": "vera", "role": "member", "team": "vision"});
    let binding = s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await;
    let minted = s
        .send(Method::POST, "/api/v1/service-accounts/vision-bot/tokens", Some(&json!({"ttl_seconds": 60})), &[])
        .await;
    let (binding_id, token_id) = (binding.body["id"].as_str().unwrap(), minted.body["id"].as_str().unwrap());
    let nina = token("nina", &[(Role::Member, Some("nlp"))]);
    // vision has run work: the usage report must not show it.
    sqlx::query(
        "INSERT INTO usage_ledger (workload_uid, attempt, team, teams, team_uids, workload, owner, flavor, cluster,
                                   backend, kind, gpus, borrowed, started_at, ended_at, outcome)
         VALUES (gen_random_uuid(), 0, 'vision', '{vision,research}',
                 ARRAY[(SELECT uid FROM teams WHERE name = 'vision'), (SELECT uid FROM teams WHERE name = 'research')],
                 'done', 'vic', 'h100', 'east', 'sim', 'training', 8, false,
                 now() - interval '2 hours', now() - interval '1 hour', 'succeeded')",
    )
    .execute(&s.db)
    .await
    .unwrap();

    let document = berthd::openapi::document();
    let mut checked = 0;
    for (template, item) in &document.paths.paths {
        if !template.starts_with("/api/") {
            continue;
        }
        let operations = [
            ("GET", item.get.is_some()),
            ("PUT", item.put.is_some()),
            ("POST", item.post.is_some()),
            ("DELETE", item.delete.is_some()),
        ];
        for (method, _) in operations.into_iter().filter(|(_, present)| *present) {
            let name = if template.starts_with("/api/v1/clusters") {
                "east"
            } else if template.starts_with("/api/v1/flavors") {
                "h100"
            } else if template.starts_with("/api/v1/service-accounts") {
                "vision-bot"
            } else if template.contains("/workloads/") {
                "vision-train"
            } else {
                "vision"
            };
            let id = if template.starts_with("/api/v1/role-bindings") { binding_id } else { token_id };
            let path = template.replace("{team}", "vision").replace("{name}", name).replace("{id}", id);
            let body = match (method, template.as_str()) {
                ("PUT", "/api/v1/clusters/{name}") => Some(common::sim_cluster("h100")),
                ("PUT", "/api/v1/flavors/{name}") => Some(common::flavor("h100")),
                ("PUT" | "POST", "/api/v1/teams/{name}" | "/api/v1/teams/{name}/preview") => {
                    Some(TeamBody::new().parent("research").quota("h100", 4, Some(16), 1).json())
                }
                ("PUT", _) => Some(crate::common::WorkloadBody::new().json()),
                ("POST", "/api/v1/teams/{team}/workloads") => {
                    let mut item = crate::common::WorkloadBody::new().json();
                    item["metadata"]["name"] = json!("sneak");
                    Some(json!({"items": [item]}))
                }
                ("POST", "/api/v1/role-bindings") => {
                    Some(json!({"subject": "nina", "role": "team-admin", "team": "vision"}))
                }
                ("POST", "/api/v1/service-accounts") => Some(json!({"name": "sneak", "team": "vision"})),
                ("POST", _) => Some(json!({"ttl_seconds": 60})),
                _ => None,
            };
            let http_method = Method::from_bytes(method.as_bytes()).unwrap();
            let r = s.send_as(Some(&nina), http_method, &path, body.as_ref()).await;
            if OPEN_TO_EVERY_CALLER.contains(&(method, template.as_str())) {
                assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
                let text = r.body.to_string();
                assert!(!text.contains("vision"), "{method} {path} showed vision's names: {text}");
            } else {
                assert!(
                    r.status == 404 || r.status == 403,
                    "{method} {path} answered {} to a caller with no grant on vision: {}",
                    r.status,
                    r.body
                );
                r.assert_problem(r.status.as_u16(), None);
            }
            checked += 1;
        }
    }
    assert!(checked >= 35, "the document lists every route ({checked} checked)");
    // Nothing was written by any of those calls.
    let names = s.get("/api/v1/teams/vision/workloads").await.names();
    assert_eq!(names, ["vision-train"]);
    assert_eq!(s.get("/api/v1/service-accounts/sneak").await.status, 404);
    s.send_as(Some(&nina), Method::GET, "/api/v1/queue?team=vision", None).await.assert_problem(404, None);
    // A filter naming a team out of reach answers as the path does (it listed nothing).
    s.send_as(Some(&nina), Method::GET, "/api/v1/workloads?team=vision", None).await.assert_problem(404, None);
    s.send_as(Some(&nina), Method::GET, "/api/v1/workloads?team=nosuch", None).await.assert_problem(404, None);
    let both = s.send_as(Some(&nina), Method::GET, "/api/v1/teams/nlp/workloads?team=vision", None).await;
    both.assert_problem(422, Some("team"));
    s.send_as(Some(&nina), Method::GET, "/api/v1/workloads?owner=", None).await.assert_problem(422, Some("owner"));
    s.send_as(Some(&nina), Method::GET, "/api/v1/workloads?team=", None).await.assert_problem(422, Some("team"));
}

/// The review's memory amplification: a member stores many large workloads and lists them
/// all at once. A page now carries at most about `PAGE_BYTES`, whatever `limit` says, and
/// the cursor walks the rest: every workload once, in order.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_page_of_large_workloads_stops_at_the_byte_budget(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let mut body = crate::common::WorkloadBody::new().json();
    body["spec"]["run"] = json!({
        "script": "#".repeat(60_000),
        "command": vec!["x".repeat(4000); 15],
        "env": (0..4).map(|i| (format!("BIG_{i}"), json!("v".repeat(30_000)))).collect::<serde_json::Map<_, _>>(),
    });
    let size = body.to_string().len();
    assert!(size > 230_000, "each workload is large: {size} bytes");
    for i in 0..24 {
        s.put_ok(&format!("/api/v1/teams/nlp/workloads/big-{i:02}"), &body, 201).await;
    }
    let (mut seen, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
    loop {
        let path = match &cursor {
            Some(c) => format!("/api/v1/teams/nlp/workloads?limit=500&cursor={c}"),
            None => "/api/v1/teams/nlp/workloads?limit=500".to_owned(),
        };
        let r = reqwest::Client::new().get(s.url(&path)).bearer_auth(token("a", &[(Role::PlatformAdmin, None)]));
        let text = r.send().await.unwrap().text().await.unwrap();
        let page: Value = serde_json::from_str(&text).unwrap();
        let budget = usize::try_from(berth_core::page::PAGE_BYTES).unwrap();
        assert!(text.len() <= budget + size, "a page of {} bytes is over the budget", text.len());
        pages += 1;
        seen.extend(
            page["items"].as_array().unwrap().iter().map(|w| w["metadata"]["name"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let all: Vec<String> = (0..24).map(|i| format!("big-{i:02}")).collect();
    assert_eq!(seen, all, "the pages hold every workload once, in order");
    assert!(pages >= 3, "the budget cut the list into pages ({pages})");
    let queue = s.get("/api/v1/queue?limit=500").await;
    assert!(queue.body.to_string().len() <= usize::try_from(berth_core::page::PAGE_BYTES).unwrap() + size);
    assert_eq!(queue.body["total"], 24, "the totals still count every waiting workload");
}

/// Limits on a spec's size fields, each a 422 naming the field.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn oversized_spec_fields_are_refused_naming_the_field(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let with_run = |run: Value| {
        let mut body = crate::common::WorkloadBody::new().json();
        body["spec"]["run"] = run;
        body
    };
    let cases = [
        (json!({"command": vec!["x".repeat(4000); 17]}), "/spec/run/command"),
        (
            json!({"env": (0..5).map(|i| (format!("E{i}"), json!("v".repeat(30_000)))).collect::<serde_json::Map<_, _>>()}),
            "/spec/run/env",
        ),
        (json!({"script": "#".repeat(70_000)}), "/spec/run/script"),
    ];
    for (run, field) in cases {
        s.put("/api/v1/teams/nlp/workloads/w", &with_run(run)).await.assert_problem(422, Some(field));
    }
    let labels: serde_json::Map<String, Value> = (0..65).map(|i| (format!("k{i}"), json!("v"))).collect();
    let mut body = crate::common::WorkloadBody::new().json();
    body["metadata"]["labels"] = Value::Object(labels);
    s.put("/api/v1/teams/nlp/workloads/w", &body).await.assert_problem(422, Some("/metadata/labels"));
}

/// A NUL (which Postgres cannot store) in a path segment, a query parameter, a cursor or a
/// body is a 400 or 422 naming where it is, never a 500; and a team name with control
/// characters is no key of a cluster's namespace map.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn nul_bytes_and_control_characters_are_refused_not_a_server_fault(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    for path in [
        "/api/v1/teams/nl%00p",
        "/api/v1/teams/nlp/workloads/a%00b",
        "/api/v1/flavors/h%00",
        "/api/v1/clusters/x%00/nodes",
        "/api/v1/service-accounts/a%00",
    ] {
        s.get(path).await.assert_problem(400, None);
    }
    for (query, field) in [
        ("/api/v1/workloads?team=nl%00p", "team"),
        ("/api/v1/workloads?label_selector=a%00", "label_selector"),
        ("/api/v1/role-bindings?subject=x%00", "subject"),
        ("/api/v1/audit?actor=%00", "actor"),
    ] {
        let r = s.get(query).await;
        r.assert_problem(400, None);
        assert_eq!(r.body["errors"][0]["field"], field, "{query}: {}", r.body);
    }
    let cursor = URL_SAFE_NO_PAD.encode(br#"["nlp\u0000","x"]"#);
    s.get(&format!("/api/v1/workloads?cursor={cursor}")).await.assert_problem(422, Some("cursor"));
    let mut body = crate::common::WorkloadBody::new().json();
    body["metadata"]["labels"] = json!({"tier": "a\u{0}b"});
    s.put("/api/v1/teams/nlp/workloads/w", &body).await.assert_problem(422, Some("/metadata/labels/tier"));
    let sa = json!({"name": "ci", "description": "nul \u{0} here"});
    s.send(Method::POST, "/api/v1/service-accounts", Some(&sa), &[]).await.assert_problem(422, Some("/description"));

    let cluster = json!({"spec": {"kind": "kubernetes", "endpoint": "https://k8s:6443",
        "kubernetes": {"flavors": [{"flavor": "h100", "product": "NVIDIA-H100"}], "namespaces": {"nlp\u{1b}[2J": "ns"}}}});
    s.put("/api/v1/clusters/k", &cluster).await.assert_problem(422, Some("/spec/kubernetes/namespaces/nlp\u{1b}[2J"));
}

/// Every page and answer says no site may frame it, and API answers (tokens among them)
/// may not be cached.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn pages_refuse_framing_and_api_answers_are_not_cached(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    for path in ["/docs/", "/api/v1/me", "/healthz"] {
        let r = reqwest::Client::new().get(s.url(path)).bearer_auth(token("a", &[(Role::PlatformAdmin, None)]));
        let r = r.send().await.unwrap();
        let header = |name: &str| r.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(header("content-security-policy").contains("frame-ancestors 'none'"), "{path}");
        assert_eq!(header("x-frame-options"), "DENY", "{path}");
        assert_eq!(header("x-content-type-options"), "nosniff", "{path}");
    }
    assert_eq!(s.send(Method::POST, "/api/v1/service-accounts", Some(&json!({"name": "ci"})), &[]).await.status, 201);
    let minted =
        s.send(Method::POST, "/api/v1/service-accounts/ci/tokens", Some(&json!({"ttl_seconds": 60})), &[]).await;
    assert_eq!(minted.status, 201);
    assert_eq!(minted.headers.get("cache-control").unwrap(), "no-store");
}

/// berthd's listener with short limits, for the connection tests.
async fn serve_with_limits(db: berth_store::PgPool, limits: berthd::server::ConnectionLimits) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = berthd::state::HttpConfig { limits, ..berthd::state::HttpConfig::default() };
    let state = berthd::state::AppState::from(berthd::state::Shared {
        http,
        ..berthd::state::Shared::new(db, berthd::auth::Auth::new(common::verifier(None), None))
    });
    tokio::spawn(berthd::server::serve(listener, berthd::app(state), limits, std::future::pending()));
    addr
}

/// Reads until the server closes the connection; what it sent.
async fn until_closed(stream: &mut tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(20), stream.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "the server kept the connection open; it sent {:?}", String::from_utf8_lossy(&got));
    String::from_utf8_lossy(&got).into_owned()
}

/// The review held connections open for 130 s without any being closed. Now a client that
/// never finishes its headers, one that never finishes its body, and one that sits on an
/// idle keep-alive connection are each cut off.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn slow_and_idle_connections_are_closed(db: berth_store::PgPool) {
    use tokio::io::AsyncWriteExt;
    let limits = berthd::server::ConnectionLimits {
        header_read: std::time::Duration::from_secs(1),
        idle: std::time::Duration::from_secs(2),
        request: std::time::Duration::from_secs(2),
        concurrent: 64,
    };
    let addr = serve_with_limits(db, limits).await;

    // Headers that never end (slowloris).
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: berth\r\nX-Slow: ").await.unwrap();
    until_closed(&mut slow).await;

    // A body that stops arriving: the request times out (408) and the connection closes.
    let admin = token("admin", &[(Role::PlatformAdmin, None)]);
    let mut stalled = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT /api/v1/flavors/x HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer {admin}\r\n\
         Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"spec\":"
    );
    stalled.write_all(head.as_bytes()).await.unwrap();
    let answer = until_closed(&mut stalled).await;
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");

    // An idle keep-alive connection after a complete exchange.
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: berth\r\n\r\n").await.unwrap();
    let answer = until_closed(&mut idle).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "the request itself is served: {answer}");
}

/// Reads are limited per caller, and every request on a team's paths or by the team's
/// service accounts counts against one team budget, so more accounts buy no more requests.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn reads_are_limited_per_caller_and_per_team(db: berth_store::PgPool) {
    let base = serve_with_budgets(db).await;
    let get = async |token: &str, path: &str| {
        reqwest::Client::new().get(format!("{base}{path}")).bearer_auth(token).send().await.unwrap().status().as_u16()
    };

    // (Budgets refill at 1 a second; the counts below leave room for a slow machine.)
    // One caller: its burst of 4 reads, then 429.
    let vic = token("vic", &[(Role::Viewer, None)]);
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(get(&vic, "/api/v1/flavors").await);
    }
    assert!(statuses[..4].iter().all(|s| *s == 200) && statuses.contains(&429), "{statuses:?}");

    let admin = token("admin", &[(Role::PlatformAdmin, None)]);
    let send = async |method: Method, path: &str, body: Value| {
        let r = reqwest::Client::new().request(method, format!("{base}{path}")).bearer_auth(&admin).json(&body);
        r.send().await.unwrap().json::<Value>().await.unwrap()
    };
    send(Method::PUT, "/api/v1/flavors/h100", common::flavor("h100")).await;
    for team in ["nlp", "ops"] {
        send(Method::PUT, &format!("/api/v1/teams/{team}"), TeamBody::new().quota("h100", 1, None, 1).json()).await;
    }

    // Three users, each within its own burst of 4, reading one team's paths share the
    // team's budget of 6 (less the one its PUT spent).
    let mut statuses = Vec::new();
    for user in ["u1", "u2", "u3"] {
        let t = token(user, &[(Role::Viewer, None)]);
        for _ in 0..4 {
            statuses.push(get(&t, "/api/v1/teams/nlp/workloads").await);
        }
    }
    assert!(statuses[..5].iter().all(|s| *s == 200) && statuses.contains(&429), "{statuses:?}");

    // Service accounts of one team share its budget wherever they read.
    let mut tokens = Vec::new();
    for name in ["bot-1", "bot-2", "bot-3"] {
        send(Method::POST, "/api/v1/service-accounts", json!({"name": name, "team": "ops"})).await;
        let minted =
            send(Method::POST, &format!("/api/v1/service-accounts/{name}/tokens"), json!({"ttl_seconds": 60})).await;
        tokens.push(minted["token"].as_str().unwrap().to_owned());
    }
    let mut statuses = Vec::new();
    for t in &tokens {
        for _ in 0..4 {
            statuses.push(get(t, "/api/v1/flavors").await);
        }
    }
    // Each account stays within its own burst of 4: only the team's budget refuses.
    assert!(statuses.contains(&429), "three accounts, one team budget: {statuses:?}");
}

/// berthd with 4 reads a caller and 6 requests a team (each refilled at 1 a second), on an
/// ephemeral port: its base URL.
async fn serve_with_budgets(db: berth_store::PgPool) -> String {
    let limit = |burst: u32| {
        Some(berthd::auth::RateLimit {
            per_second: std::num::NonZeroU32::new(1).unwrap(),
            burst: std::num::NonZeroU32::new(burst).unwrap(),
        })
    };
    let limits = berthd::auth::RateLimits { writes: None, reads: limit(4), teams: limit(6) };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let auth = berthd::auth::Auth::with_limits(common::verifier(None), limits);
    let app = berthd::app(berthd::state::AppState::new(db, auth));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// A team's budget pays only for callers who may read the team: a member of another team
/// sending requests on its paths (answered 404) spends only its own budget, and a request
/// the caller's own budget refuses costs the team nothing. Before, anyone could spend a
/// team's budget and lock its members out with 429s.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_team_budget_pays_only_for_its_own_callers(db: berth_store::PgPool) {
    let base = serve_with_budgets(db).await;
    let client = reqwest::Client::new();
    let get = async |token: &str, path: &str| {
        client.get(format!("{base}{path}")).bearer_auth(token).send().await.unwrap().status().as_u16()
    };
    let admin = token("admin", &[(Role::PlatformAdmin, None)]);
    let put = async |path: &str, body: Value| {
        let r = client.put(format!("{base}{path}")).bearer_auth(&admin).json(&body).send().await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
    };
    put("/api/v1/flavors/h100", common::flavor("h100")).await;
    // (Each team's budget of 6 pays one for its PUT.)
    for team in ["alpha", "bravo", "charlie"] {
        put(&format!("/api/v1/teams/{team}"), TeamBody::new().quota("h100", 1, None, 1).json()).await;
    }

    // Three members of alpha, 10 requests each on bravo's paths: 404 until their own
    // budgets refuse.
    for outsider in ["a1", "a2", "a3"] {
        let t = token(outsider, &[(Role::Member, Some("alpha"))]);
        let mut statuses = Vec::new();
        for _ in 0..10 {
            statuses.push(get(&t, "/api/v1/teams/bravo/workloads").await);
        }
        assert!(statuses[..4].iter().all(|s| *s == 404) && statuses.contains(&429), "{statuses:?}");
    }
    // bravo's budget is whole: its member reads within it.
    let bob = token("bob", &[(Role::Member, Some("bravo"))]);
    for _ in 0..4 {
        assert_eq!(get(&bob, "/api/v1/teams/bravo/workloads").await, 200, "bravo's budget was spent by outsiders");
    }

    // A member of charlie past its own budget: its refused requests cost charlie nothing.
    let eve = token("eve", &[(Role::Member, Some("charlie"))]);
    let mut statuses = Vec::new();
    for _ in 0..10 {
        statuses.push(get(&eve, "/api/v1/teams/charlie/workloads").await);
    }
    assert!(statuses[..4].iter().all(|s| *s == 200) && statuses.contains(&429), "{statuses:?}");
    let carl = token("carl", &[(Role::Member, Some("charlie"))]);
    assert_eq!(
        get(&carl, "/api/v1/teams/charlie/workloads").await,
        200,
        "eve's refused requests spent charlie's budget"
    );
}

/// A job's token counts against its workload's team wherever it calls, so a team's many
/// jobs buy it no more requests; and a path that names the team percent-encoded counts
/// against the team as the plain name does (the router serves it as the team's).
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn jobs_and_encoded_paths_count_against_their_team(db: berth_store::PgPool) {
    let base = serve_with_budgets(db).await;
    let client = reqwest::Client::new();
    let get = async |token: &str, path: &str| {
        client.get(format!("{base}{path}")).bearer_auth(token).send().await.unwrap().status().as_u16()
    };
    let admin = token("admin", &[(Role::PlatformAdmin, None)]);
    for (path, body) in [
        ("/api/v1/flavors/h100", common::flavor("h100")),
        ("/api/v1/teams/jobs", TeamBody::new().quota("h100", 1, None, 1).json()),
        ("/api/v1/teams/bravo", TeamBody::new().quota("h100", 1, None, 1).json()),
    ] {
        let r = client.put(format!("{base}{path}")).bearer_auth(&admin).json(&body).send().await.unwrap();
        assert!(r.status().is_success(), "{path}: {}", r.status());
    }

    // Three jobs of team jobs, each within its own burst of 4, share the team's budget.
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let scope =
            berth_core::auth::WorkloadScope { uid: uuid::Uuid::now_v7(), attempt: 0, team: Some("jobs".into()) };
        let job = common::issuer().mint_workload(scope, std::time::Duration::from_secs(60)).token;
        for _ in 0..4 {
            statuses.push(get(&job, "/api/v1/flavors").await);
        }
    }
    assert!(
        statuses[..5].iter().all(|s| *s == 200) && statuses.contains(&429),
        "three jobs, one team budget: {statuses:?}"
    );

    // Three members of bravo, each within its own burst, on bravo's path spelled %62ravo.
    let mut statuses = Vec::new();
    for member in ["b1", "b2", "b3"] {
        let t = token(member, &[(Role::Member, Some("bravo"))]);
        for _ in 0..4 {
            statuses.push(get(&t, "/api/v1/teams/%62ravo/workloads").await);
        }
    }
    assert!(statuses[..5].iter().all(|s| *s == 200) && statuses.contains(&429), "{statuses:?}");
}

/// However many connections a client opens, berthd serves a bounded number of API requests
/// at once (each may build up to a page budget): the rest wait their turn.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn api_requests_beyond_the_concurrency_limit_wait_their_turn(db: berth_store::PgPool) {
    use tokio::io::AsyncWriteExt;
    let limits = berthd::server::ConnectionLimits {
        request: std::time::Duration::from_secs(5),
        concurrent: 1,
        ..berthd::server::ConnectionLimits::default()
    };
    let addr = serve_with_limits(db, limits).await;
    let admin = token("admin", &[(Role::PlatformAdmin, None)]);
    // A request that holds the one slot: its body never comes (until its request time
    // runs out).
    let mut holder = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "PUT /api/v1/flavors/x HTTP/1.1\r\nHost: berth\r\nAuthorization: Bearer {admin}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    let holder_started = std::time::Instant::now();
    holder.write_all(head.as_bytes()).await.unwrap();
    let base = format!("http://{addr}");
    // Once the holder has the slot, a short request gets no answer: wait for that.
    let held = async {
        loop {
            let probe = reqwest::Client::new().get(format!("{base}/api/v1/me")).bearer_auth(&admin);
            match probe.timeout(std::time::Duration::from_millis(200)).send().await {
                Err(e) if e.is_timeout() => return,
                _ => {}
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(4), held).await.expect("the holder takes the one slot");
    let waited = reqwest::Client::new().get(format!("{base}/api/v1/me")).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(waited.status(), 200);
    // It was answered only once the holder's request time (5 s) had run out.
    let freed = holder_started + std::time::Duration::from_secs(5);
    let early = std::time::Duration::from_millis(500);
    assert!(std::time::Instant::now() + early >= freed, "it did not wait for the slot");
}

/// Any method name a client makes up counts as `other`: before, each became a metrics
/// series kept for ever, and an unauthenticated flood grew /metrics to 98 MB.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn made_up_methods_add_no_metrics_series(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    for i in 0..20 {
        let method = Method::from_bytes(format!("FLOOD{i}XYZ").as_bytes()).unwrap();
        reqwest::Client::new().request(method, s.url("/healthz")).send().await.unwrap();
    }
    let metrics = reqwest::Client::new().get(s.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(!metrics.contains("FLOOD"), "a made-up method became a label");
    assert!(metrics.contains("method=\"other\""), "they are counted, as other");
}
