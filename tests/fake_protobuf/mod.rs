//! A fake kube-proxy 1.37 for the tests that read it over HTTP: the real captures of
//! tests/data/metrics (the same scrape as protobuf and as text), served as kube-proxy answers
//! (protobuf with its real Content-Type when the request's Accept names the protobuf
//! exposition, else text), or as text whatever the Accept (an older server), recording each
//! `/metrics` request's Accept header. Each test binary uses part of it.
#![allow(dead_code)]

use axum::Router;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prost::Message;
use safe_termination::core::exposition::protobuf::{messages, wire};
use std::net::SocketAddr;
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

/// The Accept header of each `/metrics` request a fake received (`None`: absent), in order.
#[derive(Clone, Default)]
pub struct Seen(Arc<Mutex<Vec<Option<String>>>>);

impl Seen {
    pub fn accepts(&self) -> Vec<Option<String>> {
        self.0.lock().unwrap().clone()
    }
}

/// A fake kube-proxy on 127.0.0.1: `/metrics` as `answer` says, `/proxyMode` `iptables`.
pub async fn kube_proxy(answer: Answer) -> (SocketAddr, Seen) {
    let seen = Seen::default();
    let recorded = seen.clone();
    let metrics = move |headers: HeaderMap| {
        let (answer, seen) = (answer.clone(), recorded.clone());
        async move {
            let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()).map(str::to_string);
            let protobuf = accept.as_deref().is_some_and(|a| a.contains("application/vnd.google.protobuf"));
            seen.0.lock().unwrap().push(accept);
            let response: Response = match answer {
                Answer::Negotiate { pb, .. } if protobuf => ([(header::CONTENT_TYPE, PROTOBUF_CT)], pb).into_response(),
                Answer::Negotiate { text, .. } | Answer::TextOnly(text) => ([(header::CONTENT_TYPE, TEXT_CT)], text).into_response(),
            };
            response
        }
    };
    let app = Router::new().route("/metrics", get(metrics)).route("/proxyMode", get(|| async { "iptables" }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, seen)
}
