//! A database named by several hosts (`DATABASE_URL` as libpq lists them).

/// Two hosts that both accept writes are refused, naming both: a failed primary started
/// again as a primary beside the promoted standby, where a restarted berthd took the first
/// listed and acknowledged writes the surviving primary never had. (One server listed
/// twice, as here, looks the same from outside.) One host alone, or read-write listed
/// with nothing else, connects.
#[tokio::test]
async fn two_writable_hosts_are_refused_naming_both() {
    let url = std::env::var("DATABASE_URL").expect("DATABASE_URL must be set");
    let (start, rest) = url.split_once('@').expect("a URL with a user");
    let (host, path) = rest.split_once('/').expect("a URL with a database");
    let (name, port) = host.rsplit_once(':').unwrap_or((host, "5432"));
    let other = if name == "localhost" { "127.0.0.1" } else { "localhost" };
    let database = path.split('?').next().unwrap_or(path);
    let twice = format!("{start}@{name}:{port},{other}:{port}/{database}?target_session_attrs=read-write");
    let refused = berth_store::connect(&twice, 2).await.expect_err("two writable hosts");
    let message = refused.to_string();
    assert!(message.contains(&format!("{name}:{port} and {other}:{port} all accept writes")), "{message}");
    let once = format!("{start}@{name}:{port}/{database}?target_session_attrs=read-write");
    let pool = berth_store::connect(&once, 2).await.expect("one writable host");
    berth_store::ping(&pool).await.expect("usable");
}
