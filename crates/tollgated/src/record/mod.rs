//! The traffic record (`[record]`): what the server decided, as JSON lines, for `tollgate plan`
//! to replay against another configuration.
//!
//! A check hands its event to a bounded queue and goes on; a thread of its own writes the
//! lines (hashing identities when asked), and rotates the file past its size. The queue holds
//! `buffer` lines and `buffer_bytes` bytes (what its events hold: identities, Envoy requests)
//! at most; a full queue drops the event and counts it
//! (`tollgate_record_lines_total{result="dropped"}`): a check never waits for the disk, and
//! large requests never grow the server's memory past the budget.
//!
//! Sampling keeps a share of *identities*, each with all of its traffic, so the limits of a
//! sampled identity replay exactly (a limit shared by many identities, a global one, sees only
//! the sample).
//!
//! # Lines
//! A policy check (`/v1/check`, each check of `/v1/checks`):
//! `{"t_us":…,"policy":"sms","identity":{"ip":"203.0.113.7","user_id":"42"},"cost":1,
//! "allowed":false,"reason":"rate_limited","retry_after_ms":1200}` (the identity as the API
//! takes it). An Envoy `ShouldRateLimit`: `{"t_us":…,"domain":"edge","descriptors":
//! [{"entries":[["remote_address","203.0.113.7"]],"limit":[5,2],"hits_addend":2}],
//! "hits_addend":1,"allowed":false,"statuses":["OVER_LIMIT"]}` (`limit` a descriptor's own
//! requests per unit and Envoy's unit number, `hits_addend` where set). `t_us` is the
//! server's clock, which the memory store reads too, in microseconds since the epoch.

pub(crate) mod hash;

use std::{
    collections::BTreeMap,
    fs::{self, File, OpenOptions},
    hash::{Hash as _, Hasher as _},
    io::{self, BufWriter, Write as _},
    net::IpAddr,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
        mpsc::{Receiver, SyncSender, sync_channel},
    },
};

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, rate_limit_response::Code};
use prometheus_client::metrics::counter::Counter;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use tollgate::{Clock, Decision, Identity};

use crate::{config::RecordSettings, envoy::descriptors::Domain};
pub(crate) use hash::Hasher;

/// Writes the record: cheap to share, each call a queue push.
pub(crate) struct Recorder {
    queue: SyncSender<Event>,
    /// The bytes the queued events hold (see [`Event::bytes`]), and the most they may.
    queued: Arc<AtomicUsize>,
    max_queued: usize,
    /// An identity is recorded when its hash is below this (`u64::MAX`: all).
    sample_below: u64,
    clock: Arc<dyn Clock>,
    counts: Counts,
}

/// The record's counters (`tollgate_record_lines_total` by result).
#[derive(Clone, Default)]
pub(crate) struct Counts {
    pub(crate) written: Counter,
    pub(crate) dropped: Counter,
    pub(crate) failed: Counter,
}

enum Event {
    Check {
        t_us: u64,
        policy: Box<str>,
        identity: Identity,
        cost: u64,
        decision: Decided,
    },
    Envoy {
        t_us: u64,
        domain: Option<Arc<Domain>>,
        request: RateLimitRequest,
        statuses: Vec<i32>,
        allowed: bool,
    },
    /// Answers once every event queued before it is written.
    Flush(SyncSender<()>),
}

impl Event {
    /// About what the event holds in memory: itself and what its text takes on the heap.
    fn bytes(&self) -> usize {
        let own = std::mem::size_of::<Event>();
        match self {
            Event::Check {
                policy, identity, ..
            } => {
                let pairs = identity.headers().chain(identity.args());
                let pairs: usize = pairs.map(|(n, v)| n.len() + v.len() + 48).sum();
                let users = [identity.user_id(), identity.user_name()];
                own + policy.len() + pairs + users.iter().flatten().map(|u| u.len()).sum::<usize>()
            }
            Event::Envoy {
                request, statuses, ..
            } => {
                let entries = request.descriptors.iter().flat_map(|d| &d.entries);
                let entries: usize = entries.map(|e| e.key.len() + e.value.len() + 48).sum();
                let descriptors = request.descriptors.len() * 64;
                own + request.domain.len() + descriptors + entries + statuses.len() * 4
            }
            Event::Flush(_) => own,
        }
    }
}

/// What a check decided, as the record says it.
struct Decided {
    allowed: bool,
    reason: &'static str,
    retry_after_ms: Option<u64>,
}

/// The recorder `settings` ask for (none when unset), its hashing key read from the
/// variable they name through `var`; an error says what is missing.
pub(crate) fn start(
    settings: Option<&RecordSettings>,
    metrics: &crate::metrics::Metrics,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Option<Recorder>, String> {
    start_with_clock(settings, metrics, var, Arc::new(tollgate::SystemClock))
}

/// [`start`], the lines timed by `clock` (the memory store's, in tests).
pub(crate) fn start_with_clock(
    settings: Option<&RecordSettings>,
    metrics: &crate::metrics::Metrics,
    var: impl Fn(&str) -> Option<String>,
    clock: Arc<dyn Clock>,
) -> Result<Option<Recorder>, String> {
    let Some(settings) = settings else {
        return Ok(None);
    };
    let hasher = match &settings.hash_key_env {
        Some(name) => Some(
            var(name)
                .and_then(|key| Hasher::new(key.trim().as_bytes()))
                .ok_or_else(|| {
                    format!(
                        "environment variable {name} (record.hash_key_env) must hold a key of at least {} bytes to hash the record's identities",
                        hash::MIN_KEY
                    )
                })?,
        ),
        None => None,
    };
    let recorder =
        Recorder::open(settings, hasher, clock, metrics.record_counts()).map_err(|e| {
            format!(
                "cannot open the traffic record {} (record.path): {e}",
                settings.path.display()
            )
        })?;
    tracing::info!(
        path = %settings.path.display(),
        sample = settings.sample,
        hashed = settings.hash_key_env.is_some(),
        "recording what the server decides, for tollgate plan"
    );
    Ok(Some(recorder))
}

impl Recorder {
    /// Opens (appends to) the record of `settings` and starts its writer; `hasher` hashes
    /// identities (`record.identities = "hashed"`).
    pub(crate) fn open(
        settings: &RecordSettings,
        hasher: Option<Hasher>,
        clock: Arc<dyn Clock>,
        counts: Counts,
    ) -> io::Result<Recorder> {
        if let Some(dir) = settings.path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir)?;
        }
        let file = Rotating::open(
            settings.path.clone(),
            settings.max_file_bytes,
            settings.keep_files,
        )?;
        let (queue, events) = sync_channel(settings.buffer);
        let queued = Arc::new(AtomicUsize::new(0));
        let writer = Writer {
            file,
            hasher,
            counts: counts.clone(),
            line: Vec::with_capacity(512),
            queued: queued.clone(),
        };
        std::thread::Builder::new()
            .name("tollgate-record".into())
            .spawn(move || writer.run(events))?;
        let sample_below = if settings.sample >= 1.0 {
            u64::MAX
        } else {
            (settings.sample * u64::MAX as f64) as u64
        };
        Ok(Recorder {
            queue,
            queued,
            max_queued: settings.buffer_bytes,
            sample_below,
            clock,
            counts,
        })
    }

    /// Records a policy check (not a peek: it decides nothing).
    pub(crate) fn check(&self, policy: &str, identity: &Identity, cost: u64, decision: &Decision) {
        if !self.sampled(|h| identity.hash(h)) {
            return;
        }
        let event = Event::Check {
            t_us: self.clock.now_us(),
            policy: policy.into(),
            identity: identity.clone(),
            cost,
            decision: Decided {
                allowed: decision.allowed(),
                reason: decision.reason().as_str(),
                retry_after_ms: decision
                    .retry_after()
                    .map(|d| d.as_micros().div_ceil(1000) as u64),
            },
        };
        self.push(event);
    }

    /// Records an Envoy request and its answer.
    pub(crate) fn envoy(
        &self,
        domain: Option<Arc<Domain>>,
        request: &RateLimitRequest,
        statuses: Vec<i32>,
        allowed: bool,
    ) {
        let entries = request.descriptors.iter().flat_map(|d| &d.entries);
        if !self.sampled(|h| entries.for_each(|e| (&e.key, &e.value).hash(h))) {
            return;
        }
        let event = Event::Envoy {
            t_us: self.clock.now_us(),
            domain,
            request: request.clone(),
            statuses,
            allowed,
        };
        self.push(event);
    }

    /// Waits until every event recorded so far is written and flushed.
    pub(crate) fn flush(&self) {
        let (done, wait) = sync_channel(1);
        if self.queue.send(Event::Flush(done)).is_ok() {
            let _ = wait.recv();
        }
    }

    /// Whether the identity `feed` hashes is in the sample.
    fn sampled(&self, feed: impl FnOnce(&mut Sha256Hasher)) -> bool {
        if self.sample_below == u64::MAX {
            return true;
        }
        // A fixed hash: the same identities are kept by every instance and every restart.
        let mut hasher = Sha256Hasher(Sha256::new());
        feed(&mut hasher);
        hasher.finish() < self.sample_below
    }

    fn push(&self, event: Event) {
        let bytes = event.bytes();
        let before = self.queued.fetch_add(bytes, Ordering::Relaxed);
        let sent = before + bytes <= self.max_queued && self.queue.try_send(event).is_ok();
        if !sent {
            self.queued.fetch_sub(bytes, Ordering::Relaxed);
            self.counts.dropped.inc();
        }
    }
}

/// The most lines written between two flushes.
const MAX_BATCH: usize = 1024;

/// A hash that stays the same across builds and toolchains (the standard library's may
/// not): every instance, old and new, samples the same identities.
pub(crate) struct Sha256Hasher(Sha256);

impl std::hash::Hasher for Sha256Hasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    fn finish(&self) -> u64 {
        let digest = self.0.clone().finalize();
        u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
    }
}

/// The writer thread's side.
struct Writer {
    file: Rotating,
    hasher: Option<Hasher>,
    counts: Counts,
    line: Vec<u8>,
    /// The recorder's count of the bytes queued: the writer takes off what it has written.
    queued: Arc<AtomicUsize>,
}

impl Writer {
    fn run(mut self, events: Receiver<Event>) {
        let mut failures = 0u64;
        while let Ok(first) = events.recv() {
            let mut next = Some(first);
            let mut flushed = Vec::new();
            // What is queued now (a batch at most, so that a steady load flushes too), then
            // one flush.
            let mut batch = 0;
            while let Some(event) = next {
                batch += 1;
                match event {
                    Event::Flush(done) => flushed.push(done),
                    event => {
                        self.queued.fetch_sub(event.bytes(), Ordering::Relaxed);
                        self.line.clear();
                        self.write_line(event);
                        match self.file.write(&self.line) {
                            Ok(()) => {
                                self.counts.written.inc();
                            }
                            Err(e) => {
                                self.counts.failed.inc();
                                failures += 1;
                                // The first failure, then one in a thousand.
                                if failures % 1000 == 1 {
                                    tracing::warn!(error = %e, path = %self.file.path.display(), failures, "cannot write the traffic record");
                                }
                            }
                        };
                    }
                }
                next = if batch < MAX_BATCH {
                    events.try_recv().ok()
                } else {
                    None
                };
            }
            if let Err(e) = self.file.flush() {
                tracing::warn!(error = %e, "cannot flush the traffic record");
            }
            for done in flushed {
                let _ = done.send(());
            }
        }
        let _ = self.file.flush();
    }

    fn write_line(&mut self, event: Event) {
        let written = match event {
            Event::Check {
                t_us,
                policy,
                identity,
                cost,
                decision,
            } => {
                let line = CheckLine {
                    t_us,
                    policy: &policy,
                    identity: self.identity(&identity),
                    cost,
                    allowed: decision.allowed,
                    reason: decision.reason,
                    retry_after_ms: decision.retry_after_ms,
                };
                serde_json::to_writer(&mut self.line, &line)
            }
            Event::Envoy {
                t_us,
                domain,
                request,
                statuses,
                allowed,
            } => {
                let descriptors = request
                    .descriptors
                    .iter()
                    .map(|d| {
                        let values = self.values(domain.as_deref(), &d.entries);
                        DescriptorLine {
                            entries: d
                                .entries
                                .iter()
                                .zip(values)
                                .map(|(e, v)| (e.key.clone(), v))
                                .collect(),
                            limit: d.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
                            hits_addend: d.hits_addend.map(|h| h.value),
                        }
                    })
                    .collect();
                let line = EnvoyLine {
                    t_us,
                    domain: &request.domain,
                    descriptors,
                    hits_addend: (request.hits_addend != 0).then_some(request.hits_addend),
                    allowed,
                    statuses: statuses
                        .iter()
                        .map(|&c| Code::try_from(c).map_or("UNKNOWN", |c| c.as_str_name()))
                        .collect(),
                };
                serde_json::to_writer(&mut self.line, &line)
            }
            Event::Flush(_) => Ok(()),
        };
        // Serializing into memory fails only on a bug; the line is then left out whole.
        if written.is_err() {
            self.line.clear();
            return;
        }
        self.line.push(b'\n');
    }

    /// The identity as a line shows it: as given, or hashed.
    fn identity(&self, identity: &Identity) -> IdentityLine {
        let text = |v: &str| match &self.hasher {
            Some(h) => h.text(v),
            None => v.to_owned(),
        };
        IdentityLine {
            ip: identity.ip().map(|ip| match &self.hasher {
                Some(h) => h.ip(ip),
                None => ip,
            }),
            user_id: identity.user_id().map(text),
            user_name: identity.user_name().map(text),
            headers: identity
                .headers()
                .map(|(n, v)| (n.to_owned(), text(v)))
                .collect(),
            args: identity
                .args()
                .map(|(n, v)| (n.to_owned(), text(v)))
                .collect(),
        }
    }

    /// A descriptor's values as a line shows them: as given, or hashed where the domain's
    /// configuration does not name them (see [`Domain::record_values`]).
    fn values(
        &self,
        domain: Option<&Domain>,
        entries: &[envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry],
    ) -> Vec<String> {
        match (&self.hasher, domain) {
            (None, _) => entries.iter().map(|e| e.value.clone()).collect(),
            (Some(h), Some(domain)) => domain.record_values(entries, &|v| h.text(v)),
            (Some(h), None) => entries.iter().map(|e| h.text(&e.value)).collect(),
        }
    }
}

#[derive(Serialize)]
struct CheckLine<'a> {
    t_us: u64,
    policy: &'a str,
    identity: IdentityLine,
    cost: u64,
    allowed: bool,
    reason: &'a str,
    retry_after_ms: Option<u64>,
}

#[derive(Serialize)]
struct IdentityLine {
    #[serde(skip_serializing_if = "Option::is_none")]
    ip: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user_name: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    args: BTreeMap<String, String>,
}

#[derive(Serialize)]
struct EnvoyLine<'a> {
    t_us: u64,
    domain: &'a str,
    descriptors: Vec<DescriptorLine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hits_addend: Option<u32>,
    allowed: bool,
    statuses: Vec<&'static str>,
}

#[derive(Serialize)]
struct DescriptorLine {
    entries: Vec<(String, String)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<(u32, i32)>,
    #[serde(skip_serializing_if = "Option::is_none")]
    hits_addend: Option<u64>,
}

/// The live file, rotated past its size: `path` -> `path.1` -> ... -> `path.<keep>`.
struct Rotating {
    path: PathBuf,
    out: BufWriter<File>,
    bytes: u64,
    max_bytes: u64,
    keep: u32,
}

impl Rotating {
    fn open(path: PathBuf, max_bytes: u64, keep: u32) -> io::Result<Rotating> {
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let mut bytes = file.metadata()?.len();
        // A line cut short (a disk that filled, a crash) ends here, not in the next one.
        if bytes > 0 {
            use std::io::{Read as _, Seek as _};
            let mut last = [0u8];
            file.seek(io::SeekFrom::End(-1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
                bytes += 1;
            }
        }
        Ok(Rotating {
            path,
            out: BufWriter::with_capacity(64 << 10, file),
            bytes,
            max_bytes,
            keep,
        })
    }

    /// Writes a whole line, rotating first when it would take the file past its size.
    fn write(&mut self, line: &[u8]) -> io::Result<()> {
        if self.bytes > 0 && self.bytes + line.len() as u64 > self.max_bytes {
            self.rotate()?;
        }
        self.out.write_all(line)?;
        self.bytes += line.len() as u64;
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Moves the files one place up and starts a new live file. A file moved away meanwhile
    /// (by hand, by another tool) is skipped; whatever fails, the next rotation is a file's
    /// size away, so a failure does not shuffle the files on every line.
    fn rotate(&mut self) -> io::Result<()> {
        self.bytes = 0;
        self.out.flush()?;
        for k in (1..self.keep).rev() {
            rename_if_there(&numbered(&self.path, k), &numbered(&self.path, k + 1))?;
        }
        if self.keep > 0 {
            rename_if_there(&self.path, &numbered(&self.path, 1))?;
        }
        let file = File::create(&self.path)?;
        self.out = BufWriter::with_capacity(64 << 10, file);
        Ok(())
    }
}

/// `path.<k>`.
pub(crate) fn numbered(path: &Path, k: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{k}"));
    PathBuf::from(name)
}

fn rename_if_there(from: &Path, to: &Path) -> io::Result<()> {
    match fs::rename(from, to) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        done => done,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate::{Dimension, Limiter, ManualClock, MemoryStore, Policy, Tollgate};

    use super::*;

    fn settings(dir: &Path, max_file_bytes: u64, keep_files: u32, buffer: usize) -> RecordSettings {
        RecordSettings {
            path: dir.join("traffic.jsonl"),
            max_file_bytes,
            keep_files,
            sample: 1.0,
            hash_key_env: None,
            buffer,
            buffer_bytes: 16 << 20,
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tollgate-record-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    async fn denied_decision() -> Decision {
        let gate = Tollgate::new(
            MemoryStore::builder()
                .clock(ManualClock::new(Duration::from_secs(1_000)))
                .build(),
        );
        let policy = Policy::builder("sms")
            .limiter(Limiter::new(Dimension::Ip, ["1/1m".parse().unwrap()]))
            .build()
            .unwrap();
        let who = Identity::new().with_ip("203.0.113.7".parse().unwrap());
        gate.check(&policy, &who, 1).await.unwrap();
        gate.check(&policy, &who, 1).await.unwrap()
    }

    #[tokio::test]
    async fn a_check_is_one_line_of_json_with_the_records_clock() {
        let dir = temp_dir("line");
        let clock = ManualClock::new(Duration::from_secs(1_700_000_000));
        let recorder = Recorder::open(
            &settings(&dir, 1 << 20, 2, 16),
            None,
            Arc::new(clock.clone()),
            Counts::default(),
        )
        .unwrap();
        let who = Identity::new()
            .with_ip("203.0.113.7".parse().unwrap())
            .with_user_id("42")
            .with_header("X-Api-Key", "k1");
        recorder.check("sms", &who, 2, &denied_decision().await);
        recorder.flush();
        let text = fs::read_to_string(dir.join("traffic.jsonl")).unwrap();
        assert_eq!(
            text,
            "{\"t_us\":1700000000000000,\"policy\":\"sms\",\"identity\":{\"ip\":\"203.0.113.7\",\"user_id\":\"42\",\"headers\":{\"x-api-key\":\"k1\"}},\"cost\":2,\"allowed\":false,\"reason\":\"rate_limited\",\"retry_after_ms\":60000}\n"
        );
    }

    #[tokio::test]
    async fn hashed_identities_keep_no_value_and_stay_distinct() {
        let dir = temp_dir("hashed");
        let recorder = Recorder::open(
            &settings(&dir, 1 << 20, 2, 16),
            Hasher::new(b"sixteen byte key"),
            Arc::new(ManualClock::new(Duration::from_secs(1))),
            Counts::default(),
        )
        .unwrap();
        let decision = denied_decision().await;
        for user in ["alice", "bob", "alice"] {
            let who = Identity::new()
                .with_ip("203.0.113.7".parse().unwrap())
                .with_user_id(user);
            recorder.check("sms", &who, 1, &decision);
        }
        recorder.flush();
        let text = fs::read_to_string(dir.join("traffic.jsonl")).unwrap();
        assert!(!text.contains("alice") && !text.contains("bob"), "{text}");
        assert!(!text.contains("203.0.113.7"), "{text}");
        let users: Vec<serde_json::Value> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["identity"]["user_id"].clone()
            })
            .collect();
        assert_eq!(users[0], users[2]);
        assert_ne!(users[0], users[1]);
    }

    #[tokio::test]
    async fn the_file_rotates_past_its_size_and_keeps_as_many_as_asked() {
        let dir = temp_dir("rotate");
        let recorder = Recorder::open(
            &settings(&dir, 4096, 2, 1024),
            None,
            Arc::new(ManualClock::new(Duration::from_secs(1))),
            Counts::default(),
        )
        .unwrap();
        let decision = denied_decision().await;
        let who = Identity::new().with_ip("203.0.113.7".parse().unwrap());
        // About 150 bytes a line: 200 lines make seven files of 4096 bytes or less.
        for _ in 0..200 {
            recorder.check("sms", &who, 1, &decision);
        }
        recorder.flush();
        let path = dir.join("traffic.jsonl");
        let mut names: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["traffic.jsonl", "traffic.jsonl.1", "traffic.jsonl.2"]
        );
        for k in [None, Some(1), Some(2)] {
            let file = k.map_or(path.clone(), |k| numbered(&path, k));
            let text = fs::read_to_string(&file).unwrap();
            assert!(
                text.len() <= 4096,
                "{} holds {} bytes",
                file.display(),
                text.len()
            );
            assert!(
                text.ends_with('\n')
                    && text.lines().all(|l| l.starts_with('{') && l.ends_with('}'))
            );
        }
    }

    /// A live file moved away (by hand, by another tool) does not stop the record: the next
    /// rotation starts a new file and the rotated ones stay in order.
    #[tokio::test]
    async fn a_live_file_moved_away_is_started_again() {
        let dir = temp_dir("moved");
        let counts = Counts::default();
        let recorder = Recorder::open(
            &settings(&dir, 4096, 2, 1024),
            None,
            Arc::new(ManualClock::new(Duration::from_secs(1))),
            counts.clone(),
        )
        .unwrap();
        let decision = denied_decision().await;
        let who = Identity::new().with_ip("203.0.113.7".parse().unwrap());
        for _ in 0..10 {
            recorder.check("sms", &who, 1, &decision);
        }
        recorder.flush();
        fs::rename(dir.join("traffic.jsonl"), dir.join("elsewhere.jsonl")).unwrap();
        for _ in 0..100 {
            recorder.check("sms", &who, 1, &decision);
        }
        recorder.flush();
        assert_eq!(counts.failed.get(), 0);
        let live = fs::read_to_string(dir.join("traffic.jsonl")).unwrap();
        assert!(!live.is_empty() && live.ends_with('\n'));
    }

    /// A line cut short (a disk that filled) is ended before the next one is written.
    #[tokio::test]
    async fn a_line_cut_short_does_not_swallow_the_next() {
        let dir = temp_dir("cut");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("traffic.jsonl"), "{\"t_us\":1,\"pol").unwrap();
        let recorder = Recorder::open(
            &settings(&dir, 1 << 20, 2, 16),
            None,
            Arc::new(ManualClock::new(Duration::from_secs(1))),
            Counts::default(),
        )
        .unwrap();
        let who = Identity::new().with_ip("203.0.113.7".parse().unwrap());
        recorder.check("sms", &who, 1, &denied_decision().await);
        recorder.flush();
        let text = fs::read_to_string(dir.join("traffic.jsonl")).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[1].starts_with("{\"t_us\":1000000,"), "{text}");
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        // A queue of one line and no writer draining it.
        let (queue, events) = sync_channel(1);
        let counts = Counts::default();
        let recorder = Recorder {
            queue,
            queued: Arc::default(),
            max_queued: usize::MAX,
            sample_below: u64::MAX,
            clock: Arc::new(ManualClock::new(Duration::from_secs(1))),
            counts: counts.clone(),
        };
        let decision = denied_decision().await;
        let who = Identity::new().with_ip("203.0.113.7".parse().unwrap());
        for _ in 0..3 {
            recorder.check("sms", &who, 1, &decision);
        }
        assert_eq!(counts.dropped.get(), 2);
        assert!(matches!(
            events.try_recv(),
            Ok(Event::Check { cost: 1, .. })
        ));
        assert!(events.try_recv().is_err());
    }

    #[tokio::test]
    async fn the_queue_holds_no_more_bytes_than_its_budget() {
        let dir = temp_dir("bytes");
        fs::create_dir_all(&dir).unwrap();
        // Room for lines, not for bytes: three events of large identities fill the budget.
        let mut s = settings(&dir, 1 << 20, 0, 1024);
        let who = Identity::new().with_header("x-large", "v".repeat(30_000));
        s.buffer_bytes = 100_000;
        let decision = denied_decision().await;
        let clock = Arc::new(ManualClock::new(Duration::from_secs(1)));
        let counts = Counts::default();
        // The writer is not started yet: what is queued stays queued.
        let (queue, events) = sync_channel(s.buffer);
        let recorder = Recorder {
            queue,
            queued: Arc::default(),
            max_queued: s.buffer_bytes,
            sample_below: u64::MAX,
            clock,
            counts: counts.clone(),
        };
        for _ in 0..5 {
            recorder.check("sms", &who, 1, &decision);
        }
        assert_eq!(counts.dropped.get(), 2, "two events past the budget");
        let queued = recorder.queued.load(Ordering::Relaxed);
        assert!(
            (90_000..=100_000).contains(&queued),
            "{queued} bytes queued"
        );
        // Written, the events give their bytes back: the queue takes large events again.
        let writer = Writer {
            file: Rotating::open(s.path.clone(), s.max_file_bytes, 0).unwrap(),
            hasher: None,
            counts: counts.clone(),
            line: Vec::new(),
            queued: recorder.queued.clone(),
        };
        std::thread::spawn(move || writer.run(events));
        recorder.flush();
        assert_eq!(recorder.queued.load(Ordering::Relaxed), 0);
        assert_eq!(counts.written.get(), 3);
        recorder.check("sms", &who, 1, &decision);
        recorder.flush();
        assert_eq!((counts.written.get(), counts.dropped.get()), (4, 2));
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn sampling_keeps_whole_identities() {
        let dir = temp_dir("sample");
        let mut s = settings(&dir, 1 << 20, 0, 1024);
        s.sample = 0.5;
        let recorder = Recorder::open(
            &s,
            None,
            Arc::new(ManualClock::new(Duration::from_secs(1))),
            Counts::default(),
        )
        .unwrap();
        let kept = (0..1000)
            .filter(|i| {
                let who = Identity::new().with_user_id(i.to_string());
                recorder.sampled(|h| who.hash(h))
            })
            .count();
        assert!((400..600).contains(&kept), "{kept} of 1000 kept at 0.5");
        let who = Identity::new().with_user_id("7");
        let first = recorder.sampled(|h| who.hash(h));
        assert!((0..100).all(|_| recorder.sampled(|h| who.hash(h)) == first));
    }
}
