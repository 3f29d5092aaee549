//! The waiter's endpoint (adapter), on the webhook's HTTPS server: `GET /wait/v1` answers a
//! pod's preStop waiter whether every node has removed its endpoints
//! ([`crate::core::wait::decide`]), `POST /wait/v1/report` takes how its wait ended.
//!
//! - **Who asks**: the bearer token is the pod's projected service-account token of audience
//!   [`crate::core::wait::WAIT_AUDIENCE`]; a TokenReview ([`TokenReviewer`]) gives its pod's namespace, name and
//!   UID. The answer is only ever about that pod. Reviews are cached by the token's SHA-256 for
//!   [`TOKEN_CACHE_SECONDS`] (at most [`TOKEN_CACHE_ENTRIES`]), so a waiter's questions cost the
//!   API server one review.
//! - **Which replica**: only the leader observes removals. Any other replica answers
//!   [`WaitState::NotLeader`] (HTTP 421) before any review, and the waiter asks again on a new
//!   connection, which the Service balances to another replica.
//! - **Bounds**: a question is held at most `timeoutSeconds` (at most [`MAX_POLL_SECONDS`]); at
//!   most [`MAX_WAITS`] questions and reports are served at once (503 beyond, and the waiter
//!   falls back to the sleep); a report's body is at most [`MAX_REPORT_BYTES`]. The server's own
//!   connection bounds apply ([`super::server::serve`]).
//! - **Doubt**: an unreadable token, a refused review, a TokenReview that fails: the waiter is
//!   told `Unknown` and falls back to the sleep.

use super::server::PlanHandle;
use crate::core::wait::{MAX_POLL_SECONDS, PodView, WaitAnswer, WaitOutcome, WaitRecord, WaitReport, WaitState, decide};
use axum::Router;
use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::BoxFuture;
use http_body_util::BodyExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a TokenReview's answer is reused, seconds (a projected token lives an hour; a
/// waiter asks for at most a minute).
pub const TOKEN_CACHE_SECONDS: u64 = 120;
/// How long a refused token is refused without another review, seconds.
pub const REFUSED_CACHE_SECONDS: u64 = 10;
/// The most TokenReview answers kept.
pub const TOKEN_CACHE_ENTRIES: usize = 10_000;
/// The most questions and reports served at once.
pub const MAX_WAITS: usize = 4096;
/// The largest report body, bytes.
pub const MAX_REPORT_BYTES: usize = 4096;
/// The longest bearer token read, bytes (a projected token is about 1 KiB).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// How often a held question looks at the observer's state again.
pub const RECHECK: Duration = Duration::from_millis(100);
/// How long a TokenReview may take before the waiter is told `Unknown`.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(3);

/// The pod a token belongs to (the TokenReview's `status.user.extra`
/// `authentication.kubernetes.io/pod-name` and `pod-uid`, and the service account's namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// Checks a token of audience [`crate::core::wait::WAIT_AUDIENCE`] (the controller's TokenReview).
pub trait TokenReviewer: Send + Sync + 'static {
    /// The pod `token` was issued to.
    ///
    /// Errors: a refused token (not authenticated, another audience, not bound to a pod) or a
    /// failed review, in words.
    fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, String>>;
}

/// What the waiter's answers are made of (the controller's Service index and leadership).
pub trait WaitSource: Send + Sync + 'static {
    /// Whether this replica leads now.
    fn leading(&self) -> bool;
    /// What is known of the pod `uid` ([`crate::controller::service_index::ClusterIndex::wait_view`]).
    fn view(&self, uid: &str, first_asked: f64) -> PodView;
    /// The pod `uid`'s window, once every removal of it closed observed (seconds).
    fn window(&self, uid: &str) -> Option<f64>;
    /// Keeps a finished wait for the status.
    fn record(&self, record: WaitRecord);
}

/// The endpoint's metrics (`safe_termination_wait_`).
#[derive(Debug, Clone)]
pub struct WaitMetrics {
    /// Answers by state.
    pub answers: Family<StateLabel, Counter>,
    /// Finished waits by outcome.
    pub waits: Family<OutcomeLabel, Counter>,
    /// Each finished wait's duration, seconds.
    pub wait_seconds: Family<OutcomeLabel, Histogram, fn() -> Histogram>,
    /// The sleep each finished wait replaced, seconds.
    pub sleep_seconds: Family<OutcomeLabel, Histogram, fn() -> Histogram>,
}

/// Label `state`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    /// The answer's state, or `Refused`.
    pub state: String,
}

/// Label `outcome`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// [`WaitOutcome::as_str`].
    pub outcome: String,
}

fn seconds_histogram() -> Histogram {
    Histogram::new([0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0, 34.0, 60.0])
}

impl Default for WaitMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl WaitMetrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self {
            answers: Family::default(),
            waits: Family::default(),
            wait_seconds: Family::new_with_constructor(seconds_histogram),
            sleep_seconds: Family::new_with_constructor(seconds_histogram),
        }
    }

    /// Registers under the registry's prefix (`safe_termination_wait_`).
    pub fn register(&self, r: &mut Registry) {
        r.register("answers", "answers to preStop waiters by state (Refused: no answer about a pod)", self.answers.clone());
        r.register("waits", "finished preStop waits by outcome (Removed, LastEndpoint, Deadline, Fallback)", self.waits.clone());
        r.register_with_unit("duration", "each finished preStop wait, from its hook's start", Unit::Seconds, self.wait_seconds.clone());
        r.register_with_unit("sleep", "the preStop sleep each finished wait replaced (its fallback)", Unit::Seconds, self.sleep_seconds.clone());
    }
}

/// The endpoint's state.
#[derive(Clone)]
pub struct WaitEndpoint {
    reviewer: Arc<dyn TokenReviewer>,
    source: Arc<dyn WaitSource>,
    plan: PlanHandle,
    metrics: WaitMetrics,
    inner: Arc<Inner>,
}

struct Inner {
    /// SHA-256 of a token -> (its pod, when reviewed)
    tokens: Mutex<HashMap<[u8; 32], (PodIdentity, Instant)>>,
    /// pod UID -> when it first asked, unix seconds
    first_asked: Mutex<HashMap<String, f64>>,
    /// SHA-256 of a refused token -> when: refused again without a review for
    /// [`REFUSED_CACHE_SECONDS`] (random tokens cannot make one TokenReview each)
    refused: Mutex<HashMap<[u8; 32], Instant>>,
    /// pod UIDs whose wait was reported (a pod's containers each run a waiter: the first report
    /// counts), at most [`TOKEN_CACHE_ENTRIES`]
    reported: Mutex<std::collections::HashSet<String>>,
    permits: tokio::sync::Semaphore,
}

impl WaitEndpoint {
    /// The endpoint over `reviewer` and `source`, with the policies of `plan` (for each policy's
    /// `extraSeconds`).
    pub fn new(reviewer: Arc<dyn TokenReviewer>, source: Arc<dyn WaitSource>, plan: PlanHandle, metrics: WaitMetrics) -> Self {
        let inner = Inner {
            tokens: Mutex::new(HashMap::new()),
            first_asked: Mutex::new(HashMap::new()),
            refused: Mutex::new(HashMap::new()),
            reported: Mutex::new(std::collections::HashSet::new()),
            permits: tokio::sync::Semaphore::new(MAX_WAITS),
        };
        Self { reviewer, source, plan, metrics, inner: Arc::new(inner) }
    }

    /// The routes: `GET /wait/v1`, `POST /wait/v1/report`.
    pub fn router(self) -> Router {
        Router::new().route("/wait/v1", get(ask)).route("/wait/v1/report", post(report)).with_state(self)
    }

    /// The pod of `headers`' bearer token, reviewed or from the cache.
    async fn identify(&self, headers: &HeaderMap) -> Result<PodIdentity, (StatusCode, String)> {
        let token = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty() && t.len() <= MAX_TOKEN_BYTES)
            .ok_or((StatusCode::UNAUTHORIZED, "no bearer token (the pod's projected token of audience wait.safetermination.io)".to_string()))?;
        let key: [u8; 32] = ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref().try_into().unwrap_or([0; 32]);
        let ttl = Duration::from_secs(TOKEN_CACHE_SECONDS);
        if let Some((who, at)) = self.inner.tokens.lock().ok().and_then(|m| m.get(&key).cloned())
            && at.elapsed() < ttl
        {
            return Ok(who);
        }
        let refused_ttl = Duration::from_secs(REFUSED_CACHE_SECONDS);
        if self.inner.refused.lock().ok().and_then(|m| m.get(&key).copied()).is_some_and(|at| at.elapsed() < refused_ttl) {
            return Err((StatusCode::UNAUTHORIZED, format!("token refused (again within {REFUSED_CACHE_SECONDS} s)")));
        }
        let who = match tokio::time::timeout(REVIEW_TIMEOUT, self.reviewer.review(token)).await {
            Ok(Ok(who)) => who,
            Ok(Err(e)) => {
                if let Ok(mut m) = self.inner.refused.lock() {
                    if m.len() >= TOKEN_CACHE_ENTRIES {
                        m.retain(|_, at| at.elapsed() < refused_ttl);
                        if m.len() >= TOKEN_CACHE_ENTRIES {
                            m.clear();
                        }
                    }
                    m.insert(key, Instant::now());
                }
                return Err((StatusCode::UNAUTHORIZED, format!("token refused: {e}")));
            }
            Err(_) => return Err((StatusCode::SERVICE_UNAVAILABLE, "the TokenReview did not answer in time".into())),
        };
        if let Ok(mut m) = self.inner.tokens.lock() {
            if m.len() >= TOKEN_CACHE_ENTRIES {
                m.retain(|_, (_, at)| at.elapsed() < ttl);
                if m.len() >= TOKEN_CACHE_ENTRIES {
                    m.clear();
                }
            }
            m.insert(key, (who.clone(), Instant::now()));
        }
        Ok(who)
    }

    /// When the pod `uid` first asked (now, the first time), pruning entries older than the
    /// longest wait's worth.
    fn first_asked(&self, uid: &str, now: f64) -> f64 {
        let Ok(mut m) = self.inner.first_asked.lock() else { return now };
        if m.len() >= TOKEN_CACHE_ENTRIES {
            m.retain(|_, at| now - *at < 3600.0);
            if m.len() >= TOKEN_CACHE_ENTRIES {
                m.clear();
            }
        }
        *m.entry(uid.to_string()).or_insert(now)
    }

    /// `extraSeconds` of the policy `name` that applies in `namespace` (None when not found).
    fn extra_seconds(&self, namespace: &str, name: &str) -> Option<u32> {
        let plan = self.plan.current();
        plan.policies
            .iter()
            .chain(plan.default_policy.iter())
            .find(|p| p.name == name && (p.namespace == namespace || p.namespace.is_empty()))
            .map(|p| p.spec.pre_stop.extra_seconds)
    }

    fn answer(&self, status: StatusCode, a: &WaitAnswer) -> Response {
        self.metrics.answers.get_or_create(&StateLabel { state: format!("{:?}", a.state) }).inc();
        (status, axum::Json(a)).into_response()
    }

    fn refuse(&self, status: StatusCode, detail: String) -> Response {
        self.metrics.answers.get_or_create(&StateLabel { state: "Refused".into() }).inc();
        (status, axum::Json(WaitAnswer { state: WaitState::Unknown, margin_seconds: None, detail })).into_response()
    }

    /// What both routes check first, in order: a permit of [`MAX_WAITS`] (503 beyond), this
    /// replica leading (421 `NotLeader` before any review), and the token's pod (401/503).
    async fn admit(&self, headers: &HeaderMap) -> Result<(tokio::sync::SemaphorePermit<'_>, PodIdentity), Response> {
        let Ok(permit) = self.inner.permits.try_acquire() else {
            return Err(self.refuse(StatusCode::SERVICE_UNAVAILABLE, format!("more than {MAX_WAITS} waits at once")));
        };
        if !self.source.leading() {
            return Err(self.not_leader());
        }
        match self.identify(headers).await {
            Ok(who) => Ok((permit, who)),
            Err((status, detail)) => Err(self.refuse(status, detail)),
        }
    }

    fn not_leader(&self) -> Response {
        self.answer(
            StatusCode::MISDIRECTED_REQUEST,
            &WaitAnswer { state: WaitState::NotLeader, margin_seconds: None, detail: "this replica does not lead".into() },
        )
    }
}

/// The query of `GET /wait/v1`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct AskQuery {
    #[serde(default)]
    timeout_seconds: Option<u64>,
    #[serde(default)]
    policy: Option<String>,
}

async fn ask(State(w): State<WaitEndpoint>, Query(q): Query<AskQuery>, headers: HeaderMap) -> Response {
    let (_permit, who) = match w.admit(&headers).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let hold = Duration::from_secs(q.timeout_seconds.unwrap_or(MAX_POLL_SECONDS).min(MAX_POLL_SECONDS));
    // the policy's extraSeconds (paths the observer does not see) is part of the margin: a
    // policy not known (renamed, deleted) leaves it unknown, and the waiter falls back
    let Some(extra) = q.policy.as_deref().and_then(|p| w.extra_seconds(&who.namespace, p)) else {
        let detail = format!("the pod's policy {:?} is not known in namespace {}", q.policy.as_deref().unwrap_or(""), who.namespace);
        return w.answer(StatusCode::OK, &WaitAnswer { state: WaitState::Unknown, margin_seconds: None, detail });
    };
    let started = Instant::now();
    let first = w.first_asked(&who.uid, super::unix_now());
    loop {
        if !w.source.leading() {
            return w.not_leader();
        }
        let a = decide(&w.source.view(&who.uid, first), super::unix_now(), extra);
        if a.state != WaitState::Waiting || started.elapsed() + RECHECK > hold {
            return w.answer(StatusCode::OK, &a);
        }
        tokio::time::sleep(RECHECK).await;
    }
}

async fn report(State(w): State<WaitEndpoint>, headers: HeaderMap, body: Body) -> Response {
    let (_permit, who) = match w.admit(&headers).await {
        Ok(admitted) => admitted,
        Err(refused) => return refused,
    };
    let limited = http_body_util::Limited::new(body, MAX_REPORT_BYTES);
    let bytes = match tokio::time::timeout(REVIEW_TIMEOUT, limited.collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return w.refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("a report is at most {MAX_REPORT_BYTES} bytes")),
        Err(_) => return w.refuse(StatusCode::REQUEST_TIMEOUT, "the report did not arrive in time".into()),
    };
    let r: WaitReport = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => return w.refuse(StatusCode::BAD_REQUEST, format!("not a wait report: {e}")),
    };
    if let Err(e) = r.validate() {
        return w.refuse(StatusCode::BAD_REQUEST, e);
    }
    // only a pod being deleted waits; each pod counts once (one waiter per container reports)
    if w.source.view(&who.uid, super::unix_now()).deletion_seen.is_none() {
        return w.refuse(StatusCode::CONFLICT, "the pod's deletion was not seen: no wait to report".into());
    }
    let first = w.inner.reported.lock().map(|mut g| {
        if g.len() >= TOKEN_CACHE_ENTRIES {
            g.clear();
        }
        g.insert(who.uid.clone())
    });
    if matches!(first, Ok(false)) {
        return StatusCode::NO_CONTENT.into_response();
    }
    let outcome = OutcomeLabel { outcome: r.outcome.as_str().into() };
    w.metrics.waits.get_or_create(&outcome).inc();
    w.metrics.wait_seconds.get_or_create(&outcome).observe(r.waited_seconds);
    w.metrics.sleep_seconds.get_or_create(&outcome).observe(r.fallback_seconds);
    if r.outcome == WaitOutcome::Fallback {
        let reason: String = r.reason.chars().take(200).map(|c| if c.is_control() { ' ' } else { c }).collect();
        tracing::info!(namespace = %who.namespace, pod = %who.name, reason = %reason, "a preStop waiter fell back to the sleep");
    }
    w.source.record(WaitRecord {
        at: super::unix_now(),
        namespace: who.namespace,
        pod: who.name,
        outcome: r.outcome,
        waited_seconds: r.waited_seconds,
        fallback_seconds: r.fallback_seconds,
        window_seconds: w.source.window(&who.uid),
    });
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::wait::RemovalProgress;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    struct Reviewer(AtomicUsize);
    impl TokenReviewer for Reviewer {
        fn review<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<PodIdentity, String>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                match token {
                    "good" => Ok(PodIdentity { namespace: "a".into(), name: "web-0".into(), uid: "u1".into() }),
                    _ => Err("not authenticated".into()),
                }
            })
        }
    }

    struct Source {
        leading: AtomicBool,
        removed: AtomicBool,
        records: Mutex<Vec<WaitRecord>>,
    }
    impl WaitSource for Source {
        fn leading(&self) -> bool {
            self.leading.load(Ordering::Relaxed)
        }
        fn view(&self, _uid: &str, first_asked: f64) -> PodView {
            let r = if self.removed.load(Ordering::Relaxed) { RemovalProgress::Removed } else { RemovalProgress::Open };
            PodView {
                observing: true,
                leader: true,
                deletion_seen: Some(first_asked),
                joined: true,
                removals: vec![r],
                ready_others: vec![Some(1)],
                unobserved: 0,
                first_asked,
            }
        }
        fn window(&self, _uid: &str) -> Option<f64> {
            Some(1.5)
        }
        fn record(&self, record: WaitRecord) {
            self.records.lock().unwrap().push(record);
        }
    }

    fn endpoint() -> (WaitEndpoint, Arc<Reviewer>, Arc<Source>) {
        let reviewer = Arc::new(Reviewer(AtomicUsize::new(0)));
        let source = Arc::new(Source { leading: AtomicBool::new(true), removed: AtomicBool::new(false), records: Mutex::new(Vec::new()) });
        let policy = crate::core::plan::PlanPolicy { namespace: "a".into(), name: "p".into(), spec: Default::default(), pre_stop_seconds: 5 };
        let plan = PlanHandle::with_plan(crate::core::plan::Plan { policies: vec![policy], ..Default::default() });
        (WaitEndpoint::new(reviewer.clone(), source.clone(), plan, WaitMetrics::new()), reviewer, source)
    }

    async fn call(router: Router, req: axum::http::Request<Body>) -> (StatusCode, serde_json::Value) {
        use tower::ServiceExt;
        let res = router.oneshot(req).await.unwrap();
        let status = res.status();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
    }

    fn get(token: &str, timeout: u64) -> axum::http::Request<Body> {
        axum::http::Request::get(format!("/wait/v1?timeoutSeconds={timeout}&policy=p"))
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    }

    #[tokio::test]
    async fn a_held_question_ends_at_the_removal_and_the_token_is_reviewed_once() {
        let (w, reviewer, source) = endpoint();
        let (status, body) = call(w.clone().router(), get("good", 0)).await;
        assert_eq!((status, body["state"].as_str()), (StatusCode::OK, Some("Waiting")));
        let flip = source.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            flip.removed.store(true, Ordering::Relaxed);
        });
        let t = Instant::now();
        let (status, body) = call(w.clone().router(), get("good", 5)).await;
        assert_eq!((status, body["state"].as_str()), (StatusCode::OK, Some("Removed")), "{body}");
        assert!(t.elapsed() >= Duration::from_millis(300) && t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert_eq!(body["marginSeconds"], 0.25);
        assert_eq!(reviewer.0.load(Ordering::Relaxed), 1, "the review is cached");
    }

    #[tokio::test]
    async fn refused_tokens_followers_and_bad_reports_are_answered_without_a_verdict() {
        let (w, reviewer, source) = endpoint();
        let (status, body) = call(w.clone().router(), get("stolen", 1)).await;
        assert_eq!((status, body["state"].as_str()), (StatusCode::UNAUTHORIZED, Some("Unknown")));
        assert_eq!(call(w.clone().router(), get("stolen", 1)).await.0, StatusCode::UNAUTHORIZED);
        assert_eq!(reviewer.0.load(Ordering::Relaxed), 1, "a refused token is not reviewed again at once");
        let other = axum::http::Request::get("/wait/v1?policy=someone-elses").header("authorization", "Bearer good").body(Body::empty()).unwrap();
        let (status, body) = call(w.clone().router(), other).await;
        assert_eq!((status, body["state"].as_str()), (StatusCode::OK, Some("Unknown")), "a policy not in the pod's namespace: {body}");
        let none = axum::http::Request::get("/wait/v1").body(Body::empty()).unwrap();
        assert_eq!(call(w.clone().router(), none).await.0, StatusCode::UNAUTHORIZED);
        source.leading.store(false, Ordering::Relaxed);
        let (status, body) = call(w.clone().router(), get("good", 1)).await;
        assert_eq!((status, body["state"].as_str()), (StatusCode::MISDIRECTED_REQUEST, Some("NotLeader")));
        source.leading.store(true, Ordering::Relaxed);
        let post = |body: &str| axum::http::Request::post("/wait/v1/report").header("authorization", "Bearer good").body(Body::from(body.to_string())).unwrap();
        assert_eq!(call(w.clone().router(), post("{\"outcome\":\"Removed\"}")).await.0, StatusCode::BAD_REQUEST);
        assert_eq!(call(w.clone().router(), post(&"x".repeat(MAX_REPORT_BYTES + 1))).await.0, StatusCode::PAYLOAD_TOO_LARGE);
        let bad = "{\"outcome\":\"Removed\",\"waitedSeconds\":-1,\"fallbackSeconds\":5}";
        assert_eq!(call(w.clone().router(), post(bad)).await.0, StatusCode::BAD_REQUEST);
        let good = "{\"outcome\":\"Fallback\",\"waitedSeconds\":5,\"fallbackSeconds\":5,\"reason\":\"connection refused\"}";
        assert_eq!(call(w.clone().router(), post(good)).await.0, StatusCode::NO_CONTENT);
        assert_eq!(call(w.clone().router(), post(good)).await.0, StatusCode::NO_CONTENT, "a second container's report");
        let recs = source.records.lock().unwrap().clone();
        assert_eq!(recs.len(), 1);
        assert_eq!((recs[0].namespace.as_str(), recs[0].pod.as_str(), recs[0].outcome), ("a", "web-0", WaitOutcome::Fallback));
        assert_eq!((recs[0].waited_seconds, recs[0].window_seconds), (5.0, Some(1.5)));
    }
}
