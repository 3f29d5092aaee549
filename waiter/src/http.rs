//! The operator's wait endpoint over HTTPS: ureq (blocking) on rustls with the `ring` provider,
//! the server verified against the CA of `--dir` only (no system or bundled roots), no proxy,
//! no redirects, and with `--address` no name resolution. Parsing of the answers and the
//! report's body are pure and tested here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use ureq::Agent;
use ureq::config::Config;
use ureq::http::Uri;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig, TlsProvider};
use ureq::unversioned::resolver::{ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

use crate::machine::{Answer, Ask, Decision, Failure, Transport, short};

/// The largest answer body read.
pub const MAX_BODY: u64 = 64 * 1024;
/// The connect timeout of every request.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The report's whole-request timeout.
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(1);

const USER_AGENT: &str = concat!("safe-termination-wait/", env!("CARGO_PKG_VERSION"));

/// The CA bundle's certificates; an error when none is a certificate rustls can use as a root.
pub fn parse_ca(pem: &[u8]) -> Result<Vec<Certificate<'static>>, String> {
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(format!("bad PEM: {}", short(&e.to_string()))),
        }
    }
    let mut store = rustls::RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(certs.iter().map(|c| rustls::pki_types::CertificateDer::from(c.der())));
    if added == 0 {
        return Err("no usable certificate".into());
    }
    Ok(certs)
}

/// An answer's body: `{"state": "...", "marginSeconds": <number, optional>, "detail": "<optional>"}`.
pub fn parse_answer(body: &[u8]) -> Result<Answer, Failure> {
    let value: Value = serde_json::from_slice(body).map_err(|e| Failure::new(format!("bad JSON: {}", short(&e.to_string()))))?;
    let Some(object) = value.as_object() else {
        return Err(Failure::new("bad JSON: not an object"));
    };
    let Some(state) = object.get("state").and_then(Value::as_str) else {
        return Err(Failure::new("bad JSON: no string \"state\""));
    };
    let margin_seconds = match object.get("marginSeconds") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_f64().ok_or_else(|| Failure::new("bad JSON: \"marginSeconds\" is not a number"))?),
    };
    Ok(match state {
        "Removed" => Answer::Removed { margin_seconds },
        "LastEndpoint" => Answer::LastEndpoint,
        "Waiting" => Answer::Waiting,
        "NotLeader" => Answer::NotLeader,
        other => Answer::Other { state: short(other), detail: object.get("detail").and_then(Value::as_str).map(short) },
    })
}

/// The report's JSON body.
pub fn report_body(decision: &Decision, fallback: Duration) -> String {
    let waited = decision.end.as_millis() as f64 / 1000.0;
    serde_json::json!({
        "outcome": decision.outcome.as_str(),
        "waitedSeconds": waited,
        "fallbackSeconds": fallback.as_secs(),
        "reason": decision.reason.as_deref().unwrap_or(""),
    })
    .to_string()
}

/// `{URL}/report`.
pub fn report_url(url: &str) -> String {
    format!("{}/report", url.trim_end_matches('/'))
}

/// `--address`: the resolver that answers every name with the one address given, so that no
/// request needs DNS. Pods in clusters without working DNS at deletion time, or with DNS down,
/// still reach the operator's Service by its ClusterIP; the serving certificate is only issued
/// for the Service's DNS name, so the name stays the URL's: ureq's TLS verifies the certificate
/// against the URL's host (and sends it as SNI), and the Host header is the URL's, whatever
/// address the connection went to. Only the resolution is replaced: ureq's default connector
/// (TCP, then rustls) does the rest. Every request of the waiter goes to the URL's host (the
/// GETs and the report; no proxy, no redirects), so the URI asked about is not looked at.
/// (`ureq::unversioned` does not follow semver: written against ureq 3.5.2, of Cargo.lock; a
/// ureq update may need this changed.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedAddress(pub SocketAddr);

impl Resolver for FixedAddress {
    fn resolve(&self, _uri: &Uri, _config: &Config, _timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let mut addrs = self.empty();
        addrs.push(self.0);
        Ok(addrs)
    }
}

/// The wait endpoint, with the token, the CA, and the address when given.
pub struct Http {
    url: String,
    authorization: String,
    tls: TlsConfig,
    address: Option<SocketAddr>,
    agent: Agent,
}

impl Http {
    pub fn new(url: &str, token: &str, ca: Vec<Certificate<'static>>, address: Option<SocketAddr>) -> Http {
        // ring, not aws-lc-rs: no C toolchain beyond ring's, a smaller static binary. rustls
        // 0.23.48 deprecated ring's provider for its lack of post-quantum key exchange, which
        // does not weigh here: an in-cluster hop that carries a short-lived token.
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(Arc::new(provider))
            .root_certs(RootCerts::Specific(Arc::new(ca)))
            .build();
        let agent = new_agent(&tls, address);
        Http { url: url.to_string(), authorization: format!("Bearer {token}"), tls, address, agent }
    }

    /// Sends the report: `POST {URL}/report`, 1 s at most. On a clone of the agent, so that it
    /// may reuse the connection of the last answer.
    pub fn report(&self, body: String) -> Result<(), String> {
        let response = self
            .agent
            .post(report_url(&self.url))
            .header("Authorization", &self.authorization)
            .header("Content-Type", "application/json")
            .config()
            .timeout_global(Some(REPORT_TIMEOUT))
            .build()
            .send(body)
            .map_err(|e| e.to_string())?;
        match response.status().as_u16() {
            200..=299 => Ok(()),
            s => Err(format!("HTTP status {s}")),
        }
    }

    pub fn reporter(&self) -> Http {
        Http { url: self.url.clone(), authorization: self.authorization.clone(), tls: self.tls.clone(), address: self.address, agent: self.agent.clone() }
    }
}

/// A new agent (an empty pool); with `address`, one that connects there (see [`FixedAddress`]).
fn new_agent(tls: &TlsConfig, address: Option<SocketAddr>) -> Agent {
    let config = Agent::config_builder()
        .tls_config(tls.clone())
        // in-cluster Service names: never through a proxy of the app's environment
        .proxy(None)
        .https_only(true)
        .max_redirects(0)
        .http_status_as_error(false)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .user_agent(USER_AGENT)
        .max_idle_connections(1)
        .max_idle_connections_per_host(1)
        .build();
    match address {
        Some(a) => Agent::with_parts(config, DefaultConnector::new(), FixedAddress(a)),
        None => config.new_agent(),
    }
}

impl Transport for Http {
    fn ask(&mut self, ask: &Ask) -> Result<Answer, Failure> {
        if ask.new_connection {
            // a new agent has an empty pool: the Service's load balancing picks a replica anew
            self.agent = new_agent(&self.tls, self.address);
        }
        let url = format!("{}?timeoutSeconds={}", self.url, ask.timeout_seconds);
        let reply = self
            .agent
            .get(&url)
            .header("Authorization", &self.authorization)
            .header("Accept", "application/json")
            .config()
            .timeout_global(Some(ask.request_timeout))
            .build()
            .call();
        let mut response = reply.map_err(failure)?;
        let status = response.status().as_u16();
        if status != 200 {
            return Err(Failure::new(format!("HTTP status {status}")));
        }
        let body = response.body_mut().with_config().limit(MAX_BODY).read_to_vec().map_err(failure)?;
        parse_answer(&body)
    }
}

/// A question with no answer on the way to the operator.
impl Transport for Option<Http> {
    fn ask(&mut self, ask: &Ask) -> Result<Answer, Failure> {
        match self {
            Some(http) => http.ask(ask),
            None => Err(Failure::new("no transport")),
        }
    }
}

fn failure(e: ureq::Error) -> Failure {
    match e {
        ureq::Error::Timeout(t) => Failure::timeout(format!("timed out ({t})")),
        ureq::Error::BodyExceedsLimit(_) => Failure::new(format!("body larger than {MAX_BODY} bytes")),
        e => Failure::new(short(&e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Outcome;

    #[test]
    fn answers() {
        assert_eq!(parse_answer(br#"{"state":"Removed","marginSeconds":1.5}"#), Ok(Answer::Removed { margin_seconds: Some(1.5) }));
        assert_eq!(parse_answer(br#"{"state":"Removed","marginSeconds":null}"#), Ok(Answer::Removed { margin_seconds: None }));
        assert_eq!(parse_answer(br#"{"state":"Removed","marginSeconds":3}"#), Ok(Answer::Removed { margin_seconds: Some(3.0) }));
        assert_eq!(parse_answer(br#"{"state":"Removed"}"#), Ok(Answer::Removed { margin_seconds: None }));
        assert_eq!(parse_answer(br#"{"state":"LastEndpoint","detail":"x"}"#), Ok(Answer::LastEndpoint));
        assert_eq!(parse_answer(br#" {"state":"Waiting","extra":[1,2]} "#), Ok(Answer::Waiting));
        assert_eq!(parse_answer(br#"{"state":"NotLeader"}"#), Ok(Answer::NotLeader));
        assert_eq!(
            parse_answer(br#"{"state":"Unknown","detail":"node-b: no agent"}"#),
            Ok(Answer::Other { state: "Unknown".into(), detail: Some("node-b: no agent".into()) })
        );
        assert_eq!(parse_answer(br#"{"state":"removed"}"#), Ok(Answer::Other { state: "removed".into(), detail: None }));
    }

    #[test]
    fn bad_answers_are_failures_not_panics() {
        assert_eq!(parse_answer(b"").unwrap_err().reason, "bad JSON: EOF while parsing a value at line 1 column 0");
        assert_eq!(parse_answer(b"[1]").unwrap_err().reason, "bad JSON: not an object");
        assert_eq!(parse_answer(br#"{"state":3}"#).unwrap_err().reason, "bad JSON: no string \"state\"");
        assert_eq!(parse_answer(br#"{"state":"Removed","marginSeconds":"2"}"#).unwrap_err().reason, "bad JSON: \"marginSeconds\" is not a number");
        assert!(parse_answer(&[0xff, 0xfe]).unwrap_err().reason.starts_with("bad JSON: "));
        // deep nesting: serde_json's recursion limit, an error
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_answer(deep.as_bytes()).unwrap_err().reason.starts_with("bad JSON: recursion limit exceeded"));
    }

    #[test]
    fn report_bodies() {
        let d = Decision { outcome: Outcome::Fallback, end: Duration::from_millis(5_250), reason: Some("HTTP status 500".into()) };
        let v: Value = serde_json::from_str(&report_body(&d, Duration::from_secs(5))).unwrap();
        assert_eq!(v, serde_json::json!({"outcome": "Fallback", "waitedSeconds": 5.25, "fallbackSeconds": 5, "reason": "HTTP status 500"}));
        let d = Decision { outcome: Outcome::Removed, end: Duration::from_secs(2), reason: None };
        let v: Value = serde_json::from_str(&report_body(&d, Duration::from_secs(30))).unwrap();
        assert_eq!(v, serde_json::json!({"outcome": "Removed", "waitedSeconds": 2.0, "fallbackSeconds": 30, "reason": ""}));
    }

    #[test]
    fn report_urls() {
        assert_eq!(report_url("https://op.ns.svc:8443/wait/v1"), "https://op.ns.svc:8443/wait/v1/report");
        assert_eq!(report_url("https://op.ns.svc:8443/wait/v1/"), "https://op.ns.svc:8443/wait/v1/report");
    }

    #[test]
    fn a_fixed_address_answers_every_name_with_it() {
        for address in ["10.96.0.20:443", "[fd00:10:96::a]:8443"] {
            let address: SocketAddr = address.parse().unwrap();
            let resolver = FixedAddress(address);
            for uri in ["https://safe-termination.safe-termination.svc:443/wait/v1", "https://wait.example.invalid:8443/wait/v1/report", "https://10.1.2.3/x"] {
                let addrs = resolver.resolve(&uri.parse().unwrap(), &Config::default(), NextTimeout::default()).unwrap();
                assert_eq!(addrs.iter().copied().collect::<Vec<_>>(), vec![address], "{uri}");
            }
        }
    }

    #[test]
    fn ca_bundles() {
        assert_eq!(parse_ca(b"").err(), Some("no usable certificate".into()));
        assert_eq!(parse_ca(b"hello").err(), Some("no usable certificate".into()));
        let not_a_cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(parse_ca(not_a_cert.as_bytes()).err(), Some("no usable certificate".into()));
        assert!(parse_ca(b"-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n").err().unwrap().starts_with("bad PEM: "));
    }
}
