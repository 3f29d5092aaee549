//! The operator's side of the node agents (adapter): finding them and scraping a node through
//! its agent. `--source auto`'s fallbacks, which use it, are in [`super::scrape_loop`].
//!
//! - [`AgentSource`]: where the agents are (pods by label selector in the operator's
//!   namespace, one per node, `https://<pod IP = node IP>:<port>`, or `--agent-target`s) and the
//!   operator's client certificate for them (PEM files, re-read each cycle and the client
//!   rebuilt when they change: mutual TLS, the agent checked against the fixed name of
//!   [`crate::agent_contract::tls`]);
//! - [`scrape_agent`]: one node through its agent, as [`super::scrape::scrape_once`] scrapes
//!   kube-proxy (same parser, same failure reasons; the agent passes kube-proxy's own failure
//!   on in its 502 answer, in the headers of [`crate::agent_contract::protocol`]).

use super::error::SourceError;
use super::fetch::{ScrapeBody, client_builder, content_type, error_chain, read_limited};
use super::oneshot::unix_now;
use super::scrape::{ScrapeOptions, ScrapeOutcome};
use super::targets::{Target, targets_from_pods};
use crate::agent_contract::protocol::{PROXY_MODE_HEADER, REASON_HEADER};
use crate::core::exposition::{ACCEPT_PROTOBUF_FIRST, parse_scrape};
use crate::core::measure::{NodeFailure, NodeSource, Sample, reason};
use crate::core::model::ProxyMode;
use crate::webhook::tls::TlsError;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Default label selector of the agent pods (in the operator's namespace).
pub const DEFAULT_AGENT_SELECTOR: &str = "app.kubernetes.io/component=agent";

/// Where the operator finds the agents.
#[derive(Clone)]
pub enum AgentTargets {
    /// A fixed list, `NODE=https://IP:PORT` (tests, out-of-cluster runs).
    Static(Vec<Target>),
    /// Agent pods found through the API when a cycle needs them.
    Kube {
        /// The API client.
        client: kube::Client,
        /// The operator's namespace.
        namespace: String,
        /// Label selector of the agent pods.
        selector: String,
        /// The agents' mutual-TLS port.
        port: u16,
    },
}

impl std::fmt::Debug for AgentTargets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Static(t) => f.debug_tuple("Static").field(&t.len()).finish(),
            Self::Kube { namespace, selector, port, .. } => {
                f.debug_struct("Kube").field("namespace", namespace).field("selector", selector).field("port", port).finish()
            }
        }
    }
}

/// The operator's client certificate for the agents (PEM files; in the chart, keys `ca.crt`,
/// `client.crt` and `client.key` of the certificate Secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentClientFiles {
    /// CA bundle the agents' certificate chains to.
    pub ca: PathBuf,
    /// The operator's client certificate chain.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// The agents as a source: where they are and how to authenticate to them.
pub struct AgentSource {
    targets: AgentTargets,
    files: AgentClientFiles,
    timeout: Duration,
    /// The files' content and the client built from it.
    client: Mutex<Option<(Vec<Vec<u8>>, reqwest::Client)>>,
}

impl std::fmt::Debug for AgentSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSource").field("targets", &self.targets).field("files", &self.files).finish_non_exhaustive()
    }
}

/// Why the operator has no client for the agents.
#[derive(Debug, thiserror::Error)]
pub enum AgentClientError {
    /// A CA, certificate or key file cannot be read (the message names the file).
    #[error(transparent)]
    Read(TlsError),
    /// The files' material cannot be used: a bundle, chain or key that does not decode, or a
    /// certificate and key rustls refuses together.
    #[error("{} / {}: {source}", cert.display(), ca.display())]
    Material {
        /// The client certificate file.
        cert: PathBuf,
        /// The CA bundle file.
        ca: PathBuf,
        /// What is wrong with the material.
        source: TlsError,
    },
    /// reqwest cannot build the client; the message is the error and its causes, `: `-separated.
    #[error("{}", error_chain(.0))]
    Build(reqwest::Error),
}

/// An HTTP client for the agents: mutual TLS with `config` (see [`crate::agent_contract::tls::client_config`]),
/// the per-request `timeout`, no proxy, no idle connection kept (as the kube-proxy scraper).
///
/// Errors: reqwest cannot build it ([`AgentClientError::Build`]; never silently a client
/// without the certificate).
pub fn agent_http_client(config: rustls::ClientConfig, timeout: Duration) -> Result<reqwest::Client, AgentClientError> {
    client_builder(timeout).pool_max_idle_per_host(0).use_preconfigured_tls(config).build().map_err(AgentClientError::Build)
}

impl AgentSource {
    /// Agents at `targets`, authenticated with `files`, each request bounded by `timeout`.
    pub fn new(targets: AgentTargets, files: AgentClientFiles, timeout: Duration) -> Self {
        Self { targets, files, timeout, client: Mutex::new(None) }
    }

    /// The client for the current content of the certificate files (rebuilt when it changed).
    ///
    /// Errors: a file cannot be read ([`AgentClientError::Read`]), the material is unusable
    /// ([`AgentClientError::Material`]), or the client cannot be built.
    pub fn client(&self) -> Result<reqwest::Client, AgentClientError> {
        let content = [&self.files.ca, &self.files.cert, &self.files.key]
            .iter()
            .map(|p| crate::agent_contract::tls::read(p).map_err(AgentClientError::Read))
            .collect::<Result<Vec<_>, _>>()?;
        let mut cached = self.client.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, client)) = cached.as_ref().filter(|(c, _)| *c == content) {
            return Ok(client.clone());
        }
        let config = crate::agent_contract::tls::client_config(&content[0], &content[1], &content[2]).map_err(|source| AgentClientError::Material {
            cert: self.files.cert.clone(),
            ca: self.files.ca.clone(),
            source,
        })?;
        let client = agent_http_client(config, self.timeout)?;
        *cached = Some((content, client.clone()));
        Ok(client)
    }

    /// The agents by node name: the static list, or the running agent pods (newest per node,
    /// pod IP = node IP with `hostNetwork`) at `https://<pod IP>:<port>`.
    ///
    /// Errors: listing the pods failed (RBAC needs `list pods` in the operator's namespace).
    pub async fn targets(&self) -> Result<BTreeMap<String, Target>, SourceError> {
        let list = match &self.targets {
            AgentTargets::Static(t) => t.clone(),
            AgentTargets::Kube { client, namespace, selector, port } => {
                let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
                let pods = api
                    .list(&ListParams::default().labels(selector))
                    .await
                    .map_err(|source| SourceError::Kube { what: format!("listing agent pods {selector:?} in namespace {namespace}"), source })?;
                targets_from_pods(&pods.items, *port).into_iter().map(|t| Target::new(t.node, &t.base_url.replacen("http://", "https://", 1))).collect()
            }
        };
        Ok(list.into_iter().map(|t| (t.node.clone(), t)).collect())
    }

    /// Why a node without an agent has none, for its failure message.
    pub(super) fn none_here(&self) -> String {
        match &self.targets {
            AgentTargets::Static(_) => "no --agent-target for this node".into(),
            AgentTargets::Kube { namespace, selector, .. } => format!("no agent pod on this node ({selector} in namespace {namespace})"),
        }
    }
}

/// A failure of the request to an agent (`what`: its URL, e.g. `https://10.0.0.7:10349/metrics`).
fn transport_failure(what: &str, e: &reqwest::Error) -> AgentFailure {
    let chain = error_chain(e);
    let lower = chain.to_ascii_lowercase();
    let (reason, hint) = if e.is_timeout() {
        (reason::TIMEOUT, " (no complete answer in time: is the agent's port blocked by a NetworkPolicy or host firewall?)")
    } else if e.is_connect() && lower.contains("refused") {
        (reason::CONNECTION_REFUSED, " (is the safe-termination agent running on this node?)")
    } else if lower.contains("certificate") || lower.contains("tls") || lower.contains("handshake") {
        (
            reason::OTHER,
            " (mutual TLS failed: the agent's certificate must chain to the operator's CA and name safe-termination-agent, and the operator's client certificate must come from the same certificate Secret)",
        )
    } else {
        (reason::OTHER, "")
    };
    AgentFailure { reason: reason.to_string(), message: format!("{what}: {chain}{hint}") }
}

/// GETs `url` from an agent: the body of a 2xx answer (at most `limit` bytes), or the failure;
/// a non-2xx answer carries the agent's reason header and message.
async fn agent_get(client: &reqwest::Client, url: &str, limit: usize) -> Result<Vec<u8>, AgentFailure> {
    agent_get_with_mode(client, url, limit, None).await.map(|(body, _)| body.bytes)
}

/// [`agent_get`] with `Accept: accept` when given, also giving the answer's content type and the
/// proxy mode of its [`PROXY_MODE_HEADER`] (agents send it with `/metrics`; `None` when absent
/// or not a mode).
async fn agent_get_with_mode(client: &reqwest::Client, url: &str, limit: usize, accept: Option<&str>) -> Result<(ScrapeBody, Option<ProxyMode>), AgentFailure> {
    let what = url.to_string();
    let request = client.get(url);
    let request = match accept {
        Some(a) => request.header(reqwest::header::ACCEPT, a),
        None => request,
    };
    let resp = request.send().await.map_err(|e| transport_failure(&what, &e))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let limit = if status.is_success() { limit } else { ERROR_BODY_BYTES };
    let body = read_limited(resp, limit).await.map_err(|e| e.to_string());
    agent_answer(&what, status, &headers, body)
}

/// Why a read through an agent gave nothing to use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AgentFailure {
    /// One of the [`reason`] labels: the agent's own (its [`REASON_HEADER`]), or the operator's.
    pub reason: String,
    /// What failed, naming the agent's URL (and kube-proxy's failure, as the agent said it).
    pub message: String,
}

/// The most of a non-2xx answer's body that is read into the failure message (bytes).
const ERROR_BODY_BYTES: usize = 4096;

/// What the operator takes from an agent's answer to `what` (its URL): its `status`, `headers`
/// and `body` as read (the bytes, or why they could not be read: over the limit, cut off).
///
/// A 2xx answer: the body with its `Content-Type` (when visible ASCII) and the proxy mode of
/// its [`PROXY_MODE_HEADER`] (`None` when absent or not a mode); a body that could not be read
/// is the failure ([`reason::OTHER`], `what: why`). Any other status is a failure ([`AgentFailure`]): with the
/// agent's [`REASON_HEADER`] when that is one of the [`reason`] labels, else
/// [`reason::HTTP_STATUS`]; the message `what: HTTP status: body`, the body read as at most
/// 4,096 bytes, decoded lossily as UTF-8 and trimmed (empty when unreadable; then, without a
/// known reason, left out with its `: `).
#[doc(hidden)]
pub fn agent_answer(
    what: &str,
    status: reqwest::StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: Result<Vec<u8>, String>,
) -> Result<(ScrapeBody, Option<ProxyMode>), AgentFailure> {
    if status.is_success() {
        let mode = headers.get(PROXY_MODE_HEADER).and_then(|v| v.to_str().ok()).and_then(ProxyMode::parse);
        let content_type = content_type(headers);
        return body
            .map(|bytes| (ScrapeBody { bytes, content_type }, mode))
            .map_err(|e| AgentFailure { reason: reason::OTHER.to_string(), message: format!("{what}: {e}") });
    }
    let known = [reason::CONNECTION_REFUSED, reason::TIMEOUT, reason::HTTP_STATUS, reason::PARSE, reason::OTHER];
    let label = headers.get(REASON_HEADER).and_then(|v| v.to_str().ok()).and_then(|v| known.into_iter().find(|k| *k == v));
    let body = body.map(|b| String::from_utf8_lossy(&b).trim().to_string()).unwrap_or_default();
    Err(match label {
        Some(r) => AgentFailure { reason: r.to_string(), message: format!("{what}: HTTP {status}: {body}") },
        None => AgentFailure {
            reason: reason::HTTP_STATUS.to_string(),
            message: format!("{what}: HTTP {status}{}", if body.is_empty() { String::new() } else { format!(": {body}") }),
        },
    })
}

/// Scrapes one node through its agent at `target` (`https://IP:PORT`): `/metrics` within
/// `opts.timeout` (protobuf first, text as the fallback, as from kube-proxy directly), read in
/// the format the agent's `Content-Type` names, and when enabled the proxy mode, best
/// effort: from the answer's [`PROXY_MODE_HEADER`], or from `/proxyMode` for an agent that does
/// not send it (one request more). The outcome's source is [`NodeSource::Agent`]; failures carry
/// the [`reason`] labels and messages naming the agent's URL (and kube-proxy's own failure, as
/// the agent reported it).
pub async fn scrape_agent(client: &reqwest::Client, target: &Target, opts: &ScrapeOptions) -> ScrapeOutcome {
    let start = Instant::now();
    let metrics_url = target.url("/metrics");
    let mode_url = target.url("/proxyMode");
    let work = async {
        let metrics = agent_get_with_mode(client, &metrics_url, opts.max_body_bytes, Some(ACCEPT_PROTOBUF_FIRST)).await;
        match metrics {
            Ok((body, header_mode)) => {
                let mode = match header_mode {
                    Some(m) if opts.fetch_proxy_mode => Some(m),
                    None if opts.fetch_proxy_mode => agent_get(client, &mode_url, super::fetch::MAX_PROXY_MODE_BYTES)
                        .await
                        .ok()
                        .and_then(|b| ProxyMode::parse(std::str::from_utf8(&b).ok()?)),
                    _ => None,
                };
                (Ok(body), mode)
            }
            Err(e) => (Err(e), None),
        }
    };
    let fetched = tokio::time::timeout(opts.timeout, work).await;
    let at = unix_now();
    let fail = |AgentFailure { reason, message }| NodeFailure { reason, message, at_unix_seconds: at };
    let result = match fetched {
        Err(_) => Err(fail(AgentFailure {
            reason: reason::TIMEOUT.into(),
            message: format!("{metrics_url}: no complete answer within {:.1} s (is the agent's port blocked, or kube-proxy slow?)", opts.timeout.as_secs_f64()),
        })),
        Ok((Err(f), _)) => Err(fail(f)),
        Ok((Ok(body), proxy_mode)) => match parse_scrape(&body.bytes, body.content_type.as_deref()) {
            Ok(scrape) => Ok(Sample { at_unix_seconds: at, scrape, proxy_mode }),
            // a text body that is not UTF-8 reads "not UTF-8 text: ...", as before protobuf was read
            Err(e) => Err(fail(AgentFailure { reason: reason::PARSE.into(), message: format!("{metrics_url}: {e}") })),
        },
    };
    ScrapeOutcome { node: target.node.clone(), result, elapsed: start.elapsed(), source: NodeSource::Agent }
}

/// The largest observe answer read, bytes ([`crate::agent_contract::observer::MAX_WATCHES`]
/// records of the longest names fit).
pub const MAX_OBSERVE_ANSWER_BYTES: usize = 16 << 20;

/// An agent's observe answer and the operator's clock around the request (unix seconds), for
/// the clock offset.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// The answer.
    pub response: crate::agent_contract::observer::ObserveResponse,
    /// When the request was sent.
    pub sent_unix_seconds: f64,
    /// When the answer was read.
    pub received_unix_seconds: f64,
}

/// Why an observe request to an agent gave no answer. Every message names the URL.
#[derive(Debug, thiserror::Error)]
pub enum ObserveError {
    /// The request could not be serialized.
    #[error("{url}: {source}")]
    Serialize {
        /// The agent's `/removals` URL.
        url: String,
        /// serde_json's error.
        source: serde_json::Error,
    },
    /// No answer: refused, timed out, TLS (the message is the client's error and its causes).
    #[error("{url}: {message}")]
    Transport {
        /// The URL asked.
        url: String,
        /// The client error with its causes, `: `-separated.
        message: String,
    },
    /// The answer's body could not be read (over [`MAX_OBSERVE_ANSWER_BYTES`], cut off).
    #[error("{url}: {source}")]
    Read {
        /// The URL asked.
        url: String,
        /// Why.
        source: super::fetch::FetchError,
    },
    /// A status other than 2xx, with the start of the agent's message.
    #[error("{url}: HTTP {status}: {body}")]
    Status {
        /// The URL asked.
        url: String,
        /// The answer's status.
        status: reqwest::StatusCode,
        /// At most 4,096 bytes of the body, lossily UTF-8, trimmed.
        body: String,
    },
    /// A 2xx body that is not an observe answer.
    #[error("{url}: not an observe answer: {source}")]
    NotAnAnswer {
        /// The URL asked.
        url: String,
        /// serde_json's error.
        source: serde_json::Error,
    },
}

/// Asks the agent at `target` to watch `request`'s removals (`POST /removals`) and reads its
/// answer.
///
/// Errors: [`ObserveError`], naming the URL: the request failed, a status other than 2xx (with
/// the agent's message), or a body that is not an answer.
pub async fn observe_agent(
    client: &reqwest::Client,
    target: &Target,
    request: &crate::agent_contract::observer::ObserveRequest,
) -> Result<Observed, ObserveError> {
    let body =
        serde_json::to_vec(request).map_err(|source| ObserveError::Serialize { url: target.url(crate::agent_contract::observer::REMOVALS_PATH), source })?;
    observe_agent_body(client, target, body.into(), None).await
}

/// [`observe_agent`] with the request already serialized (JSON), so that one body serves every
/// agent (a clone of [`bytes::Bytes`] shares it), asking only the records changed since `since`
/// when given (protocol 3: `?since=<epoch>.<generation>`).
pub async fn observe_agent_body(
    client: &reqwest::Client,
    target: &Target,
    body: bytes::Bytes,
    since: Option<crate::agent_contract::observer::AnswerMark>,
) -> Result<Observed, ObserveError> {
    let mut url = target.url(crate::agent_contract::observer::REMOVALS_PATH);
    if let Some(m) = since {
        url = format!("{url}?since={}", m.to_query());
    }
    let sent = unix_now();
    let resp = client
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .map_err(|e| ObserveError::Transport { url: url.clone(), message: error_chain(&e) })?;
    let status = resp.status();
    let body = match read_limited(resp, MAX_OBSERVE_ANSWER_BYTES).await {
        Ok(body) => body,
        Err(source) => return Err(ObserveError::Read { url, source }),
    };
    let received = unix_now();
    if !status.is_success() {
        return Err(ObserveError::Status { body: String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_BYTES)]).trim().to_string(), url, status });
    }
    let response = serde_json::from_slice(&body).map_err(|source| ObserveError::NotAnAnswer { url, source })?;
    Ok(Observed { response, sent_unix_seconds: sent, received_unix_seconds: received })
}
