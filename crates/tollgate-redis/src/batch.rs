//! Natural batching: while a check.lua call is in flight on a lane, the checks that arrive for
//! that lane wait; when it returns, they go together as one call (up to [`MAX_BATCH`]), which
//! evaluates them one after the other against one `TIME`.
//!
//! A lane is where one call may go: the server (standalone, Sentinel primary) or, on a Cluster,
//! one hash slot (a call's keys must share a slot). Nothing waits on a timer: a check that
//! finds its lane idle is sent at once by its own task, and the checks that queued behind it
//! are sent, when its reply arrives, by a task that drains the lane until it is empty. So at
//! one check in flight every check is its own call, as without batching; at many in flight,
//! each call carries what arrived during the previous one, and the server pays the cost of a
//! call (the command, the script's setup, `TIME`) once per batch.
//!
//! Replicated checks ([`Durability::Replicated`]) queue apart, one queue per lane and
//! durability: a batch of them is one call followed by one `WAIT` on the replicated checks'
//! own connection, so a replica that lags holds up only the checks that wait for it.
//!
//! Each check keeps its own timeout (the caller bounds its wait); a check whose caller gave
//! up before its batch left is not sent. A failed call fails every check it carried.

use std::{
    collections::{HashMap, hash_map::Entry},
    mem,
    sync::{Arc, Mutex, MutexGuard},
};

use redis::cluster_routing::Slot;
use tokio::sync::oneshot;
use tollgate::{Durability, StoreError, StoreErrorKind};

use crate::shared::Inner;

/// The most checks one call carries.
pub(crate) const MAX_BATCH: usize = 64;

/// Where one call may go: `None` for the one server, the hash slot on a Cluster.
pub(crate) type Lane = Option<Slot>;

/// The checks that may share a call: one lane, one durability.
type Queue = (Lane, Durability);

/// One encoded check, waiting for its call.
pub(crate) struct Job {
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
    reply: oneshot::Sender<Result<Vec<i64>, StoreError>>,
}

/// The lanes with a call in flight, and the checks waiting behind each. An idle lane has no
/// entry, so the map holds at most as many lanes as there are calls in flight.
#[derive(Default)]
pub(crate) struct Lanes {
    busy: Mutex<HashMap<Queue, Vec<Job>>>,
}

impl Lanes {
    fn lock(&self) -> MutexGuard<'_, HashMap<Queue, Vec<Job>>> {
        // A panic while holding the lock leaves a consistent map: every step is one insert or
        // one removal.
        self.busy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next batch of `lane`, or `None` (and the lane idle) when nothing waits.
    fn next_batch(&self, lane: Queue) -> Option<Vec<Job>> {
        let mut busy = self.lock();
        let queue = busy.get_mut(&lane)?;
        if queue.is_empty() {
            busy.remove(&lane);
            return None;
        }
        let rest = queue.split_off(queue.len().min(MAX_BATCH));
        Some(mem::replace(queue, rest))
    }
}

/// Runs one check (its keys and arguments, as [`Call::into_parts`] gives them) on `lane`,
/// alone or with others of the same durability; its reply.
///
/// [`Call::into_parts`]: crate::conn::Call::into_parts
pub(crate) async fn submit(
    inner: &Arc<Inner>,
    lane: Lane,
    durability: Durability,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
) -> Result<Vec<i64>, StoreError> {
    let lane = (lane, durability);
    let (reply, answer) = oneshot::channel();
    let job = Job { keys, args, reply };
    let lead = match inner.lanes.lock().entry(lane) {
        Entry::Occupied(mut waiting) => {
            waiting.get_mut().push(job);
            None
        }
        Entry::Vacant(idle) => {
            idle.insert(Vec::new());
            Some(job)
        }
    };
    if let Some(job) = lead {
        // The lane was idle: this check goes now, alone. Whatever queued meanwhile is handed
        // to a drain task when it returns, or if this future is dropped first.
        let hand_off = HandOff { inner, lane };
        run(inner, durability, vec![job]).await;
        drop(hand_off);
    }
    answer.await.unwrap_or_else(|_| {
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            format!(
                "check on {}: abandoned (the runtime is shutting down)",
                inner.backend.target
            ),
        ))
    })
}

/// Hands a lane's queue on when the call that made it busy is over.
struct HandOff<'a> {
    inner: &'a Arc<Inner>,
    lane: Queue,
}

impl Drop for HandOff<'_> {
    fn drop(&mut self) {
        {
            let mut busy = self.inner.lanes.lock();
            match busy.get(&self.lane) {
                Some(queue) if queue.is_empty() => {
                    busy.remove(&self.lane);
                    return;
                }
                Some(_) => {}
                None => return,
            }
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(drain(self.inner.clone(), self.lane));
            }
            // No runtime to drain on: the waiting checks fail (their senders drop).
            Err(_) => {
                self.inner.lanes.lock().remove(&self.lane);
            }
        }
    }
}

/// Sends `lane`'s waiting checks, a batch per call, until none waits.
async fn drain(inner: Arc<Inner>, lane: Queue) {
    /// Leaves the lane idle if this task is dropped (its runtime shut down) mid-way.
    struct Idle<'a>(&'a Inner, Queue);
    impl Drop for Idle<'_> {
        fn drop(&mut self) {
            self.0.lanes.lock().remove(&self.1);
        }
    }
    let idle = Idle(&inner, lane);
    while let Some(batch) = inner.lanes.next_batch(lane) {
        run(&inner, lane.1, batch).await;
    }
    // next_batch left the lane idle (a new check may already have made it busy again).
    mem::forget(idle);
}

/// One call of check.lua carrying `jobs`, in order; each job gets its own reply.
async fn run(inner: &Inner, durability: Durability, mut jobs: Vec<Job>) {
    // A check whose caller gave up (its timeout) is not sent.
    jobs.retain(|job| !job.reply.is_closed());
    if jobs.is_empty() {
        return;
    }
    let mut call = inner.backend.scripts.check.call();
    for job in &mut jobs {
        call.append(&mut job.keys, &mut job.args);
    }
    let replies = inner
        .backend
        .bounded_store("check", inner.backend.check_call(&call, durability))
        .await;
    match replies {
        Ok(replies) if replies.len() == jobs.len() => {
            for (job, reply) in jobs.into_iter().zip(replies) {
                let _ = job.reply.send(Ok(reply));
            }
        }
        Ok(replies) => {
            let why = format!(
                "check script reply: {} replies to {} checks",
                replies.len(),
                jobs.len()
            );
            for job in jobs {
                let _ = job
                    .reply
                    .send(Err(StoreError::new(StoreErrorKind::Protocol, why.clone())));
            }
        }
        Err(err) => {
            // One error for every check of the batch: each gets its own copy.
            let (kind, why) = (err.kind(), err.to_string());
            let mut first = Some(err);
            for job in jobs {
                let err = first
                    .take()
                    .unwrap_or_else(|| StoreError::new(kind, why.clone()));
                let _ = job.reply.send(Err(err));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::{Algorithm, CheckRequest, LimiterRequest, Rule, Store};
    use tollgate_testkit::RedisServer;

    use super::*;
    use crate::RedisStore;

    /// A store on `server` with no local cache, and a plain connection to inspect it.
    async fn store_and_conn(
        server: &RedisServer,
    ) -> (RedisStore, redis::aio::MultiplexedConnection) {
        let store = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(10))
            .local_cache(false)
            .build()
            .await
            .unwrap();
        let conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        (store, conn)
    }

    async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
        calls(conn, "evalsha").await
    }

    async fn calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .unwrap();
        let head = format!("cmdstat_{command}:calls=");
        info.lines()
            .filter_map(|l| l.strip_prefix(&head))
            .map(|rest| rest.split(',').next().unwrap().parse::<u64>().unwrap())
            .sum()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replicated_checks_queued_together_share_one_call_and_one_wait() {
        let server = RedisServer::start();
        let _replica = RedisServer::replica_of(&server);
        let (store, mut conn) = store_and_conn(&server).await;
        let durability = Durability::replicated(1, Duration::from_secs(5));
        let inner = store.inner().clone();
        let queue = (None, durability);
        inner.lanes.lock().insert(queue, Vec::new());
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let rules = ["7/1h".parse::<Rule>().unwrap()];
                    let limiters = [LimiterRequest {
                        key: "one:{durable}",
                        compact: &[],
                        rules: &rules,
                        ban: None,
                        shadow: false,
                        overrides: None,
                    }];
                    let request = CheckRequest::new(1, true, &limiters).with_durability(durability);
                    store.check(&request).await.unwrap().allowed
                })
            })
            .collect();
        for _ in 0..10_000 {
            if inner.lanes.lock().get(&queue).map_or(0, Vec::len) == 20 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(inner.lanes.lock().get(&queue).map(Vec::len), Some(20));
        assert!(
            !inner.lanes.lock().contains_key(&(None, Durability::Async)),
            "async checks queue apart"
        );
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        drop(HandOff {
            inner: &inner,
            lane: queue,
        });
        let mut admitted = 0;
        for task in tasks {
            admitted += usize::from(task.await.unwrap());
        }
        assert_eq!(admitted, 7);
        // The drain's call may be EVALSHA, or EVAL where the script was not loaded.
        let scripts = calls(&mut conn, "evalsha").await + calls(&mut conn, "eval").await;
        assert_eq!((scripts, calls(&mut conn, "wait").await), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn checks_of_one_key_in_one_batch_admit_exactly_the_limit() {
        let server = RedisServer::start();
        let (store, mut conn) = store_and_conn(&server).await;
        let inner = store.inner().clone();
        // The lane is busy (as if a call were in flight): every check queues behind it.
        inner
            .lanes
            .lock()
            .insert((None, Durability::Async), Vec::new());
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let algorithm = [Algorithm::SlidingLog, Algorithm::FixedWindow][i % 2];
                    let rules = [
                        "7/1h".parse::<Rule>().unwrap(),
                        "7/1h".parse::<Rule>().unwrap().with_algorithm(algorithm),
                    ];
                    let limiters = [LimiterRequest {
                        key: "one:{batch}",
                        compact: &[],
                        rules: &rules[..1 + i % 2],
                        ban: None,
                        shadow: false,
                        overrides: None,
                    }];
                    store
                        .check(&CheckRequest::new(1, true, &limiters))
                        .await
                        .unwrap()
                        .allowed
                })
            })
            .collect();
        // Wait (bounded) until all 20 have queued.
        for _ in 0..10_000 {
            if inner
                .lanes
                .lock()
                .get(&(None, Durability::Async))
                .map_or(0, Vec::len)
                == 20
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            inner
                .lanes
                .lock()
                .get(&(None, Durability::Async))
                .map(Vec::len),
            Some(20)
        );
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .unwrap();
        // The call returns: its hand-off drains the queue, all 20 in one call.
        drop(HandOff {
            inner: &inner,
            lane: (None, Durability::Async),
        });
        let mut admitted = 0;
        for task in tasks {
            admitted += usize::from(task.await.unwrap());
        }
        assert_eq!(admitted, 7);
        assert_eq!(script_calls(&mut conn).await, 1);
        let logged: u64 = redis::cmd("ZCARD")
            .arg("one:{batch}:l")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(logged, 7);
        assert!(inner.lanes.lock().is_empty(), "the lane is idle again");
    }
}
