//! The server's HTTP router and Envoy service without listeners, for tests that drive them in
//! process: `tower::ServiceExt::oneshot` on the router, `ShouldRateLimit` called directly.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::{
    RateLimitRequest, RateLimitResponse, rate_limit_service_server::RateLimitService as _,
};
use tollgate::{AnyStore, Clock, SystemClock, Tollgate};

use crate::{
    app::App,
    config::{Config, Source},
    envoy,
    metrics::Metrics,
    observed, store,
};

/// A server's handlers over one store and configuration, as `serve` builds them.
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let config = tollgated::Config::parse("t.toml", "")?;
/// let server = tollgated::InProcess::new(config, None).await?;
/// let _router: axum::Router = server.router();
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct InProcess {
    app: Arc<App>,
}

impl InProcess {
    /// Opens the store of `config`; admin endpoints accept `admin_token` (none: they answer 401).
    pub async fn new(config: Config, admin_token: Option<String>) -> Result<InProcess, String> {
        let (store, opened) = store::open(&config.store).await?;
        InProcess::build(config, store, &opened, admin_token, Arc::new(SystemClock))
    }

    /// The same handlers over `store` instead of the store `config` names: a test's own store
    /// (one that records what it is asked, say). The configuration's prefix and `on_error`
    /// still apply.
    ///
    /// # Panics
    /// If the configuration's traffic record (`[record]`) cannot be opened.
    pub fn with_store(config: Config, store: AnyStore, admin_token: Option<String>) -> InProcess {
        InProcess::with_store_and_clock(config, store, admin_token, SystemClock)
    }

    /// [`with_store`](Self::with_store), the traffic record (`[record]`) timed by `clock`:
    /// the memory store's own clock, for a record that replays exactly.
    ///
    /// # Panics
    /// If the record cannot be opened.
    pub fn with_store_and_clock(
        config: Config,
        store: AnyStore,
        admin_token: Option<String>,
        clock: impl Clock,
    ) -> InProcess {
        InProcess::build(
            config,
            store,
            &store::Opened::Given,
            admin_token,
            Arc::new(clock),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn build(
        config: Config,
        store: AnyStore,
        opened: &store::Opened,
        admin_token: Option<String>,
        clock: Arc<dyn Clock>,
    ) -> Result<InProcess, String> {
        let gate = Tollgate::new(store)
            .with_prefix(&config.store.prefix)
            .with_on_error(config.store.on_error)
            .with_max_stored_response(config.server.max_stored_response)
            .with_max_keep_for(config.server.max_keep_for);
        let metrics = Metrics::new();
        if let store::Opened::Memory(memory) = opened {
            metrics.watch_memory_store(memory.clone());
        }
        let tokens = crate::auth::Tokens {
            admin: admin_token,
            ..Default::default()
        };
        let recorder = crate::record::start_with_clock(
            config.record.as_ref(),
            &metrics,
            |v| std::env::var(v).ok(),
            clock,
        )?;
        let app = Arc::new(
            App::new(
                gate,
                config,
                metrics,
                &tokens,
                crate::receipt::ReceiptKey::random(),
                Source::default(),
            )
            .with_recorder(recorder),
        );
        app.observed.watch_store(opened);
        observed::spawn_sampler(&app);
        Ok(InProcess { app })
    }

    /// Waits until the traffic record holds every decision made so far.
    pub fn flush_record(&self) {
        if let Some(recorder) = &self.app.recorder {
            recorder.flush();
        }
    }

    /// The HTTP port's router: the JSON API and the dashboard.
    pub fn router(&self) -> axum::Router {
        crate::server::routes(self.app.clone())
    }

    /// Envoy's `ShouldRateLimit`, through the gRPC service's implementation.
    pub async fn should_rate_limit(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        envoy::limiter(self.app.clone())
            .should_rate_limit(tonic::Request::new(request))
            .await
            .map(tonic::Response::into_inner)
    }
}
