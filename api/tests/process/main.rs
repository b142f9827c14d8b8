//! Tests of real berthd processes: crashes at random points, and two replicas on one
//! database. They need Postgres (DATABASE_URL, as scripts/test sets up).

mod support;

use std::time::{Duration, Instant};

use berth_store::PgPool;
use support::{Berthd, Lcg};

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn killing_berthd_during_a_burst_loses_and_duplicates_nothing(db: PgPool) {
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-crash-{}", uuid::Uuid::now_v7()));
    let world = support::seed(&db).await;
    let mut berthd = Berthd::start(&url, "crash-0", &dir);
    let submitter = {
        let db = db.clone();
        tokio::spawn(async move {
            let mut rng = Lcg(42);
            for i in 0..500 {
                support::submit(&db, &mut rng, i).await;
                // Paced, so the burst spans the kills below.
                tokio::time::sleep(Duration::from_millis(8)).await;
            }
        })
    };
    let mut rng = Lcg(7);
    for restart in 1..=6 {
        // A random point in the burst: the kill itself is what is under test.
        tokio::time::sleep(Duration::from_millis(300 + rng.below(1200))).await;
        berthd.kill();
        berthd = Berthd::start(&url, &format!("crash-{restart}"), &dir);
    }
    submitter.await.unwrap();
    support::wait_all_final(&db, Duration::from_secs(240)).await;

    let admissions = support::check_history(&db, &world).await;
    let jobs = support::check_jobs(&db, &dir).await;
    let phases: Vec<(String, i64)> =
        sqlx::query_as("SELECT phase, count(*) FROM workloads GROUP BY phase ORDER BY 1").fetch_all(&db).await.unwrap();
    println!("after 6 kills: {phases:?}, {admissions} admissions, {jobs} backend jobs");
    assert_eq!(phases.iter().map(|(_, n)| n).sum::<i64>(), 500, "no workload lost");
    assert!(admissions >= 500 && jobs >= 500);
    berthd.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

#[sqlx::test(migrator = "berth_store::MIGRATOR")]
async fn one_of_two_replicas_leads_and_the_other_takes_over_when_it_dies(db: PgPool) {
    let url = support::database_url(&db);
    let dir = std::env::temp_dir().join(format!("berth-replicas-{}", uuid::Uuid::now_v7()));
    support::seed(&db).await;
    let first = Berthd::start(&url, "replica-1", &dir);
    let leader = wait_for_leader(&first, Duration::from_secs(30)).await;
    assert_eq!(leader, "replica-1");
    let second = Berthd::start(&url, "replica-2", &dir);
    let mut rng = Lcg(3);
    for i in 0..150 {
        support::submit(&db, &mut rng, i).await;
    }
    // Work flows under the first replica before the second's view is checked.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let started: i64 = sqlx::query_scalar("SELECT count(*) FROM workloads WHERE phase IN ('Running', 'Succeeded')")
            .fetch_one(&db)
            .await
            .unwrap();
        let reports = second.controllers().await["controllers"].as_array().map_or(0, Vec::len);
        if started > 0 && reports > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no work started under the first replica");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let overview = second.controllers().await;
    assert_eq!(overview["leader"]["holder"], "replica-1", "the first replica still leads");
    let holders: Vec<&str> =
        overview["controllers"].as_array().unwrap().iter().map(|c| c["holder"].as_str().unwrap()).collect();
    assert!(
        !holders.is_empty() && holders.iter().all(|h| *h == "replica-1"),
        "only the leader runs controllers: {holders:?}"
    );

    let killed = Instant::now();
    first.kill();
    let leader = wait_for_leader_other_than(&second, "replica-1", Duration::from_secs(30)).await;
    println!("replica-2 took over {:.1} s after replica-1 was killed", killed.elapsed().as_secs_f64());
    assert_eq!(leader, "replica-2");
    for i in 150..200 {
        support::submit(&db, &mut rng, i).await;
    }
    support::wait_all_final(&db, Duration::from_secs(240)).await;
    let dispatched_twice: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT object_uid, details ->> 'attempt' FROM events
         WHERE reason IN ('Dispatched', 'Running') AND details ->> 'from' = 'Admitted'
         GROUP BY 1, 2 HAVING count(*) > 1) twice",
    )
    .fetch_one(&db)
    .await
    .unwrap();
    assert_eq!(dispatched_twice, 0, "an attempt left Admitted twice");
    support::check_jobs(&db, &dir).await;
    second.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

async fn wait_for_leader(b: &Berthd, timeout: std::time::Duration) -> String {
    wait_for_leader_other_than(b, "", timeout).await
}

/// Polls until a leader other than `not` renews its lease.
async fn wait_for_leader_other_than(b: &Berthd, not: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let o = b.controllers().await;
        if let Some(holder) = o["leader"]["holder"].as_str()
            && holder != not
        {
            return holder.to_owned();
        }
        assert!(Instant::now() < deadline, "no new leader within {timeout:?}: {o}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
