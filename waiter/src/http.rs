//! The operator's wait endpoint over HTTPS: ureq (blocking) on rustls with the `ring` provider,
//! the server verified against the CA of `--dir` only (no system or bundled roots), no proxy,
//! no redirects, and with `--address` no name resolution. Parsing of the answers, the query,
//! the report's body and the report's retries (on a virtual clock) are pure and tested here.

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

use crate::machine::{Answer, Ask, Clock, Decision, Failure, Transport, short};

/// The largest answer body read.
pub const MAX_BODY: u64 = 64 * 1024;
/// The connect timeout of every request.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The report's bound: its POSTs (retries included) end at most this long after the decision.
pub const REPORT_TIMEOUT: Duration = Duration::from_secs(1);
/// The most report POSTs, the first included: a NotLeader answer is sent again on a new
/// connection until this many were sent.
pub const MAX_REPORT_SENDS: u32 = 8;
/// HTTP 421 Misdirected Request: how a replica that does not lead answers (`NotLeader`), the
/// GETs and the report alike.
pub const MISDIRECTED: u16 = 421;

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

/// True for the bytes of an unreserved URI character (RFC 3986: letters, digits, `-._~`): a
/// query value of only these needs no percent-encoding.
fn unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// A `--policy` that goes into the query as it is: not empty, unreserved characters only. A
/// Kubernetes object name (what `args` accepts) always is; the crate has no percent-encoder,
/// so anything else is refused (a doubt) rather than sent mangled.
pub fn check_query_value(policy: &str) -> Result<(), String> {
    if !policy.is_empty() && policy.bytes().all(unreserved) { Ok(()) } else { Err(format!("policy {policy:?} cannot go in a query unescaped")) }
}

/// `{URL}?timeoutSeconds=N&policy=NAME` (NAME checked by [`check_query_value`]): the server adds
/// the policy's `extraSeconds` to the margin.
pub fn ask_url(url: &str, timeout_seconds: u64, policy: &str) -> String {
    format!("{url}?timeoutSeconds={timeout_seconds}&policy={policy}")
}

/// True for the answer of a replica that does not lead: HTTP 421 with `{"state": "NotLeader"}`.
pub fn is_not_leader(status: u16, body: &[u8]) -> bool {
    status == MISDIRECTED && parse_answer(body) == Ok(Answer::NotLeader)
}

/// What a GET's status and body say: a 200's answer; a 421 NotLeader (asked again on a new
/// connection); any other status is a doubt.
pub fn get_reply(status: u16, body: &[u8]) -> Result<Answer, Failure> {
    match status {
        200 => parse_answer(body),
        _ if is_not_leader(status, body) => Ok(Answer::NotLeader),
        _ => Err(Failure::new(format!("HTTP status {status}"))),
    }
}

/// What one report POST got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sent {
    /// A 2xx: the leader kept it.
    Kept,
    /// 421 NotLeader: a replica that does not lead (only the leader keeps reports).
    NotLeader,
    /// Any other status, or no answer: the retries end.
    Failed(String),
}

/// What a report POST's status and body (read only for a 421) say.
pub fn report_reply(status: u16, body: &[u8]) -> Sent {
    match status {
        200..=299 => Sent::Kept,
        _ if is_not_leader(status, body) => Sent::NotLeader,
        _ => Sent::Failed(format!("HTTP status {status}")),
    }
}

/// Sends the report through `post` until the leader keeps it: on NotLeader, again at once on a
/// new connection (`post`'s second argument), so that the Service balances it to another
/// replica; at most [`MAX_REPORT_SENDS`] POSTs in all, none started at or after `until` (from
/// t0, on `clock`), each bounded by the time left until then (`post`'s first argument). Any
/// other answer or error ends it. The number of POSTs when kept, else why not.
pub fn send_report<C: Clock>(clock: &C, until: Duration, mut post: impl FnMut(Duration, bool) -> Sent) -> Result<u32, String> {
    let mut sent = 0;
    loop {
        let left = until.saturating_sub(clock.now());
        if left.is_zero() {
            return Err(format!("no time left after {sent} NotLeader answers"));
        }
        sent += 1;
        match post(left, sent > 1) {
            Sent::Kept => return Ok(sent),
            Sent::NotLeader if sent < MAX_REPORT_SENDS => {}
            Sent::NotLeader => return Err(format!("NotLeader {sent} times")),
            Sent::Failed(reason) => return Err(reason),
        }
    }
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

/// The wait endpoint, with the policy, the token, the CA, and the address when given.
pub struct Http {
    url: String,
    policy: String,
    authorization: String,
    tls: TlsConfig,
    address: Option<SocketAddr>,
    agent: Agent,
}

impl Http {
    /// An error (a doubt) only for a policy that cannot go in the query ([`check_query_value`]).
    pub fn new(url: &str, policy: &str, token: &str, ca: Vec<Certificate<'static>>, address: Option<SocketAddr>) -> Result<Http, String> {
        check_query_value(policy)?;
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
        Ok(Http { url: url.to_string(), policy: policy.to_string(), authorization: format!("Bearer {token}"), tls, address, agent })
    }

    /// Sends the report, `POST {URL}/report` with `body`, by [`send_report`]: until the leader
    /// keeps it, at most [`MAX_REPORT_SENDS`] POSTs, none past `until` (from t0, on `clock`).
    /// The first on this agent (a [`Http::reporter`]'s: it may reuse the connection of the last
    /// answer), each one after a NotLeader on a new agent, so on a new connection.
    pub fn report<C: Clock>(&mut self, body: &str, clock: &C, until: Duration) -> Result<u32, String> {
        send_report(clock, until, |timeout, new_connection| {
            if new_connection {
                self.agent = new_agent(&self.tls, self.address);
            }
            post_report(&self.agent, &report_url(&self.url), &self.authorization, body, timeout)
        })
    }

    /// A copy for the report's thread, on a clone of the agent (which shares its pool).
    pub fn reporter(&self) -> Http {
        Http {
            url: self.url.clone(),
            policy: self.policy.clone(),
            authorization: self.authorization.clone(),
            tls: self.tls.clone(),
            address: self.address,
            agent: self.agent.clone(),
        }
    }
}

/// One report POST, `timeout` at most (connecting and reading a 421's body included).
fn post_report(agent: &Agent, url: &str, authorization: &str, body: &str, timeout: Duration) -> Sent {
    let reply = agent
        .post(url)
        .header("Authorization", authorization)
        .header("Content-Type", "application/json")
        .config()
        .timeout_global(Some(timeout))
        .build()
        .send(body);
    let mut response = match reply {
        Ok(r) => r,
        Err(e) => return Sent::Failed(short(&e.to_string())),
    };
    let status = response.status().as_u16();
    if status != MISDIRECTED {
        return report_reply(status, &[]);
    }
    match response.body_mut().with_config().limit(MAX_BODY).read_to_vec() {
        Ok(answer) => report_reply(status, &answer),
        Err(e) => Sent::Failed(short(&e.to_string())),
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
        let url = ask_url(&self.url, ask.timeout_seconds, &self.policy);
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
        // the body of a 200, or of a 421 (NotLeader); any other status is a doubt unread
        if status != 200 && status != MISDIRECTED {
            return Err(Failure::new(format!("HTTP status {status}")));
        }
        let body = response.body_mut().with_config().limit(MAX_BODY).read_to_vec().map_err(failure)?;
        get_reply(status, &body)
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
    use std::cell::{Cell, RefCell};

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    use crate::machine::testing::FakeClock;

    /// One POST of [`send_report`]: when, its timeout, on a new connection.
    type Post = (Duration, Duration, bool);

    /// [`send_report`] from 0.5 s (until 1.5 s) against scripted answers, each taking its time
    /// (one longer than the POST's timeout is a failure at the timeout, as ureq's global timeout);
    /// the result and each POST.
    fn report(answers: Vec<(Duration, Sent)>) -> (Result<u32, String>, Vec<Post>) {
        let clock = FakeClock(Cell::new(ms(500)));
        let until = clock.now() + REPORT_TIMEOUT;
        let mut answers = answers.into_iter();
        let posts = RefCell::new(Vec::new());
        let result = send_report(&clock, until, |timeout, new_connection| {
            posts.borrow_mut().push((clock.now(), timeout, new_connection));
            let (took, sent) = answers.next().expect("more POSTs than answers");
            if took > timeout {
                clock.sleep(timeout);
                return Sent::Failed("timed out".into());
            }
            clock.sleep(took);
            sent
        });
        assert_eq!(answers.next(), None, "unused answers");
        (result, posts.into_inner())
    }

    #[test]
    fn the_query_has_the_timeout_and_the_policy() {
        assert_eq!(ask_url("https://op.ns.svc:8443/wait/v1", 10, "web"), "https://op.ns.svc:8443/wait/v1?timeoutSeconds=10&policy=web");
        assert_eq!(ask_url("https://h/w", 1, "a.b-c9"), "https://h/w?timeoutSeconds=1&policy=a.b-c9");
        assert_eq!(check_query_value("a.b-c9_~Z"), Ok(()));
        for bad in ["", "a b", "a&b", "a=b", "a%20", "a#b", "a+b", "a/b", "é"] {
            assert_eq!(check_query_value(bad), Err(format!("policy {bad:?} cannot go in a query unescaped")), "{bad:?}");
        }
    }

    #[test]
    fn a_policy_that_cannot_go_in_the_query_is_a_doubt_not_a_panic() {
        let ca = Vec::new();
        assert_eq!(Http::new("https://h/w", "a&b", "t", ca, None).err(), Some("policy \"a&b\" cannot go in a query unescaped".into()));
    }

    #[test]
    fn get_statuses() {
        let not_leader = br#"{"state":"NotLeader","detail":"this replica does not lead"}"#;
        assert_eq!(get_reply(200, br#"{"state":"Waiting"}"#), Ok(Answer::Waiting));
        assert_eq!(get_reply(200, not_leader), Ok(Answer::NotLeader));
        // the operator's answer of a replica that does not lead
        assert_eq!(get_reply(421, not_leader), Ok(Answer::NotLeader));
        // a 421 that does not say NotLeader, or a NotLeader under another status: a doubt
        assert_eq!(get_reply(421, br#"{"state":"Unknown"}"#), Err(Failure::new("HTTP status 421")));
        assert_eq!(get_reply(421, b"Misdirected Request"), Err(Failure::new("HTTP status 421")));
        assert_eq!(get_reply(503, not_leader), Err(Failure::new("HTTP status 503")));
        assert_eq!(get_reply(204, b""), Err(Failure::new("HTTP status 204")));
    }

    #[test]
    fn report_statuses() {
        let not_leader = br#"{"state":"NotLeader","detail":"this replica does not lead"}"#;
        assert_eq!(report_reply(204, b""), Sent::Kept);
        assert_eq!(report_reply(200, b"{}"), Sent::Kept);
        assert_eq!(report_reply(421, not_leader), Sent::NotLeader);
        assert_eq!(report_reply(421, br#"{"state":"Unknown"}"#), Sent::Failed("HTTP status 421".into()));
        assert_eq!(report_reply(421, b""), Sent::Failed("HTTP status 421".into()));
        assert_eq!(report_reply(503, not_leader), Sent::Failed("HTTP status 503".into()));
        assert_eq!(report_reply(401, b""), Sent::Failed("HTTP status 401".into()));
    }

    #[test]
    fn a_kept_report_is_sent_once_on_the_connection_it_has() {
        assert_eq!(report(vec![(ms(20), Sent::Kept)]), (Ok(1), vec![(ms(500), ms(1000), false)]));
    }

    #[test]
    fn not_leader_sends_the_report_again_at_once_on_a_new_connection() {
        let (result, posts) = report(vec![(ms(10), Sent::NotLeader), (ms(20), Sent::NotLeader), (ms(30), Sent::Kept)]);
        assert_eq!(result, Ok(3));
        assert_eq!(posts, vec![(ms(500), ms(1000), false), (ms(510), ms(990), true), (ms(530), ms(970), true)]);
    }

    #[test]
    fn eight_posts_in_all() {
        let (result, posts) = report(vec![(ms(10), Sent::NotLeader); 8]);
        assert_eq!(result, Err("NotLeader 8 times".into()));
        assert_eq!(posts.len(), 8);
        assert_eq!(posts.iter().filter(|p| p.2).count(), 7);
    }

    #[test]
    fn any_other_answer_or_error_ends_the_retries() {
        let (result, posts) = report(vec![(ms(10), Sent::NotLeader), (ms(10), Sent::Failed("HTTP status 500".into()))]);
        assert_eq!((result, posts.len()), (Err("HTTP status 500".into()), 2));
        let (result, posts) = report(vec![(ms(10), Sent::Failed("connection refused".into()))]);
        assert_eq!((result, posts.len()), (Err("connection refused".into()), 1));
    }

    #[test]
    fn the_retries_end_within_the_report_timeout_of_the_decision() {
        // slow NotLeader answers: POSTs at 0.5, 0.8, 1.1 and 1.4 s, the last cut at 1.5 s
        let (result, posts) = report(vec![(ms(300), Sent::NotLeader); 4]);
        assert_eq!(result, Err("timed out".into()));
        assert_eq!(posts, vec![(ms(500), ms(1000), false), (ms(800), ms(700), true), (ms(1100), ms(400), true), (ms(1400), ms(100), true)]);
        // an answer exactly at the bound: no POST after it
        let (result, posts) = report(vec![(ms(400), Sent::NotLeader), (ms(600), Sent::NotLeader)]);
        assert_eq!(result, Err("no time left after 2 NotLeader answers".into()));
        assert_eq!(posts.len(), 2);
        // the bound already passed: nothing is sent
        let clock = FakeClock(Cell::new(ms(1500)));
        assert_eq!(send_report(&clock, ms(1500), |_, _| panic!("sent past the bound")), Err("no time left after 0 NotLeader answers".into()));
    }

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
