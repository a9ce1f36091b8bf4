//! `tollgate plan`: replays traffic against a candidate configuration (and the one in force,
//! or the decisions the record kept) and reports who would be limited, how often and for how
//! long, before the limits are enforced.
//!
//! The replay is exact: each configuration runs the server's own engine and Envoy service
//! over a memory store whose clock the replay moves to each request's time, in time order.
//! So a plan of a record against the configuration that made it decides every request as the
//! server did (a test holds it to that).
//!
//! # Layout
//! - `input`: the traffic formats (tollgate's record, JSON lines, nginx and Envoy access
//!   logs), the field mapping, and several files merged in time order.
//! - `synthetic`: traffic made up to a pattern (`--synthetic`).
//! - `replay`: one configuration replayed.
//! - `report`: the counts, and the report as a table and as JSON.
//! - `html`: the report as a self-contained page with charts.

mod html;
mod input;
mod replay;
mod report;
mod synthetic;

use std::{
    io::Write as _,
    path::{Path, PathBuf},
};

use crate::{
    cli::{InputFormat, PlanArgs, ReportFormat},
    config::Config,
};
use input::{Event, Merged, Names, Reading};
use replay::{Outcome, Replay};
use report::{Read, Tally};

/// What a plan printed, and whether its budgets held (else `tollgate plan` exits 2).
#[derive(Debug)]
pub struct Planned {
    /// The report, as `--format` asks.
    pub output: String,
    /// Every budget held (`--max-newly-denied`, `--max-denied-identities`).
    pub passed: bool,
}

/// Runs `tollgate plan`; an error says what could not be read.
pub fn plan(args: &PlanArgs) -> Result<Planned, String> {
    let candidate = load(&args.config)?;
    let against = args.against.as_deref().map(load).transpose()?;
    let format = if args.synthetic.is_some() {
        if !args.traffic.is_empty() {
            return Err("--synthetic makes its own traffic: give no traffic files".into());
        }
        if !args.filter.is_empty() {
            return Err("--where applies to traffic files, not to --synthetic".into());
        }
        InputFormat::Json
    } else {
        args.input
    };
    let reading = Reading::new(
        format,
        &args.map,
        &args.filter,
        args.policy.clone(),
        args.domain.clone(),
        &args.descriptor,
    )?;
    let mut traffic = match args.synthetic {
        Some(pattern) => Traffic::Synthetic(Box::new(synthetic::Generator::new(
            pattern,
            args.rate,
            args.duration.as_secs_f64(),
            args.identities,
            args.seed,
        )?)),
        None => Traffic::Files(Merged::open(&reading, &args.traffic)?),
    };
    let baseline = match (&against, format) {
        (Some(_), _) => Baseline::Against,
        (None, InputFormat::Record) if args.synthetic.is_none() => Baseline::Record,
        (None, _) => Baseline::Nothing,
    };
    let labels = [
        args.config.display().to_string(),
        match (&args.against, baseline) {
            (Some(path), _) => path.display().to_string(),
            (None, Baseline::Record) => "the recorded decisions".to_owned(),
            _ => "no limits".to_owned(),
        },
    ];
    let mut decisions = match &args.decisions {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        )),
        None => None,
    };
    let mut names = Names::default();
    let mut tally = Tally::new();
    let mut replays: Option<(Replay, Option<Replay>)> = None;
    let mut configs = Some((candidate, against));
    while let Some(event) = traffic.next(&reading, &mut names)? {
        let (now, then) = replays.get_or_insert_with(|| {
            let (candidate, against) = configs.take().expect("configurations, once");
            (
                Replay::new(candidate, event.t_us),
                against.map(|a| Replay::new(a, event.t_us)),
            )
        });
        let decided = now.decide(event.t_us, &event.what, &names);
        let before = match (then.as_mut(), baseline) {
            (Some(then), _) => then.decide(event.t_us, &event.what, &names),
            (None, Baseline::Record) => match event.recorded {
                Some(r) => Outcome {
                    allowed: r.allowed,
                    known: true,
                    retry_after_us: r.retry_after_us.unwrap_or(0),
                    wait_unknown: r.retry_after_us.is_none(),
                    ..Outcome::default()
                },
                None => admitted(),
            },
            (None, _) => admitted(),
        };
        if let Some(out) = decisions.as_mut() {
            write_decision(out, &traffic, &event, &decided)
                .map_err(|e| format!("cannot write the decisions: {e}"))?;
        }
        tally.add(&event, &names, [&decided, &before]);
    }
    if let Some(mut out) = decisions {
        out.flush()
            .map_err(|e| format!("cannot write the decisions: {e}"))?;
    }
    let read = match traffic {
        Traffic::Files(merged) => Read {
            skipped: merged.skipped,
            malformed: merged.malformed_count,
            malformed_lines: merged.malformed,
        },
        Traffic::Synthetic(_) => Read {
            skipped: 0,
            malformed: 0,
            malformed_lines: Vec::new(),
        },
    };
    if tally.events == 0 {
        // An empty or unreadable input would pass every budget: it is an error instead.
        let first = read
            .malformed_lines
            .first()
            .map(|m| format!("; the first: {}:{}: {}", m.file, m.line, m.error))
            .unwrap_or_default();
        return Err(format!(
            "no request to replay: {} lines malformed, {} skipped{first}",
            read.malformed, read.skipped
        ));
    }
    let mut report = tally.report(labels, read, args.top);
    report.judge(args.max_newly_denied, args.max_denied_identities);
    if let Some(path) = &args.html {
        std::fs::write(path, html::page(&report))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let output = match args.format {
        ReportFormat::Table => report.table(),
        ReportFormat::Json => {
            let mut json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
            json.push('\n');
            json
        }
    };
    Ok(Planned {
        output,
        passed: report.passed,
    })
}

/// What the candidate is compared with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Baseline {
    /// `--against`'s configuration, replayed beside it.
    Against,
    /// The decisions a tollgate record kept.
    Record,
    /// No limits: every request admitted.
    Nothing,
}

fn admitted() -> Outcome {
    Outcome {
        allowed: true,
        ..Outcome::default()
    }
}

/// The traffic replayed: files, or made up.
enum Traffic<'r> {
    Files(Merged<'r>),
    Synthetic(Box<synthetic::Generator>),
}

impl Traffic<'_> {
    fn next(&mut self, reading: &Reading, names: &mut Names) -> Result<Option<Event>, String> {
        match self {
            Traffic::Files(merged) => Ok(merged.next(names)),
            Traffic::Synthetic(generator) => generator.next(reading, names).transpose(),
        }
    }

    fn file_name(&self, i: u32) -> String {
        match self {
            Traffic::Files(merged) => merged.file_name(i),
            Traffic::Synthetic(_) => "(synthetic)".to_owned(),
        }
    }
}

/// One line of `--decisions`: where the request was read, and the candidate's decision.
fn write_decision(
    out: &mut impl std::io::Write,
    traffic: &Traffic<'_>,
    event: &Event,
    decided: &Outcome,
) -> std::io::Result<()> {
    let line = serde_json::json!({
        "file": traffic.file_name(event.file),
        "line": event.line,
        "t_us": event.t_us,
        "allowed": decided.allowed,
        "retry_after_ms": (!decided.allowed).then(|| decided.retry_after_us.div_ceil(1000)),
        "recorded_allowed": event.recorded.map(|r| r.allowed),
    });
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")
}

/// A configuration: tollgate's TOML, or an Envoy rate-limit YAML file (or directory), read
/// as `[envoy] ratelimit_config` reads it.
fn load(path: &Path) -> Result<Config, String> {
    let yaml = path.is_dir()
        || matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("yaml" | "yml")
        );
    let config = if yaml {
        let absolute: PathBuf = std::path::absolute(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let text = format!(
            "[envoy]\nratelimit_config = {}\n",
            toml::Value::String(absolute.display().to_string())
        );
        Config::parse(&path.display().to_string(), &text)
    } else {
        Config::load(path)
    };
    config.map_err(|e| e.to_string())
}
