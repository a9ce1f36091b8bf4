//! A failing store is a decision, not a crash (invariant 8): a dead server is answered by the
//! policy's `on_error` within the timeout, and a restarted one is used again.

use std::{
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tollgate::{Decision, Dimension, Identity, Limiter, OnError, Policy, Reason, Tollgate};
use tollgate_redis::RedisStore;
use tollgate_testkit::RedisServer;

/// Far above the 100 ms timeout: only a hang fails it.
const HANG: Duration = Duration::from_secs(3);

fn policy(scope: &str, on_error: OnError) -> Policy {
    Policy::builder(scope)
        .limiter(Limiter::new(Dimension::Ip, ["2/1m".parse().unwrap()]))
        .on_error(on_error)
        .build()
        .unwrap()
}

/// Awaits one engine call, failing the test if it does not return within [`HANG`].
async fn bounded(call: impl Future<Output = Result<Decision, tollgate::CheckError>>) -> Decision {
    let start = Instant::now();
    let decision = tokio::time::timeout(HANG, call)
        .await
        .expect("a check hung on a dead store")
        .unwrap();
    assert!(start.elapsed() < HANG);
    decision
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_server_is_answered_by_on_error_and_a_restarted_one_recovers() {
    let mut server = RedisServer::start();
    // Long enough for a loaded machine: the checks of a live server must be answered (a dead
    // one refuses at once).
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let gate = Arc::new(Tollgate::new(store));
    let who = Identity::new().with_ip("198.51.100.9".parse().unwrap());
    let allow = policy("fail_open", OnError::Allow);
    let deny = policy("fail_closed", OnError::Deny);
    let local = policy("fall_back", OnError::Local);
    assert_eq!(
        bounded(gate.check(&allow, &who, 1)).await.reason(),
        Reason::Ok
    );

    // Checks keep coming while the server dies.
    let running = Arc::new(AtomicBool::new(true));
    let background = {
        let (gate, who, running) = (gate.clone(), who.clone(), running.clone());
        let p = policy("background", OnError::Allow);
        tokio::spawn(async move {
            let mut reasons = Vec::new();
            while running.load(Ordering::Relaxed) {
                reasons.push(bounded(gate.check(&p, &who, 0)).await.reason());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            reasons
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.kill();

    for _ in 0..3 {
        let d = bounded(gate.check(&allow, &who, 1)).await;
        assert!(d.allowed());
        assert_eq!(d.reason(), Reason::StoreUnavailable);
        let d = bounded(gate.check(&deny, &who, 1)).await;
        assert!(!d.allowed());
        assert_eq!(d.reason(), Reason::StoreUnavailable);
    }
    // The in-memory fallback applies the same rules: 2 per minute.
    let fallback: Vec<Decision> = vec![
        bounded(gate.check(&local, &who, 1)).await,
        bounded(gate.check(&local, &who, 1)).await,
        bounded(gate.check(&local, &who, 1)).await,
    ];
    let allowed: Vec<bool> = fallback.iter().map(Decision::allowed).collect();
    assert_eq!(allowed, [true, true, false]);
    assert!(
        fallback
            .iter()
            .all(|d| d.reason() == Reason::StoreUnavailable)
    );
    assert!(fallback[2].retry_after().is_some());

    server.restart();
    // The connection comes back by itself (reconnect backoff is capped at 1 s).
    let mut recovered = None;
    for attempt in 0..100 {
        let d = bounded(gate.check(&allow, &who, 1)).await;
        if d.reason() == Reason::Ok {
            recovered = Some(attempt);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempt = recovered.expect("the store never recovered after the restart");
    println!("recovered after {attempt} failed attempts");
    // The restarted server is empty: its own count starts again.
    let d = bounded(gate.check(&deny, &who, 1)).await;
    assert_eq!(d.reason(), Reason::Ok);
    assert!(d.allowed());

    running.store(false, Ordering::Relaxed);
    let reasons = background.await.expect("the background checker panicked");
    assert!(reasons.contains(&Reason::StoreUnavailable), "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| matches!(r, Reason::Ok | Reason::StoreUnavailable)),
        "{reasons:?}"
    );
}

/// The local fallback is handed in (`Tollgate::with_local_fallback`): with the store down,
/// checks of `on_error = local` are counted there, and `Tollgate::run` says so (`Local`), as
/// every front end that prepares its own check sees it.
#[tokio::test]
async fn the_local_fallback_is_the_one_handed_in() {
    use tollgate::{Answered, CheckRequest, LimiterRequest, MemoryStore, Verdict};
    let mut server = RedisServer::start();
    let store = RedisStore::builder(&server.url())
        .timeout(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let fallback = MemoryStore::new();
    let gate = Tollgate::new(store).with_local_fallback(fallback.clone());
    server.kill();
    let who = Identity::new().with_ip("198.51.100.10".parse().unwrap());
    let d = bounded(gate.check(&policy("handed_in", OnError::Local), &who, 1)).await;
    assert_eq!((d.allowed(), d.reason()), (true, Reason::StoreUnavailable));
    assert_eq!(fallback.usage().limiter_keys, 1);

    let rules = ["1/1m".parse().unwrap()];
    let limiters = [LimiterRequest {
        key: "prepared",
        compact: &[],
        rules: &rules,
        ban: None,
        shadow: false,
        overrides: None,
    }];
    let request = CheckRequest::new(1, true, &limiters);
    let mut verdict = Verdict::empty();
    let run = |on_error| {
        let (gate, request) = (&gate, &request);
        async move {
            let mut verdict = Verdict::empty();
            let answered = tokio::time::timeout(HANG, gate.run(request, on_error, &mut verdict))
                .await
                .expect("a run hung on a dead store");
            (answered, verdict.allowed)
        }
    };
    assert_eq!(
        run(OnError::Allow).await.0,
        Answered::Failed { allowed: true }
    );
    assert_eq!(
        run(OnError::Deny).await.0,
        Answered::Failed { allowed: false }
    );
    assert_eq!(run(OnError::Local).await, (Answered::Local, true));
    assert_eq!(run(OnError::Local).await, (Answered::Local, false));
    assert_eq!(fallback.usage().limiter_keys, 2);
    // A store that answers at once needs no future.
    let memory = Tollgate::new(MemoryStore::new());
    assert_eq!(
        memory.run_now(&request, OnError::Deny, &mut verdict),
        Some(Answered::Store)
    );
    assert!(verdict.allowed);
}
