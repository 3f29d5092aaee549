//! What the integration tests share: a CA and a server certificate from rcgen (for `localhost`
//! and [`INVALID_HOST`]), a scripted HTTPS server on 127.0.0.1 (rustls on ring, HTTP/1.1 with
//! keep-alive, written here), the files of a `--dir`, and a run of the built binary.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub const BIN: &str = env!("CARGO_BIN_EXE_safe-termination-wait");

/// A name the server certificate also holds that never resolves (`.invalid`, RFC 6761): a URL
/// with it reaches the server only through `--address`.
pub const INVALID_HOST: &str = "wait.example.invalid";

/// A CA and a server certificate for "localhost" and [`INVALID_HOST`] that it signed.
pub struct Pki {
    pub ca_pem: String,
    ca_der: Vec<u8>,
    leaf_der: Vec<u8>,
    leaf_key: Vec<u8>,
}

pub fn pki() -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "safe-termination-wait test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let mut leaf_params = CertificateParams::new(vec!["localhost".to_string(), INVALID_HOST.to_string()]).unwrap();
    leaf_params.distinguished_name.push(DnType::CommonName, "localhost");
    leaf_params.use_authority_key_identifier_extension = true;
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    Pki { ca_pem: ca.pem(), ca_der: ca.der().to_vec(), leaf_der: leaf.der().to_vec(), leaf_key: leaf_key.serialize_der() }
}

/// What the server answers to one GET or report POST.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A JSON state, at once: `{"state": STATE}` (plus a margin when given).
    State(&'static str, Option<f64>),
    /// Any status and body, at once.
    Raw(u16, Vec<u8>),
    /// Hold the request for its timeoutSeconds, then Waiting (what a real long poll does).
    Hold,
    /// Close the connection without an answer.
    Close,
    /// The other reply, after a pause.
    Slow(Duration, Box<Reply>),
}

/// The operator's body of a replica that does not lead (with HTTP 421).
pub const NOT_LEADER_BODY: &[u8] = br#"{"state":"NotLeader","detail":"this replica does not lead"}"#;

impl Reply {
    /// What a replica that does not lead answers, GETs and reports alike: 421 NotLeader.
    pub fn not_leader() -> Reply {
        Reply::Raw(421, NOT_LEADER_BODY.to_vec())
    }
}

/// One request the server read.
#[derive(Clone, Debug)]
pub struct Request {
    pub method: String,
    pub target: String,
    pub authorization: Option<String>,
    /// The Host header.
    pub host: Option<String>,
    /// The server name the client sent in its TLS handshake (SNI).
    pub sni: Option<String>,
    pub body: Vec<u8>,
    /// Which TCP connection (0, 1, ...) it came on.
    pub conn: usize,
    /// When it was read.
    pub at: Instant,
}

impl Request {
    /// The value of the query parameter `name`, as sent.
    pub fn query(&self, name: &str) -> Option<&str> {
        let (_, query) = self.target.split_once('?')?;
        query.split('&').find_map(|p| p.strip_prefix(name)?.strip_prefix('='))
    }
}

struct State {
    script: VecDeque<Reply>,
    /// What answers once the script is used up.
    then: Reply,
    requests: Vec<Request>,
    /// What answers the report POSTs, in turn, then `reports_then` (200 `{}` unless told).
    reports: VecDeque<Reply>,
    reports_then: Reply,
}

pub struct Server {
    pub port: u16,
    state: Arc<Mutex<State>>,
    /// TLS connections accepted (handshake complete).
    tls_connections: Arc<AtomicUsize>,
}

impl Server {
    /// Serves `script` (then `then` for ever) with the certificate of `pki`, on 127.0.0.1.
    pub fn start(pki: &Pki, script: Vec<Reply>, then: Reply) -> Server {
        Server::start_on(pki, "127.0.0.1:0", script, then).unwrap()
    }

    /// As [`Server::start`], listening on `bind` (an address with port 0); an error when it
    /// cannot listen there (`[::1]:0` on a host without IPv6).
    pub fn start_on(pki: &Pki, bind: &str, script: Vec<Reply>, then: Reply) -> std::io::Result<Server> {
        #[allow(deprecated)]
        let provider = rustls::crypto::ring::default_provider();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from(pki.leaf_der.clone()), CertificateDer::from(pki.ca_der.clone())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pki.leaf_key.clone())),
            )
            .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind(bind)?;
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(State {
            script: script.into(),
            then,
            requests: Vec::new(),
            reports: VecDeque::new(),
            reports_then: Reply::Raw(200, b"{}".to_vec()),
        }));
        let shared = state.clone();
        let conns = Arc::new(AtomicUsize::new(0));
        let tls_connections = Arc::new(AtomicUsize::new(0));
        let handshakes = tls_connections.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(tcp) = tcp else { continue };
                let conn = conns.fetch_add(1, Ordering::SeqCst);
                let (config, state, handshakes) = (config.clone(), shared.clone(), handshakes.clone());
                std::thread::spawn(move || serve_connection(tcp, conn, config, state, handshakes));
            }
        });
        Ok(Server { port, state, tls_connections })
    }

    /// Answers the report POSTs with `script` in turn, then `then` for ever.
    pub fn answer_reports(&self, script: Vec<Reply>, then: Reply) {
        let mut s = self.state.lock().unwrap();
        s.reports = script.into();
        s.reports_then = then;
    }

    /// The TLS connections accepted so far (handshake complete).
    pub fn tls_connections(&self) -> usize {
        self.tls_connections.load(Ordering::SeqCst)
    }

    pub fn url(&self) -> String {
        format!("https://localhost:{}/wait/v1", self.port)
    }

    /// The URL with [`INVALID_HOST`] (and this server's port).
    pub fn invalid_url(&self) -> String {
        format!("https://{INVALID_HOST}:{}/wait/v1", self.port)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.state.lock().unwrap().requests.clone()
    }

    pub fn gets(&self) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.method == "GET").collect()
    }

    /// The report POSTs, waiting up to 2 s for at least `n`.
    pub fn posts(&self, n: usize) -> Vec<Request> {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let posts: Vec<Request> = self.requests().into_iter().filter(|r| r.method == "POST").collect();
            if posts.len() >= n || Instant::now() > until {
                return posts;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The report POSTs' bodies, waiting up to 2 s for at least one.
    pub fn reports(&self) -> Vec<serde_json::Value> {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            let reports: Vec<serde_json::Value> = self
                .requests()
                .into_iter()
                .filter(|r| r.method == "POST")
                .map(|r| {
                    assert_eq!(r.target, "/wait/v1/report");
                    serde_json::from_slice(&r.body).unwrap()
                })
                .collect();
            if !reports.is_empty() || Instant::now() > until {
                return reports;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn serve_connection(mut tcp: TcpStream, conn: usize, config: Arc<rustls::ServerConfig>, state: Arc<Mutex<State>>, handshakes: Arc<AtomicUsize>) {
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
    let Ok(mut tls) = rustls::ServerConnection::new(config) else { return };
    while tls.is_handshaking() {
        if tls.complete_io(&mut tcp).is_err() {
            return;
        }
    }
    handshakes.fetch_add(1, Ordering::SeqCst);
    let mut stream = BufReader::new(rustls::StreamOwned::new(tls, tcp));
    loop {
        let Some(mut request) = read_request(&mut stream, conn) else { return };
        request.sni = stream.get_ref().conn.server_name().map(str::to_string);
        let mut reply = {
            let mut s = state.lock().unwrap();
            if request.method == "POST" {
                let then = s.reports_then.clone();
                s.reports.pop_front().unwrap_or(then)
            } else {
                let then = s.then.clone();
                s.script.pop_front().unwrap_or(then)
            }
        };
        let timeout_seconds: u64 = request.query("timeoutSeconds").and_then(|v| v.parse().ok()).unwrap_or(0);
        state.lock().unwrap().requests.push(request);
        while let Reply::Slow(pause, then) = reply {
            std::thread::sleep(pause);
            reply = *then;
        }
        let (status, body) = match reply {
            Reply::State(s, None) => (200, format!(r#"{{"state":"{s}"}}"#).into_bytes()),
            Reply::State(s, Some(m)) => (200, format!(r#"{{"state":"{s}","marginSeconds":{m}}}"#).into_bytes()),
            Reply::Raw(status, body) => (status, body),
            Reply::Hold => {
                std::thread::sleep(Duration::from_secs(timeout_seconds));
                (200, br#"{"state":"Waiting"}"#.to_vec())
            }
            Reply::Close => return,
            Reply::Slow(..) => unreachable!(),
        };
        // a 204 has no body, and no Content-Length (RFC 9110)
        let length = if status == 204 { String::new() } else { format!("Content-Length: {}\r\n", body.len()) };
        let head = format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n{length}\r\n");
        let out = stream.get_mut();
        if out.write_all(head.as_bytes()).and_then(|()| out.write_all(&body)).and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

/// One HTTP/1.1 request (head and Content-Length body); None at the connection's end.
fn read_request<R: BufRead>(r: &mut R, conn: usize) -> Option<Request> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    let (mut authorization, mut host, mut length) = (None, None, 0usize);
    loop {
        let mut header = String::new();
        r.read_line(&mut header).ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        match name.to_ascii_lowercase().as_str() {
            "authorization" => authorization = Some(value.trim().to_string()),
            "host" => host = Some(value.trim().to_string()),
            "content-length" => length = value.trim().parse().ok()?,
            _ => {}
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body).ok()?;
    Some(Request { method, target, authorization, host, sni: None, body, conn, at: Instant::now() })
}

/// A port on 127.0.0.1 that nothing listens on.
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A fresh `--dir`, removed on drop.
pub struct Dir(pub PathBuf);

impl Dir {
    /// With `token` and `ca.crt`; `policy_seconds`: the content of `web.preStopSeconds`, if any.
    pub fn new(name: &str, ca_pem: &str, policy_seconds: Option<&str>) -> Dir {
        let path = std::env::temp_dir().join(format!("st-wait-it-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        std::fs::write(path.join("token"), format!("{}\n", token(name))).unwrap();
        std::fs::write(path.join("ca.crt"), ca_pem).unwrap();
        if let Some(s) = policy_seconds {
            std::fs::write(path.join("web.preStopSeconds"), s).unwrap();
        }
        Dir(path)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The token written for the test `name` (a JWT's alphabet).
pub fn token(name: &str) -> String {
    format!("eyJhbGciOiJSUzI1NiJ9.{}.c2ln-_", name.replace(['_', ' '], "-"))
}

pub struct Run {
    pub status: ExitStatus,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Run {
    /// The outcome word of the last line, `safe-termination-wait: <Outcome> after ...`.
    pub fn outcome(&self) -> &str {
        let line = self.stderr.lines().last().unwrap_or("");
        line.strip_prefix("safe-termination-wait: ").and_then(|l| l.split(' ').next()).unwrap_or_else(|| panic!("no result line in {:?}", self.stderr))
    }
}

/// Runs the binary with `args`, timing it.
pub fn run(args: &[&str]) -> Run {
    let start = Instant::now();
    let out = Command::new(BIN).args(args).output().unwrap();
    Run { status: out.status, stderr: String::from_utf8_lossy(&out.stderr).into_owned(), elapsed: start.elapsed() }
}

/// `wait --url URL --policy web --fallback-seconds N --deadline-seconds D --dir DIR` plus `extra`.
pub fn run_wait(dir: &Path, url: &str, n: u64, d: u64, extra: &[&str]) -> Run {
    let (n, d) = (n.to_string(), d.to_string());
    let mut args = vec!["wait", "--url", url, "--policy", "web", "--fallback-seconds", &n, "--deadline-seconds", &d, "--dir", dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    run(&args)
}
