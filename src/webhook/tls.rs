//! The webhook's TLS: rustls with the ring provider only, ALPN `h2` and `http/1.1`, and a
//! serving certificate that is reloaded from its PEM files without a restart.
//!
//! Mounted Secrets are updated by an atomic symlink swap (`..data`), which file-change
//! notification does not reliably see, so [`CertReloader`] polls the files' *content* every few
//! seconds. A new certificate/key pair is parsed and checked (the key must match the
//! certificate) before it replaces the current one; a bad pair keeps the old one, logs an error
//! and counts `certificate_reloads_total{result="error"}`. Until a first pair has loaded,
//! [`CertificateStore::is_loaded`] is false (readiness) and handshakes are refused.

use crate::telemetry::WebhookMetrics;
use arc_swap::ArcSwapOption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A certificate or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No certificate in the certificate file.
    #[error("no PEM CERTIFICATE block in the certificate file")]
    NoCertificate,
    /// A certificate block cannot be decoded.
    #[error("bad certificate PEM: {0}")]
    BadCertificate(String),
    /// No usable private key in the key file.
    #[error("no usable private key (PKCS#8, PKCS#1 or SEC1 PEM) in the key file: {0}")]
    BadKey(String),
    /// rustls refused the pair (unsupported key type, or the key does not match the certificate).
    #[error("certificate and key cannot be used together: {0}")]
    Rejected(rustls::Error),
}

/// The most a certificate, key or CA bundle file is read, bytes (1 MiB: a PEM chain or bundle is
/// a few KB; the system's whole CA bundle about 200 KB).
pub const MAX_PEM_FILE_BYTES: u64 = 1 << 20;

/// Reads a PEM file (certificate chain, key or CA bundle), at most [`MAX_PEM_FILE_BYTES`]: a
/// larger or endless file (`/dev/zero` named by mistake) is [`TlsError::Read`] saying so, after
/// reading one byte past the limit, never held whole.
pub fn read_pem_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read as _;
    let error = |source| TlsError::Read { path: path.to_path_buf(), source };
    let mut bytes = Vec::new();
    std::fs::File::open(path).and_then(|f| f.take(MAX_PEM_FILE_BYTES + 1).read_to_end(&mut bytes)).map_err(error)?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(error(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("larger than {MAX_PEM_FILE_BYTES} bytes, the limit on a PEM file: is this the right file?"),
        )));
    }
    Ok(bytes)
}

/// The ring crypto provider (the only one this process uses).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Parses a PEM certificate chain (leaf first) and a PEM private key, and checks that the key
/// matches the leaf certificate.
pub fn load_certified_key(cert_pem: &[u8], key_pem: &[u8]) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert_pem).collect::<Result<Vec<_>, _>>().map_err(|e| TlsError::BadCertificate(e.to_string()))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate);
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| TlsError::BadKey(e.to_string()))?;
    CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider()).map_err(TlsError::Rejected)
}

/// The current serving certificate, swapped atomically; a rustls certificate resolver.
#[derive(Debug, Default)]
pub struct CertificateStore {
    current: ArcSwapOption<CertifiedKey>,
}

impl CertificateStore {
    /// Empty: no certificate yet (handshakes fail, not ready).
    pub fn new() -> Self {
        Self::default()
    }

    /// True once a certificate has been loaded.
    pub fn is_loaded(&self) -> bool {
        self.current.load().is_some()
    }

    /// Replaces the serving certificate (new handshakes use it; open connections keep theirs).
    pub fn set(&self, key: CertifiedKey) {
        self.current.store(Some(Arc::new(key)));
    }

    /// The leaf certificate being served, DER.
    pub fn current_leaf(&self) -> Option<CertificateDer<'static>> {
        self.current.load().as_ref().and_then(|k| k.cert.first().cloned())
    }
}

impl ResolvesServerCert for CertificateStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.load_full()
    }
}

/// The rustls server configuration: ring provider, TLS 1.2 and 1.3, no client authentication
/// (the API server authenticates the webhook, not the reverse), ALPN `h2` then `http/1.1`,
/// certificates from `store`.
pub fn server_config(store: Arc<CertificateStore>) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config =
        rustls::ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?.with_no_client_auth().with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What one poll did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollOutcome {
    /// The files hold what was tried last time: nothing to do.
    Unchanged,
    /// A new certificate is being served.
    Loaded,
    /// The new content is unusable (or unreadable); the previous certificate, if any, stays.
    Failed(String),
}

/// Polls the certificate and key files and loads changed content into a [`CertificateStore`].
#[derive(Debug)]
pub struct CertReloader {
    cert_path: PathBuf,
    key_path: PathBuf,
    store: Arc<CertificateStore>,
    metrics: Option<WebhookMetrics>,
    /// Content last tried (loaded or failed) and the read error last reported.
    last: Mutex<Last>,
}

#[derive(Debug, Default)]
struct Last {
    content: Option<(Vec<u8>, Vec<u8>)>,
    read_error: Option<String>,
}

impl CertReloader {
    /// A reloader for `cert_path`/`key_path` (PEM) feeding `store`; counts loads in `metrics`.
    pub fn new(cert_path: impl AsRef<Path>, key_path: impl AsRef<Path>, store: Arc<CertificateStore>, metrics: Option<WebhookMetrics>) -> Self {
        Self { cert_path: cert_path.as_ref().to_path_buf(), key_path: key_path.as_ref().to_path_buf(), store, metrics, last: Mutex::new(Last::default()) }
    }

    /// The store this reloader feeds.
    pub fn store(&self) -> &Arc<CertificateStore> {
        &self.store
    }

    async fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
        let owned = path.to_path_buf();
        tokio::task::spawn_blocking(move || read_pem_file(&owned))
            .await
            .map_err(|e| TlsError::Read { path: path.to_path_buf(), source: std::io::Error::other(e.to_string()) })?
    }

    fn count(&self, ok: bool) {
        if let Some(m) = &self.metrics {
            m.certificate_reload(ok);
        }
    }

    /// Reads both files; loads them if their content changed since the last attempt.
    pub async fn poll_once(&self) -> PollOutcome {
        let read = async { Ok::<_, TlsError>((Self::read(&self.cert_path).await?, Self::read(&self.key_path).await?)) }.await;
        let pair = match read {
            Ok(pair) => pair,
            Err(e) => {
                let msg = e.to_string();
                {
                    // Report a read error once, not on every poll.
                    let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
                    if last.read_error.as_deref() == Some(msg.as_str()) {
                        return PollOutcome::Unchanged;
                    }
                    last.read_error = Some(msg.clone());
                }
                self.count(false);
                if self.store.is_loaded() {
                    tracing::error!(error = %msg, "cannot read the TLS certificate files; still serving the previous certificate");
                } else {
                    tracing::warn!(error = %msg, "no TLS certificate yet; not ready");
                }
                return PollOutcome::Failed(msg);
            }
        };
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            last.read_error = None;
            if last.content.as_ref() == Some(&pair) {
                return PollOutcome::Unchanged;
            }
        }
        let outcome = match load_certified_key(&pair.0, &pair.1) {
            Ok(key) => {
                let first = !self.store.is_loaded();
                self.store.set(key);
                self.count(true);
                tracing::info!(cert = %self.cert_path.display(), first, "TLS certificate loaded");
                PollOutcome::Loaded
            }
            Err(e) => {
                self.count(false);
                if self.store.is_loaded() {
                    tracing::error!(cert = %self.cert_path.display(), error = %e, "new TLS certificate/key rejected; still serving the previous one");
                } else {
                    tracing::error!(cert = %self.cert_path.display(), error = %e, "TLS certificate/key rejected; not ready");
                }
                PollOutcome::Failed(e.to_string())
            }
        };
        self.last.lock().unwrap_or_else(PoisonError::into_inner).content = Some(pair);
        outcome
    }

    /// Polls every `interval` until `stop` is cancelled (the first poll happens at once).
    pub async fn run(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.poll_once().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let c = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (c.cert.pem(), c.signing_key.serialize_pem())
    }

    #[test]
    fn pem_files_are_read_up_to_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = pair("a.example");
        let ok = dir.path().join("tls.crt");
        std::fs::write(&ok, &cert).unwrap();
        assert_eq!(read_pem_file(&ok).unwrap(), cert.as_bytes());
        let at_limit = dir.path().join("big.crt");
        std::fs::write(&at_limit, vec![b'x'; MAX_PEM_FILE_BYTES as usize]).unwrap();
        assert_eq!(read_pem_file(&at_limit).unwrap().len() as u64, MAX_PEM_FILE_BYTES);
        for path in [Path::new("/dev/zero").to_path_buf(), {
            std::fs::write(&at_limit, vec![b'x'; MAX_PEM_FILE_BYTES as usize + 1]).unwrap();
            at_limit.clone()
        }] {
            let e = read_pem_file(&path).unwrap_err().to_string();
            assert_eq!(e, format!("cannot read {}: larger than 1048576 bytes, the limit on a PEM file: is this the right file?", path.display()));
        }
        assert!(read_pem_file(&dir.path().join("missing")).unwrap_err().to_string().contains("No such file"));
    }

    #[test]
    fn loads_a_matching_pair_and_rejects_the_rest() {
        let (cert, key) = pair("a.example");
        let (_, other_key) = pair("b.example");
        assert!(load_certified_key(cert.as_bytes(), key.as_bytes()).is_ok());
        assert!(matches!(load_certified_key(cert.as_bytes(), other_key.as_bytes()), Err(TlsError::Rejected(_))));
        assert!(matches!(load_certified_key(b"", key.as_bytes()), Err(TlsError::NoCertificate)));
        assert!(matches!(load_certified_key(cert.as_bytes(), b"junk"), Err(TlsError::BadKey(_))));
        assert!(matches!(load_certified_key(key.as_bytes(), key.as_bytes()), Err(TlsError::NoCertificate)));
    }

    #[tokio::test]
    async fn reloader_keeps_the_old_certificate_on_bad_content() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let store = Arc::new(CertificateStore::new());
        let metrics = WebhookMetrics::default();
        let r = CertReloader::new(&c, &k, store.clone(), Some(metrics.clone()));
        assert!(matches!(r.poll_once().await, PollOutcome::Failed(_)));
        assert_eq!(r.poll_once().await, PollOutcome::Unchanged, "same read error reported once");
        assert!(!store.is_loaded());
        let (cert, key) = pair("a.example");
        std::fs::write(&c, &cert).unwrap();
        std::fs::write(&k, &key).unwrap();
        assert_eq!(r.poll_once().await, PollOutcome::Loaded);
        assert_eq!(r.poll_once().await, PollOutcome::Unchanged);
        let leaf = store.current_leaf().unwrap();
        std::fs::write(&c, "garbage").unwrap();
        assert!(matches!(r.poll_once().await, PollOutcome::Failed(_)));
        assert_eq!(r.poll_once().await, PollOutcome::Unchanged);
        assert_eq!(store.current_leaf().unwrap(), leaf, "bad content keeps the old certificate");
        std::fs::remove_file(&c).unwrap();
        assert!(matches!(r.poll_once().await, PollOutcome::Failed(_)));
        assert_eq!(r.poll_once().await, PollOutcome::Unchanged, "a missing file is reported once");
        assert_eq!(store.current_leaf().unwrap(), leaf);
        std::fs::write(&c, "garbage").unwrap();
        assert_eq!(r.poll_once().await, PollOutcome::Unchanged, "the same bad pair is not retried");
        let (cert2, key2) = pair("b.example");
        std::fs::write(&c, &cert2).unwrap();
        std::fs::write(&k, &key2).unwrap();
        assert_eq!(r.poll_once().await, PollOutcome::Loaded);
        assert_ne!(store.current_leaf().unwrap(), leaf);
        let ok = metrics.certificate_reloads.get_or_create(&crate::telemetry::ReloadResultLabel { result: "success" }).get();
        let err = metrics.certificate_reloads.get_or_create(&crate::telemetry::ReloadResultLabel { result: "error" }).get();
        assert_eq!((ok, err), (2, 3));
    }
}
