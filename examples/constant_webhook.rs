//! The load-test ceiling (docs/benchmarks/webhook.md "Webhook"): the same axum + axum-server + rustls (ring,
//! ALPN h2/http1.1) stack as the real webhook, with a handler that reads the request body and
//! returns a constant AdmissionReview: no JSON parsing, no mutation, no logging, no metrics.
//! Same global allocator (mimalloc) as the `safe-termination` binary.
//!
//! With `validate` as a fourth argument, the handler also checks that the body is one JSON
//! value (serde_json, nothing built) and answers 400 when not: the least work a webhook that
//! rejects undecodable bodies can do, measured to show where the throughput target's floor is.
//!
//! `cargo run --release --example constant_webhook -- LISTEN CERT.pem KEY.pem [validate]`

use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::routing::post;
use safe_termination::webhook::tls::{CertificateStore, load_certified_key, server_config};
use std::sync::Arc;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const RESPONSE: &str =
    r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"0c9a8d74-9cb7-44dd-b98e-09fd62def2f4","allowed":true}}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (listen, cert, key, validate) = match args.as_slice() {
        [_, listen, cert, key] => (listen, cert, key, false),
        [_, listen, cert, key, mode] if mode == "validate" => (listen, cert, key, true),
        _ => return Err("usage: constant_webhook LISTEN CERT.pem KEY.pem [validate]".into()),
    };
    let store = Arc::new(CertificateStore::new());
    store.set(load_certified_key(&std::fs::read(cert)?, &std::fs::read(key)?)?);
    let tls = server_config(store)?;
    let app = if validate {
        axum::Router::new().route(
            "/mutate",
            post(|body: Bytes| async move {
                match serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
                    Ok(_) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], RESPONSE),
                    Err(_) => (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "text/plain")], "body is not JSON\n"),
                }
            }),
        )
    } else {
        axum::Router::new().route("/mutate", post(|_body: Bytes| async { ([(header::CONTENT_TYPE, "application/json")], RESPONSE) }))
    };
    let listener = std::net::TcpListener::bind(listen)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        axum_server::from_tcp_rustls(listener, axum_server::tls_rustls::RustlsConfig::from_config(tls))?.serve(app.into_make_service()).await
    })?;
    Ok(())
}
