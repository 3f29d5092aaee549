//! Certificate fixtures of the fast tests: a test CA from rcgen that signs serving leaves for
//! 127.0.0.1 ([`Pki`]), and the one rustls client configuration the tests build
//! ([`client_config`]: a CA's PEM as the only root, an optional client certificate, ALPN).
//! The operator's own issuing (`safe_termination::certs`) is what tests of the agent's mutual
//! TLS use for their Secret: these fixtures stand in only for certificates a user brings.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::Arc;
use std::time::Duration;

/// A self-signed test CA ("safe-termination test CA").
pub struct Pki {
    pub ca: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate for `localhost` and `127.0.0.1`, PEM and DER.
pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Pki {
    pub fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "safe-termination test CA");
        Self { ca: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap() }
    }

    /// A new key and a leaf with common name `cn`, signed by this CA.
    pub fn leaf(&self, cn: &str) -> Leaf {
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        Leaf { cert_pem: cert.pem(), key_pem: key.serialize_pem(), der: cert.der().clone() }
    }

    /// [`client_config`] trusting this CA, without a client certificate.
    pub fn client_config(&self, alpn: &[&[u8]]) -> rustls::ClientConfig {
        client_config(self.ca.pem().as_bytes(), None, alpn)
    }

    /// A fresh reqwest client (no pooled connection) trusting this CA and offering only `alpn`
    /// (HTTP/1.1 only when that is all it offers), 10 s timeout.
    pub fn client(&self, alpn: &[&[u8]]) -> reqwest::Client {
        let mut b = reqwest::Client::builder().use_preconfigured_tls(self.client_config(alpn)).tls_info(true).timeout(Duration::from_secs(10));
        if alpn == [b"http/1.1"] {
            b = b.http1_only();
        }
        b.build().unwrap()
    }
}

/// A rustls client configuration (ring, the safe default protocol versions) trusting only the
/// certificates in `ca_pem`, presenting `identity` (certificate chain PEM, key PEM) when given,
/// and offering `alpn`.
pub fn client_config(ca_pem: &[u8], identity: Option<(&[u8], &[u8])>, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let roots = safe_termination::agent_contract::tls::roots(ca_pem).expect("a CA certificate in PEM");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut c = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>().unwrap();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_slice(key).unwrap()).unwrap()
        }
    };
    c.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    c
}
