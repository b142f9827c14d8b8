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
    for (what, token) in [
        ("an unknown critical header", crit),
        ("issued an hour from now", signed(&hs256, &future)),
        ("an empty subject", signed(&hs256, &empty)),
        ("a blank subject", signed(&hs256, &blank)),
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
