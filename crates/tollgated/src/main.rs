//! The `tollgate` binary; see the `tollgated` crate docs.

use std::{io::IsTerminal as _, process::ExitCode};

use clap::Parser as _;
use tollgated::{Cli, Command, LogFormat};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig(args) => match tollgated::check_config(&args) {
            Ok(summary) => {
                println!("{}: ok", args.file().display());
                print!("{summary}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                print_errors(&e);
                ExitCode::FAILURE
            }
        },
        Command::EnvoyRatelimit(args) => {
            // The reference service's LOG_LEVEL and LOG_FORMAT, unless RUST_LOG or the flag
            // say otherwise.
            let level = std::env::var("LOG_LEVEL")
                .ok()
                .map(|l| match l.trim().to_ascii_lowercase().as_str() {
                    "fatal" | "panic" => "error".to_owned(),
                    "warning" => "warn".to_owned(),
                    other => other.to_owned(),
                })
                .filter(|l| !l.is_empty())
                .unwrap_or_else(|| "warn".into());
            let format = match std::env::var("LOG_FORMAT") {
                Ok(f) if f.trim().eq_ignore_ascii_case("json") => LogFormat::Json,
                _ => args.log_format,
            };
            init_logs_with(format, &level);
            run(tollgated::serve_envoy(args))
        }
        Command::Plan(args) => match tollgated::plan(&args) {
            Ok(planned) => {
                print!("{}", planned.output);
                if planned.passed {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(2)
                }
            }
            Err(e) => {
                print_errors(&e);
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            init_logs(args.log_format);
            run(tollgated::serve(args))
        }
    }
}

/// Runs `server` on a multi-threaded runtime; its error is logged and printed.
fn run(server: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(server) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            print_errors(&e);
            ExitCode::FAILURE
        }
    }
}

/// One `error: ` line per error (a configuration reports each of its mistakes).
fn print_errors(errors: &str) {
    for line in errors.lines() {
        eprintln!("error: {line}");
    }
}

fn init_logs(format: LogFormat) {
    init_logs_with(format, "info");
}

/// Logs filtered by RUST_LOG, else at `default`.
fn init_logs_with(format: LogFormat, default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => builder.json().init(),
    }
}
