//! The kube-proxy scrape source (adapter): read every kube-proxy's `/metrics` and `/proxyMode`
//! concurrently with a bound on requests in flight and a per-target timeout, classify failures,
//! and record them into the rolling [`MeasurementStore`]. Where the kube-proxies are is
//! [`super::targets`]; their configuration, [`super::proxy_config`]; the loop that scrapes on
//! an interval with jitter, with `--source auto`'s fallbacks, [`super::scrape_loop`].
//!
//! Pieces, each usable on its own:
//! - [`scrape_once`] / [`scrape_all`]: one target / every target, each giving a
//!   [`ScrapeOutcome`] whose failure is a [`NodeFailure`] with a [`reason`] label:
//!   `connection_refused` (the message carries the `metricsBindAddress` hint), `timeout`,
//!   `http_status`, `parse` (the message names the family and the line) or `other`;
//! - [`record_outcomes`]: outcomes into the store;
//! - [`Jitter`]: the interval plus up to 10% of it, for the measurement loops
//!   ([`super::scrape_loop`], [`super::prometheus`]);
//! - [`ScrapeMetrics`]: `scrape_errors_total{reason}`, `scrape_duration_seconds`,
//!   `scrape_targets` for the process registry.

use super::fetch::{FetchError, ScrapeBody, connect_hint, fetch_scrape};
use super::oneshot::{decode_utf8, unix_now};
use super::targets::Target;
use crate::core::exposition::{ACCEPT_PROTOBUF_FIRST, KubeProxyScrape, ScrapeError, parse_scrape};
use crate::core::measure::{MeasurementStore, NodeFailure, NodeSource, Sample, reason};
use futures::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio_util::sync::CancellationToken;

/// Default time between scrape cycles.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(30);
/// Default per-target timeout (both requests of a target together).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default bound on targets scraped at once.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// The jitter added to each interval is uniform in `[0, JITTER_FRACTION * interval]`.
pub const JITTER_FRACTION: f64 = 0.1;

/// How to scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct ScrapeOptions {
    /// Per-target limit for both requests together (default 5 s).
    pub timeout: Duration,
    /// Targets scraped at once (default 64; at least 1).
    pub max_in_flight: usize,
    /// Largest `/metrics` body accepted, bytes (default 32 MiB).
    pub max_body_bytes: usize,
    /// Also read `/proxyMode` (default true); a failure there is never an error.
    pub fetch_proxy_mode: bool,
}

impl Default for ScrapeOptions {
    fn default() -> Self {
        Self { timeout: DEFAULT_TIMEOUT, max_in_flight: DEFAULT_MAX_IN_FLIGHT, max_body_bytes: super::fetch::DEFAULT_MAX_BODY_BYTES, fetch_proxy_mode: true }
    }
}

/// The result of scraping one target.
#[derive(Debug, Clone)]
pub struct ScrapeOutcome {
    /// The target's node name.
    pub node: String,
    /// The sample, or why there is none.
    pub result: Result<Sample, NodeFailure>,
    /// Time from the first request to the parsed result (or the failure); with fallbacks,
    /// every source tried together.
    pub elapsed: Duration,
    /// The source that measured the node (for a failure: the last one tried).
    pub source: NodeSource,
}

impl ScrapeOutcome {
    /// The failure reason label, `None` on success.
    pub fn reason(&self) -> Option<&str> {
        self.result.as_ref().err().map(|f| f.reason.as_str())
    }
}

pub(super) struct Failure {
    pub(super) reason: &'static str,
    pub(super) message: String,
}

fn classify(url: &str, e: &reqwest::Error) -> Failure {
    let message = connect_hint(e);
    let reason = if e.is_timeout() {
        reason::TIMEOUT
    } else if e.is_connect() && message.to_ascii_lowercase().contains("refused") {
        reason::CONNECTION_REFUSED
    } else {
        reason::OTHER
    };
    let message = if message.contains(url) { message } else { format!("{url}: {message}") };
    Failure { reason, message }
}

/// A fetch failure as the scraper records it: a [`reason`] label and a message naming the URL.
pub(super) fn failure(url: &str, e: FetchError) -> Failure {
    match e {
        FetchError::Transport(e) => classify(url, &e),
        FetchError::Status(status) => Failure { reason: reason::HTTP_STATUS, message: format!("{url}: HTTP {status}") },
        e @ FetchError::TooLarge { .. } => Failure { reason: reason::OTHER, message: format!("{url}: {e}") },
    }
}

/// `bytes` from `url` as UTF-8 text, or a [`reason::PARSE`] failure.
pub(super) fn text(url: &str, bytes: Vec<u8>) -> Result<String, Failure> {
    decode_utf8(url, bytes).map_err(|e| Failure { reason: reason::PARSE, message: e.to_string() })
}

/// A `/metrics` body from `url` read in the format its content type names ([`parse_scrape`]),
/// or a [`reason::PARSE`] failure naming the URL (a text body that is not UTF-8 as [`text`]
/// names it).
fn read_scrape(url: &str, body: ScrapeBody) -> Result<KubeProxyScrape, Failure> {
    match parse_scrape(&body.bytes, body.content_type.as_deref()) {
        Ok(scrape) => Ok(scrape),
        Err(ScrapeError::NotUtf8(e)) => {
            Err(text(url, body.bytes).err().unwrap_or_else(|| Failure { reason: reason::PARSE, message: format!("{url}: not UTF-8 text: {e}") }))
        }
        Err(e) => Err(Failure { reason: reason::PARSE, message: format!("{url}: {e}") }),
    }
}

/// Scrapes one target: GET `/metrics` (and, when enabled, `/proxyMode` at the same time), both
/// within `opts.timeout`, asking for the protobuf exposition first and text as the fallback
/// ([`ACCEPT_PROTOBUF_FIRST`]), then reads the body in the format its `Content-Type` names
/// ([`parse_scrape`]: protobuf carries the native histograms). Never panics; every failure
/// becomes a [`NodeFailure`] (see the [`reason`] labels): a refused connection carries
/// [`connect_hint`]'s `metricsBindAddress` advice, a parse failure names the URL, line and
/// family (`line 17: kubeproxy_sync_proxy_rules_duration_seconds: ...`; for protobuf the
/// message and its byte offset).
pub async fn scrape_once(client: &reqwest::Client, target: &Target, opts: &ScrapeOptions) -> ScrapeOutcome {
    let start = Instant::now();
    let metrics_url = target.url("/metrics");
    let mode_url = opts.fetch_proxy_mode.then(|| target.url("/proxyMode"));
    let work = fetch_scrape(client, &metrics_url, mode_url.as_deref(), opts.max_body_bytes, ACCEPT_PROTOBUF_FIRST);
    let fetched = tokio::time::timeout(opts.timeout, work).await;
    let at = unix_now();
    let fail = |f: Failure| NodeFailure { reason: f.reason.to_string(), message: f.message, at_unix_seconds: at };
    let result = match fetched {
        Err(_) => {
            let port = target.port().map_or_else(|| "the metrics port".to_string(), |p| format!("port {p}"));
            Err(fail(Failure {
                reason: reason::TIMEOUT,
                message: format!(
                    "{metrics_url}: no complete answer within {:.1} s (timed out: is a NetworkPolicy or host firewall blocking {port}, or is kube-proxy overloaded?)",
                    opts.timeout.as_secs_f64()
                ),
            }))
        }
        Ok((Err(e), _)) => Err(fail(failure(&metrics_url, e))),
        Ok((Ok(body), proxy_mode)) => match read_scrape(&metrics_url, body) {
            Ok(scrape) => Ok(Sample { at_unix_seconds: at, scrape, proxy_mode }),
            Err(f) => Err(fail(f)),
        },
    };
    ScrapeOutcome { node: target.node.clone(), result, elapsed: start.elapsed(), source: NodeSource::KubeProxy }
}

/// Scrapes every target with at most `opts.max_in_flight` at once
/// (`stream::iter(..).buffer_unordered(n)`), each bounded by `opts.timeout`. The outcomes come
/// back in completion order, one per target.
pub async fn scrape_all(client: &reqwest::Client, targets: &[Target], opts: &ScrapeOptions) -> Vec<ScrapeOutcome> {
    // by index, lazily: a closure over `&Target` would be higher-ranked over the reference's
    // lifetime, which makes a caller's `tokio::spawn` fail the `Send` check (rustc limitation);
    // collecting the futures first would allocate all of them at once
    futures::stream::iter((0..targets.len()).map(move |i| scrape_once(client, &targets[i], opts))).buffer_unordered(opts.max_in_flight.max(1)).collect().await
}

/// Counts of one [`record_outcomes`] call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Recorded {
    /// Successful scrapes recorded.
    pub scraped: usize,
    /// Failures recorded.
    pub failed: usize,
}

/// Records outcomes into the store: samples with [`MeasurementStore::record_via`] (their
/// source noted), failures with
/// [`MeasurementStore::record_failure`]. Does not drop vanished nodes (see
/// [`MeasurementStore::retain_nodes`]).
pub fn record_outcomes(store: &mut MeasurementStore, outcomes: impl IntoIterator<Item = ScrapeOutcome>) -> Recorded {
    let mut n = Recorded::default();
    for o in outcomes {
        match o.result {
            Ok(sample) => {
                store.record_via(&o.node, sample, o.source);
                n.scraped += 1;
            }
            Err(f) => {
                store.record_failure(&o.node, f);
                n.failed += 1;
            }
        }
    }
    n
}

/// `reason` label of `scrape_errors_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// One of the [`reason`] labels.
    pub reason: String,
}

/// Buckets of `scrape_duration_seconds`: 5 ms .. 30 s.
pub const SCRAPE_DURATION_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// The scraper's metrics. Register once with [`ScrapeMetrics::register`], e.g.
/// `telemetry.register("scrape", |r| m.register(r))`, which exposes
/// `safe_termination_scrape_errors_total{reason}`, `safe_termination_scrape_duration_seconds`
/// and `safe_termination_scrape_targets`. Clones share the same series.
#[derive(Debug, Clone)]
pub struct ScrapeMetrics {
    /// `errors_total{reason}`: failed target scrapes by reason.
    pub errors: Family<ReasonLabel, Counter>,
    /// `duration_seconds`: time to scrape and parse one target, successful or not.
    pub duration: Histogram,
    /// `targets`: kube-proxy targets in the last cycle.
    pub targets: Gauge,
}

impl Default for ScrapeMetrics {
    fn default() -> Self {
        Self { errors: Family::default(), duration: Histogram::new(SCRAPE_DURATION_BUCKETS), targets: Gauge::default() }
    }
}

impl ScrapeMetrics {
    /// Registers the three metrics in `registry` (names relative to the registry's prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("errors", "Failed kube-proxy scrapes, by reason", self.errors.clone());
        registry.register_with_unit("duration", "Time to scrape and parse one kube-proxy", Unit::Seconds, self.duration.clone());
        registry.register("targets", "kube-proxy targets in the last scrape cycle", self.targets.clone());
    }

    /// Records a cycle's outcomes.
    pub fn observe(&self, outcomes: &[ScrapeOutcome]) {
        self.targets.set(outcomes.len() as i64);
        for o in outcomes {
            self.duration.observe(o.elapsed.as_secs_f64());
            if let Some(r) = o.reason() {
                self.errors.get_or_create(&ReasonLabel { reason: r.to_string() }).inc();
            }
        }
    }
}

/// A small xorshift64* generator for the loops' jitter (no cryptographic use).
#[derive(Debug, Clone)]
pub struct Jitter(u64);

impl Jitter {
    /// Seeded from the clock and the process id.
    pub fn seeded() -> Self {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Self((nanos ^ (std::process::id() as u64).rotate_left(32)) | 1)
    }

    /// Uniform in [0, 1).
    fn next_unit(&mut self) -> f64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// `interval` plus up to `JITTER_FRACTION` of it.
    pub fn delay(&mut self, interval: Duration) -> Duration {
        interval.mul_f64(1.0 + JITTER_FRACTION * self.next_unit())
    }

    /// Sleeps `interval` plus jitter; false when `cancel` fired first (the loop should end).
    pub async fn sleep(&mut self, interval: Duration, cancel: &CancellationToken) -> bool {
        let delay = self.delay(interval);
        tokio::select! {
            biased;
            _ = cancel.cancelled() => false,
            _ = tokio::time::sleep(delay) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_ten_percent() {
        let mut j = Jitter(42);
        let base = Duration::from_secs(30);
        let mut seen_low = false;
        let mut seen_high = false;
        for _ in 0..10_000 {
            let d = j.delay(base);
            assert!(d >= base && d <= base.mul_f64(1.1), "{d:?}");
            seen_low |= d < base.mul_f64(1.01);
            seen_high |= d > base.mul_f64(1.09);
        }
        assert!(seen_low && seen_high);
    }

    #[test]
    fn metrics_register_and_count_reasons() {
        let m = ScrapeMetrics::default();
        let mut r = Registry::with_prefix("safe_termination_scrape");
        m.register(&mut r);
        let fail = |reason: &str| ScrapeOutcome {
            node: "n".into(),
            result: Err(NodeFailure { reason: reason.into(), message: String::new(), at_unix_seconds: 0.0 }),
            elapsed: Duration::from_millis(3),
            source: NodeSource::KubeProxy,
        };
        m.observe(&[fail(reason::TIMEOUT), fail(reason::TIMEOUT), fail(reason::PARSE)]);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        assert!(text.contains("safe_termination_scrape_errors_total{reason=\"timeout\"} 2"), "{text}");
        assert!(text.contains("safe_termination_scrape_errors_total{reason=\"parse\"} 1"), "{text}");
        assert!(text.contains("safe_termination_scrape_duration_seconds_count 3"), "{text}");
        assert!(text.contains("safe_termination_scrape_targets 3"), "{text}");
    }
}
