//! `tollgate serve`: open the store, bind both listeners, reload on SIGHUP or file change,
//! drain on SIGTERM or Ctrl-C.

use std::{sync::Arc, time::Duration};

use tokio::{net::TcpListener, sync::watch};
use tollgate::Tollgate;

use crate::{
    app::App,
    auth::Tokens,
    cli::{CheckConfigArgs, EnvoyRatelimitArgs, ServeArgs},
    config::{Config, Source},
    envoy, grpc, health, http, listen,
    metrics::Metrics,
    receipt::ReceiptKey,
    store, trace,
};

/// Runs `tollgate check-config`: prints the policies, or the error.
pub fn check_config(args: &CheckConfigArgs) -> Result<String, String> {
    Config::load(args.file())
        .map(|c| c.summary())
        .map_err(|e| e.to_string())
}

/// The shortest token (and receipt key) the server starts with: a short one is guessed.
const MIN_ADMIN_TOKEN: usize = 16;

/// The token in the environment variable `var` names (`server.<field>`): none when the field
/// is unset or the variable empty; an error when it is too short to resist guessing.
fn token(var: Option<&str>, field: &str) -> Result<Option<String>, String> {
    let Some(var) = var else { return Ok(None) };
    match std::env::var(var) {
        Ok(token) if token.trim().len() >= MIN_ADMIN_TOKEN => Ok(Some(token.trim().to_owned())),
        Ok(token) if !token.trim().is_empty() => Err(format!(
            "the token in {var} (server.{field}) is {} bytes; use at least {MIN_ADMIN_TOKEN} (e.g. `openssl rand -hex 16`)",
            token.trim().len()
        )),
        _ => {
            tracing::warn!("environment variable {var} (server.{field}) is not set or empty");
            Ok(None)
        }
    }
}

/// Runs the server until SIGTERM or Ctrl-C, then drains in-flight requests.
///
/// Errors (invalid configuration, unreachable store, address in use) are returned before
/// anything listens.
pub async fn serve(args: ServeArgs) -> Result<(), String> {
    let source = Source::file(&args.config);
    run(source, args).await
}

/// Runs the server as a drop-in for Envoy's reference rate-limit service: configured by its
/// environment variables (and the TOML file, if given); see `tollgate envoy-ratelimit`.
pub async fn serve_envoy(args: EnvoyRatelimitArgs) -> Result<(), String> {
    let source = Source {
        path: args.config.clone(),
        envoy_env: true,
    };
    let args = ServeArgs {
        config: args.config.unwrap_or_default(),
        http: None,
        grpc: None,
        store: None,
        log_format: args.log_format,
        watch_interval: args.watch_interval,
        drain_timeout: args.drain_timeout,
    };
    run(source, args).await
}

async fn run(source: Source, args: ServeArgs) -> Result<(), String> {
    let (shutdown, hangup) = Signals::register().split();
    // The bytes the watcher compares against, read before parsing: a change in between is
    // then seen as a change rather than missed.
    let toml = watched(source.path.as_deref(), None);
    let mut config = Config::load_source(&source).map_err(|e| e.to_string())?;
    // The YAML files' bytes are read after parsing them (their directory is in the file): an
    // edit in between is seen at the next one.
    let loaded = toml.map(|bytes| with_yaml(bytes, config.envoy_yaml.as_ref()));
    if let Some(addr) = args.http {
        config.server.http = addr;
    }
    if let Some(addr) = args.grpc {
        config.server.grpc = addr;
    }
    if let Some(url) = &args.store {
        store::check_url(url).map_err(|e| format!("--store: {e}"))?;
        config.store.url.clone_from(url);
    }
    let metrics = Metrics::new();
    let (store, opened) = store::open(&config.store).await?;
    if let store::Opened::Memory(memory) = &opened {
        metrics.watch_memory_store(memory.clone());
    }
    let gate = Tollgate::new(store)
        .with_prefix(&config.store.prefix)
        .with_on_error(config.store.on_error)
        .with_max_stored_response(config.server.max_stored_response)
        .with_max_keep_for(config.server.max_keep_for);
    let tokens = Tokens {
        check: token(config.server.check_token_env.as_deref(), "check_token_env")?,
        refund: token(
            config.server.refund_token_env.as_deref(),
            "refund_token_env",
        )?,
        admin: token(config.server.admin_token_env.as_deref(), "admin_token_env")?,
    };
    if tokens.admin.is_none() {
        tracing::info!("no admin token (server.admin_token_env): admin endpoints answer 401");
    }
    // Each listener holds up to max_connections.
    let listeners = u64::try_from(config.server.max_connections).unwrap_or(u64::MAX);
    open_files(listeners.saturating_mul(2).saturating_add(OTHER_FILES));
    let grpc_verified = config
        .server
        .grpc_tls
        .as_ref()
        .is_some_and(|tls| tls.client_ca.is_some());
    if !grpc_verified && tokens.check.is_none() && !config.server.grpc.ip().is_loopback() {
        tracing::warn!(
            "the gRPC port is not on loopback and asks neither a client certificate (server.grpc_tls.client_ca_file) nor the check scope's token (server.check_token_env): any client that reaches it may spend counters and, in a domain with `identity` and a blocklist, have the addresses and users it names banned; keep it on a private network"
        );
    }
    // The refund scope takes the check scope's token when it has none of its own.
    let refund_set = tokens.refund.is_some() || tokens.check.is_some();
    for (scope, set) in [("check", tokens.check.is_some()), ("refund", refund_set)] {
        if !set && !config.server.http.ip().is_loopback() {
            tracing::warn!(
                "the {scope} scope has no token (server.{scope}_token_env) and the HTTP port is not on loopback: any client that reaches it may use it"
            );
        }
    }
    let receipts = match &config.server.receipt_key_env {
        Some(var) => match std::env::var(var) {
            Ok(key) if key.trim().len() >= MIN_ADMIN_TOKEN => ReceiptKey::from_secret(key.trim()),
            _ => {
                return Err(format!(
                    "environment variable {var} (server.receipt_key_env) must hold a secret of at least {MIN_ADMIN_TOKEN} bytes"
                ));
            }
        },
        None => ReceiptKey::random(),
    };
    // TLS on the gRPC port: served, or the start fails (never plaintext instead).
    let grpc_tls = match &config.server.grpc_tls {
        Some(files) => Some(crate::tls::acceptor(files).map_err(|e| format!("gRPC TLS: {e}"))?),
        None => None,
    };
    let http_listener = TcpListener::bind(config.server.http)
        .await
        .map_err(|e| format!("cannot listen on {} (http): {e}", config.server.http))?;
    let grpc_listener = TcpListener::bind(config.server.grpc)
        .await
        .map_err(|e| format!("cannot listen on {} (grpc): {e}", config.server.grpc))?;
    let http_addr = http_listener.local_addr().map_err(|e| e.to_string())?;
    let grpc_addr = grpc_listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!(
        store = %store::redact(&config.store.url),
        policies = %config.policy_names().collect::<Vec<_>>().join(", "),
        "configuration loaded from {}",
        source
            .path
            .as_deref()
            .map_or("the environment".into(), |p| p.display().to_string())
    );
    if let store::Opened::Redis(redis) = &opened {
        metrics.watch_redis_store(redis.clone());
    }
    let recorder =
        crate::record::start(config.record.as_ref(), &metrics, |v| std::env::var(v).ok())?;
    let webhook = config
        .webhook
        .as_ref()
        .map(|settings| crate::webhook::Webhook::start(settings, metrics.clone()))
        .transpose()?;
    let app = Arc::new(
        App::new(gate, config, metrics, &tokens, receipts, source)
            .with_recorder(recorder)
            .with_webhook(webhook),
    );
    app.observed.watch_store(&opened);
    crate::observed::spawn_sampler(&app);
    if matches!(opened, store::Opened::Redis(_) | store::Opened::Late(_)) {
        let app = app.clone();
        tokio::spawn(async move { app.watch_persistence(&opened).await });
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let draining = app.clone();
    tokio::spawn(async move {
        shutdown.recv().await;
        tracing::info!("shutting down: draining in-flight requests");
        draining.start_draining();
        let _ = stop_tx.send(true);
    });
    tokio::spawn(reload_loop(
        app.clone(),
        loaded,
        args.watch_interval,
        hangup,
        stop_rx.clone(),
    ));

    let limits = app.config().server.clone();
    let connections = listen::ConnLimits {
        max_connections: limits.max_connections,
        max_per_ip: limits.max_connections_per_ip,
        write_timeout: limits.write_timeout,
    };
    let router = trace::http(routes(app.clone()));
    let http = listen::serve_http(
        http_listener,
        router,
        listen::HttpLimits {
            header_read_timeout: limits.header_read_timeout,
            body_read_timeout: limits.body_read_timeout,
            connections,
        },
        limits.allowed_hosts(),
        stopped(stop_rx.clone()),
    );
    let grpc_incoming = listen::limit_grpc(
        tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
        connections,
        limits.header_read_timeout,
        limits.idle_timeout,
        |tcp: &tokio::net::TcpStream| tcp.peer_addr().ok().map(|a| a.ip()),
    );
    // A health request names one service: 4 KiB holds any name (tonic's default is 4 MiB).
    let health = health::service(app.clone(), stop_rx.clone())
        .await
        .max_decoding_message_size(4096);
    // The Envoy service and the health service, picked by path, with request spans when asked
    // for; served on hyper's HTTP/2 server directly.
    let services = grpc::GrpcServices::new(
        envoy::service(app.clone())
            .max_decoding_message_size(limits.grpc_max_message_bytes)
            .max_encoding_message_size(limits.grpc_max_message_bytes),
        crate::rlqs::service(app.clone())
            .max_decoding_message_size(limits.grpc_max_message_bytes)
            .max_encoding_message_size(limits.grpc_max_message_bytes),
        health,
        limits.max_health_watches,
    );
    let grpc = listen::serve_grpc(
        grpc_incoming,
        tower::ServiceBuilder::new()
            .layer(trace::grpc())
            .service(services),
        (
            limits.grpc_max_concurrent_streams,
            app.auth.guarded(crate::auth::Scope::Check),
            limits.body_read_timeout,
        ),
        grpc_tls.map(|acceptor| (acceptor, limits.header_read_timeout)),
        stopped(stop_rx.clone()),
    );
    tracing::info!(addr = %http_addr, "HTTP API listening");
    tracing::info!(addr = %grpc_addr, "Envoy gRPC listening");
    let servers = async { tokio::join!(http, grpc) };
    let drain_limit = async {
        stopped(stop_rx.clone()).await;
        tokio::time::sleep(args.drain_timeout).await;
    };
    tokio::select! {
        ((), ()) = servers => {
            tracing::info!("stopped");
        }
        () = drain_limit => {
            tracing::warn!(
                "stopped with requests still in flight after --drain-timeout {}",
                tollgate::format_duration(args.drain_timeout)
            );
        }
    }
    // What the record holds for the checks answered so far reaches the disk before the exit.
    if let Some(recorder) = &app.recorder {
        tokio::task::block_in_place(|| recorder.flush());
    }
    Ok(())
}

/// Everything the HTTP port serves over `app`: the API, and beside it the dashboard; a path
/// or method neither serves is answered by the API's problem documents.
pub(crate) fn routes(app: Arc<App>) -> axum::Router {
    http::api()
        .merge(crate::dashboard::routes(&app))
        .fallback(http::not_found)
        .method_not_allowed_fallback(http::method_not_allowed)
        .with_state(app)
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|&s| s).await;
}

/// The signals the server acts on, registered before it listens: until a handler is
/// registered, SIGTERM and SIGHUP would kill the process outright.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    hup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn register() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Signals {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
                hup: signal(SignalKind::hangup()).ok(),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Splits into the shutdown signals and the reload signal.
    fn split(self) -> (Shutdown, Hangup) {
        #[cfg(unix)]
        {
            (
                Shutdown {
                    term: self.term,
                    int: self.int,
                },
                Hangup(self.hup),
            )
        }
        #[cfg(not(unix))]
        (Shutdown {}, Hangup {})
    }
}

/// SIGTERM or Ctrl-C.
struct Shutdown {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Shutdown {
    async fn recv(mut self) {
        #[cfg(unix)]
        {
            let term = recv_or_pending(self.term.as_mut());
            let int = recv_or_pending(self.int.as_mut());
            tokio::select! {
                () = term => {}
                () = int => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = &mut self;
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// SIGHUP (never fires where there is none).
struct Hangup(#[cfg(unix)] Option<tokio::signal::unix::Signal>);

impl Hangup {
    async fn recv(&mut self) {
        #[cfg(unix)]
        recv_or_pending(self.0.as_mut()).await;
        #[cfg(not(unix))]
        std::future::pending::<()>().await;
    }
}

#[cfg(unix)]
async fn recv_or_pending(signal: Option<&mut tokio::signal::unix::Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending::<()>().await,
    }
}

/// The bytes whose change means a reload: the file's, then those of the YAML files of
/// `yaml` (Envoy's reference-service configuration); `None` if the file cannot be read.
fn watched(
    path: Option<&std::path::Path>,
    yaml: Option<&(std::path::PathBuf, bool)>,
) -> Option<Vec<u8>> {
    // Without a file, the environment (read once) and the YAML files are the configuration.
    let bytes = match path {
        Some(path) => std::fs::read(path).ok()?,
        None => Vec::new(),
    };
    Some(with_yaml(bytes, yaml))
}

/// `bytes` followed by the fingerprint of the YAML files of `yaml`, if any.
fn with_yaml(mut bytes: Vec<u8>, yaml: Option<&(std::path::PathBuf, bool)>) -> Vec<u8> {
    if let Some((dir, ignore_dotfiles)) = yaml {
        bytes.push(0);
        bytes.extend(crate::config::envoy_yaml::fingerprint(
            dir,
            *ignore_dotfiles,
        ));
    }
    bytes
}

/// [`watched`] for the configuration in force, off the async threads.
async fn watched_now(app: &App, path: Option<&std::path::Path>) -> Option<Vec<u8>> {
    let yaml = app.config().envoy_yaml.clone();
    let path = path.map(ToOwned::to_owned);
    tokio::task::spawn_blocking(move || watched(path.as_deref(), yaml.as_ref()))
        .await
        .ok()
        .flatten()
}

/// Reloads on SIGHUP, and when the file's bytes (or the YAML files') change (checked every
/// `interval`).
async fn reload_loop(
    app: Arc<App>,
    mut seen: Option<Vec<u8>>,
    interval: Duration,
    mut hup: Hangup,
    stop: watch::Receiver<bool>,
) {
    let path = app.source().path.clone();
    let mut tick = (!interval.is_zero()).then(|| {
        let mut t = tokio::time::interval(interval);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        let hup_recv = hup.recv();
        let tick_recv = async {
            match tick.as_mut() {
                Some(t) => {
                    t.tick().await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            () = stopped(stop.clone()) => return,
            () = hup_recv => {
                tracing::info!("SIGHUP: reloading the configuration");
                seen = watched_now(&app, path.as_deref()).await;
                let _ = app.reload();
            }
            () = tick_recv => {
                let now = watched_now(&app, path.as_deref()).await;
                if now.is_some() && now != seen {
                    tracing::info!("configuration file changed: reloading");
                    seen = now;
                    let _ = app.reload();
                }
            }
        }
    }
}

/// Open files besides the listeners' connections: Redis connections, the configuration, logs.
const OTHER_FILES: u64 = 256;

/// Raises the soft limit on open files to the hard one, as Go's runtime does for its servers:
/// the two listeners' `max_connections` (10,000 each by default) are far past the common soft
/// limit of 1,024, and a process out of descriptors pauses accepting on both ports and cannot
/// reach Redis. Warns when even that is below what the listeners may hold (`wanted`).
fn open_files(wanted: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    // No hard limit: as many as the listeners want (the kernel's own cap still applies).
    let target = limit.maximum.unwrap_or(wanted);
    let mut soft = limit.current.unwrap_or(u64::MAX);
    if soft < target {
        let raised = Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        };
        match setrlimit(Resource::Nofile, raised) {
            Ok(()) => {
                tracing::debug!(from = soft, to = target, "open-file limit raised");
                soft = target;
            }
            Err(e) => tracing::debug!(error = %e, "the open-file limit could not be raised"),
        }
    }
    if soft < wanted {
        tracing::warn!(
            "the open-file limit is {soft}, below the {wanted} the listeners' max_connections \
             and the store may hold: raise it (ulimit -n, LimitNOFILE=) or lower max_connections"
        );
    }
}
