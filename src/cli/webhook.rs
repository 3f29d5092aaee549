//! `safe-termination webhook`: the admission webhook on its own, serving a static plan built from
//! flags (the operator runs the same server with the plan its controller publishes).
//!
//! Two listeners: the webhook over HTTPS (`--listen`), and the plain-HTTP admin port
//! (`--admin-listen`: `/livez`, `/readyz`, `/metrics`). Ready once a certificate has loaded and a
//! plan is published, and not after a shutdown signal. SIGTERM/SIGINT: stop accepting, finish
//! in-flight reviews (at most `--drain-seconds`), exit 0; a second signal aborts (exit 130).

use crate::cli::mutate::PlanArgs;
use crate::cli::{Error, whole_in};
use crate::core::selector::{AssumeServiceBacked, ServiceIndex};
use crate::shutdown::Shutdown;
use crate::telemetry::{self, Readiness, Telemetry};
use crate::webhook::server::{self, PlanHandle, RequestLimits, WebhookState};
use crate::webhook::tls::{CertReloader, CertificateStore};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Arguments of `webhook`. Every flag can also be set by its environment variable.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    #[command(flatten)]
    pub serving: ServingArgs,
    #[command(flatten)]
    pub plan: PlanArgs,
}

/// How the HTTPS webhook and the admin port are served; shared by `webhook` and `run`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServingArgs {
    /// HTTPS address of the admission webhook.
    #[arg(long, default_value = "0.0.0.0:8443", env = "SAFE_TERMINATION_LISTEN")]
    pub listen: SocketAddr,
    /// Plain-HTTP address of /livez, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080", env = "SAFE_TERMINATION_ADMIN_LISTEN")]
    pub admin_listen: SocketAddr,
    /// Serving certificate chain, PEM (leaf first). Reloaded when its content changes.
    #[arg(long, value_name = "FILE", default_value = "/etc/safe-termination/tls/tls.crt", env = "SAFE_TERMINATION_TLS_CERT_FILE")]
    pub tls_cert_file: PathBuf,
    /// Private key of the serving certificate, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE", default_value = "/etc/safe-termination/tls/tls.key", env = "SAFE_TERMINATION_TLS_KEY_FILE")]
    pub tls_key_file: PathBuf,
    /// How often the certificate files are re-read, seconds (mounted Secrets change by symlink
    /// swap, so content is polled).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, value_parser = whole_in(1u64, 3600, "a whole number of seconds"), env = "SAFE_TERMINATION_CERT_RELOAD_INTERVAL_SECONDS")]
    pub cert_reload_interval_seconds: u64,
    /// Largest accepted AdmissionReview body, bytes, 1024 to 268435456 (413 beyond).
    #[arg(long, default_value_t = server::DEFAULT_MAX_BODY_BYTES, allow_negative_numbers = true, value_parser = whole_in(1024usize, 256 << 20, "a whole number of bytes"), env = "SAFE_TERMINATION_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,
    /// Request body bytes held at once by all requests together, 1048576 to 17179869184, at
    /// least --max-body-bytes; beyond it, requests wait for budget (within their timeout).
    #[arg(long, default_value_t = server::DEFAULT_MAX_BUFFERED_BODY_BYTES, allow_negative_numbers = true, value_parser = whole_in(1usize << 20, 16 << 30, "a whole number of bytes"), env = "SAFE_TERMINATION_MAX_BUFFERED_BODY_BYTES")]
    pub max_buffered_body_bytes: usize,
    /// Per-request timeout, milliseconds; keep it below the webhook's timeoutSeconds.
    #[arg(long, default_value_t = 4000, allow_negative_numbers = true, value_parser = whole_in(1u64, 30_000, "a whole number of milliseconds"), env = "SAFE_TERMINATION_REQUEST_TIMEOUT_MS")]
    pub request_timeout_ms: u64,
    /// Time a request's body may take to arrive once its bytes are reserved, milliseconds
    /// (408 after it, and the reservation is given back for other reviews).
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true, value_parser = whole_in(1u64, 30_000, "a whole number of milliseconds"), env = "SAFE_TERMINATION_BODY_TIMEOUT_MS")]
    pub body_timeout_ms: u64,
    /// On shutdown, how long in-flight requests may take to finish, seconds, 0 to 3600.
    #[arg(long, default_value_t = 10, env = "SAFE_TERMINATION_DRAIN_SECONDS", allow_negative_numbers = true, value_parser = whole_in(0u64, 3600, "a whole number of seconds"))]
    pub drain_seconds: u64,
    /// How long a connection may wait before its first request and, on HTTP/1.1, stay idle
    /// between requests or take to send a request's headers, seconds; then it is closed.
    #[arg(long, default_value_t = 30, allow_negative_numbers = true, value_parser = whole_in(1u64, 3600, "a whole number of seconds"), env = "SAFE_TERMINATION_IDLE_TIMEOUT_SECONDS")]
    pub idle_timeout_seconds: u64,
}

/// Runs the stand-alone webhook until a shutdown signal. Call inside a Tokio runtime.
pub async fn run(args: &WebhookArgs) -> Result<(), Error> {
    let shutdown = Shutdown::new();
    shutdown.listen_for_signals().map_err(|e| Error::Io(format!("cannot install signal handlers: {e}")))?;
    let listeners = Listeners::bind(&args.serving).await?;
    serve(args, listeners, shutdown).await
}

/// The two listening sockets.
#[derive(Debug)]
pub struct Listeners {
    /// The HTTPS webhook socket.
    pub webhook: std::net::TcpListener,
    /// The plain-HTTP admin socket.
    pub admin: tokio::net::TcpListener,
}

impl Listeners {
    /// Binds `--listen` and `--admin-listen`.
    pub async fn bind(args: &ServingArgs) -> Result<Self, Error> {
        let webhook = std::net::TcpListener::bind(args.listen).map_err(|e| Error::Io(format!("cannot listen on {}: {e}", args.listen)))?;
        let admin = tokio::net::TcpListener::bind(args.admin_listen).await.map_err(|e| Error::Io(format!("cannot listen on {}: {e}", args.admin_listen)))?;
        Ok(Self { webhook, admin })
    }
}

/// Serves the stand-alone webhook (a static plan from flags, every pod counted as
/// service-backed: it has no Service watch) on already-bound `listeners` until `shutdown`
/// fires: returns `Ok` after a graceful drain, [`Error::Aborted`] after a second
/// trigger. (`--listen`/`--admin-listen` are only used by [`Listeners::bind`].)
pub async fn serve(args: &WebhookArgs, listeners: Listeners, shutdown: Shutdown) -> Result<(), Error> {
    // a policy file that cannot be read or used is bad input (exit 1), as in every command
    let plan = args.plan.plan()?;
    let telemetry = Telemetry::new();
    let parts = Served { plan: PlanHandle::with_plan(plan), services: Arc::new(AssumeServiceBacked), readiness: Readiness::new(), telemetry, wait: None };
    serve_with(&args.serving, listeners, parts, shutdown).await
}

/// What the served webhook reads: the plan handle (published by whoever owns the plan), the
/// Service index, the process's telemetry and readiness checks (the webhook adds "no certificate
/// loaded", "no plan published yet" and "shutting down" to them).
pub struct Served {
    /// The plan the handler reads.
    pub plan: PlanHandle,
    /// Services, for scope ServiceBacked.
    pub services: Arc<dyn ServiceIndex>,
    /// The process's one registry.
    pub telemetry: Telemetry,
    /// The process's readiness checks.
    pub readiness: Readiness,
    /// A second HTTPS server with the same certificate, on its own socket and connection cap
    /// (the operator's preStop waiter endpoint: its long polls never take the admission
    /// webhook's connections).
    pub wait: Option<(std::net::TcpListener, axum::Router)>,
}

/// Connections the preStop waiter endpoint holds at once, at most: one per pod waiting (a
/// waiter keeps one connection), about 22 KB each; beyond it a waiter falls back to the sleep.
pub const WAIT_MAX_CONNECTIONS: usize = 4096;

/// Serves the HTTPS webhook and the admin port on `listeners` until `shutdown` fires, with
/// certificates reloaded from `serving`'s files.
pub async fn serve_with(serving: &ServingArgs, listeners: Listeners, parts: Served, shutdown: Shutdown) -> Result<(), Error> {
    if serving.max_buffered_body_bytes < serving.max_body_bytes {
        return Err(Error::Usage(format!(
            "--max-buffered-body-bytes ({}) must be at least --max-body-bytes ({})",
            serving.max_buffered_body_bytes, serving.max_body_bytes
        )));
    }
    let Served { plan: plan_handle, services, telemetry, readiness, wait } = parts;
    let metrics = telemetry.webhook().clone();
    let Listeners { webhook: listener, admin } = listeners;
    let addr = |a: std::io::Result<SocketAddr>| a.map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
    let (listen, admin_listen) = (addr(listener.local_addr()), addr(admin.local_addr()));

    let store = Arc::new(CertificateStore::new());
    let reloader = Arc::new(CertReloader::new(&serving.tls_cert_file, &serving.tls_key_file, store.clone(), Some(metrics.clone())));
    reloader.poll_once().await;

    {
        let store = store.clone();
        readiness.add("no certificate loaded", move || store.is_loaded());
        let plan = plan_handle.clone();
        readiness.add("no plan published yet", move || plan.is_published());
        readiness.add_shutdown(shutdown.token());
    }

    let stop_background = CancellationToken::new();
    let reload_task = tokio::spawn(reloader.clone().run(Duration::from_secs(serving.cert_reload_interval_seconds), stop_background.clone()));
    let admin_task = tokio::spawn(telemetry::serve_admin(
        admin,
        telemetry::admin_router(telemetry.clone(), readiness),
        stop_background.clone(),
        Duration::from_secs(serving.idle_timeout_seconds),
    ));

    let tls = crate::webhook::tls::server_config(store).map_err(|e| Error::Io(format!("TLS configuration: {e}")))?;
    let state = WebhookState {
        plan: plan_handle,
        services,
        metrics,
        settings: RequestLimits {
            max_body_bytes: serving.max_body_bytes,
            request_timeout: Duration::from_millis(serving.request_timeout_ms),
            body_timeout: Duration::from_millis(serving.body_timeout_ms),
            body_budget: server::BodyBudget::new(serving.max_buffered_body_bytes),
        },
    };
    tracing::info!(listen = %listen, admin = %admin_listen, cert = %serving.tls_cert_file.display(), "admission webhook serving");
    let wait_task = wait.map(|(listener, router)| {
        let addr = listener.local_addr().map_or_else(|e| format!("unknown ({e})"), |a| a.to_string());
        tracing::info!(listen = %addr, "preStop waiter endpoint serving");
        let connections = server::Connections { max_connections: WAIT_MAX_CONNECTIONS, ..Default::default() };
        let (tls, token, drain) = (tls.clone(), shutdown.token(), Duration::from_secs(serving.drain_seconds));
        tokio::spawn(async move {
            if let Err(e) = server::serve(listener, router, tls, token, drain, connections).await {
                tracing::error!(error = %e, "the preStop waiter endpoint stopped");
            }
        })
    });
    let serve = server::serve(
        listener,
        server::router(state),
        tls,
        shutdown.token(),
        Duration::from_secs(serving.drain_seconds),
        server::Connections { idle_timeout: Duration::from_secs(serving.idle_timeout_seconds), ..Default::default() },
    );
    let abort = shutdown.abort_token();
    let result = tokio::select! {
        r = serve => r.map_err(|e| Error::Io(format!("webhook server: {e}"))),
        () = abort.cancelled() => Err(Error::Aborted),
    };
    stop_background.cancel();
    if let Some(t) = wait_task {
        if matches!(result, Err(Error::Aborted)) {
            t.abort();
        } else {
            let _ = t.await;
        }
    }
    if !matches!(result, Err(Error::Aborted)) {
        let _ = reload_task.await;
        if let Ok(Err(e)) = admin_task.await {
            tracing::warn!(error = %e, "admin server");
        }
        tracing::info!("admission webhook stopped");
    }
    result
}
