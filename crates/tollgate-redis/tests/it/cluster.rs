//! `redis+cluster://`: one script per hash slot, concurrently; a denial in one slot undoes the
//! reservations made in the others; never over-admit (invariants 1 to 3 on a Cluster).
//!
//! The tests share one cluster (each under its own keys); the last to finish stops it. The
//! failover test has a cluster of its own (see `cluster_failover.rs`).

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, Weak, mpsc},
    thread,
    time::Duration,
};

use redis::{AsyncCommands, cluster::ClusterClient, cluster_async::ClusterConnection};
use tokio::sync::Barrier;
use tollgate::{Algorithm, BanRule, BanStore, BanTarget, ban_index_key};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisCluster;

use crate::support::{CheckPlan, PlanBan, PlanExt, PlanLimiter, limiter, plan, rule};

static CLUSTER: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());

/// One cluster while any test here runs.
pub(crate) fn shared_cluster() -> Arc<RedisCluster> {
    let mut slot = CLUSTER.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(cluster) = slot.upgrade() {
        return cluster;
    }
    let cluster = Arc::new(RedisCluster::start());
    *slot = Arc::downgrade(&cluster);
    cluster
}

/// A production store (each node's `TIME`), with a timeout generous enough for a busy machine.
async fn store(cluster: &RedisCluster) -> RedisStore {
    RedisStore::builder(&cluster.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap()
}

/// A plain cluster connection, for inspecting keys.
async fn raw(cluster: &RedisCluster) -> ClusterConnection {
    ClusterClient::new(cluster.urls())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

/// `n` hash tags `name0`, `name1`, ... whose slots are served by `n` different primaries.
fn tags_on_distinct_primaries(cluster: &RedisCluster, name: &str, n: usize) -> Vec<String> {
    let mut tags: Vec<String> = Vec::new();
    let mut primaries = Vec::new();
    for i in 0.. {
        let tag = format!("{name}{i}");
        let primary = cluster
            .primary_for_slot(cluster.slot_of(&tag))
            .expect("every slot is served");
        if !primaries.contains(&primary) {
            primaries.push(primary);
            tags.push(tag);
        }
        if tags.len() == n {
            return tags;
        }
    }
    unreachable!()
}

/// Fires `n` checks of `plan` at once; returns how many were admitted.
async fn fire(store: &RedisStore, plan: &CheckPlan, n: usize) -> usize {
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let (store, plan, barrier) = (store.clone(), plan.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.check_plan(&plan).await.unwrap().allowed
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += usize::from(task.await.unwrap());
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_slots_on_three_primaries_admit_exactly_the_limit() {
    let cluster = shared_cluster();
    let store = store(&cluster).await;
    let mut conn = raw(&cluster).await;
    let tags = tags_on_distinct_primaries(&cluster, "exact", 3);
    let key = |i: usize| format!("cc:{{{}}}", tags[i]);
    // The sliding log decides; the others have room for every check, so no reservation of a
    // denied check can deny another one, and the count is exact.
    let p = plan(
        1,
        &[
            limiter(&key(0), &[rule("100/1h", Algorithm::SlidingLog)]),
            limiter(&key(1), &[rule("1000/1h", Algorithm::FixedWindow)]),
            limiter(&key(2), &[rule("1000/1h", Algorithm::Gcra)]),
        ],
    );
    assert_eq!(fire(&store, &p, 500).await, 100);
    let log: u64 = conn.zcard(format!("{}:l", key(0))).await.unwrap();
    assert_eq!(log, 100);
    let fixed: String = conn.get(format!("{}:f1000/3600000", key(1))).await.unwrap();
    assert!(
        fixed.ends_with(":100"),
        "denied checks left {fixed} in the counter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tight_slots_never_over_admit() {
    let cluster = shared_cluster();
    let store = store(&cluster).await;
    let mut conn = raw(&cluster).await;
    let tags = tags_on_distinct_primaries(&cluster, "tight", 3);
    let key = |i: usize| format!("cc:{{{}}}", tags[i]);
    // Every limiter is close to the limit: reservations of denied checks are seen by others
    // for a round trip (extra denials allowed), yet nothing may pass a limit.
    let p = plan(
        1,
        &[
            limiter(&key(0), &[rule("100/1h", Algorithm::SlidingLog)]),
            limiter(&key(1), &[rule("105/1h", Algorithm::FixedWindow)]),
            limiter(&key(2), &[rule("110/1h", Algorithm::SlidingLog)]),
        ],
    );
    let admitted = fire(&store, &p, 500).await;
    println!("three tight slots: {admitted} of 500 admitted under a limit of 100");
    assert!((1..=100).contains(&admitted), "{admitted}");
    // Every undo has run: each limiter counts exactly the admitted checks.
    let first: usize = conn.zcard(format!("{}:l", key(0))).await.unwrap();
    let third: usize = conn.zcard(format!("{}:l", key(2))).await.unwrap();
    let fixed: String = conn.get(format!("{}:f105/3600000", key(1))).await.unwrap();
    assert_eq!((first, third), (admitted, admitted));
    assert!(fixed.ends_with(&format!(":{admitted}")), "{fixed}");
}

#[tokio::test]
async fn a_denial_in_one_slot_restores_every_algorithm_in_the_others() {
    let cluster = shared_cluster();
    let store = store(&cluster).await;
    let mut conn = raw(&cluster).await;
    let tags = tags_on_distinct_primaries(&cluster, "undo", 2);
    let roomy = format!("ud:{{{}}}", tags[0]);
    let tight = format!("ud:{{{}}}", tags[1]);
    let rules = [
        rule("10/1h", Algorithm::SlidingLog),
        rule("10/1h", Algorithm::FixedWindow),
        rule("10/1h", Algorithm::Gcra),
    ];
    let p = plan(
        2,
        &[
            limiter(&roomy, &rules),
            limiter(&tight, &[rule("3/1h", Algorithm::SlidingLog)]),
        ],
    );
    assert!(store.check_plan(&p).await.unwrap().allowed);
    let state = |conn: &mut ClusterConnection| {
        let (l, f, g) = (
            format!("{roomy}:l"),
            format!("{roomy}:f10/3600000"),
            format!("{roomy}:g10/3600000"),
        );
        let mut conn = conn.clone();
        async move {
            let members: Vec<Vec<u8>> = conn.zrange(&l, 0, -1).await.unwrap();
            let fixed: String = conn.get(&f).await.unwrap();
            let gcra: String = conn.get(&g).await.unwrap();
            (members, fixed, gcra)
        }
    };
    let before = state(&mut conn).await;
    assert_eq!(before.0.len(), 2);

    // The tight limiter has 1 unit left: denied; the roomy one admitted in its slot, then was
    // restored exactly (same members, same counter, same tat).
    let denied = store.check_plan(&p).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(state(&mut conn).await, before);
    // The roomy rules show the state as it stays: 8 left, not 6.
    let remaining: Vec<u64> = denied.rules.iter().map(|r| r.remaining).collect();
    assert_eq!(remaining, [8, 8, 8, 1]);
    assert!(!denied.rules[3].allowed);
}

#[tokio::test]
async fn a_live_ban_undoes_the_reservations_and_a_denial_bans() {
    let cluster = shared_cluster();
    let store = store(&cluster).await;
    let mut conn = raw(&cluster).await;
    let tags = tags_on_distinct_primaries(&cluster, "ban", 2);
    let target = BanTarget::UserId(format!("banned-{}", tags[0]));
    let bans = vec![PlanBan {
        key: target.key("bn"),
        target: target.clone(),
    }];
    let mut banning = limiter(
        &format!("bn:{{{}}}", tags[0]),
        &[rule("1/1h", Algorithm::SlidingLog)],
    );
    banning.ban = Some(BanRule::new(Duration::from_secs(60)));
    let other = limiter(
        &format!("bn:{{{}}}", tags[1]),
        &[rule("10/1h", Algorithm::FixedWindow)],
    );
    let p = CheckPlan::new(1, true, vec![banning, other]).with_bans(bans, ban_index_key("bn"));

    assert!(store.check_plan(&p).await.unwrap().allowed);
    // Denied by the first limiter, which bans: the ban is written in its key's slot, and
    // listed in the index's ({ban}).
    let denied = store.check_plan(&p).await.unwrap();
    assert!(!denied.allowed);
    let banned = denied.banned_us.expect("the denial bans");
    assert!(banned > 59_000_000 && banned <= 60_000_000, "{banned}");
    // Banned: blocked, and the slots that admitted are undone.
    let blocked = store.check_plan(&p).await.unwrap();
    assert!(blocked.blocked_us.is_some() && blocked.rules.is_empty());
    let fixed: String = conn
        .get(format!("bn:{{{}}}:f10/3600000", tags[1]))
        .await
        .unwrap();
    assert!(fixed.ends_with(":1"), "{fixed}");
    let listed = store.bans("bn").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].target, target);
    // Counted and paged from the index in the {ban} slot, read from the ban's own.
    assert_eq!(store.ban_count("bn").await.unwrap(), 1);
    let page = store.bans_page("bn", None, 10).await.unwrap();
    assert_eq!(page.bans.len(), 1);
    assert_eq!(page.bans[0].target, target);
    assert_eq!(page.next, None);
}

#[tokio::test]
async fn nodes_that_lost_their_scripts_run_them_from_source() {
    let cluster = shared_cluster();
    let store = store(&cluster).await;
    let tags = tags_on_distinct_primaries(&cluster, "flush", 2);
    let p = plan(
        1,
        &[
            limiter(
                &format!("fl:{{{}}}", tags[0]),
                &[rule("5/1h", Algorithm::SlidingLog)],
            ),
            limiter(
                &format!("fl:{{{}}}", tags[1]),
                &[rule("1/1h", Algorithm::Gcra)],
            ),
        ],
    );
    assert!(store.check_plan(&p).await.unwrap().allowed);
    for port in cluster.live_ports() {
        let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut node)
            .await
            .unwrap();
    }
    // check.lua on both slots, then undo.lua on the first: all loaded again by EVAL.
    let denied = store.check_plan(&p).await.unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.rules[0].remaining, 4);
}

/// Watches one node with `redis-cli monitor`; lines arrive on the receiver.
fn monitor(port: u16) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "monitor"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli must be on PATH (it comes with redis-server)");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), "OK");
    (child, rx)
}

/// The commands (first word) that clients sent the primaries with `marker` in them, while
/// `run` ran; the scripts' own commands are left out.
async fn commands_sent(
    cluster: &RedisCluster,
    marker: &str,
    run: impl std::future::Future<Output = ()>,
) -> Vec<String> {
    let watchers: Vec<(u16, Child, mpsc::Receiver<String>)> = cluster
        .primaries()
        .into_iter()
        .map(|port| {
            let (child, lines) = monitor(port);
            (port, child, lines)
        })
        .collect();
    run.await;
    let end = format!("{marker}-end-of-checks");
    let mut sent = Vec::new();
    for (port, mut child, lines) in watchers {
        let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: String = redis::cmd("ECHO")
            .arg(&end)
            .query_async(&mut node)
            .await
            .unwrap();
        loop {
            let line = lines
                .recv_timeout(Duration::from_secs(10))
                .expect("the monitor never saw the end marker");
            if line.contains(&end) {
                break;
            }
            if line.contains("lua]") || !line.contains(marker) {
                continue;
            }
            let command = line
                .split_once("] \"")
                .and_then(|(_, rest)| rest.split('"').next())
                .unwrap_or(&line)
                .to_lowercase();
            sent.push(command);
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    sent.sort();
    sent
}

#[tokio::test]
async fn one_slot_is_one_evalsha_and_several_slots_one_each() {
    let cluster = shared_cluster();
    let store = store(&cluster).await;
    let tags = tags_on_distinct_primaries(&cluster, "count", 3);
    let one_slot = |name: &str| -> Vec<PlanLimiter> {
        vec![
            limiter(
                &format!("{name}:{{{}}}:ip", tags[0]),
                &[
                    rule("50/1m", Algorithm::SlidingLog),
                    rule("80/1h", Algorithm::FixedWindow),
                ],
            ),
            limiter(
                &format!("{name}:{{{}}}:user", tags[0]),
                &[
                    rule("60/1m", Algorithm::SlidingLog),
                    rule("90/1h", Algorithm::Gcra),
                ],
            ),
        ]
    };

    // Two limiters sharing a hash tag: one EVALSHA per check, as on a standalone server.
    let p = CheckPlan::new(1, true, one_slot("mon1"));
    let sent = commands_sent(&cluster, "mon1:", async {
        for _ in 0..10 {
            assert!(store.check_plan(&p).await.unwrap().allowed);
        }
    })
    .await;
    assert_eq!(sent, vec!["evalsha"; 10]);

    // Three slots, admitted: one EVALSHA per slot, nothing else.
    let three = plan(
        1,
        &(0..3)
            .map(|i| {
                limiter(
                    &format!("mon2:{{{}}}", tags[i]),
                    &[rule("5/1m", Algorithm::SlidingLog)],
                )
            })
            .collect::<Vec<_>>(),
    );
    let sent = commands_sent(&cluster, "mon2:", async {
        for _ in 0..5 {
            assert!(store.check_plan(&three).await.unwrap().allowed);
        }
    })
    .await;
    assert_eq!(sent, vec!["evalsha"; 15]);

    // Denied by all three: nothing to undo, still one call per slot.
    let sent = commands_sent(&cluster, "mon2:", async {
        assert!(!store.check_plan(&three).await.unwrap().allowed);
    })
    .await;
    assert_eq!(sent, vec!["evalsha"; 3]);
}

#[tokio::test]
async fn acl_users_and_passwords_come_from_the_url() {
    let cluster = shared_cluster();
    // An ACL user on every node; the default user stays open for the other tests.
    for port in cluster.live_ports() {
        let mut node = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("ACL")
            .arg(&["SETUSER", "tgapp", "on", ">app%pass", "~*", "+@all"])
            .query_async(&mut node)
            .await
            .unwrap();
    }
    let seeds: Vec<String> = cluster
        .urls()
        .iter()
        .map(|u| {
            u.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    let url = format!("redis+cluster://tgapp:app%25pass@{}", seeds.join(","));
    let store = RedisStore::connect(&url).await.unwrap();
    let tags = tags_on_distinct_primaries(&cluster, "acl", 2);
    let p = plan(
        1,
        &[
            limiter(
                &format!("acl:{{{}}}", tags[0]),
                &[rule("1/1h", Algorithm::SlidingLog)],
            ),
            limiter(
                &format!("acl:{{{}}}", tags[1]),
                &[rule("5/1h", Algorithm::FixedWindow)],
            ),
        ],
    );
    assert!(store.check_plan(&p).await.unwrap().allowed);
    assert!(!store.check_plan(&p).await.unwrap().allowed);

    let wrong = format!("redis+cluster://tgapp:nope@{}", seeds.join(","));
    let err = RedisStore::connect(&wrong).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(!format!("{err:?} {err}").contains("nope"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_one_slot_are_batched_and_admit_exactly_the_limit() {
    let cluster = shared_cluster();
    let store = RedisStore::builder(&cluster.url())
        .timeout(Duration::from_secs(10))
        .local_cache(false)
        .build()
        .await
        .unwrap();
    let tags = tags_on_distinct_primaries(&cluster, "batch", 1);
    // Two limiters in one slot, the first over its limit half way.
    let p = CheckPlan::new(
        1,
        true,
        vec![
            limiter(
                &format!("bsl:{{{}}}:ip", tags[0]),
                &[rule("100/1h", Algorithm::SlidingLog)],
            ),
            limiter(
                &format!("bsl:{{{}}}:user", tags[0]),
                &[rule("1000/1h", Algorithm::Gcra)],
            ),
        ],
    );
    let mut admitted = 0;
    let sent = commands_sent(&cluster, "bsl:", async {
        for _ in 0..4 {
            admitted += fire(&store, &p, 50).await;
        }
    })
    .await;
    assert_eq!(admitted, 100);
    println!("200 one-slot checks, 50 in flight: {} calls", sent.len());
    // (`eval` when a test beside this one has just flushed the nodes' scripts)
    assert!(
        sent.iter().all(|c| c == "evalsha" || c == "eval"),
        "{sent:?}"
    );
    assert!(sent.len() < 200 / 2, "{} calls for 200 checks", sent.len());
}

/// Script calls (`EVALSHA` and `EVAL`) each primary of `cluster` has served since its stats
/// were last reset.
async fn script_calls_per_primary(cluster: &RedisCluster) -> Vec<(u16, u64)> {
    let mut calls = Vec::new();
    for port in cluster.primaries() {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        let n: u64 = info
            .lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split_once("calls=")?
                    .1
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        calls.push((port, n));
    }
    calls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_blocklist_on_no_primary_serves_most_checks() {
    // A cluster of its own: the per-node counts are this test's calls only.
    let cluster = RedisCluster::start();
    let store = store(&cluster).await;
    let gate = tollgate::Tollgate::new(store.clone());
    let policy = tollgate::Policy::builder("spread")
        .limiter(
            tollgate::Limiter::new(
                tollgate::Dimension::Ip,
                [rule("100/1h", Algorithm::SlidingLog)],
            )
            .with_blocklist(BanRule::new(Duration::from_secs(60))),
        )
        .build()
        .unwrap();
    for port in cluster.primaries() {
        let mut conn = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // Random identities: an IP and a user id each, so every check reads two ban keys beside
    // its limiter.
    let checks = 600;
    for i in 0..checks {
        let ip: std::net::IpAddr = format!("10.{}.{}.{}", i % 7, i / 7 % 250, rand::random::<u8>())
            .parse()
            .unwrap();
        let who = tollgate::Identity::new()
            .with_ip(ip)
            .with_user_id(format!("user-{}", rand::random::<u64>()));
        let decision = gate.check(&policy, &who, 1).await.unwrap();
        assert!(decision.allowed(), "{decision:?}");
    }
    let calls = script_calls_per_primary(&cluster).await;
    let total: u64 = calls.iter().map(|(_, n)| n).sum();
    // The limiter's slot, and each target's ban key's: three calls per check (two when both
    // ban keys happen to share a slot).
    assert!(total > 2 * checks && total <= 3 * checks, "{calls:?}");
    for (port, n) in &calls {
        assert!(
            *n * 2 <= total,
            "primary {port} served {n} of {total} script calls: {calls:?}"
        );
    }
    // Bans written on such a cluster are listed and counted from the index.
    let target = BanTarget::UserId("mallory".into());
    store
        .ban("tg", &target, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(store.ban_count("tg").await.unwrap(), 1);
    let page = store.bans_page("tg", None, 10).await.unwrap();
    assert_eq!(page.bans.len(), 1);
    assert_eq!(page.bans[0].target, target);
    assert!(store.unban("tg", &target).await.unwrap());
    assert_eq!(store.ban_count("tg").await.unwrap(), 0);
}

/// An override's index entry lives in a slot of its own on a Cluster, written by commands apart
/// from the override's: sets (one that never ends, one that does) and removes racing on one
/// key from several tasks leave it saying what the override does (its end, `inf` for never, or
/// no entry once it is gone), whichever write lands last.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_sets_and_removes_leave_the_index_as_the_override_stands() {
    use tollgate::{Dimension, Identity, Limiter, Policy, Tollgate, key};

    let cluster = shared_cluster();
    let gate = Arc::new(Tollgate::new(store(&cluster).await).with_prefix("ovrace"));
    let policy = Arc::new(
        Policy::builder("race")
            .limiter(
                Limiter::new(Dimension::UserId, [rule("5/1m", Algorithm::FixedWindow)])
                    .with_overrides(true),
            )
            .build()
            .unwrap(),
    );
    let raised = [rule("50/1m", Algorithm::FixedWindow)];
    let mut conn = raw(&cluster).await;
    let index = key::override_index_key(gate.prefix());
    for round in 0..30 {
        let value = format!("u{round}");
        let writers = 6;
        let barrier = Arc::new(Barrier::new(writers));
        let tasks: Vec<_> = (0..writers)
            .map(|i| {
                let (gate, policy, barrier) = (gate.clone(), policy.clone(), barrier.clone());
                let who = Identity::new().with_user_id(value.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    match i % 3 {
                        0 => drop(
                            gate.set_override(&policy, "user_id", &who, &raised, None)
                                .await,
                        ),
                        1 => {
                            let ttl = Some(Duration::from_secs(600));
                            drop(
                                gate.set_override(&policy, "user_id", &who, &raised, ttl)
                                    .await,
                            )
                        }
                        _ => drop(gate.remove_override(&policy, "user_id", &who).await),
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        let base = key::limiter_key(gate.prefix(), "race", "user_id", &value);
        let override_key = key::override_key(&base);
        let stored: Option<String> = conn.get(&override_key).await.unwrap();
        let listed: Option<String> = redis::cmd("ZSCORE")
            .arg(&index)
            .arg(&override_key)
            .query_async(&mut conn)
            .await
            .unwrap();
        // "fingerprint:ends:limits\n...": the end, 0 for never.
        let ends = stored.map(|v| match v.split(':').nth(1).unwrap() {
            "0" => "inf".to_owned(),
            ends => ends.to_owned(),
        });
        assert_eq!(
            listed, ends,
            "round {round}: the index entry against the override"
        );
    }
}
