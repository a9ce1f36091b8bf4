//! `sms-verification`: the example service; see `README.md`.
//!
//! ```text
//! cargo run -p sms-verification -- --listen 127.0.0.1:8090 [--redis redis://127.0.0.1:6379]
//! ```

use std::{io::Write, net::SocketAddr, process::ExitCode, sync::Arc, time::Duration};

use clap::Parser;
use tollgate::{AnyStore, IpNet, MemoryStore, OnError, Tollgate};

/// An SMS-verification service guarded by tollgate.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Address to listen on (port 0: any free port; the chosen one is printed).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Share limits with other instances through this Redis (default: in-process memory).
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// How long a Redis call may take before the store counts as down (e.g. 100ms, 2s).
    #[arg(long, value_name = "DURATION", default_value = "250ms", value_parser = parse_timeout)]
    redis_timeout: Duration,
    /// A reverse proxy (CIDR) whose X-Forwarded-For is believed; repeatable.
    #[arg(long = "trust-proxy", value_name = "CIDR", value_parser = parse_net)]
    trust_proxy: Vec<IpNet>,
    /// This instance's name in /admin/stats (default: the port).
    #[arg(long)]
    instance: Option<String>,
}

fn parse_net(text: &str) -> Result<IpNet, tollgate::IpNetError> {
    text.parse()
}

fn parse_timeout(text: &str) -> Result<Duration, String> {
    tollgate::parse_duration(text).map_err(|e| e.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let store = match &args.redis {
        None => AnyStore::new(MemoryStore::new()),
        Some(url) => match tollgate_redis::RedisStore::builder(url)
            .timeout(args.redis_timeout)
            .build()
            .await
        {
            Ok(store) => AnyStore::new(store),
            Err(e) => {
                eprintln!("sms-verification: cannot use Redis: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let listener = match tokio::net::TcpListener::bind(args.listen).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("sms-verification: cannot listen on {}: {e}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => {
            eprintln!("sms-verification: {e}");
            return ExitCode::FAILURE;
        }
    };
    let config = sms_verification::Config {
        trusted_proxies: args.trust_proxy,
        instance: args.instance.unwrap_or_else(|| addr.port().to_string()),
    };
    // Codes cost money and orders must not double: when the store cannot answer, refuse
    // (503) rather than admit unchecked.
    let gate = Tollgate::new(store).with_on_error(OnError::Deny);
    let app = sms_verification::app(Arc::new(gate), config);
    // Scripts and tests read this line to find the port.
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    let served = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sms-verification: {e}");
            ExitCode::FAILURE
        }
    }
}
