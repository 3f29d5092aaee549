//! The one fake kube-proxy of the fast tests, on 127.0.0.1: `/metrics` as its [`Answer`] says
//! (kube-proxy 1.37's negotiation: protobuf with its real Content-Type when the request's Accept
//! names the protobuf exposition, else text; or text whatever the Accept, an older server),
//! with an HTTP status to answer (200 unless set), `/proxyMode`, and `/configz` when given
//! (404 otherwise). It counts `/metrics` requests and records each one's Accept header. The
//! real captures of tests/data/metrics (the same 1.37.2 scrape as protobuf and as text) are
//! here too. (examples/fake_kube_proxies.rs is another program: thousands of padded fakes for
//! the scale benchmarks, in a process of its own.)

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prost::Message;
use safe_termination::core::exposition::protobuf::{messages, wire};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

pub const A_PB: &[u8] = include_bytes!("../data/metrics/kube-proxy-v1.37.2-idle-node-a.pb");
pub const A_TXT: &str = include_str!("../data/metrics/kube-proxy-v1.37.2-idle-node-a.txt");
/// kube-proxy 1.37.2's Content-Type for a protobuf answer, as captured.
pub const PROTOBUF_CT: &str = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited; escaping=underscores";
pub const TEXT_CT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `pb` (a protobuf body) with every series labelled `ip_family="IPv6"` dropped: one series per
/// family, so that reading it needs no sum of native histograms (`NativeHistogram::add`).
pub fn ipv4_only(pb: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in messages(pb) {
        let mut family = wire::MetricFamily::decode(m.unwrap().message).unwrap();
        family.metric.retain(|s| !s.label.iter().any(|l| l.name.as_deref() == Some("ip_family") && l.value.as_deref() == Some("IPv6")));
        out.extend(family.encode_length_delimited_to_vec());
    }
    out
}

/// The same for the text capture: its `ip_family="IPv6"` lines dropped.
pub fn ipv4_only_text(text: &str) -> String {
    text.lines().filter(|l| !l.contains("ip_family=\"IPv6\"")).map(|l| format!("{l}\n")).collect()
}

/// What a fake answers to `/metrics`.
#[derive(Clone)]
pub enum Answer {
    /// Protobuf (`pb`) when the Accept names it, else text (`text`), as kube-proxy negotiates.
    Negotiate { pb: Vec<u8>, text: String },
    /// Text whatever the Accept.
    TextOnly(String),
}

/// A fake kube-proxy's answers, changeable between requests; clones share them.
#[derive(Clone)]
pub struct FakeKubeProxy {
    answer: Arc<Mutex<Answer>>,
    status: Arc<AtomicU16>,
    mode: &'static str,
    configz: Option<&'static str>,
    hits: Arc<AtomicUsize>,
    accepts: Arc<Mutex<Vec<Option<String>>>>,
}

impl FakeKubeProxy {
    /// Answers `answer`, status 200, `/proxyMode` `iptables`, no `/configz`.
    pub fn new(answer: Answer) -> Self {
        Self {
            answer: Arc::new(Mutex::new(answer)),
            status: Arc::new(AtomicU16::new(200)),
            mode: "iptables",
            configz: None,
            hits: Arc::default(),
            accepts: Arc::default(),
        }
    }

    /// Answers the text `body` whatever the Accept.
    pub fn text(body: &str) -> Self {
        Self::new(Answer::TextOnly(body.to_string()))
    }

    /// `/proxyMode` answers `mode`.
    pub fn with_mode(mut self, mode: &'static str) -> Self {
        self.mode = mode;
        self
    }

    /// `/configz` answers `json`.
    pub fn with_configz(mut self, json: &'static str) -> Self {
        self.configz = Some(json);
        self
    }

    /// From now on `/metrics` answers the text `body`.
    pub fn set_text(&self, body: &str) {
        *self.answer.lock().unwrap() = Answer::TextOnly(body.to_string());
    }

    /// From now on `/metrics` answers with HTTP status `code`.
    pub fn set_status(&self, code: u16) {
        self.status.store(code, Ordering::SeqCst);
    }

    /// `/metrics` requests received.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The Accept header of each `/metrics` request received (`None`: absent), in order.
    pub fn accepts(&self) -> Vec<Option<String>> {
        self.accepts.lock().unwrap().clone()
    }

    /// Serves this fake on a new 127.0.0.1 port.
    pub async fn start(&self) -> SocketAddr {
        let app = Router::new().route("/metrics", get(metrics)).route("/proxyMode", get(proxy_mode)).route("/configz", get(configz)).with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }
}

async fn metrics(State(f): State<FakeKubeProxy>, headers: HeaderMap) -> Response {
    f.hits.fetch_add(1, Ordering::SeqCst);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).map(str::to_string);
    let protobuf = accept.as_deref().is_some_and(|a| a.contains("application/vnd.google.protobuf"));
    f.accepts.lock().unwrap().push(accept);
    let status = StatusCode::from_u16(f.status.load(Ordering::SeqCst)).unwrap();
    match f.answer.lock().unwrap().clone() {
        Answer::Negotiate { pb, .. } if protobuf => (status, [(header::CONTENT_TYPE, PROTOBUF_CT)], pb).into_response(),
        Answer::Negotiate { text, .. } | Answer::TextOnly(text) => (status, [(header::CONTENT_TYPE, TEXT_CT)], text).into_response(),
    }
}

async fn proxy_mode(State(f): State<FakeKubeProxy>) -> &'static str {
    f.mode
}

async fn configz(State(f): State<FakeKubeProxy>) -> Response {
    match f.configz {
        Some(c) => ([(header::CONTENT_TYPE, "application/json")], c).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A fake kube-proxy answering `answer`, started: its address, and the fake (for what it saw).
pub async fn kube_proxy(answer: Answer) -> (SocketAddr, FakeKubeProxy) {
    let fake = FakeKubeProxy::new(answer);
    (fake.start().await, fake)
}
