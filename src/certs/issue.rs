//! The pure part of the operator's certificates (see the module above): what a Secret holds
//! ([`observe`]), what to renew ([`decide`]), generation and renewal ([`renewed`],
//! [`renew_all`]), and the caBundle patch. No I/O; times are Unix seconds passed in.

use super::{
    AGENT_CERT, AGENT_KEY, AGENT_SERVER_NAME, ANNOTATION_ROTATE_CA, ANNOTATION_ROTATED_CA, BACKDATE_SECONDS, CA_CERT, CA_KEY, CLIENT_CERT, CLIENT_KEY,
    OPERATOR_CLIENT_NAME, TLS_CERT, TLS_KEY,
};
use base64::Engine as _;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

/// The pending rotation request of a Secret's `annotations`: the value of
/// [`ANNOTATION_ROTATE_CA`] when it is set, non-empty and differs from [`ANNOTATION_ROTATED_CA`].
pub fn rotation_requested(annotations: Option<&BTreeMap<String, String>>) -> Option<String> {
    let a = annotations?;
    let want = a.get(ANNOTATION_ROTATE_CA).map(|v| v.trim()).filter(|v| !v.is_empty())?;
    (a.get(ANNOTATION_ROTATED_CA).map(|v| v.trim()) != Some(want)).then(|| want.to_string())
}

/// The DNS names the API server may use for the Service: `<service>`, `<service>.<namespace>`,
/// `<service>.<namespace>.svc` (the one it uses) and `<service>.<namespace>.svc.cluster.local`.
pub fn dns_names(service: &str, namespace: &str) -> Vec<String> {
    vec![service.to_string(), format!("{service}.{namespace}"), format!("{service}.{namespace}.svc"), format!("{service}.{namespace}.svc.cluster.local")]
}

/// The serving certificate's subject alternative names: [`dns_names`], then `extra` (names
/// or IP addresses), without duplicates or blanks, in that order.
pub fn subject_alt_names(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
    let mut names = dns_names(service, namespace);
    for e in extra.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        if !names.iter().any(|n| n == e) {
            names.push(e.to_string());
        }
    }
    names
}

/// When a certificate valid from `not_before` to `not_after` (Unix seconds) is renewed: at two
/// thirds of its lifetime.
pub fn renew_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before).max(0) * 2 / 3
}

/// What a certificate says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// notBefore, Unix seconds.
    pub not_before: i64,
    /// notAfter, Unix seconds.
    pub not_after: i64,
    /// DNS names and IP addresses (as text) of its subjectAltName.
    pub sans: Vec<String>,
    /// basicConstraints CA.
    pub is_ca: bool,
    /// DER of its SubjectPublicKeyInfo (to match a key).
    pub spki: Vec<u8>,
}

fn info(cert: &x509_parser::certificate::X509Certificate<'_>) -> CertInfo {
    use x509_parser::extensions::GeneralName;
    let mut sans = Vec::new();
    if let Ok(Some(ext)) = cert.subject_alternative_name() {
        for n in &ext.value.general_names {
            match n {
                GeneralName::DNSName(d) => sans.push((*d).to_string()),
                GeneralName::IPAddress(b) => {
                    let ip = match b.len() {
                        4 => <[u8; 4]>::try_from(*b).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*b).ok().map(IpAddr::from),
                        _ => None,
                    };
                    if let Some(ip) = ip {
                        sans.push(ip.to_string());
                    }
                }
                _ => {}
            }
        }
    }
    CertInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        sans,
        is_ca: cert.is_ca(),
        spki: cert.public_key().raw.to_vec(),
    }
}

/// Why a certificate or key of the Secret is unusable (then it is regenerated; a problem of
/// the renewal itself is a [`CertError`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    /// The Secret has no (or an empty) entry under this key.
    #[error("no {0}")]
    Missing(String),
    /// The PEM text cannot be read.
    #[error("bad PEM: {0}")]
    Pem(String),
    /// The PEM text has no CERTIFICATE block.
    #[error("no CERTIFICATE block")]
    NoCertificate,
    /// A certificate cannot be decoded.
    #[error("bad certificate: {0}")]
    Certificate(String),
    /// The private key is not UTF-8 text.
    #[error("key is not text")]
    KeyNotText,
    /// The private key cannot be read.
    #[error("bad key: {0}")]
    Key(String),
    /// The first certificate of `ca.crt` is not a CA.
    #[error("the first certificate of {CA_CERT} is not a CA")]
    NotCa,
    /// A private key does not belong to its certificate.
    #[error("{key} does not match {cert}")]
    KeyMismatch {
        /// The key's entry.
        key: &'static str,
        /// The certificate's entry.
        cert: &'static str,
    },
    /// The serving certificate's issuer cannot be checked (the CA is unusable).
    #[error("cannot check its issuer: {0}")]
    Issuer(Box<Unusable>),
    /// The serving certificate is not signed by the current CA.
    #[error("not signed by the current CA")]
    NotSignedByCa,
}

/// The DER of every CERTIFICATE block in `pem`, in order.
fn pem_certs(pem: &[u8]) -> Result<Vec<Vec<u8>>, Unusable> {
    let mut out = Vec::new();
    for p in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let p = p.map_err(|e| Unusable::Pem(e.to_string()))?;
        if p.label == "CERTIFICATE" {
            out.push(p.contents);
        }
    }
    if out.is_empty() {
        return Err(Unusable::NoCertificate);
    }
    Ok(out)
}

fn parse_der(der: &[u8]) -> Result<x509_parser::certificate::X509Certificate<'_>, Unusable> {
    x509_parser::parse_x509_certificate(der).map(|(_, c)| c).map_err(|e| Unusable::Certificate(e.to_string()))
}

/// [`CertInfo`] of one DER certificate (e.g. a TLS peer's leaf).
pub fn cert_info(der: &[u8]) -> Result<CertInfo, Unusable> {
    parse_der(der).map(|c| info(&c))
}

/// [`CertInfo`] of every certificate in a PEM bundle, in order.
pub fn bundle_info(pem: &[u8]) -> Result<Vec<CertInfo>, Unusable> {
    pem_certs(pem)?.iter().map(|der| parse_der(der).map(|c| info(&c))).collect()
}

/// The SubjectPublicKeyInfo DER of a PEM private key.
fn key_spki(key_pem: &[u8]) -> Result<Vec<u8>, Unusable> {
    let text = std::str::from_utf8(key_pem).map_err(|_| Unusable::KeyNotText)?;
    KeyPair::from_pem(text).map(|k| rcgen::PublicKeyData::subject_public_key_info(&k)).map_err(|e| Unusable::Key(e.to_string()))
}

/// The Secret's content, checked (no I/O).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// The current CA (first of `ca.crt`), or why it is unusable (missing, unreadable, not a
    /// CA, not matching `ca.key`).
    pub ca: Result<CertInfo, Unusable>,
    /// Every certificate of `ca.crt` (current first).
    pub ca_bundle: Vec<CertInfo>,
    /// The serving certificate, or why it is unusable (missing, unreadable, not matching
    /// `tls.key`, not signed by the current CA).
    pub serving: Result<CertInfo, Unusable>,
    /// The agents' serving certificate (`agent.crt`/`agent.key`), checked like `serving`.
    pub agent: Result<CertInfo, Unusable>,
    /// The operator's client certificate (`client.crt`/`client.key`), checked like `serving`.
    pub client: Result<CertInfo, Unusable>,
}

/// Reads and checks the Secret's data.
pub fn observe(data: &BTreeMap<String, Vec<u8>>) -> Observed {
    let get = |k: &str| data.get(k).filter(|v| !v.is_empty()).ok_or_else(|| Unusable::Missing(k.to_string()));
    let ca_ders = get(CA_CERT).and_then(|pem| pem_certs(pem));
    let ca_bundle: Vec<CertInfo> = ca_ders.as_ref().map(|ders| ders.iter().filter_map(|d| parse_der(d).ok().map(|c| info(&c))).collect()).unwrap_or_default();
    let ca = ca_ders.clone().and_then(|ders| {
        let c = info(&parse_der(&ders[0])?);
        if !c.is_ca {
            return Err(Unusable::NotCa);
        }
        if key_spki(get(CA_KEY)?)? != c.spki {
            return Err(Unusable::KeyMismatch { key: CA_KEY, cert: CA_CERT });
        }
        Ok(c)
    });
    // a leaf: readable, matching its key, signed by the current CA
    let leaf = |cert_key: &'static str, key_key: &'static str| -> Result<CertInfo, Unusable> {
        let ders = pem_certs(get(cert_key)?)?;
        let leaf = parse_der(&ders[0])?;
        let i = info(&leaf);
        if key_spki(get(key_key)?)? != i.spki {
            return Err(Unusable::KeyMismatch { key: key_key, cert: cert_key });
        }
        let ca_der = ca_ders.as_ref().map_err(|e| Unusable::Issuer(Box::new(e.clone())))?;
        let ca = parse_der(&ca_der[0])?;
        leaf.verify_signature(Some(ca.public_key())).map_err(|_| Unusable::NotSignedByCa)?;
        Ok(i)
    };
    Observed { serving: leaf(TLS_CERT, TLS_KEY), agent: leaf(AGENT_CERT, AGENT_KEY), client: leaf(CLIENT_CERT, CLIENT_KEY), ca, ca_bundle }
}

/// What to do with the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Everything is current; check again at `renew_at` at the latest (Unix seconds).
    Keep {
        /// The earliest renewal point of the CA and the serving certificate.
        renew_at: i64,
    },
    /// Issue a new serving certificate from the current CA.
    RenewServing(String),
    /// Issue a new agent serving certificate and operator client certificate from the current
    /// CA (the pair is always renewed together).
    RenewAgent(String),
    /// Generate a new CA (keeping the old one in the bundle while valid) and a new serving
    /// certificate.
    RenewCa(String),
}

/// The renewal decision for a Secret (`None`: there is none) that should serve `wanted` names
/// at `now` (Unix seconds).
pub fn decide(observed: Option<&Observed>, wanted: &[String], now: i64) -> Action {
    let Some(o) = observed else { return Action::RenewCa("no Secret yet".into()) };
    let ca = match &o.ca {
        Ok(ca) => ca,
        Err(e) => return Action::RenewCa(format!("CA unusable: {e}")),
    };
    let ca_renew = renew_at(ca.not_before, ca.not_after);
    if now >= ca_renew {
        return Action::RenewCa(format!("the CA is past two thirds of its lifetime (expires at {})", ca.not_after));
    }
    let serving = match leaf_renewal("serving certificate", &o.serving, wanted, now) {
        Ok(at) => at,
        Err(why) => return Action::RenewServing(why),
    };
    let agent = [("agent certificate", &o.agent, AGENT_SERVER_NAME), ("operator client certificate", &o.client, OPERATOR_CLIENT_NAME)]
        .into_iter()
        .map(|(what, leaf, name)| leaf_renewal(what, leaf, &[name.to_string()], now))
        .collect::<Result<Vec<i64>, String>>();
    match agent {
        Ok(at) => Action::Keep { renew_at: at.into_iter().fold(ca_renew.min(serving), i64::min) },
        Err(why) => Action::RenewAgent(why),
    }
}

/// When a leaf (`what`: its name in messages) that should name `wanted` is to be renewed
/// (Unix seconds), or why it must be renewed now: unusable, not naming one of `wanted`, not
/// valid yet, or past two thirds of its lifetime.
fn leaf_renewal(what: &str, leaf: &Result<CertInfo, Unusable>, wanted: &[String], now: i64) -> Result<i64, String> {
    let leaf = leaf.as_ref().map_err(|e| format!("{what} unusable: {e}"))?;
    let missing: Vec<&str> = wanted.iter().filter(|w| !leaf.sans.contains(w)).map(String::as_str).collect();
    if !missing.is_empty() {
        return Err(format!("the {what} does not name {}", missing.join(", ")));
    }
    if now < leaf.not_before {
        return Err(format!("the {what} is not valid yet"));
    }
    let at = renew_at(leaf.not_before, leaf.not_after);
    if now >= at {
        return Err(format!("the {what} is past two thirds of its lifetime (expires at {})", leaf.not_after));
    }
    Ok(at)
}

fn ts(unix: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(unix).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

/// A new self-signed CA valid from `now` (backdated 5 minutes) for `validity`: (cert, key) PEM.
pub fn generate_ca(now: i64, validity: Duration) -> Result<(String, String), rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, format!("safe-termination webhook CA {now}"));
    params.distinguished_name.push(DnType::OrganizationName, "safe-termination");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.not_before = ts(now - BACKDATE_SECONDS);
    params.not_after = ts(now + validity.as_secs() as i64);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A new serving certificate for `names` signed by the CA (`ca_cert_pem` first certificate,
/// `ca_key_pem`), valid from `now` (backdated 5 minutes) for `validity` but never past
/// `ca_not_after`: (cert, key) PEM.
pub fn generate_serving(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    names: &[String],
    now: i64,
    validity: Duration,
    ca_not_after: i64,
) -> Result<(String, String), rcgen::Error> {
    generate_leaf(ca_cert_pem, ca_key_pem, names, ExtendedKeyUsagePurpose::ServerAuth, now, validity, ca_not_after)
}

/// A new leaf for `names` (the common name: the third name, the Service's `.svc` form for the
/// webhook, else the first) with the one extended key usage `usage`, signed by the CA, valid
/// from `now` (backdated 5 minutes) for `validity` but never past `ca_not_after`: (cert, key)
/// PEM.
pub fn generate_leaf(
    ca_cert_pem: &str,
    ca_key_pem: &str,
    names: &[String],
    usage: ExtendedKeyUsagePurpose,
    now: i64,
    validity: Duration,
    ca_not_after: i64,
) -> Result<(String, String), rcgen::Error> {
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(ca_cert_pem, ca_key)?;
    let mut params = CertificateParams::new(names.to_vec())?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, names.get(2).or(names.first()).cloned().unwrap_or_default());
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    params.not_before = ts(now - BACKDATE_SECONDS);
    params.not_after = ts((now + validity.as_secs() as i64).min(ca_not_after));
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Adds a new agent serving certificate ([`AGENT_SERVER_NAME`], server authentication) and
/// operator client certificate ([`OPERATOR_CLIENT_NAME`], client authentication) signed by the
/// CA to `data`, with the serving certificates' lifetime.
fn add_agent_pair(
    data: &mut BTreeMap<String, Vec<u8>>,
    ca_cert: &str,
    ca_key: &str,
    now: i64,
    validity: Duration,
    ca_not_after: i64,
) -> Result<(), rcgen::Error> {
    for (name, usage, cert_key, key_key) in [
        (AGENT_SERVER_NAME, ExtendedKeyUsagePurpose::ServerAuth, AGENT_CERT, AGENT_KEY),
        (OPERATOR_CLIENT_NAME, ExtendedKeyUsagePurpose::ClientAuth, CLIENT_CERT, CLIENT_KEY),
    ] {
        let (cert, key) = generate_leaf(ca_cert, ca_key, &[name.to_string()], usage, now, validity, ca_not_after)?;
        data.insert(cert_key.into(), cert.into_bytes());
        data.insert(key_key.into(), key.into_bytes());
    }
    Ok(())
}

/// The node agents' Secret data: the CA bundle (`ca.crt`, to check the operator's client
/// certificate) and the agent pair as `tls.crt`/`tls.key`; nothing else of `main` (no CA key,
/// no client key, no webhook key). `None` while `main` has no agent pair yet.
pub fn agent_secret_data(main: &BTreeMap<String, Vec<u8>>) -> Option<BTreeMap<String, Vec<u8>>> {
    let get = |k: &str| main.get(k).filter(|v| !v.is_empty()).cloned();
    Some([(CA_CERT.to_string(), get(CA_CERT)?), (TLS_CERT.to_string(), get(AGENT_CERT)?), (TLS_KEY.to_string(), get(AGENT_KEY)?)].into())
}

/// The PEM blocks of `pem` whose certificate is still valid at `now`, concatenated.
/// The first `max` certificates of `pem` that are still valid at `now`, as PEM.
fn still_valid(pem: &[u8], now: i64, max: usize) -> String {
    let mut out = String::new();
    for p in x509_parser::pem::Pem::iter_from_buffer(pem).flatten().take(max) {
        if p.label != "CERTIFICATE" {
            continue;
        }
        if parse_der(&p.contents).is_ok_and(|c| c.validity().not_after.timestamp() > now) {
            out.push_str(&pem_encode(&p.contents));
        }
    }
    out
}

/// One DER certificate as PEM (64-column base64, trailing line feed).
pub fn pem_encode(der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(chunk).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

/// The Secret data after `action` (pure apart from key generation): `current` is what the
/// Secret holds now. `Keep` only drops expired previous CAs from the bundle.
pub fn renewed(
    current: &BTreeMap<String, Vec<u8>>,
    action: &Action,
    names: &[String],
    now: i64,
    ca_validity: Duration,
    serving_validity: Duration,
) -> Result<BTreeMap<String, Vec<u8>>, rcgen::Error> {
    let mut data = current.clone();
    let text = |k: &str| current.get(k).map(|v| String::from_utf8_lossy(v).into_owned()).unwrap_or_default();
    match action {
        Action::Keep { .. } => {
            // drop previous CAs that have expired (the current CA stays first)
            let ders = pem_certs(&current.get(CA_CERT).cloned().unwrap_or_default()).unwrap_or_default();
            let keep: Vec<&Vec<u8>> = ders
                .iter()
                .enumerate()
                .filter(|(i, d)| *i == 0 || parse_der(d).is_ok_and(|c| c.validity().not_after.timestamp() > now))
                .map(|(_, d)| d)
                .collect();
            if keep.len() != ders.len() {
                data.insert(CA_CERT.into(), keep.iter().map(|d| pem_encode(d)).collect::<String>().into_bytes());
            }
        }
        Action::RenewServing(_) => {
            let ca_pem = text(CA_CERT);
            let ca_not_after = bundle_info(ca_pem.as_bytes()).ok().and_then(|b| b.first().map(|c| c.not_after)).unwrap_or(i64::MAX);
            let (cert, key) = generate_serving(&ca_pem, &text(CA_KEY), names, now, serving_validity, ca_not_after)?;
            data.insert(TLS_CERT.into(), cert.into_bytes());
            data.insert(TLS_KEY.into(), key.into_bytes());
        }
        Action::RenewAgent(_) => {
            let ca_pem = text(CA_CERT);
            let ca_not_after = bundle_info(ca_pem.as_bytes()).ok().and_then(|b| b.first().map(|c| c.not_after)).unwrap_or(i64::MAX);
            add_agent_pair(&mut data, &ca_pem, &text(CA_KEY), now, serving_validity, ca_not_after)?;
        }
        Action::RenewCa(_) => {
            let (ca_cert, ca_key) = generate_ca(now, ca_validity)?;
            let ca_not_after = now + ca_validity.as_secs() as i64;
            let (cert, key) = generate_serving(&ca_cert, &ca_key, names, now, serving_validity, ca_not_after)?;
            // keep the CA being replaced while it is valid, so replicas serving its leaf stay
            // trusted until the kubelet refreshes their files; only that one: older CAs were
            // replaced a rotation ago (their leaves are long gone), and keeping every CA until
            // it expires would grow the bundle with each rotation on demand and never stop
            // trusting a CA rotated away (found by the fresh tester: 51 CAs after 50 rotations)
            let previous = still_valid(&current.get(CA_CERT).cloned().unwrap_or_default(), now, 1);
            data.insert(CA_CERT.into(), format!("{ca_cert}{previous}").into_bytes());
            data.insert(TLS_CERT.into(), cert.into_bytes());
            data.insert(TLS_KEY.into(), key.into_bytes());
            add_agent_pair(&mut data, &ca_cert, &ca_key, now, serving_validity, ca_not_after)?;
            data.insert(CA_KEY.into(), ca_key.into_bytes());
        }
    }
    Ok(data)
}

/// A certificate Secret's data: key (`ca.crt`, `tls.key`, ...) to bytes.
pub type SecretData = BTreeMap<String, Vec<u8>>;

/// Every renewal a Secret needs at `now`, applied one after the other (pure apart from key
/// generation): `first` (a requested CA rotation) or [`decide`]'s action, then [`decide`] again
/// on the result until it says `Keep` (at most three more steps: CA, serving, agent pair).
/// Returns the actions taken (the last one `Keep`) and the new data.
pub fn renew_all(
    current: &BTreeMap<String, Vec<u8>>,
    exists: bool,
    first: Option<Action>,
    names: &[String],
    now: i64,
    ca_validity: Duration,
    serving_validity: Duration,
) -> Result<(Vec<Action>, SecretData), rcgen::Error> {
    let mut data = current.clone();
    let mut actions = Vec::new();
    let mut next = first.unwrap_or_else(|| decide(exists.then(|| observe(current)).as_ref(), names, now));
    for _ in 0..4 {
        data = renewed(&data, &next, names, now, ca_validity, serving_validity)?;
        let keep = matches!(next, Action::Keep { .. });
        actions.push(next);
        if keep {
            break;
        }
        next = decide(Some(&observe(&data)), names, now);
    }
    Ok((actions, data))
}

/// The JSON patch that sets `webhooks[i].clientConfig.caBundle` to `ca_b64` wherever it
/// differs, each guarded by a test of the webhook's name (an empty list: nothing to do).
pub fn ca_bundle_patch(config: &MutatingWebhookConfiguration, ca_b64: &str) -> Vec<serde_json::Value> {
    let mut ops = Vec::new();
    for (i, w) in config.webhooks.iter().flatten().enumerate() {
        let current = w.client_config.ca_bundle.as_ref().map(|b| base64::engine::general_purpose::STANDARD.encode(&b.0));
        if current.as_deref() != Some(ca_b64) {
            ops.push(json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": w.name}));
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": ca_b64}));
        }
    }
    ops
}

#[cfg(test)]
mod tests {
    use super::super::{CA_VALIDITY, SERVING_VALIDITY, unix_now};
    use super::*;

    const DAY: i64 = 86_400;

    #[test]
    fn a_ca_rotation_keeps_only_the_ca_it_replaces() {
        let now = 1_800_000_000;
        let first = |pem: &[u8]| pem_certs(pem).unwrap()[0].clone();
        let mut data = renewed(&BTreeMap::new(), &Action::RenewCa("test".into()), &names(), now, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        for i in 1..=5 {
            let before = first(&data[CA_CERT]);
            data = renewed(&data, &Action::RenewCa(format!("rotation {i}")), &names(), now + i, CA_VALIDITY, SERVING_VALIDITY).unwrap();
            let bundle = pem_certs(&data[CA_CERT]).unwrap();
            assert_eq!(bundle.len(), 2, "rotation {i}: the new CA and the one it replaced");
            assert_ne!(bundle[0], before);
            assert_eq!(bundle[1], before);
        }
    }

    #[test]
    fn a_rotation_request_is_compared_trimmed() {
        let ann = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        assert_eq!(rotation_requested(Some(&ann(&[(ANNOTATION_ROTATE_CA, " 1"), (ANNOTATION_ROTATED_CA, "1")]))), None);
        assert_eq!(rotation_requested(Some(&ann(&[(ANNOTATION_ROTATE_CA, " 2 "), (ANNOTATION_ROTATED_CA, "1")]))), Some("2".into()));
    }

    #[test]
    fn a_rotation_is_requested_once_per_new_annotation_value() {
        let ann = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        assert_eq!(rotation_requested(None), None);
        assert_eq!(rotation_requested(Some(&ann(&[]))), None);
        assert_eq!(rotation_requested(Some(&ann(&[(ANNOTATION_ROTATE_CA, "1")]))), Some("1".into()));
        assert_eq!(rotation_requested(Some(&ann(&[(ANNOTATION_ROTATE_CA, " ")]))), None);
        assert_eq!(rotation_requested(Some(&ann(&[(ANNOTATION_ROTATE_CA, "1"), (ANNOTATION_ROTATED_CA, "1")]))), None);
        assert_eq!(rotation_requested(Some(&ann(&[(ANNOTATION_ROTATE_CA, "2"), (ANNOTATION_ROTATED_CA, "1")]))), Some("2".into()));
        assert_eq!(rotation_requested(Some(&ann(&[(ANNOTATION_ROTATED_CA, "1")]))), None);
    }

    fn names() -> Vec<String> {
        subject_alt_names("safe-termination", "ops", &[])
    }

    fn fresh(now: i64) -> BTreeMap<String, Vec<u8>> {
        renewed(&BTreeMap::new(), &Action::RenewCa("test".into()), &names(), now, CA_VALIDITY, SERVING_VALIDITY).unwrap()
    }

    #[test]
    fn names_cover_the_service_dns_forms_and_extras_once() {
        assert_eq!(names(), ["safe-termination", "safe-termination.ops", "safe-termination.ops.svc", "safe-termination.ops.svc.cluster.local"]);
        let extra = ["127.0.0.1".to_string(), " ".into(), "safe-termination.ops.svc".into(), "localhost".into()];
        let all = subject_alt_names("safe-termination", "ops", &extra);
        assert_eq!(all.len(), 6);
        assert_eq!(&all[4..], ["127.0.0.1", "localhost"]);
    }

    #[test]
    fn renewal_point_is_two_thirds_of_the_lifetime() {
        assert_eq!(renew_at(0, 300), 200);
        assert_eq!(renew_at(1000, 1000 + 365 * DAY), 1000 + 365 * DAY * 2 / 3);
        assert_eq!(renew_at(10, 5), 10, "an inverted validity renews at once");
    }

    #[test]
    fn no_secret_or_garbage_means_a_new_ca() {
        assert!(matches!(decide(None, &names(), 0), Action::RenewCa(_)));
        let o = observe(&BTreeMap::new());
        assert!(matches!(decide(Some(&o), &names(), 0), Action::RenewCa(m) if m.contains("no ca.crt")));
        let junk: BTreeMap<String, Vec<u8>> = [(CA_CERT.to_string(), b"junk".to_vec())].into();
        assert!(matches!(decide(Some(&observe(&junk)), &names(), 0), Action::RenewCa(_)));
    }

    #[test]
    fn a_fresh_secret_is_kept_until_the_serving_renewal_point() {
        let now = unix_now();
        let data = fresh(now);
        let o = observe(&data);
        assert!(o.ca.as_ref().unwrap().is_ca);
        let s = o.serving.as_ref().unwrap();
        assert_eq!(s.sans, names());
        assert!(!s.is_ca);
        assert_eq!(s.not_after - s.not_before, SERVING_VALIDITY.as_secs() as i64 + BACKDATE_SECONDS);
        let at = renew_at(s.not_before, s.not_after);
        assert_eq!(decide(Some(&o), &names(), now), Action::Keep { renew_at: at });
        assert!(at - now > 240 * DAY && at - now < 245 * DAY, "about 8 months: {}", (at - now) / DAY);
        assert!(matches!(decide(Some(&o), &names(), at), Action::RenewServing(m) if m.contains("two thirds")));
        assert!(matches!(decide(Some(&o), &names(), s.not_before - 1), Action::RenewServing(m) if m.contains("not valid yet")));
        // the CA's point comes later and wins over the serving certificate's
        let ca = o.ca.as_ref().unwrap();
        assert!(matches!(decide(Some(&o), &names(), renew_at(ca.not_before, ca.not_after)), Action::RenewCa(_)));
        // a renamed Service needs a new serving certificate
        let other = subject_alt_names("webhook", "ops", &[]);
        assert!(matches!(decide(Some(&o), &other, now), Action::RenewServing(m) if m.contains("webhook.ops.svc")));
        // an extra IP SAN is checked too
        let with_ip = subject_alt_names("safe-termination", "ops", &["127.0.0.1".into()]);
        assert!(matches!(decide(Some(&o), &with_ip, now), Action::RenewServing(m) if m.contains("127.0.0.1")));
        let data2 = renewed(&data, &Action::RenewServing("ip".into()), &with_ip, now, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        assert!(matches!(decide(Some(&observe(&data2)), &with_ip, now), Action::Keep { .. }));
        assert_eq!(observe(&data2).serving.unwrap().sans.last().unwrap(), "127.0.0.1");
    }

    #[test]
    fn mismatched_keys_and_foreign_issuers_are_renewed() {
        let now = unix_now();
        let a = fresh(now);
        let b = fresh(now);
        let mut wrong_key = a.clone();
        wrong_key.insert(TLS_KEY.into(), b[TLS_KEY].clone());
        assert!(matches!(decide(Some(&observe(&wrong_key)), &names(), now), Action::RenewServing(m) if m.contains("does not match")));
        let mut foreign = a.clone();
        foreign.insert(TLS_CERT.into(), b[TLS_CERT].clone());
        foreign.insert(TLS_KEY.into(), b[TLS_KEY].clone());
        assert!(matches!(decide(Some(&observe(&foreign)), &names(), now), Action::RenewServing(m) if m.contains("not signed by the current CA")));
        let mut wrong_ca_key = a.clone();
        wrong_ca_key.insert(CA_KEY.into(), b[CA_KEY].clone());
        assert!(matches!(decide(Some(&observe(&wrong_ca_key)), &names(), now), Action::RenewCa(m) if m.contains("ca.key does not match")));
        let mut leaf_as_ca = a.clone();
        leaf_as_ca.insert(CA_CERT.into(), a[TLS_CERT].clone());
        leaf_as_ca.insert(CA_KEY.into(), a[TLS_KEY].clone());
        assert!(matches!(decide(Some(&observe(&leaf_as_ca)), &names(), now), Action::RenewCa(m) if m.contains("not a CA")));
        // renewing the serving certificate keeps the CA and fixes it
        let fixed = renewed(&foreign, &Action::RenewServing("t".into()), &names(), now, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        assert_eq!(fixed[CA_CERT], a[CA_CERT]);
        assert_eq!(fixed[CA_KEY], a[CA_KEY]);
        assert!(matches!(decide(Some(&observe(&fixed)), &names(), now), Action::Keep { .. }));
        // the new pair is usable by the webhook's TLS loader
        let _ = rustls::crypto::ring::default_provider().install_default();
        crate::webhook::tls::load_certified_key(&fixed[TLS_CERT], &fixed[TLS_KEY]).expect("serving pair loads");
    }

    #[test]
    fn a_ca_rotation_keeps_the_previous_ca_until_it_expires() {
        let now = unix_now();
        let short = Duration::from_secs(3 * DAY as u64);
        let old = renewed(&BTreeMap::new(), &Action::RenewCa("t".into()), &names(), now, short, short).unwrap();
        let o = observe(&old);
        let ca = o.ca.as_ref().unwrap();
        let at = renew_at(ca.not_before, ca.not_after);
        assert!(matches!(decide(Some(&o), &names(), at), Action::RenewCa(_)));
        let rotated = renewed(&old, &Action::RenewCa("t".into()), &names(), at, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        let bundle = bundle_info(&rotated[CA_CERT]).unwrap();
        assert_eq!(bundle.len(), 2, "new CA + previous CA");
        assert_eq!(bundle[1], *ca);
        let r = observe(&rotated);
        assert_eq!(r.ca_bundle.len(), 2);
        assert!(matches!(decide(Some(&r), &names(), at), Action::Keep { .. }));
        // the serving certificate never outlives its CA
        let s = r.serving.unwrap();
        assert!(s.not_after <= r.ca.unwrap().not_after);
        // once the previous CA has expired, Keep drops it from the bundle
        let later = ca.not_after + 1;
        let trimmed = renewed(&rotated, &Action::Keep { renew_at: 0 }, &names(), later, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        assert_eq!(bundle_info(&trimmed[CA_CERT]).unwrap().len(), 1);
        let same = renewed(&rotated, &Action::Keep { renew_at: 0 }, &names(), at, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        assert_eq!(same, rotated, "nothing to drop: unchanged");
    }

    #[test]
    fn a_serving_certificate_is_capped_at_the_ca_expiry() {
        let now = unix_now();
        let (ca, key) = generate_ca(now, Duration::from_secs(10 * DAY as u64)).unwrap();
        let ca_after = bundle_info(ca.as_bytes()).unwrap()[0].not_after;
        let (cert, _) = generate_serving(&ca, &key, &names(), now, SERVING_VALIDITY, ca_after).unwrap();
        assert_eq!(bundle_info(cert.as_bytes()).unwrap()[0].not_after, ca_after);
    }

    #[test]
    fn ca_bundle_patch_touches_only_stale_webhooks_and_tests_names() {
        let config: MutatingWebhookConfiguration = serde_json::from_value(json!({
            "metadata": {"name": "st"},
            "webhooks": [
                {"name": "a.safetermination.io", "clientConfig": {"caBundle": "Zm9v"}, "sideEffects": "None", "admissionReviewVersions": ["v1"]},
                {"name": "b.safetermination.io", "clientConfig": {}, "sideEffects": "None", "admissionReviewVersions": ["v1"]}
            ]
        }))
        .unwrap();
        assert!(ca_bundle_patch(&config, "Zm9v")[..].iter().any(|op| op["path"] == "/webhooks/1/clientConfig/caBundle"));
        assert_eq!(ca_bundle_patch(&config, "Zm9v").len(), 2, "the first webhook is current");
        let ops = ca_bundle_patch(&config, "YmFy");
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[0], json!({"op": "test", "path": "/webhooks/0/name", "value": "a.safetermination.io"}));
        assert_eq!(ops[3], json!({"op": "add", "path": "/webhooks/1/clientConfig/caBundle", "value": "YmFy"}));
        let _: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops)).unwrap();
    }

    #[test]
    fn a_fresh_secret_holds_the_agent_pair_for_the_fixed_names() {
        let now = unix_now();
        let data = fresh(now);
        let o = observe(&data);
        let (agent, client) = (o.agent.clone().unwrap(), o.client.clone().unwrap());
        assert_eq!(agent.sans, [AGENT_SERVER_NAME]);
        assert_eq!(client.sans, [OPERATOR_CLIENT_NAME]);
        assert!(!agent.is_ca && !client.is_ca);
        // one usage each: the agent leaf cannot authenticate a client, nor the client leaf a server
        let eku = |pem: &[u8]| {
            let der = pem_certs(pem).unwrap().remove(0);
            let cert = parse_der(&der).unwrap();
            let e = cert.extended_key_usage().unwrap().unwrap().value.clone();
            (e.server_auth, e.client_auth)
        };
        assert_eq!(eku(&data[AGENT_CERT]), (true, false));
        assert_eq!(eku(&data[CLIENT_CERT]), (false, true));
        assert_eq!(eku(&data[TLS_CERT]), (true, false));
        match decide(Some(&o), &names(), now) {
            Action::Keep { renew_at: at } => assert_eq!(
                at,
                renew_at(agent.not_before, agent.not_after).min(renew_at(o.serving.as_ref().unwrap().not_before, o.serving.as_ref().unwrap().not_after))
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_secret_without_the_agent_pair_gets_one_from_the_same_ca_in_the_same_round() {
        let now = unix_now();
        let mut old = fresh(now);
        for k in [AGENT_CERT, AGENT_KEY, CLIENT_CERT, CLIENT_KEY] {
            old.remove(k);
        }
        let o = observe(&old);
        assert!(matches!(decide(Some(&o), &names(), now), Action::RenewAgent(m) if m.contains("agent certificate unusable: no agent.crt")));
        let (actions, data) = renew_all(&old, true, None, &names(), now, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        assert!(matches!(actions.as_slice(), [Action::RenewAgent(_), Action::Keep { .. }]), "{actions:?}");
        for k in [CA_CERT, CA_KEY, TLS_CERT, TLS_KEY] {
            assert_eq!(data[k], old[k], "{k} kept");
        }
        assert!(observe(&data).client.is_ok());
        // a serving key and a client key of other pairs: both renewed at once
        let mut both = data.clone();
        let other = fresh(now);
        both.insert(TLS_KEY.into(), other[TLS_KEY].clone());
        both.insert(CLIENT_KEY.into(), other[CLIENT_KEY].clone());
        let (actions, renewed) = renew_all(&both, true, None, &names(), now, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        assert!(
            matches!(actions.as_slice(), [Action::RenewServing(_), Action::RenewAgent(m), Action::Keep { .. }] if m.contains("client.key does not match client.crt")),
            "{actions:?}"
        );
        assert_eq!(renewed[CA_CERT], data[CA_CERT]);
        // a new Secret: one CA rotation makes everything
        let (actions, _) = renew_all(&BTreeMap::new(), false, None, &names(), now, CA_VALIDITY, SERVING_VALIDITY).unwrap();
        assert!(matches!(actions.as_slice(), [Action::RenewCa(_), Action::Keep { .. }]), "{actions:?}");
    }

    #[test]
    fn the_agents_secret_holds_the_ca_bundle_and_the_agent_pair_only() {
        let data = fresh(unix_now());
        let agent = agent_secret_data(&data).unwrap();
        assert_eq!(agent.keys().map(String::as_str).collect::<Vec<_>>(), [CA_CERT, TLS_CERT, TLS_KEY]);
        assert_eq!((&agent[CA_CERT], &agent[TLS_CERT], &agent[TLS_KEY]), (&data[CA_CERT], &data[AGENT_CERT], &data[AGENT_KEY]));
        assert!(agent.values().all(|v| !v.windows(8).any(|w| w == b"PRIVATE ") || v == &data[AGENT_KEY]), "no other key");
        let mut without = data.clone();
        without.remove(AGENT_KEY);
        assert_eq!(agent_secret_data(&without), None);
    }
}
