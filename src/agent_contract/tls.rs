//! Mutual TLS between the operator and the node agents, from the CA the operator keeps in its
//! certificate Secret ([`crate::certs`]).
//!
//! - **The agent** ([`AgentTls`]) serves the leaf for [`AGENT_SERVER_NAME`] and requires, during
//!   the handshake, a client certificate that chains to `ca.crt` (client authentication usage)
//!   and names [`OPERATOR_CLIENT_NAME`]; a client without one, with one from another CA, or with
//!   another leaf of the same CA (the webhook's serving certificate, the agent's own) is refused
//!   before any HTTP is read.
//! - **The operator** ([`client_config`]) presents its client leaf and checks the agent's chain
//!   to `ca.crt` and the name [`AGENT_SERVER_NAME`] whatever address it dials: the agents run
//!   with `hostNetwork`, so their address is the node's, which no certificate names.
//!
//! Why mTLS rather than the operator's ServiceAccount token checked with a TokenReview: no API
//! call per request (the agent needs no API access at all, and no RBAC for `tokenreviews`), the
//! agents keep answering while the API server is down, and the CA already exists.
//!
//! No background work: the agent re-reads its three PEM files on a handshake at most once per
//! reload interval (mounted Secrets change by symlink swap; the content is compared), so an idle
//! agent does nothing. A changed pair or CA is parsed and checked before it replaces the
//! current one; a bad one keeps the previous material and logs an error.

use crate::certs::{AGENT_SERVER_NAME, OPERATOR_CLIENT_NAME, cert_info};
use crate::webhook::tls::{TlsError, load_certified_key, provider};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The trust roots of a PEM bundle (every CERTIFICATE block).
///
/// Errors: unreadable PEM, no certificate, or a certificate rustls cannot use as a root.
pub fn roots(ca_pem: &[u8]) -> Result<Arc<RootCertStore>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(ca_pem).collect::<Result<Vec<_>, _>>().map_err(|e| TlsError::BadCertificate(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let mut store = RootCertStore::empty();
    for c in certs {
        store.add(c).map_err(TlsError::Rejected)?;
    }
    Ok(Arc::new(store))
}

/// The operator's TLS client configuration for the agents: trusts the CA bundle `ca_pem`,
/// presents the client chain `cert_pem` with its key `key_pem`, checks every agent against
/// the name [`AGENT_SERVER_NAME`] (not the address dialled), ALPN `http/1.1`.
///
/// Errors: an unusable bundle, chain or key ([`TlsError`]).
pub fn client_config(ca_pem: &[u8], cert_pem: &[u8], key_pem: &[u8]) -> Result<rustls::ClientConfig, TlsError> {
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(ca_pem)?, provider()).build().map_err(|e| TlsError::BadCertificate(e.to_string()))?;
    let chain = CertificateDer::pem_slice_iter(cert_pem).collect::<Result<Vec<_>, _>>().map_err(|e| TlsError::BadCertificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::BadKey(e.to_string()))?;
    let name = ServerName::try_from(AGENT_SERVER_NAME).map_err(|e| TlsError::BadCertificate(e.to_string()))?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rejected)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(FixedName { inner: verifier, name }))
        .with_client_auth_cert(chain, key)
        .map_err(TlsError::Rejected)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A server certificate verifier that checks the chain with `inner` (WebPKI, the CA bundle)
/// against one fixed name instead of the name or address the client dialled.
#[derive(Debug)]
struct FixedName {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
    name: ServerName<'static>,
}

impl ServerCertVerifier for FixedName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner.verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Where the agent's TLS material is: the CA bundle that signs the operator's client
/// certificate, and the agent's own certificate chain and key (PEM files; the chart mounts the
/// agents' Secret: `ca.crt`, `tls.crt`, `tls.key`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTlsFiles {
    /// CA bundle (`ca.crt`).
    pub ca: PathBuf,
    /// Serving certificate chain, leaf first (`tls.crt`).
    pub cert: PathBuf,
    /// Its private key (`tls.key`).
    pub key: PathBuf,
}

/// The material in use: the serving pair and the client verifier built from the CA bundle.
struct Loaded {
    key: Arc<CertifiedKey>,
    verifier: Arc<dyn ClientCertVerifier>,
}

struct State {
    loaded: Option<Arc<Loaded>>,
    /// The file content last tried (loaded or refused), to skip unchanged files.
    content: Option<[Vec<u8>; 3]>,
    /// The last error, reported once.
    error: Option<String>,
    checked: Option<Instant>,
}

/// The agent's TLS material, reloaded from [`AgentTlsFiles`] on use (a handshake or a health
/// check) at most once per `interval`; a rustls certificate resolver and client verifier (see
/// the module docs).
pub struct AgentTls {
    files: AgentTlsFiles,
    interval: Duration,
    state: Mutex<State>,
}

impl std::fmt::Debug for AgentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentTls").field("files", &self.files).field("interval", &self.interval).finish_non_exhaustive()
    }
}

/// The serving pair and client verifier of three PEM texts: CA bundle, chain, key.
fn load(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Loaded, TlsError> {
    let key = Arc::new(load_certified_key(cert, key)?);
    let verifier =
        WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider()).build().map_err(|e| TlsError::BadCertificate(format!("CA bundle: {e}")))?;
    Ok(Loaded { key, verifier })
}

/// Reads one of the mutual-TLS files (CA bundle, certificate, key), at most
/// [`crate::webhook::tls::MAX_PEM_FILE_BYTES`] ([`crate::webhook::tls::read_pem_file`]).
pub fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    crate::webhook::tls::read_pem_file(path)
}

impl AgentTls {
    /// Material from `files`, re-read at most every `interval` (at least 1 s); loaded at once
    /// (a failure is logged and retried on the next use).
    pub fn new(files: AgentTlsFiles, interval: Duration) -> Arc<Self> {
        let tls = Arc::new(Self {
            files,
            interval: interval.max(Duration::from_secs(1)),
            state: Mutex::new(State { loaded: None, content: None, error: None, checked: None }),
        });
        tls.current();
        tls
    }

    /// True once a usable pair and CA bundle have loaded (the health check's answer).
    pub fn is_loaded(&self) -> bool {
        self.current().is_some()
    }

    /// Why nothing is loaded, when that is the case: the last error.
    pub fn last_error(&self) -> Option<String> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).error.clone()
    }

    /// The current material, after re-reading the files when `interval` has passed since the
    /// last read. Reads small files synchronously: a handshake costs a few microseconds more
    /// at most once per interval.
    fn current(&self) -> Option<Arc<Loaded>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.checked.is_some_and(|t| t.elapsed() < self.interval) {
            return state.loaded.clone();
        }
        state.checked = Some(Instant::now());
        let content = (|| Ok::<_, TlsError>([read(&self.files.ca)?, read(&self.files.cert)?, read(&self.files.key)?]))();
        let result = content.and_then(|c| {
            if state.content.as_ref() == Some(&c) {
                return Ok(None);
            }
            let loaded = load(&c[0], &c[1], &c[2]);
            state.content = Some(c);
            loaded.map(Some)
        });
        match result {
            Ok(None) => {}
            Ok(Some(loaded)) => {
                tracing::info!(cert = %self.files.cert.display(), ca = %self.files.ca.display(), first = state.loaded.is_none(), "agent TLS material loaded");
                state.loaded = Some(Arc::new(loaded));
                state.error = None;
            }
            Err(e) => {
                let message = e.to_string();
                if state.error.as_deref() != Some(message.as_str()) {
                    if state.loaded.is_some() {
                        tracing::error!(error = %message, "agent TLS material unusable; keeping the previous one");
                    } else {
                        tracing::error!(error = %message, "agent TLS material unusable; refusing connections");
                    }
                }
                state.error = Some(message);
            }
        }
        state.loaded.clone()
    }

    /// The rustls server configuration: ring, TLS 1.2 and 1.3, a client certificate required
    /// and checked by `self`, the certificate resolved by `self`, ALPN `h2` then `http/1.1`.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(self.clone())
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    fn verifier(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.current().map(|l| l.verifier.clone()).ok_or_else(|| rustls::Error::General("no TLS material loaded".into()))
    }
}

impl ResolvesServerCert for AgentTls {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current().map(|l| l.key.clone())
    }
}

impl ClientCertVerifier for AgentTls {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // the hints would borrow from material that may be swapped; clients have one pair
        &[]
    }

    /// The chain must verify against the CA bundle (WebPKI, client authentication usage) and
    /// the leaf must name [`OPERATOR_CLIENT_NAME`].
    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self.verifier()?.verify_client_cert(end_entity, intermediates, now)?;
        let names = cert_info(end_entity).map_err(|e| rustls::Error::General(format!("client certificate: {e}")))?.sans;
        if !names.iter().any(|n| n == OPERATOR_CLIENT_NAME) {
            tracing::warn!(names = ?names, "client certificate from the CA refused: it does not name {OPERATOR_CLIENT_NAME}");
            return Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(&self, message: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        provider().signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{self, AGENT_CERT, AGENT_KEY, CA_CERT, CLIENT_CERT, CLIENT_KEY};

    #[test]
    fn material_reloads_on_use_after_the_interval_and_bad_content_keeps_the_old() {
        let data = certs::renewed(
            &Default::default(),
            &certs::Action::RenewCa("test".into()),
            &certs::subject_alt_names("st", "ops", &[]),
            certs::unix_now(),
            certs::CA_VALIDITY,
            certs::SERVING_VALIDITY,
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files = AgentTlsFiles { ca: dir.path().join("ca.crt"), cert: dir.path().join("tls.crt"), key: dir.path().join("tls.key") };
        let tls = AgentTls::new(files.clone(), Duration::from_secs(1));
        assert!(!tls.is_loaded());
        assert!(tls.last_error().unwrap().contains("ca.crt"), "{:?}", tls.last_error());
        std::fs::write(&files.ca, &data[CA_CERT]).unwrap();
        std::fs::write(&files.cert, &data[AGENT_CERT]).unwrap();
        std::fs::write(&files.key, &data[AGENT_KEY]).unwrap();
        assert!(!tls.is_loaded(), "not re-read within the interval");
        std::thread::sleep(Duration::from_millis(1100));
        assert!(tls.is_loaded());
        // a key of another pair: refused, the loaded pair stays
        std::fs::write(&files.key, &data[CLIENT_KEY]).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        assert!(tls.is_loaded());
        assert!(tls.last_error().unwrap().contains("cannot be used together"), "{:?}", tls.last_error());
        // the operator's side loads its pair
        client_config(&data[CA_CERT], &data[CLIENT_CERT], &data[CLIENT_KEY]).unwrap();
        assert!(matches!(client_config(b"", &data[CLIENT_CERT], &data[CLIENT_KEY]), Err(TlsError::NoCertificate)));
    }
}
