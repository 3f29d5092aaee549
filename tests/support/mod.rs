//! What the fast tests (no cluster) share: the one fake kube-proxy ([`fake_kube_proxy`]),
//! generated valid pods ([`pods`], also sent to the API server by the policy e2e), certificate
//! fixtures ([`tls`]), ports, and float comparison. Each test binary includes it with `mod support;` and uses part
//! of it. The cluster tests' scaffolding is tests/common.
#![allow(dead_code)]

pub mod fake_kube_proxy;
pub mod pods;
pub mod tls;

/// A 127.0.0.1 port with nothing listening (bound, then released): a connection to it is refused.
pub fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Asserts `|actual - expected| <= tol`.
#[track_caller]
pub fn approx(actual: f64, expected: f64, tol: f64) {
    assert!((actual - expected).abs() <= tol, "expected {expected} ± {tol}, got {actual}");
}
