//! The admission webhook's HTTPS server over real sockets on 127.0.0.1 (ephemeral ports), run
//! in-process through the same composition as `safe-termination webhook`
//! (`cli::webhook::serve`), with certificates from rcgen and real rustls clients (reqwest, and
//! tokio-rustls for raw HTTP/1.1 and the h2 crate for HTTP/2 when a test needs frame-level
//! control).

use axum::body::Bytes;
use base64::Engine as _;
use reqwest::StatusCode;
use rustls::pki_types::{CertificateDer, ServerName};
use safe_termination::cli::Error as CliError;
use safe_termination::cli::mutate::{NativeSleep, PlanArgs};
use safe_termination::cli::webhook::{Listeners, ServingArgs, WebhookArgs, serve};
use safe_termination::shutdown::Shutdown;
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;

mod support;
use support::tls::{Leaf, Pki};

const CASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/admission/admissionreview-pod-create.json");
const CASE_UID: &str = "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4";

// ---------------------------------------------------------------------------------------------
// certificates

/// Replaces `path` atomically (write a temporary file, then rename), as a Secret mount update does.
fn write_atomically(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn install(dir: &Path, leaf: &Leaf) {
    write_atomically(&dir.join("tls.key"), &leaf.key_pem);
    write_atomically(&dir.join("tls.crt"), &leaf.cert_pem);
}

// ---------------------------------------------------------------------------------------------
// the server under test

struct Harness {
    addr: SocketAddr,
    admin: SocketAddr,
    shutdown: Shutdown,
    task: JoinHandle<Result<(), CliError>>,
    dir: tempfile::TempDir,
    pki: Pki,
}

struct Options {
    with_cert: bool,
    request_timeout_ms: u64,
    drain_seconds: u64,
    idle_timeout_seconds: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self { with_cert: true, request_timeout_ms: 4000, drain_seconds: 10, idle_timeout_seconds: 30 }
    }
}

impl Harness {
    async fn start(o: Options) -> Self {
        // as src/main.rs does: ring is the process default (reqwest's plain client needs one)
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pki = Pki::new();
        let dir = tempfile::tempdir().unwrap();
        if o.with_cert {
            install(dir.path(), &pki.leaf("cert-a"));
        }
        let args = WebhookArgs {
            serving: ServingArgs {
                listen: "127.0.0.1:0".parse().unwrap(),
                admin_listen: "127.0.0.1:0".parse().unwrap(),
                tls_cert_file: dir.path().join("tls.crt"),
                tls_key_file: dir.path().join("tls.key"),
                cert_reload_interval_seconds: 1,
                max_body_bytes: safe_termination::webhook::server::DEFAULT_MAX_BODY_BYTES,
                max_buffered_body_bytes: safe_termination::webhook::server::DEFAULT_MAX_BUFFERED_BODY_BYTES,
                request_timeout_ms: o.request_timeout_ms,
                body_timeout_ms: 1000,
                drain_seconds: o.drain_seconds,
                idle_timeout_seconds: o.idle_timeout_seconds,
            },
            plan: PlanArgs { policy: None, pre_stop_seconds: Some(10), native_sleep: NativeSleep::Auto },
        };
        let listeners = Listeners::bind(&args.serving).await.unwrap();
        let addr = listeners.webhook.local_addr().unwrap();
        let admin = listeners.admin.local_addr().unwrap();
        let shutdown = Shutdown::new();
        let task = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { serve(&args, listeners, shutdown).await }
        });
        Self { addr, admin, shutdown, task, dir, pki }
    }

    fn url(&self) -> String {
        format!("https://{}/mutate", self.addr)
    }

    async fn admin_get(&self, path: &str) -> (StatusCode, String, String) {
        let r = reqwest::get(format!("http://{}{path}", self.admin)).await.unwrap();
        let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        (r.status(), ct, r.text().await.unwrap())
    }

    async fn metrics(&self) -> String {
        self.admin_get("/metrics").await.2
    }

    /// A raw TLS connection (ALPN http/1.1) for byte-level HTTP/1.1.
    async fn raw(&self) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let connector = tokio_rustls::TlsConnector::from(Arc::new(self.pki.client_config(&[b"http/1.1"])));
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        connector.connect(ServerName::IpAddress(self.addr.ip().into()), tcp).await.unwrap()
    }

    /// The leaf certificate a new TLS connection is served.
    async fn served_leaf(&self) -> CertificateDer<'static> {
        self.raw().await.get_ref().1.peer_certificates().unwrap()[0].clone()
    }

    async fn stop(self) {
        self.shutdown.trigger();
        let r = tokio::time::timeout(Duration::from_secs(15), self.task).await.expect("server stops").unwrap();
        assert!(r.is_ok(), "{r:?}");
    }
}

/// Polls `f` until it returns true, for at most `limit`.
async fn eventually<F, Fut>(limit: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn case() -> Vec<u8> {
    std::fs::read(CASE).unwrap()
}

/// Checks an AdmissionReview response for the shared case: uid echoed, allowed, a base64
/// JSONPatch that applies to request.object and injects the preStop.
fn check_case_response(body: &[u8]) {
    let v: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    let r = &v["response"];
    assert_eq!(r["uid"], CASE_UID);
    assert_eq!(r["allowed"], true);
    assert_eq!(r["patchType"], "JSONPatch");
    let patch_bytes = base64::engine::general_purpose::STANDARD.decode(r["patch"].as_str().expect("patch is a base64 string")).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&patch_bytes).unwrap();
    let request: Value = serde_json::from_slice(&case()).unwrap();
    let mut pod = request["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch.0).expect("the patch applies to request.object");
    let pre_stop = &pod["spec"]["containers"][0]["lifecycle"]["preStop"];
    assert!(pre_stop.is_object(), "preStop injected: {pod}");
    assert_eq!(pod["metadata"]["annotations"]["safetermination.io/prestop-seconds"], "10");
}

async fn post(client: &reqwest::Client, url: &str, body: Vec<u8>, content_type: &str) -> reqwest::Response {
    client.post(url).header("content-type", content_type).body(body).send().await.unwrap()
}

// ---------------------------------------------------------------------------------------------
// tests

#[tokio::test]
async fn shared_case_over_https_http1_and_http2() {
    let h = Harness::start(Options::default()).await;
    for (alpn, version) in [(&b"http/1.1"[..], reqwest::Version::HTTP_11), (&b"h2"[..], reqwest::Version::HTTP_2)] {
        let client = h.pki.client(&[alpn]);
        for _ in 0..3 {
            // several requests on one keep-alive connection
            let r = post(&client, &h.url(), case(), "application/json").await;
            assert_eq!(r.status(), StatusCode::OK);
            assert_eq!(r.version(), version, "negotiated protocol for ALPN {:?}", String::from_utf8_lossy(alpn));
            assert_eq!(r.headers()["content-type"], "application/json");
            check_case_response(&r.bytes().await.unwrap());
        }
    }
    // a client offering both gets h2 (server preference order h2, http/1.1)
    let r = post(&h.pki.client(&[b"h2", b"http/1.1"]), &h.url(), case(), "application/json; charset=utf-8").await;
    assert_eq!((r.status(), r.version()), (StatusCode::OK, reqwest::Version::HTTP_2));
    h.stop().await;
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let h = Harness::start(Options::default()).await;
    for alpn in [&b"http/1.1"[..], &b"h2"[..]] {
        let c = h.pki.client(&[alpn]);
        let r = post(&c, &h.url(), b"{\"kind\": \"AdmissionReview\", nope".to_vec(), "application/json").await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let msg = r.text().await.unwrap();
        assert!(msg.contains("bad AdmissionReview: body is not JSON"), "{msg}");

        let r = post(&c, &h.url(), br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"x"}}"#.to_vec(), "application/json")
            .await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(r.text().await.unwrap().contains("admission.k8s.io/v1"));

        let r = post(&c, &h.url(), case(), "text/plain").await;
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let msg = r.text().await.unwrap();
        assert!(msg.contains("unsupported Content-Type \"text/plain\"; expected application/json"), "{msg}");
        let r = c.post(h.url()).body(case()).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(r.text().await.unwrap().contains("missing Content-Type"));

        assert_eq!(c.get(h.url()).send().await.unwrap().status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(c.post(format!("https://{}/validate", h.addr)).send().await.unwrap().status(), StatusCode::NOT_FOUND);
    }

    // answers that do not read the body (415, 404, 405) over HTTP/2 with a 2 MB body: the client
    // reads the answer (the body is drained first), not a reset stream, every time
    let h2 = h.pki.client(&[b"h2"]);
    let big = vec![b' '; 2 * 1024 * 1024];
    for round in 0..5 {
        let r = post(&h2, &h.url(), big.clone(), "text/plain").await;
        assert_eq!((round, r.status()), (round, StatusCode::UNSUPPORTED_MEDIA_TYPE));
        let r = post(&h2, &format!("https://{}/validate", h.addr), big.clone(), "application/json").await;
        assert_eq!((round, r.status()), (round, StatusCode::NOT_FOUND));
        assert!(r.text().await.unwrap().contains("the webhook serves POST /mutate"));
        let r = h2.put(h.url()).header("content-type", "application/json").body(big.clone()).send().await.unwrap();
        assert_eq!((round, r.status()), (round, StatusCode::METHOD_NOT_ALLOWED));
        assert_eq!(r.headers()["allow"], "POST");
    }

    // the same with curl, whose HTTP/2 client reports a stream reset after the answer as an
    // error (exit 92) instead of the answer
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ca.pem"), h.pki.ca.pem()).unwrap();
    std::fs::write(dir.path().join("body"), &big).unwrap();
    for (method, path, content_type, want) in
        [("POST", "/mutate", "text/plain", "415"), ("POST", "/validate", "application/json", "404"), ("PUT", "/mutate", "application/json", "405")]
    {
        for round in 0..5 {
            let mut curl = std::process::Command::new("curl");
            curl.args(["--http2", "-sS", "--max-time", "20", "-o", "/dev/null", "-w", "%{http_code}", "-X", method, "-H"])
                .arg(format!("content-type: {content_type}"))
                .arg("--cacert")
                .arg(dir.path().join("ca.pem"))
                .arg("--data-binary")
                .arg(format!("@{}", dir.path().join("body").display()))
                .arg(format!("https://127.0.0.1:{}{path}", h.addr.port()));
            // off the runtime's threads: the server under test runs on them
            let out = tokio::task::spawn_blocking(move || curl.output()).await.unwrap().expect("curl (the e2e cluster's scripts need it too)");
            let code = String::from_utf8_lossy(&out.stdout);
            assert_eq!((round, code.as_ref()), (round, want), "{method} {path}: {}", String::from_utf8_lossy(&out.stderr));
        }
    }

    // oversized over HTTP/2: the request is refused with 413 and a message
    let over = vec![b' '; safe_termination::webhook::server::DEFAULT_MAX_BODY_BYTES + 1];
    let r = post(&h.pki.client(&[b"h2"]), &h.url(), over, "application/json").await;
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert!(r.text().await.unwrap().contains("request body exceeds the limit of 3145728 bytes"));

    // oversized over HTTP/1.1, announced by Content-Length: answered before the body is sent
    let mut s = h.raw().await;
    s.write_all(b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4000000\r\n\r\n").await.unwrap();
    let head = read_response(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");
    assert!(head.contains("exceeds the limit"), "{head}");

    // oversized over HTTP/1.1 without a length (chunked): cut at the limit
    let mut s = h.raw().await;
    s.write_all(b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n").await.unwrap();
    let chunk = vec![b' '; 1 << 20];
    for _ in 0..4 {
        let _ = s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).await;
        if s.write_all(&chunk).await.is_err() || s.write_all(b"\r\n").await.is_err() {
            break;
        }
    }
    let _ = s.flush().await;
    let head = read_response(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 413"), "{head}");

    // the rejections were counted
    let m = h.metrics().await;
    for needle in [
        "safe_termination_webhook_requests_total{decision=\"bad_request\"} 4",
        // 4 over HTTP/1.1 and HTTP/2, and 5 + 5 HTTP/2 rounds with a 2 MB body (reqwest, curl)
        "safe_termination_webhook_requests_total{decision=\"unsupported_media_type\"} 14",
        "safe_termination_webhook_requests_total{decision=\"payload_too_large\"} 3",
    ] {
        assert!(m.contains(needle), "missing {needle}:\n{m}");
    }
    h.stop().await;
}

/// Reads an HTTP/1.1 response (headers and a Content-Length body) as text.
async fn read_response<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16384];
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = tokio::time::timeout_at(deadline.into(), s.read(&mut chunk)).await.expect("response in time").unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some(end) = text.find("\r\n\r\n") {
            let len = text[..end]
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()))
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                break;
            }
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test]
async fn readyz_waits_for_a_certificate() {
    let h = Harness::start(Options { with_cert: false, ..Options::default() }).await;
    assert_eq!(h.admin_get("/livez").await.0, StatusCode::OK);
    let (status, _, body) = h.admin_get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "not ready: no certificate loaded\n");
    // no certificate: the handshake is refused
    let err = h.pki.client(&[b"h2"]).post(h.url()).body(case()).send().await;
    assert!(err.is_err(), "{err:?}");

    install(h.dir.path(), &h.pki.leaf("cert-a"));
    assert!(eventually(Duration::from_secs(5), || async { h.admin_get("/readyz").await.0 == StatusCode::OK }).await, "ready after the certificate appears");
    assert_eq!(h.admin_get("/readyz").await.2, "ready\n");
    let r = post(&h.pki.client(&[b"h2"]), &h.url(), case(), "application/json").await;
    assert_eq!(r.status(), StatusCode::OK);
    h.stop().await;
}

#[tokio::test]
async fn certificate_rotation_without_restart() {
    let h = Harness::start(Options { with_cert: false, ..Options::default() }).await;
    let (a, b) = (h.pki.leaf("cert-a"), h.pki.leaf("cert-b"));
    install(h.dir.path(), &a);
    assert!(eventually(Duration::from_secs(5), || async { h.admin_get("/readyz").await.0 == StatusCode::OK }).await);
    assert_eq!(h.served_leaf().await, a.der);
    // a keep-alive connection opened on cert A
    let kept = h.pki.client(&[b"h2"]);
    assert_eq!(post(&kept, &h.url(), case(), "application/json").await.status(), StatusCode::OK);

    install(h.dir.path(), &b);
    assert!(eventually(Duration::from_secs(5), || async { h.served_leaf().await == b.der }).await, "cert B served after the poll");
    // the open connection keeps working; a new one sees B and validates it
    assert_eq!(post(&kept, &h.url(), case(), "application/json").await.status(), StatusCode::OK);
    let r = post(&h.pki.client(&[b"http/1.1"]), &h.url(), case(), "application/json").await;
    let tls = r.extensions().get::<reqwest::tls::TlsInfo>().unwrap();
    assert_eq!(tls.peer_certificate(), Some(b.der.as_ref()));

    // a broken replacement (key of A with cert B... then garbage) keeps B and is counted
    write_atomically(&h.dir.path().join("tls.key"), &a.key_pem);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.served_leaf().await, b.der);
    write_atomically(&h.dir.path().join("tls.crt"), "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(h.served_leaf().await, b.der);
    assert_eq!(h.admin_get("/readyz").await.0, StatusCode::OK);
    let m = h.metrics().await;
    assert!(m.contains("safe_termination_webhook_certificate_reloads_total{result=\"success\"} 2"), "{m}");
    assert!(m.contains("safe_termination_webhook_certificate_reloads_total{result=\"error\"}"), "{m}");
    h.stop().await;
}

/// Sends the headers and the first half of the shared case, returning the stream and the rest.
async fn start_slow_request(h: &Harness) -> (tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Vec<u8>) {
    let body = case();
    let mut s = h.raw().await;
    let head = format!("POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len());
    s.write_all(head.as_bytes()).await.unwrap();
    let half = body.len() / 2;
    s.write_all(&body[..half]).await.unwrap();
    s.flush().await.unwrap();
    // let the server parse the headers and start reading the body: the request is in flight
    tokio::time::sleep(Duration::from_millis(300)).await;
    (s, body[half..].to_vec())
}

#[tokio::test]
async fn graceful_shutdown_finishes_the_in_flight_request() {
    let h = Harness::start(Options::default()).await;
    let (mut s, rest) = start_slow_request(&h).await;
    assert_eq!(h.shutdown.trigger(), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // no new connections
    let refused = tokio::net::TcpStream::connect(h.addr).await;
    assert!(refused.is_err(), "the listener is closed during the drain");
    // not ready while draining (the admin port stays up until the drain ends)
    let (status, _, body) = h.admin_get("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, "not ready: shutting down\n");
    assert!(!h.task.is_finished(), "the server waits for the in-flight request");
    // the in-flight request completes normally
    s.write_all(&rest).await.unwrap();
    s.flush().await.unwrap();
    let response = read_response(&mut s).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body_at = response.find("\r\n\r\n").unwrap() + 4;
    check_case_response(&response.as_bytes()[body_at..]);
    // then the server exits cleanly
    let r = tokio::time::timeout(Duration::from_secs(5), h.task).await.expect("exits after the drain").unwrap();
    assert!(r.is_ok(), "{r:?}");
    assert!(tokio::net::TcpStream::connect(h.admin).await.is_err(), "admin port closed at exit");
}

/// Reads until the peer closes the connection (EOF or a reset) or `limit` passes; returns how
/// long that took, or None when the connection was still open at `limit`. Writes `dribble` one
/// byte every 100 ms meanwhile (a slowloris sending a request head).
async fn closed_within(s: &mut tokio_rustls::client::TlsStream<tokio::net::TcpStream>, dribble: &[u8], limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut bytes = dribble.iter();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        if let Some(b) = bytes.next()
            && (s.write_all(&[*b]).await.is_err() || s.flush().await.is_err())
        {
            return Some(start.elapsed());
        }
        // anything else is a 408 or nothing yet
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
            return Some(start.elapsed());
        }
    }
    None
}

/// Slowloris after the first request: hyper's header timeout used to cover only the first
/// request of a connection (axum-server turns it off; its first-request timeout stops after the
/// first request), so a client could send one good request and then dribble a header, or idle,
/// forever. Now both are closed once the idle timeout (1 s here) has passed.
#[tokio::test]
async fn slow_header_or_idle_connection_after_a_first_request_is_closed() {
    let h = Harness::start(Options { idle_timeout_seconds: 1, ..Options::default() }).await;
    let body = case();
    let request = |s: &mut Vec<u8>| {
        s.extend_from_slice(format!("POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes());
        s.extend_from_slice(&body);
    };
    let slow_head = b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    for dribble in [&slow_head[..], b""] {
        let mut s = h.raw().await;
        let mut first = Vec::new();
        request(&mut first);
        s.write_all(&first).await.unwrap();
        s.flush().await.unwrap();
        let response = read_response(&mut s).await;
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(!response.to_ascii_lowercase().contains("connection: close"), "kept alive: {response}");
        let took = closed_within(&mut s, dribble, Duration::from_secs(8)).await;
        let took = took.unwrap_or_else(|| panic!("connection still open 8 s after its first request (dribbling {} bytes)", dribble.len()));
        assert!(took >= Duration::from_millis(500) && took <= Duration::from_secs(3), "closed after {took:?} (dribbling {} bytes)", dribble.len());
    }
    // a client that keeps sending whole requests within the timeout keeps its connection
    let mut s = h.raw().await;
    for _ in 0..3 {
        let mut req = Vec::new();
        request(&mut req);
        s.write_all(&req).await.unwrap();
        assert!(read_response(&mut s).await.starts_with("HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    h.stop().await;
}

#[tokio::test]
async fn second_signal_aborts_the_drain() {
    let h = Harness::start(Options { drain_seconds: 60, ..Options::default() }).await;
    let (_stuck, _) = start_slow_request(&h).await;
    h.shutdown.trigger();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!h.task.is_finished(), "draining");
    h.shutdown.trigger();
    let r = tokio::time::timeout(Duration::from_secs(2), h.task).await.expect("abort is immediate").unwrap();
    assert!(matches!(r, Err(CliError::Aborted)), "{r:?}");
    assert_eq!(CliError::Aborted.exit_code(), 130);
}

#[tokio::test]
async fn request_timeout_answers_instead_of_hanging() {
    let h = Harness::start(Options { request_timeout_ms: 500, ..Options::default() }).await;
    let (mut s, _) = start_slow_request(&h).await;
    let response = read_response(&mut s).await;
    assert!(response.starts_with("HTTP/1.1 503"), "{response}");
    assert!(response.contains("admission request not answered within 500 ms"), "{response}");
    assert!(h.metrics().await.contains("safe_termination_webhook_requests_total{decision=\"timeout\"} 1"));
    h.stop().await;
}

#[tokio::test]
async fn metrics_count_requests_by_decision() {
    let h = Harness::start(Options::default()).await;
    let c = h.pki.client(&[b"h2"]);
    for _ in 0..3 {
        assert_eq!(post(&c, &h.url(), case(), "application/json").await.status(), StatusCode::OK);
    }
    // a DELETE review: allowed, ignored
    let mut delete: Value = serde_json::from_slice(&case()).unwrap();
    delete["request"]["operation"] = "DELETE".into();
    let r = post(&c, &h.url(), serde_json::to_vec(&delete).unwrap(), "application/json").await;
    let v: Value = r.json().await.unwrap();
    assert_eq!((v["response"]["allowed"].as_bool(), v["response"].get("patch")), (Some(true), None));

    let (status, content_type, m) = h.admin_get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    assert!(content_type.starts_with("application/openmetrics-text"), "{content_type}");
    for needle in [
        "safe_termination_webhook_requests_total{decision=\"mutated\"} 3",
        "safe_termination_webhook_requests_total{decision=\"ignored\"} 1",
        "safe_termination_webhook_request_duration_seconds_count 4",
        "safe_termination_webhook_fail_open_total 0",
        "safe_termination_webhook_certificate_reloads_total{result=\"success\"} 1",
        "# EOF",
    ] {
        assert!(m.contains(needle), "missing {needle}:\n{m}");
    }
    h.stop().await;
}

/// The real binary (`safe-termination webhook`, built by cargo; `SAFE_TERMINATION_BIN` names
/// another build, to measure it) on ephemeral loopback ports, logging JSON lines to a pipe.
/// Killed when dropped without [`Binary::stop`] (a failed assertion).
struct Binary {
    child: Option<std::process::Child>,
    /// Every log line, parsed, after the `admission webhook serving` line.
    lines: std::sync::mpsc::Receiver<Value>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// `https://ADDR/mutate`.
    url: String,
    /// The admin port's address.
    admin: String,
    pki: Pki,
    _dir: tempfile::TempDir,
}

impl Binary {
    fn start() -> Self {
        use std::io::BufRead as _;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pki = Pki::new();
        let dir = tempfile::tempdir().unwrap();
        install(dir.path(), &pki.leaf("cert-a"));
        let bin = std::env::var("SAFE_TERMINATION_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_safe-termination").to_string());
        let mut child = std::process::Command::new(bin)
            .args(["--log-format", "json", "webhook", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--pre-stop-seconds", "10"])
            .arg("--tls-cert-file")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key-file")
            .arg(dir.path().join("tls.key"))
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let (lines_tx, lines) = std::sync::mpsc::channel::<Value>();
        let stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines() {
                let line = line.unwrap();
                let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
                if lines_tx.send(v).is_err() {
                    break;
                }
            }
        });
        let serving = loop {
            let v = lines.recv_timeout(Duration::from_secs(20)).expect("the webhook logs that it serves");
            if v["message"] == "admission webhook serving" {
                break v;
            }
        };
        let url = format!("https://{}/mutate", serving["listen"].as_str().unwrap());
        let admin = serving["admin"].as_str().unwrap().to_string();
        Self { child: Some(child), lines, reader: Some(reader), url, admin, pki, _dir: dir }
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// A field of `/proc/PID/status` in bytes (`VmHWM`: the peak resident size; `VmRSS`).
    fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with(&format!("{field}:"))).unwrap_or_else(|| panic!("no {field} in {status}"));
        let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap();
        kib * 1024
    }

    /// Waits until the process has used no CPU for 250 ms (at most 60 s): a review answered
    /// 503 at the request timeout may still be running on the blocking pool.
    async fn settle(&self) {
        let cpu = || -> u64 {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
            // utime and stime, the 14th and 15th fields, after the parenthesised command name
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            rest.split_whitespace().skip(11).take(2).filter_map(|v| v.parse::<u64>().ok()).sum()
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = cpu();
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let now = cpu();
            if now == last {
                return;
            }
            last = now;
        }
    }

    /// SIGTERM, then waits for the exit; the exit status and every log line left.
    async fn stop(mut self) -> (std::process::ExitStatus, Vec<Value>) {
        assert_eq!(unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) }, 0);
        let mut child = self.child.take().unwrap();
        let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
        self.reader.take().unwrap().join().unwrap();
        (status, self.lines.try_iter().collect())
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The real binary, as deployed: every review is logged once (JSON lines, with the fields the
/// issue names), and after a SIGTERM sent right after the last answer, no line is missing and the
/// shutdown's last line is there (the servers log from a writer thread, see
/// `telemetry::init_logging`: this is the check that the queue is written out, not dropped).
#[tokio::test]
async fn the_binary_logs_every_review_and_writes_its_queued_lines_out_on_sigterm() {
    let server = Binary::start();
    let (url, client) = (server.url.clone(), server.pki.client(&[b"h2"]));
    const REVIEWS: usize = 300;
    let answers = futures::future::join_all((0..REVIEWS).map(|_| post(&client, &url, case(), "application/json"))).await;
    assert!(answers.iter().all(|r| r.status() == StatusCode::OK));
    // at once: lines may still be queued
    let (status, rest) = server.stop().await;
    assert!(status.success(), "{status:?}");
    let reviews: Vec<&Value> = rest.iter().filter(|v| v["message"] == "admission review").collect();
    assert_eq!(reviews.len(), REVIEWS, "one line per review, none lost");
    for v in &reviews {
        assert_eq!((v["level"].as_str(), v["uid"].as_str(), v["namespace"].as_str()), (Some("INFO"), Some(CASE_UID), Some("example-ns")));
        assert_eq!((v["pod"].as_str(), v["decision"].as_str(), v["patch_ops"].as_u64()), (Some("echo-pod"), Some("mutated"), Some(4)));
        assert!(v["duration_us"].as_u64().is_some(), "{v}");
    }
    assert_eq!(rest.last().unwrap()["message"], "admission webhook stopped", "the last line is written too");
}

/// An HTTP/2 client connection over TLS (ALPN h2) to `addr`: the request handle and the
/// connection, which answers the server's pings only while it is polled.
async fn h2_connect(
    pki: &Pki,
    addr: SocketAddr,
) -> (h2::client::SendRequest<Bytes>, h2::client::Connection<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, Bytes>) {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(pki.client_config(&[b"h2"])));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = connector.connect(ServerName::IpAddress(addr.ip().into()), tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    h2::client::handshake(tls).await.unwrap()
}

/// POSTs the shared case on `send`, polling `conn` meanwhile; returns the status.
async fn h2_review<C: std::future::Future<Output = Result<(), h2::Error>> + Unpin>(
    send: &mut h2::client::SendRequest<Bytes>,
    conn: &mut C,
    addr: SocketAddr,
) -> u16 {
    let request = http::Request::post(format!("https://{addr}/mutate")).header("content-type", "application/json").body(()).unwrap();
    let exchange = async {
        let mut ready = send.clone().ready().await.unwrap();
        let (response, mut body) = ready.send_request(request, false).unwrap();
        body.send_data(Bytes::from(case()), true).unwrap();
        let response = response.await.unwrap();
        let status = response.status().as_u16();
        let mut data = response.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = data.data().await {
            let chunk = chunk.unwrap();
            data.flow_control().release_capacity(chunk.len()).unwrap();
            got.extend_from_slice(&chunk);
        }
        check_case_response(&got);
        status
    };
    tokio::select! {
        status = exchange => status,
        end = conn => panic!("the connection ended during a request: {end:?}"),
    }
}

/// `server::serve` alone (no CLI composition) on 127.0.0.1 with `settings` and `connections`,
/// a static 10 s plan and a certificate from a fresh test CA: for the tests of settings the
/// command line does not expose. Stop it by cancelling the token, then await the task.
struct Direct {
    addr: SocketAddr,
    pki: Pki,
    stop: tokio_util::sync::CancellationToken,
    task: JoinHandle<std::io::Result<()>>,
}

impl Direct {
    fn start(settings: safe_termination::webhook::server::RequestLimits, connections: safe_termination::webhook::server::Connections) -> Self {
        use safe_termination::webhook::server::{self, WebhookState};
        use safe_termination::webhook::tls::{CertificateStore, load_certified_key, server_config};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let pki = Pki::new();
        let leaf = pki.leaf("cert-a");
        let store = Arc::new(CertificateStore::new());
        store.set(load_certified_key(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes()).unwrap());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let plan = PlanArgs { policy: None, pre_stop_seconds: Some(10), native_sleep: NativeSleep::Auto }.plan().unwrap();
        let state = WebhookState {
            plan: safe_termination::webhook::PlanHandle::with_plan(plan),
            services: Arc::new(safe_termination::core::selector::AssumeServiceBacked),
            metrics: safe_termination::telemetry::Telemetry::new().webhook().clone(),
            settings,
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let task =
            tokio::spawn(server::serve(listener, server::router(state), server_config(store).unwrap(), stop.clone(), Duration::from_secs(2), connections));
        Self { addr, pki, stop, task }
    }

    async fn stop(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task).await.unwrap().unwrap().unwrap();
    }
}

/// HTTP/2 as the API server uses it: the stream limit is advertised in SETTINGS; a peer that
/// answers keep-alive pings keeps its idle connection; a peer that stops answering is
/// disconnected after the ping interval plus its timeout (shortened here to 1 s + 1 s).
#[tokio::test]
async fn http2_stream_limit_and_keep_alive_pings() {
    use safe_termination::webhook::server::Connections;
    let connections = Connections {
        h2_keep_alive_interval: Duration::from_secs(1),
        h2_keep_alive_timeout: Duration::from_secs(1),
        h2_max_concurrent_streams: 7,
        ..Default::default()
    };
    let server = Direct::start(Default::default(), connections);
    let (pki, addr) = (&server.pki, server.addr);

    // a peer that keeps answering pings
    let (mut send, conn) = h2_connect(pki, addr).await;
    let mut conn = Box::pin(conn);
    assert_eq!(h2_review(&mut send, &mut conn, addr).await, 200);
    assert_eq!(conn.max_concurrent_send_streams(), 7, "SETTINGS_MAX_CONCURRENT_STREAMS as configured");
    // idle for three ping intervals, answering pings (the connection is polled)
    let idle = tokio::time::timeout(Duration::from_secs(3), &mut conn).await;
    assert!(idle.is_err(), "an idle connection whose peer answers pings is kept, got {idle:?}");
    assert_eq!(h2_review(&mut send, &mut conn, addr).await, 200, "and it still serves");

    // a peer that stops answering: not polled for longer than interval + timeout
    let (mut send, conn) = h2_connect(pki, addr).await;
    let mut silent = Box::pin(conn);
    assert_eq!(h2_review(&mut send, &mut silent, addr).await, 200);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let ended = tokio::time::timeout(Duration::from_secs(2), &mut silent).await;
    assert!(ended.is_ok(), "the server closed the connection of a peer that did not answer its ping");

    server.stop().await;
}

/// Connections open at once are capped (`Connections::max_connections`, 2 here): a third is
/// closed before its TLS handshake, the two open ones still serve, and once one closes a new
/// connection is served again.
#[tokio::test]
async fn connections_open_at_once_are_capped() {
    use safe_termination::webhook::server::Connections;
    let server = Direct::start(Default::default(), Connections { max_connections: 2, ..Default::default() });
    let (pki, addr) = (&server.pki, server.addr);
    let (mut send_a, conn_a) = h2_connect(pki, addr).await;
    let mut conn_a = Box::pin(conn_a);
    let (mut send_b, conn_b) = h2_connect(pki, addr).await;
    let mut conn_b = Box::pin(conn_b);
    assert_eq!(h2_review(&mut send_a, &mut conn_a, addr).await, 200);
    assert_eq!(h2_review(&mut send_b, &mut conn_b, addr).await, 200);

    // a third: the TCP connection is accepted by the kernel, then closed without a handshake
    let connector = tokio_rustls::TlsConnector::from(Arc::new(pki.client_config(&[b"h2"])));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let third = tokio::time::timeout(Duration::from_secs(5), connector.connect(ServerName::IpAddress(addr.ip().into()), tcp)).await;
    assert!(matches!(third, Ok(Err(_))), "the third connection's handshake fails at once: {:?}", third.map(|r| r.map(|_| ())));
    assert_eq!(h2_review(&mut send_a, &mut conn_a, addr).await, 200, "the open ones still serve");

    // one closes: its permit comes back, and a new connection is served
    drop((send_b, conn_b));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        if let Ok(tls) = connector.connect(ServerName::IpAddress(addr.ip().into()), tcp).await {
            let (mut send, conn) = h2::client::handshake(tls).await.unwrap();
            let mut conn = Box::pin(conn);
            assert_eq!(h2_review(&mut send, &mut conn, addr).await, 200);
            break;
        }
        assert!(Instant::now() < deadline, "no connection was served again within 5 s of one closing");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop().await;
}

/// Reads from a plain TCP stream until the peer closes it or `limit` passes; the time it took.
async fn tcp_closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    while start.elapsed() < limit {
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout(Duration::from_millis(100), s.read(&mut buf)).await {
            return Some(start.elapsed());
        }
    }
    None
}

/// The admin port (plain HTTP) has the webhook port's idle/slow-header bound, and a stalled
/// request on it cannot hold the process's exit: shutdown finishes within the webhook's drain
/// plus the admin port's own short drain (`telemetry::ADMIN_DRAIN`, 1 s).
#[tokio::test]
async fn admin_port_closes_slow_headers_and_a_stalled_request_does_not_hold_shutdown() {
    let h = Harness::start(Options { idle_timeout_seconds: 2, drain_seconds: 1, ..Options::default() }).await;
    // a dribbled head is cut off after the idle timeout
    let mut slow = tokio::net::TcpStream::connect(h.admin).await.unwrap();
    slow.write_all(b"GET /readyz HTTP/1.1\r\nHo").await.unwrap();
    let closed = tcp_closed_within(&mut slow, Duration::from_secs(6)).await;
    assert!(closed.is_some_and(|t| t >= Duration::from_millis(1500)), "closed after about 2 s, got {closed:?}");
    // a stalled request at shutdown time
    let mut stalled = tokio::net::TcpStream::connect(h.admin).await.unwrap();
    stalled.write_all(b"GET /readyz HTTP/1.1\r\nHo").await.unwrap();
    let start = Instant::now();
    h.stop().await;
    assert!(start.elapsed() < Duration::from_secs(4), "shutdown took {:?} with a stalled admin request", start.elapsed());
    drop(stalled);
}

/// An HTTP/1.1 request over TLS to `addr` that declares a 64,000-byte body and sends only `sent`
/// bytes of it, once the server has reserved the declared length in `budget` (asserted).
async fn stalled_body(
    pki: &Pki,
    addr: SocketAddr,
    budget: &safe_termination::webhook::server::BodyBudget,
    sent: usize,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(pki.client_config(&[b"http/1.1"])));
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut a = connector.connect(ServerName::IpAddress(addr.ip().into()), tcp).await.unwrap();
    a.write_all(b"POST /mutate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 64000\r\n\r\n").await.unwrap();
    a.write_all(&vec![b' '; sent]).await.unwrap();
    a.flush().await.unwrap();
    let (total, reserved) = (budget.bytes(), 64_000);
    let deadline = Instant::now() + Duration::from_secs(5);
    while budget.available() > total - reserved && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(budget.available(), total - reserved, "the stalled request reserved its declared length");
    a
}

/// Many large bodies at once cannot take the process's memory: body bytes held by all requests
/// together are bounded (`BodyBudget`, 64 KiB here): each request reserves its declared length
/// before reading. A request whose body does not fit beside another's waits until that one is
/// answered (here: it times out, its body never completed), then goes through; with the budget
/// free nothing waits; two that do not fit together go one after the other. (A request that
/// waits past its own timeout gets the usual 503: `request_timeout_answers_instead_of_hanging`.)
#[tokio::test]
async fn request_bodies_held_at_once_are_bounded() {
    use safe_termination::webhook::server::{BodyBudget, RequestLimits};
    let budget = BodyBudget::new(64 * 1024);
    // (a body timeout beyond the request timeout: here A holds its budget until the latter)
    let settings = RequestLimits {
        max_body_bytes: 64 * 1024,
        request_timeout: Duration::from_millis(1500),
        body_timeout: Duration::from_secs(10),
        body_budget: budget.clone(),
    };
    let server = Direct::start(settings, Default::default());
    let (pki, addr) = (&server.pki, server.addr);

    // A: 60,000 of its 64,000 body bytes, then nothing
    let mut a = stalled_body(pki, addr, &budget, 60_000).await;

    // B: a whole 10 KB body does not fit beside A's: it waits until A's timeout (1.5 s after A
    // started) gives A's budget back, then is answered
    let client = pki.client(&[b"h2"]);
    let mut padded = case();
    padded.resize(10_000, b' ');
    let started = Instant::now();
    let b = post(&client, &format!("https://{addr}/mutate"), padded.clone(), "application/json").await;
    let waited = started.elapsed();
    assert_eq!(b.status(), StatusCode::OK);
    assert!(waited >= Duration::from_millis(1000), "B waited for A's budget: answered after {waited:?}");
    check_case_response(&b.bytes().await.unwrap());

    // A timed out (its body never completed); the budget is whole again
    let a_answer = read_response(&mut a).await;
    assert!(a_answer.starts_with("HTTP/1.1 503"), "{a_answer}");
    assert!(a_answer.contains("not answered within 1500 ms"), "{a_answer}");
    assert_eq!(budget.available(), 64 * 1024, "given back after the answers");
    let started = Instant::now();
    let again = post(&client, &format!("https://{addr}/mutate"), padded, "application/json").await;
    assert_eq!(again.status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_millis(1000), "no wait with the budget free: {:?}", started.elapsed());

    // two bodies that do not fit together (2 x 40 KB in 64 KiB) arrive at once: each reserves
    // its whole length before reading, so one waits for the other rather than both holding a
    // part and waiting for the rest until both time out
    let mut big = case();
    big.resize(40_000, b' ');
    let url = format!("https://{addr}/mutate");
    let started = Instant::now();
    let (x, y) = tokio::join!(post(&client, &url, big.clone(), "application/json"), post(&client, &url, big, "application/json"));
    assert_eq!((x.status(), y.status()), (StatusCode::OK, StatusCode::OK));
    assert!(started.elapsed() < Duration::from_millis(1000), "one after the other, quickly: {:?}", started.elapsed());
    assert_eq!(budget.available(), 64 * 1024);

    server.stop().await;
}

/// A client that declares a large body and sends it slowly holds its reservation only for the
/// body timeout (here 500 ms), not the whole request timeout (10 s): it gets 408, and a review
/// that waited for that budget is answered soon after. (The fresh-user trial: 25 such
/// connections of 3 MB made every review wait 3.4 s with the budget held for the request
/// timeout.)
#[tokio::test]
async fn a_body_that_does_not_arrive_gives_its_budget_back_at_the_body_timeout() {
    use safe_termination::webhook::server::{BodyBudget, RequestLimits};
    let budget = BodyBudget::new(64 * 1024);
    let settings = RequestLimits {
        max_body_bytes: 64 * 1024,
        request_timeout: Duration::from_secs(10),
        body_timeout: Duration::from_millis(500),
        body_budget: budget.clone(),
    };
    let server = Direct::start(settings, Default::default());
    let (pki, addr) = (&server.pki, server.addr);

    // A declares 64,000 bytes and sends one
    let a_started = Instant::now();
    let mut a = stalled_body(pki, addr, &budget, 1).await;

    // B does not fit beside A: answered once A's body timeout gives the budget back, long
    // before A's request timeout
    let client = pki.client(&[b"h2"]);
    let mut padded = case();
    padded.resize(10_000, b' ');
    let b = post(&client, &format!("https://{addr}/mutate"), padded, "application/json").await;
    let b_after = a_started.elapsed();
    assert_eq!(b.status(), StatusCode::OK);
    check_case_response(&b.bytes().await.unwrap());
    assert!(b_after < Duration::from_secs(5), "B waited {b_after:?}: A held the budget beyond its body timeout");

    let a_answer = read_response(&mut a).await;
    assert!(a_answer.starts_with("HTTP/1.1 408"), "{a_answer}");
    assert!(a_answer.contains("did not arrive within 500 ms"), "{a_answer}");
    assert_eq!(budget.available(), 64 * 1024, "given back");
    server.stop().await;
}

/// The body limits are range-checked flags: a usage error (exit 2) naming the range, and the
/// total must hold one body.
#[test]
fn body_limit_flags_are_range_checked() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_safe-termination"))
            .args(["webhook", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--pre-stop-seconds", "10"])
            .args(["--tls-cert-file", "/nonexistent/tls.crt", "--tls-key-file", "/nonexistent/tls.key"])
            .args(args)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    for bad in ["0", "-1", "1023", "1e6", "268435457"] {
        let (code, err) = run(&["--max-body-bytes", bad]);
        assert_eq!(code, Some(2), "--max-body-bytes {bad}: {err}");
        assert!(err.contains("expected a whole number of bytes from 1024 to 268435456"), "--max-body-bytes {bad}: {err}");
    }
    let (code, err) = run(&["--max-buffered-body-bytes", "1000"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected a whole number of bytes from 1048576 to 17179869184"), "{err}");
    let (code, err) = run(&["--max-body-bytes", "8388608", "--max-buffered-body-bytes", "4194304"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--max-buffered-body-bytes (4194304) must be at least --max-body-bytes (8388608)"), "{err}");
}

/// Sends a POST over HTTP/2 whose body is `total` bytes in 16 KiB DATA frames (with
/// `content-length: declared` when given), reading the answer meanwhile; returns the status and
/// body text, or the h2 error the exchange ended with (a stream reset instead of an answer).
async fn h2_post_streaming(pki: &Pki, addr: SocketAddr, declared: Option<usize>, total: usize) -> Result<(u16, String), String> {
    let (send, conn) = h2_connect(pki, addr).await;
    let conn_task = tokio::spawn(conn);
    let mut request = http::Request::post(format!("https://{addr}/mutate")).header("content-type", "application/json");
    if let Some(n) = declared {
        request = request.header("content-length", n.to_string());
    }
    let mut ready = send.ready().await.map_err(|e| e.to_string())?;
    let (response, mut body) = ready.send_request(request.body(()).unwrap(), false).map_err(|e| e.to_string())?;
    // the sender stops at the first refusal (the server is not obliged to read the rest)
    let sender = tokio::spawn(async move {
        let mut left = total;
        while left > 0 {
            let n = left.min(16 * 1024);
            body.reserve_capacity(n);
            match std::future::poll_fn(|cx| body.poll_capacity(cx)).await {
                Some(Ok(_)) => {}
                _ => return,
            }
            if body.send_data(Bytes::from(vec![b' '; n]), left == n).is_err() {
                return;
            }
            left -= n;
        }
    });
    let answer = async {
        let response = response.await.map_err(|e| format!("response: {e}"))?;
        let status = response.status().as_u16();
        let mut data = response.into_body();
        let mut got = Vec::new();
        while let Some(chunk) = data.data().await {
            let chunk = chunk.map_err(|e| format!("body after status {status}: {e}"))?;
            let _ = data.flow_control().release_capacity(chunk.len());
            got.extend_from_slice(&chunk);
        }
        Ok::<_, String>((status, String::from_utf8_lossy(&got).into_owned()))
    };
    let out = tokio::time::timeout(Duration::from_secs(10), answer).await.map_err(|_| "no answer within 10 s".to_string())?;
    sender.abort();
    conn_task.abort();
    out
}

/// A body over the limit is answered 413 with the message over HTTP/2 as over HTTP/1.1, whether
/// its length was declared or not, and while the client is still sending: the answer is a
/// complete response, not a reset stream.
#[tokio::test]
async fn oversized_body_over_http2_is_413_not_a_reset() {
    use safe_termination::webhook::server::{BodyBudget, RequestLimits};
    let limit = 64 * 1024;
    let settings = RequestLimits {
        max_body_bytes: limit,
        request_timeout: Duration::from_secs(5),
        body_timeout: Duration::from_secs(5),
        body_budget: BodyBudget::new(1 << 20),
    };
    let server = Direct::start(settings, Default::default());
    let (pki, addr) = (&server.pki, server.addr);
    let message = format!("request body exceeds the limit of {limit} bytes\n");
    for (declared, total) in [(None, 4 * limit), (Some(4 * limit), 4 * limit), (Some(limit + 1), limit + 1), (None, limit + 1)] {
        let got = h2_post_streaming(pki, addr, declared, total).await;
        assert_eq!(got, Ok((413, message.clone())), "declared {declared:?}, sent {total}");
    }
    // a body at the limit is read and reviewed (400: blank JSON is not an AdmissionReview)
    let (status, text) = h2_post_streaming(pki, addr, None, limit).await.unwrap();
    assert_eq!(status, 400, "{text}");
    server.stop().await;
}

// ---------------------------------------------------------------------------------------------
// bounded work per request

/// The peak resident size (VmHWM) the real `webhook` process may reach while it answers the
/// worst-case reviews below, 8 at once: 96 MiB, well below the chart's memory limit (256 MiB,
/// charts/safe-termination/values.yaml `resources.limits.memory`). Measured 55-73 MiB (debug
/// build, idle 24 MiB; docs/benchmarks/bounded-work.md "Bounded work per request"); before the bounds, the first
/// shape alone took it to 1.7-4.0 GiB.
const MEMORY_BOUND_BYTES: u64 = 96 << 20;

/// An AdmissionReview v1 of a Pod CREATE in namespace `default` with `labels` (a JSON object's
/// members, without braces) and `containers` (JSON objects), as long as the body fits in the
/// API server's request limit (3 MiB, the webhook's default `--max-body-bytes`): the containers
/// that do not fit are left out.
fn big_review(uid: &str, labels: &str, containers: impl Iterator<Item = String>) -> Vec<u8> {
    const LIMIT: usize = safe_termination::webhook::server::DEFAULT_MAX_BODY_BYTES;
    let head = format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{"uid":"{uid}","kind":{{"group":"","version":"v1","kind":"Pod"}},"resource":{{"group":"","version":"v1","resource":"pods"}},"operation":"CREATE","namespace":"default","name":"big","object":{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"big","namespace":"default","labels":{{{labels}}}}},"spec":{{"containers":["#
    );
    let tail = "]}}}}";
    let mut body = head;
    for (i, c) in containers.enumerate() {
        if body.len() + c.len() + 1 + tail.len() > LIMIT {
            break;
        }
        if i > 0 {
            body.push(',');
        }
        body.push_str(&c);
    }
    body.push_str(tail);
    assert!(body.len() <= LIMIT);
    body.into_bytes()
}

/// Work per admission request is bounded by design, not by the body limit: eight worst-case
/// reviews at once, each at the API server's 3 MiB request limit, sent to the real `webhook`
/// process (a fresh one per shape, so each shape's peak is its own), keep its peak resident size
/// under [`MEMORY_BOUND_BYTES`], and each is answered as the rules say:
/// - about 100,000 containers `{"name":"cN","image":"x"}` (the shape that took the server from
///   18 MB to 442 MB per request): past `MAX_POD_CONTAINERS` (256), admitted unchanged with
///   the warning, counted as `skipped_too_many_containers`;
/// - 256 containers (at the limit), each as large as fits (12 KB: a 63-character name, a 4 KB
///   image, a postStart command of single-letter arguments): mutated, one preStop per container;
/// - 256 containers, each with a 12 KB name and its own preStop sleep of 1 s (the name is kept,
///   and copied into the per-container reasons and the under-sized-sleep warnings): only the
///   grace raised, a warning per container;
/// - about 300,000 short labels: past `MAX_POD_LABELS` (1,024), admitted unchanged with the
///   warning, counted as `skipped_too_many_labels`.
#[tokio::test]
async fn eight_worst_case_reviews_at_once_stay_under_the_memory_bound() {
    use safe_termination::core::mutate::{MAX_POD_CONTAINERS, too_many_containers_warning, too_many_labels_warning};
    const LIMIT: usize = safe_termination::webhook::server::DEFAULT_MAX_BODY_BYTES;
    let tiny = big_review("tiny", r#""app":"web""#, (0..).map(|i| format!(r#"{{"name":"c{i}","image":"x"}}"#)));
    let per_container = (LIMIT - 600) / MAX_POD_CONTAINERS;
    let large = big_review(
        "large",
        r#""app":"web""#,
        (0..MAX_POD_CONTAINERS).map(|i| {
            let head = format!(r#"{{"name":"c{i:0>62}","image":"registry.example/{}","lifecycle":{{"postStart":{{"exec":{{"command":["a""#, "x".repeat(4096));
            let args = (per_container - head.len() - 8) / 4;
            format!("{head}{}]}}}}}}}}", r#","a""#.repeat(args))
        }),
    );
    let long_name = |i: usize| format!("c{i}-{}", "n".repeat(per_container - 120));
    let named = big_review(
        "names",
        r#""app":"web""#,
        (0..MAX_POD_CONTAINERS).map(|i| format!(r#"{{"name":"{}","image":"x","lifecycle":{{"preStop":{{"sleep":{{"seconds":1}}}}}}}}"#, long_name(i))),
    );
    let mut labels: String = (0..400_000).map(|i| format!(r#""l{i}":"","#)).collect();
    labels.truncate(LIMIT - 700);
    labels.truncate(labels.rfind(",\"l").unwrap());
    let labelled = big_review("labels", &labels, std::iter::once(r#"{"name":"web","image":"x"}"#.to_string()));
    let tiny_count = String::from_utf8_lossy(&tiny).matches(r#""image":"x""#).count();
    assert!(tiny_count > 90_000, "{tiny_count} containers in {} bytes", tiny.len());
    for body in [&large, &named, &labelled] {
        assert!(body.len() > 3_000_000, "{}", body.len());
    }

    let mut peaks = Vec::new();
    let mut answers = Vec::new();
    for (shape, body, decision) in [
        ("tiny", &tiny, "skipped_too_many_containers"),
        ("large", &large, "mutated"),
        ("names", &named, "mutated"),
        ("labels", &labelled, "skipped_too_many_labels"),
    ] {
        let server = Binary::start();
        let client = server.pki.client(&[b"h2"]);
        let idle = server.status_bytes("VmRSS");
        let started = Instant::now();
        // each answer read whole as it comes (the client's timeout is 10 s per request)
        let exchange = |body: Vec<u8>| async {
            let r = client.post(&server.url).header("content-type", "application/json").body(body).send().await.map_err(|e| e.to_string())?;
            let status = r.status();
            r.bytes().await.map(|b| (status, b)).map_err(|e| e.to_string())
        };
        let out: Vec<Result<(StatusCode, Bytes), String>> = futures::future::join_all((0..8).map(|_| exchange(body.clone()))).await;
        let elapsed = started.elapsed();
        server.settle().await;
        let peak = server.status_bytes("VmHWM");
        eprintln!(
            "{shape}: 8 x {} bytes, {} answered 200 in {elapsed:?}, {} bytes each; VmHWM {:.1} MiB (idle VmRSS {:.1} MiB)",
            body.len(),
            out.iter().filter(|a| a.as_ref().is_ok_and(|(s, _)| *s == StatusCode::OK)).count(),
            out.iter().find_map(|a| a.as_ref().ok()).map_or(0, |(_, b)| b.len()),
            peak as f64 / 1048576.0,
            idle as f64 / 1048576.0
        );
        let metrics = reqwest::get(format!("http://{}/metrics", server.admin)).await.unwrap().text().await.unwrap();
        let counted = format!("safe_termination_webhook_requests_total{{decision=\"{decision}\"}} 8");
        let (status, _) = server.stop().await;
        assert!(status.success(), "{status:?}");
        peaks.push((shape, peak));
        answers.push((shape, out, metrics.contains(&counted).then_some(()).ok_or(counted)));
    }
    assert!(peaks.iter().all(|(_, peak)| *peak < MEMORY_BOUND_BYTES), "VmHWM over the bound of {MEMORY_BOUND_BYTES} bytes: {peaks:?}");

    let response = |body: &[u8]| -> Value { serde_json::from_slice::<Value>(body).unwrap()["response"].clone() };
    let large_ops = |answer: &Result<(StatusCode, Bytes), String>| -> Vec<Value> {
        let r = response(&answer.as_ref().unwrap().1);
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(r["patch"].as_str().unwrap()).unwrap()).unwrap()
    };
    let first_ops = large_ops(&answers[1].1[0]);
    for (shape, out, counted) in &answers {
        assert_eq!(counted, &Ok(()), "{shape}: counted in /metrics");
        for answer in out {
            let (status, body) = answer.as_ref().unwrap_or_else(|e| panic!("{shape}: {e}"));
            assert_eq!(*status, StatusCode::OK, "{shape}: {}", String::from_utf8_lossy(body));
            let r = response(body);
            assert_eq!((r["uid"].as_str(), r["allowed"].as_bool()), (Some(*shape), Some(true)), "{shape}: {r}");
            match *shape {
                "tiny" => {
                    assert!(r.get("patch").is_none(), "{shape}: {r}");
                    assert_eq!(r["warnings"], serde_json::json!([too_many_containers_warning()]));
                }
                "labels" => {
                    assert!(r.get("patch").is_none(), "{shape}: {r}");
                    assert_eq!(r["warnings"], serde_json::json!([too_many_labels_warning()]));
                }
                "names" => {
                    // each kept hook reported, cut to 119 characters; only the grace raised
                    let warnings = r["warnings"].as_array().unwrap();
                    assert_eq!(warnings.len(), MAX_POD_CONTAINERS, "{shape}");
                    assert!(warnings.iter().all(|w| w.as_str().unwrap().chars().count() == 119), "{shape}: {}", warnings[0]);
                    assert!(
                        warnings[0].as_str().unwrap().starts_with("safe-termination: preStop sleep 1s kept, below the recommended 10s, in container c0-nnn")
                    );
                    let patch = base64::engine::general_purpose::STANDARD.decode(r["patch"].as_str().unwrap()).unwrap();
                    let ops: Value = serde_json::from_slice(&patch).unwrap();
                    assert_eq!(ops, serde_json::json!([{"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": 40}]));
                }
                _ => assert_eq!(large_ops(answer), first_ops, "every answer the same"),
            }
        }
    }
    // one preStop per container; the patch applies to the whole pod and keeps its postStart hooks
    let pre_stops = first_ops.iter().filter(|op| op["path"].as_str().unwrap().ends_with("/lifecycle/preStop")).count();
    assert_eq!(pre_stops, MAX_POD_CONTAINERS);
    let mut whole: Value = serde_json::from_slice(&large).unwrap();
    let mut pod = whole["request"]["object"].take();
    json_patch::patch(&mut pod, &serde_json::from_value::<json_patch::Patch>(Value::Array(first_ops)).unwrap().0).expect("the patch applies");
    for c in pod["spec"]["containers"].as_array().unwrap() {
        assert_eq!(c["lifecycle"]["preStop"], serde_json::json!({"sleep": {"seconds": 10}}), "{}", c["name"]);
        assert_eq!(c["lifecycle"]["postStart"]["exec"]["command"][0], "a", "postStart kept");
    }
}
