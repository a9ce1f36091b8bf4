use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::Router;
use tokio::{net::TcpListener, task::JoinHandle};
use tollgate::{ManualClock, MemoryStore, Tollgate};

/// An axum app served on a free loopback port, with peer addresses; stops on drop.
pub(crate) struct Server {
    pub(crate) url: String,
    task: JoinHandle<()>,
}

impl Server {
    pub(crate) async fn start(app: Router) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        Server {
            url: format!("http://{addr}"),
            task,
        }
    }

    pub(crate) fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Moves tokio's paused time by `timers` and lets the tasks it wakes run (a lease renewal,
/// say), then the store's clock by `store`.
pub(crate) async fn step(clock: &ManualClock, timers: Duration, store: Duration) {
    tokio::time::advance(timers).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    clock.advance(store);
}

/// An engine on a memory store whose clock only moves when told.
pub(crate) fn gate() -> (Arc<Tollgate<MemoryStore>>, ManualClock) {
    let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (Arc::new(Tollgate::new(store)), clock)
}

pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        // A hang detector, not a timing assertion.
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

pub(crate) fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

pub(crate) async fn problem(response: reqwest::Response) -> serde_json::Value {
    assert_eq!(
        header(&response, "content-type").as_deref(),
        Some("application/problem+json")
    );
    response.json().await.unwrap()
}
