//! Authentication, roles and tenant isolation over real HTTP: the attack table, JWKS
//! rotation, service accounts, rate limits, CORS and public routes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use berth_auth::{Jwks, OidcConfig};
use berth_core::auth::Role;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::Method;
use serde_json::{Value, json};

use crate::common::{self, LoggedBerthd, Server, TeamBody, WorkloadBody, flavor, sim_cluster, token};

const IDP: &str = "http://idp.test";
const KEY_A: &[u8] = include_bytes!("keys/a.pem");
const KEY_B: &[u8] = include_bytes!("keys/b.pem");
const PUBLIC_A: &[u8] = include_bytes!("keys/a.pub.pem");

/// Published keys: (kid, private key PEM; the JWKS carries its public half).
type Keys = Vec<(String, &'static [u8])>;

/// A stand-in identity provider: serves a JWKS that the test can swap, and counts fetches.
struct Idp {
    jwks_url: String,
    keys: Arc<Mutex<Keys>>,
    fetches: Arc<AtomicUsize>,
}

impl Idp {
    async fn start(keys: Keys) -> Self {
        let keys = Arc::new(Mutex::new(keys));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (k, f) = (keys.clone(), fetches.clone());
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let (k, f) = (k.clone(), f.clone());
                async move {
                    f.fetch_add(1, Ordering::SeqCst);
                    let keys = k.lock().unwrap().iter().map(|(kid, pem)| jwk(kid, pem)).collect();
                    axum::Json(JwkSet { keys })
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let jwks_url = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { jwks_url, keys, fetches }
    }

    fn jwks(&self, min_refresh: Duration) -> Jwks {
        Jwks::new(OidcConfig {
            issuer: IDP.into(),
            audience: "berth".into(),
            jwks_url: Some(self.jwks_url.clone()),
            algorithms: vec![Algorithm::RS256, Algorithm::ES256],
            min_refresh,
            refresh_every: Duration::from_secs(3600),
        })
    }
}

fn jwk(kid: &str, pem: &[u8]) -> Jwk {
    let mut jwk = Jwk::from_encoding_key(&EncodingKey::from_rsa_pem(pem).unwrap(), Algorithm::RS256).unwrap();
    jwk.common.key_id = Some(kid.into());
    jwk
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// A token from the stand-in provider, signed with `pem` under `kid`.
fn idp_token(sub: &str, kid: &str, pem: &[u8]) -> String {
    let claims = json!({"iss": IDP, "sub": sub, "aud": "berth", "exp": now() + 600, "iat": now()});
    let header = Header { kid: Some(kid.into()), ..Header::new(Algorithm::RS256) };
    jsonwebtoken::encode(&header, &claims, &EncodingKey::from_rsa_pem(pem).unwrap()).unwrap()
}

/// An HS256 token signed with Berth's own secret but with claims of the test's choosing.
fn berth_signed(claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(common::SECRET)).unwrap()
}

fn berth_claims(sub: &str) -> Value {
    json!({"iss": "berth", "sub": sub, "aud": "berth", "exp": now() + 600, "iat": now(),
           "grants": [{"role": "platform-admin"}]})
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(v).unwrap())
}

/// Flavors, research > {nlp, vision}, a workload in each child; alice (from the identity
/// provider) is bound as a member of nlp.
async fn world(s: &Server) {
    s.seed().await;
    s.put_ok("/api/v1/teams/vision", &TeamBody::new().parent("research").quota("h100", 4, Some(16), 1).json(), 201)
        .await;
    s.put_ok("/api/v1/teams/nlp/workloads/n1", &WorkloadBody::new().json(), 201).await;
    s.put_ok("/api/v1/teams/vision/workloads/v1", &WorkloadBody::new().json(), 201).await;
    let bind = json!({"subject": "alice", "role": "member", "team": "nlp"});
    let r = s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await;
    assert_eq!(r.status, 201, "{}", r.body);
}

/// One attack: what it is, the token, the request, and the exact status expected.
type Row = (&'static str, Option<String>, Method, &'static str, Option<Value>, u16);

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_attack_table(db: berth_store::PgPool) {
    let idp = Idp::start(vec![("a".into(), KEY_A)]).await;
    let s = Server::start_with(db, common::verifier(Some(idp.jwks(Duration::from_secs(3600)))), None).await;
    world(&s).await;
    let alice = idp_token("alice", "a", KEY_A);
    let bob = token("bob", &[(Role::TeamAdmin, Some("nlp"))]);
    let carol = token("carol", &[(Role::TeamAdmin, Some("research"))]);
    let viewer = token("vic", &[(Role::Viewer, None)]);

    // Positive controls: the same principals are let in where they belong.
    assert_eq!(s.send_as(Some(&alice), Method::GET, "/api/v1/teams/nlp/workloads/n1", None).await.status, 200);
    let mine = s.send_as(Some(&alice), Method::GET, "/api/v1/workloads", None).await;
    assert_eq!(mine.names(), ["n1"], "a member lists only its team's workloads");
    let teams = s.send_as(Some(&alice), Method::GET, "/api/v1/teams", None).await;
    assert_eq!(teams.names(), ["nlp"]);
    assert_eq!(s.send_as(Some(&viewer), Method::GET, "/api/v1/teams/vision/workloads/v1", None).await.status, 200);

    // A service-account token that works, then is revoked.
    let sa = s.send(Method::POST, "/api/v1/service-accounts", Some(&json!({"name": "ci", "team": "nlp"})), &[]).await;
    assert_eq!(sa.status, 201, "{}", sa.body);
    let bind = json!({"subject": "serviceaccount:ci", "role": "member", "team": "nlp"});
    assert_eq!(s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await.status, 201);
    let minted =
        s.send(Method::POST, "/api/v1/service-accounts/ci/tokens", Some(&json!({"ttl_seconds": 600})), &[]).await;
    assert_eq!(minted.status, 201, "{}", minted.body);
    let sa_token = minted.body["token"].as_str().unwrap().to_owned();
    assert_eq!(s.send_as(Some(&sa_token), Method::GET, "/api/v1/teams/nlp/workloads", None).await.status, 200);
    let id = minted.body["id"].as_str().unwrap();
    let revoke = s.send(Method::DELETE, &format!("/api/v1/service-accounts/ci/tokens/{id}"), None, &[]).await;
    assert_eq!(revoke.status, 200, "{}", revoke.body);

    let mut expired = berth_claims("eve");
    expired["exp"] = json!(now() - 3600);
    let mut early = berth_claims("eve");
    early["nbf"] = json!(now() + 3600);
    let mut wrong_iss = berth_claims("eve");
    wrong_iss["iss"] = json!("evil");
    let mut wrong_aud = berth_claims("eve");
    wrong_aud["aud"] = json!("someone-else");
    let none = format!("{}.{}.", b64(&json!({"alg": "none", "typ": "JWT"})), b64(&berth_claims("eve")));
    // The classic key confusion: HS256 keyed with the provider's *public* key.
    let idp_claims = json!({"iss": IDP, "sub": "eve", "aud": "berth", "exp": now() + 600, "iat": now()});
    let confused =
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &idp_claims, &EncodingKey::from_secret(PUBLIC_A)).unwrap();
    let member = token("mallory", &[(Role::Member, Some("nlp"))]);
    let parts: Vec<&str> = member.split('.').collect();
    let tampered = format!("{}.{}.{}", parts[0], b64(&berth_claims("mallory")), parts[2]);
    let unknown_kid = idp_token("alice", "zz", KEY_B);

    let too_big = TeamBody::new().parent("research").quota("h100", 32, Some(32), 2).json();
    let new_team = TeamBody::new().parent("research").quota("h100", 1, Some(2), 1).json();
    let binding = json!({"subject": "mallory", "role": "member", "team": "nlp"});
    let v = || Some(viewer.clone());
    let rows: Vec<Row> = vec![
        ("no token", None, Method::GET, "/api/v1/teams", None, 401),
        ("malformed token", Some("not-a-jwt".into()), Method::GET, "/api/v1/teams", None, 401),
        ("expired", Some(berth_signed(&expired)), Method::GET, "/api/v1/teams", None, 401),
        ("not yet valid", Some(berth_signed(&early)), Method::GET, "/api/v1/teams", None, 401),
        ("wrong issuer", Some(berth_signed(&wrong_iss)), Method::GET, "/api/v1/teams", None, 401),
        ("wrong audience", Some(berth_signed(&wrong_aud)), Method::GET, "/api/v1/teams", None, 401),
        ("alg none", Some(none), Method::GET, "/api/v1/teams", None, 401),
        ("HS256 signed with the RS256 public key", Some(confused), Method::GET, "/api/v1/teams", None, 401),
        ("tampered payload", Some(tampered), Method::GET, "/api/v1/teams", None, 401),
        ("unknown kid", Some(unknown_kid), Method::GET, "/api/v1/teams", None, 401),
        ("revoked service-account token", Some(sa_token), Method::GET, "/api/v1/teams/nlp/workloads", None, 401),
        (
            "member of nlp reads vision's workload",
            Some(alice.clone()),
            Method::GET,
            "/api/v1/teams/vision/workloads/v1",
            None,
            404,
        ),
        (
            "member of nlp lists vision's workloads",
            Some(alice.clone()),
            Method::GET,
            "/api/v1/teams/vision/workloads",
            None,
            404,
        ),
        ("member of nlp reads team vision", Some(alice.clone()), Method::GET, "/api/v1/teams/vision", None, 404),
        (
            "member of nlp updates vision's workload",
            Some(alice.clone()),
            Method::PUT,
            "/api/v1/teams/vision/workloads/v1",
            Some(WorkloadBody::new().gpus(2.0).json()),
            404,
        ),
        (
            "member of nlp deletes vision's workload",
            Some(alice.clone()),
            Method::DELETE,
            "/api/v1/teams/vision/workloads/v1",
            None,
            404,
        ),
        (
            "team-admin of nlp raises nlp's own guarantee above research's",
            Some(bob),
            Method::PUT,
            "/api/v1/teams/nlp",
            Some(too_big.clone()),
            403,
        ),
        (
            "team-admin of research raises child nlp above research's guarantee",
            Some(carol),
            Method::PUT,
            "/api/v1/teams/nlp",
            Some(too_big),
            422,
        ),
        ("viewer writes a flavor", v(), Method::PUT, "/api/v1/flavors/l40s", Some(flavor("l40s")), 403),
        ("viewer deletes a flavor", v(), Method::DELETE, "/api/v1/flavors/a100", None, 403),
        ("viewer creates a team", v(), Method::PUT, "/api/v1/teams/speech", Some(new_team), 403),
        ("viewer deletes a team", v(), Method::DELETE, "/api/v1/teams/vision", None, 403),
        ("viewer registers a cluster", v(), Method::PUT, "/api/v1/clusters/east", Some(sim_cluster("h100")), 403),
        ("viewer removes a cluster", v(), Method::DELETE, "/api/v1/clusters/east", None, 403),
        (
            "viewer submits a workload",
            v(),
            Method::PUT,
            "/api/v1/teams/nlp/workloads/w2",
            Some(WorkloadBody::new().json()),
            403,
        ),
        ("viewer deletes a workload", v(), Method::DELETE, "/api/v1/teams/nlp/workloads/n1", None, 403),
        ("viewer creates a role binding", v(), Method::POST, "/api/v1/role-bindings", Some(binding.clone()), 403),
        (
            "viewer creates a service account",
            v(),
            Method::POST,
            "/api/v1/service-accounts",
            Some(json!({"name": "x"})),
            403,
        ),
        ("viewer deletes a service account", v(), Method::DELETE, "/api/v1/service-accounts/ci", None, 403),
        (
            "viewer mints a service-account token",
            v(),
            Method::POST,
            "/api/v1/service-accounts/ci/tokens",
            Some(json!({"ttl_seconds": 60})),
            403,
        ),
        (
            "member creates a role binding",
            Some(alice.clone()),
            Method::POST,
            "/api/v1/role-bindings",
            Some(binding),
            403,
        ),
    ];
    let before = s.table_counts().await;
    for (attack, token, method, path, body, status) in rows {
        let reply = s.send_as(token.as_deref(), method, path, body.as_ref()).await;
        assert_eq!(reply.status.as_u16(), status, "{attack}: {}", reply.body);
        reply.assert_problem(status, None);
        if status == 401 {
            assert!(reply.headers.contains_key("www-authenticate"), "{attack}");
        }
        println!("{attack:<70} {status} {}", reply.body["detail"].as_str().unwrap_or(""));
    }
    assert_eq!(s.table_counts().await, before, "no refused request wrote anything");

    // A team outside one's reach answers exactly as a team that does not exist.
    let hidden = s.send_as(Some(&alice), Method::GET, "/api/v1/teams/vision/workloads/v1", None).await;
    let absent = s.send_as(Some(&alice), Method::GET, "/api/v1/teams/nowhere/workloads/v1", None).await;
    assert_eq!(hidden.body["title"], absent.body["title"]);
    assert_eq!(
        hidden.body["detail"].as_str().unwrap().replace("vision", "X"),
        absent.body["detail"].as_str().unwrap().replace("nowhere", "X")
    );
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn rotated_keys_are_picked_up_and_retired_ones_refused_without_a_restart(db: berth_store::PgPool) {
    let idp = Idp::start(vec![("a".into(), KEY_A)]).await;
    let s = Server::start_with(db, common::verifier(Some(idp.jwks(Duration::ZERO))), None).await;
    let bind = json!({"subject": "alice", "role": "viewer"});
    assert_eq!(s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await.status, 201);
    let get = |t: String| {
        let s = &s;
        async move { s.send_as(Some(&t), Method::GET, "/api/v1/teams", None).await.status.as_u16() }
    };
    assert_eq!(get(idp_token("alice", "a", KEY_A)).await, 200);
    assert_eq!(get(idp_token("alice", "b", KEY_B)).await, 401, "key b is not published yet");

    *idp.keys.lock().unwrap() = vec![("b".into(), KEY_B)];
    assert_eq!(get(idp_token("alice", "b", KEY_B)).await, 200, "the new key is fetched on first sight");
    assert_eq!(get(idp_token("alice", "a", KEY_A)).await, 401, "the retired key is refused");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn a_flood_of_unknown_kids_fetches_the_keys_once(db: berth_store::PgPool) {
    let idp = Idp::start(vec![("a".into(), KEY_A)]).await;
    let s = Server::start_with(db, common::verifier(Some(idp.jwks(Duration::from_secs(3600)))), None).await;
    for i in 0..50 {
        let bogus = idp_token("alice", &format!("bogus-{i}"), KEY_A);
        assert_eq!(s.send_as(Some(&bogus), Method::GET, "/api/v1/teams", None).await.status, 401);
    }
    assert_eq!(idp.fetches.load(Ordering::SeqCst), 1, "one fetch, then the refresh limit holds");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn service_accounts_act_under_their_own_name_and_tokens_are_shown_once(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let sa = json!({"name": "ci", "team": "nlp", "description": "the CI pipeline"});
    assert_eq!(s.send(Method::POST, "/api/v1/service-accounts", Some(&sa), &[]).await.status, 201);
    let again = s.send(Method::POST, "/api/v1/service-accounts", Some(&sa), &[]).await;
    again.assert_problem(409, Some("/name"));
    let bind = json!({"subject": "serviceaccount:ci", "role": "member", "team": "nlp"});
    assert_eq!(s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await.status, 201);
    let minted =
        s.send(Method::POST, "/api/v1/service-accounts/ci/tokens", Some(&json!({"ttl_seconds": 60})), &[]).await;
    let token = minted.body["token"].as_str().unwrap().to_owned();

    let me = s.send_as(Some(&token), Method::GET, "/api/v1/me", None).await;
    assert_eq!(me.body["subject"], "serviceaccount:ci");
    assert_eq!(me.body["service_account"], "ci");
    assert_eq!(me.body["grants"], json!([{"role": "member", "team": "nlp"}]));
    let put = s
        .send_as(Some(&token), Method::PUT, "/api/v1/teams/nlp/workloads/job", Some(&WorkloadBody::new().json()))
        .await;
    assert_eq!(put.status, 201, "{}", put.body);
    let audit = s.get("/api/v1/audit?kind=workload&name=job").await;
    assert_eq!(audit.body["items"][0]["actor"], "serviceaccount:ci", "the audit names the real actor");

    let listed = s.get("/api/v1/service-accounts/ci/tokens").await;
    let text = listed.body.to_string();
    assert!(!text.contains(&token) && !text.contains("\"token\""), "a token's text is never shown again");
    assert!(listed.body["items"][0]["last_used_at"].is_string(), "use is recorded: {text}");
    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT token_sha256 FROM service_account_tokens").fetch_one(&s.db).await.unwrap();
    assert_eq!(stored, berth_auth::token_sha256(&token), "only the hash is stored");

    // Deleting the account refuses its tokens at once.
    assert_eq!(s.delete("/api/v1/service-accounts/ci").await.status, 200);
    assert_eq!(s.send_as(Some(&token), Method::GET, "/api/v1/me", None).await.status, 401);
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn team_admins_manage_their_subtree_and_its_role_bindings(db: berth_store::PgPool) {
    let s = Server::start(db).await;
    s.seed().await;
    let bob = token("bob", &[(Role::TeamAdmin, Some("research"))]);
    let child = TeamBody::new().parent("nlp").quota("h100", 2, Some(4), 1).json();
    assert_eq!(s.send_as(Some(&bob), Method::PUT, "/api/v1/teams/llm", Some(&child)).await.status, 201);
    let root = TeamBody::new().quota("h100", 2, Some(4), 1).json();
    assert_eq!(s.send_as(Some(&bob), Method::PUT, "/api/v1/teams/rogue", Some(&root)).await.status, 403);
    let bind = json!({"subject": "dan", "role": "member", "team": "llm"});
    let created = s.send_as(Some(&bob), Method::POST, "/api/v1/role-bindings", Some(&bind)).await;
    assert_eq!(created.status, 201, "{}", created.body);
    let twice = s.send_as(Some(&bob), Method::POST, "/api/v1/role-bindings", Some(&bind)).await;
    twice.assert_problem(409, Some("/subject"));
    let broken = json!({"subject": "dan\nroot", "role": "member", "team": "llm"});
    s.send_as(Some(&bob), Method::POST, "/api/v1/role-bindings", Some(&broken))
        .await
        .assert_problem(422, Some("/subject"));
    let global = json!({"subject": "dan", "role": "viewer"});
    assert_eq!(s.send_as(Some(&bob), Method::POST, "/api/v1/role-bindings", Some(&global)).await.status, 403);
    let dan = token("dan", &[]);
    let me = s.send_as(Some(&dan), Method::GET, "/api/v1/me", None).await;
    assert_eq!(me.body["grants"], json!([{"role": "member", "team": "llm"}]), "bindings apply at the next request");
    let id = created.body["id"].as_str().unwrap();
    assert_eq!(s.send_as(Some(&bob), Method::DELETE, &format!("/api/v1/role-bindings/{id}"), None).await.status, 200);
    let me = s.send_as(Some(&dan), Method::GET, "/api/v1/me", None).await;
    assert_eq!(me.body["grants"], json!([]));
    let unknown = json!({"subject": "dan", "role": "member", "team": "ghost"});
    s.send(Method::POST, "/api/v1/role-bindings", Some(&unknown), &[]).await.assert_problem(422, Some("/team"));
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn writes_are_rate_limited_per_principal(db: berth_store::PgPool) {
    let limit = berthd::auth::RateLimit { per_second: 1.try_into().unwrap(), burst: 2.try_into().unwrap() };
    let s = Server::start_with(db, common::verifier(None), Some(limit)).await;
    let alice = token("alice", &[(Role::PlatformAdmin, None)]);
    let mut statuses = Vec::new();
    for i in 0..3 {
        let r = s.send_as(Some(&alice), Method::PUT, &format!("/api/v1/flavors/f{i}"), Some(&flavor("x"))).await;
        statuses.push(r.status.as_u16());
        if r.status == 429 {
            r.assert_problem(429, None);
            let after: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
            assert!((1..=2).contains(&after), "Retry-After {after}");
        }
    }
    assert_eq!(statuses, [201, 201, 429]);
    assert_eq!(
        s.send_as(Some(&alice), Method::GET, "/api/v1/flavors", None).await.status,
        200,
        "reads are not limited"
    );
    let other = s.put("/api/v1/flavors/g", &flavor("x")).await;
    assert_eq!(other.status, 201, "another principal has its own budget");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn public_routes_cors_and_dashboard_headers(db: berth_store::PgPool) {
    let s = Server::start(db.clone()).await;
    let plain = reqwest::Client::new();
    for path in ["/healthz", "/readyz", "/openapi.json", "/docs/", "/metrics", "/"] {
        let r = plain.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path} is public");
    }
    let page = plain.get(s.url("/")).send().await.unwrap();
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("default-src 'self'"));
    // Without configured origins there are no CORS headers.
    let r = plain.get(s.url("/healthz")).header("origin", "https://dash.example").send().await.unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let auth = berthd::auth::Auth::new(common::verifier(None), None);
    let http = berthd::state::HttpConfig {
        cors_origins: vec!["https://dash.example".parse().unwrap()],
        metrics_here: false,
        web_dir: None,
        ..berthd::state::HttpConfig::default()
    };
    let app = berthd::app(berthd::state::AppState::from(berthd::state::Shared {
        http,
        ..berthd::state::Shared::new(db, auth)
    }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let preflight = |origin: &'static str| {
        plain
            .request(Method::OPTIONS, format!("{base}/api/v1/teams"))
            .header("origin", origin)
            .header("access-control-request-method", "PUT")
            .header("access-control-request-headers", "authorization,content-type")
            .send()
    };
    let ok = preflight("https://dash.example").await.unwrap();
    assert_eq!(ok.headers()["access-control-allow-origin"], "https://dash.example");
    let other = preflight("https://evil.example").await.unwrap();
    assert!(!other.headers().contains_key("access-control-allow-origin"));
    let metrics = plain.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 404, "metrics moved off the API address");
}

#[test]
fn the_document_declares_the_bearer_scheme_on_every_api_route() {
    let doc: Value = serde_json::to_value(berthd::openapi::document()).unwrap();
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let secured = op["security"] == json!([{"bearer": []}]);
            assert_eq!(secured, path.starts_with("/api/"), "{method} {path}");
            checked += 1;
        }
    }
    assert!(checked > 30, "{checked} operations");
}

#[sqlx::test(migrations = false)]
async fn refused_tokens_and_secrets_never_reach_the_logs(
    _pool: sqlx::postgres::PgPoolOptions,
    options: sqlx::postgres::PgConnectOptions,
) {
    // The most verbose logging berthd has, so nothing is hidden by the level.
    let mut berthd =
        LoggedBerthd::start(&options, &[("RUST_LOG", "trace,hyper=info,h2=info"), ("BERTH_LOG_FORMAT", "json")]);
    let base = format!("http://{}", berthd.address);
    let http = reqwest::Client::new();
    let admin = token("admin", &[(Role::PlatformAdmin, None)]);
    let forged = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &berth_claims("eve"),
        &EncodingKey::from_secret(b"not-the-secret-not-the-secret-not-the"),
    )
    .unwrap();
    let mut expired = berth_claims("eve");
    expired["exp"] = json!(now() - 3600);
    let expired = berth_signed(&expired);
    let garbage = "garbage-token-value-1234567890";
    for bad in [forged.as_str(), expired.as_str(), garbage] {
        let r = http.get(format!("{base}/api/v1/teams")).bearer_auth(bad).send().await.unwrap();
        assert_eq!(r.status(), 401);
    }
    // A good request and a minted service-account token, whose text is in a response body.
    let r = http
        .post(format!("{base}/api/v1/service-accounts"))
        .bearer_auth(&admin)
        .json(&json!({"name": "ci"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let minted: Value = http
        .post(format!("{base}/api/v1/service-accounts/ci/tokens"))
        .bearer_auth(&admin)
        .json(&json!({"ttl_seconds": 60}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sa_token = minted["token"].as_str().unwrap().to_owned();
    let r = http.get(format!("{base}/api/v1/me")).bearer_auth(&sa_token).send().await.unwrap();
    assert_eq!(r.status(), 200);

    // Each refusal is logged, with its reason.
    for reason in ["bad_signature", "expired", "malformed"] {
        berthd.wait_for(|l| l["message"] == "authentication refused" && l["reason"] == reason);
    }
    berthd.stop();
    assert!(berthd.lines.len() > 20, "the trace level logs plenty: {} lines", berthd.lines.len());
    let log = berthd.lines.join("\n");
    let secret = std::str::from_utf8(common::SECRET).unwrap();
    for (what, needle) in [
        ("the forged token", forged.as_str()),
        ("the expired token", expired.as_str()),
        ("the garbage token", garbage),
        ("the admin token", admin.as_str()),
        ("the service-account token", sa_token.as_str()),
        ("the signing secret", secret),
    ] {
        assert!(!log.contains(needle), "{what} appears in the log");
        // Nor any signature part on its own.
        let signature = needle.rsplit('.').next().unwrap();
        assert!(signature.len() < 16 || !log.contains(signature), "{what}'s signature appears in the log");
    }
    assert!(!log.to_ascii_lowercase().contains("bearer "), "no Authorization header value is logged");
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn the_dashboard_build_is_served_with_its_assets(db: berth_store::PgPool) {
    let dir = std::env::temp_dir().join(format!("berth-web-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(dir.join("assets")).unwrap();
    std::fs::write(dir.join("index.html"), "<!doctype html><title>built</title>").unwrap();
    std::fs::write(dir.join("assets/app-1.js"), "console.log(1)").unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let auth = berthd::auth::Auth::new(common::verifier(None), None);
    let http = berthd::state::HttpConfig { web_dir: Some(dir.clone()), ..Default::default() };
    let app = berthd::app(berthd::state::AppState::from(berthd::state::Shared {
        http,
        ..berthd::state::Shared::new(db, auth)
    }));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let plain = reqwest::Client::new();
    let page = plain.get(format!("{base}/")).send().await.unwrap();
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    assert_eq!(page.text().await.unwrap(), "<!doctype html><title>built</title>");
    let script = plain.get(format!("{base}/assets/app-1.js")).send().await.unwrap();
    assert_eq!(script.status(), 200);
    assert!(script.headers()["content-type"].to_str().unwrap().contains("javascript"));
    assert_eq!(plain.get(format!("{base}/assets/nope.js")).send().await.unwrap().status(), 404);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Asks `GET /api/v1/me` as `token` until its grants are `want`, for at most five seconds.
async fn grants_become(s: &Server, token: &str, want: &serde_json::Value) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let me = s.send_as(Some(token), Method::GET, "/api/v1/me", None).await;
        if &me.body["grants"] == want {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Role bindings and the team tree are kept between requests; a change written by another
/// replica (here: straight into the database) still applies within moments, and a change
/// while the cache is not listening is never missed.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn bindings_and_teams_changed_elsewhere_apply_at_once(db: berth_store::PgPool) {
    let s = Server::start(db.clone()).await;
    s.seed().await;
    let bind = json!({"subject": "erin", "role": "member", "team": "nlp"});
    assert_eq!(s.send(Method::POST, "/api/v1/role-bindings", Some(&bind), &[]).await.status, 201);
    let erin = token("erin", &[]);
    let member = json!([{"role": "member", "team": "nlp"}]);
    assert!(grants_become(&s, &erin, &member).await);
    // Another replica revokes the binding: the next requests here stop carrying it.
    sqlx::query("DELETE FROM role_bindings WHERE subject = 'erin'").execute(&db).await.unwrap();
    assert!(grants_become(&s, &erin, &json!([])).await, "a binding revoked elsewhere is dropped");
    sqlx::query("INSERT INTO role_bindings (id, subject, issuer, role, team, created_by) VALUES (gen_random_uuid(), 'erin', 'berth', 'member', 'nlp', 'test')")
        .execute(&db)
        .await
        .unwrap();
    assert!(grants_become(&s, &erin, &member).await);

    // The tree: a team moved elsewhere is no longer readable through its old parent.
    let bob = token("bob", &[(Role::Viewer, Some("research"))]);
    assert_eq!(s.send_as(Some(&bob), Method::GET, "/api/v1/teams/nlp", None).await.status, 200);
    s.put_ok("/api/v1/teams/other", &TeamBody::new().json(), 201).await;
    sqlx::query("UPDATE teams SET parent_uid = (SELECT uid FROM teams WHERE name = 'other') WHERE name = 'nlp'")
        .execute(&db)
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while s.send_as(Some(&bob), Method::GET, "/api/v1/teams/nlp", None).await.status != 404 {
        assert!(std::time::Instant::now() < deadline, "a team moved elsewhere left its old parent's readers");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // The listening connection is killed, and the binding revoked before it is back: the
    // revocation still applies at once (well before entries expire), since the cache
    // serves only while it listens.
    let killed: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE 'LISTEN%'",
    )
    .fetch_all(&db)
    .await
    .unwrap();
    assert_eq!(killed, [true], "one listening connection");
    sqlx::query("DELETE FROM role_bindings WHERE subject = 'erin'").execute(&db).await.unwrap();
    assert!(berth_app::access_cache::KEPT_FOR > std::time::Duration::from_secs(5));
    assert!(grants_become(&s, &erin, &json!([])).await, "no binding outlives its revocation");
}

/// Pooled connections are not pinged before every use; one that sat idle through a lost
/// connection (a database restart, a dropped link) is, and the request does not fail.
#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn requests_survive_killed_database_connections(db: berth_store::PgPool) {
    let s = Server::start(db.clone()).await;
    s.seed().await;
    let killer = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*db.connect_options()).clone())
        .await
        .unwrap();
    let killed: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND query NOT LIKE 'LISTEN%') k",
    )
    .fetch_one(&killer)
    .await
    .unwrap();
    assert!(killed > 0, "the server's pooled connections were killed");
    // Idle at least as long as a connection must be before it is pinged again.
    tokio::time::sleep(berth_store::PING_IDLE_AFTER).await;
    for _ in 0..3 {
        let r = s.get("/api/v1/teams/nlp").await;
        assert_eq!(r.status, 200, "{}", r.body);
    }
}
