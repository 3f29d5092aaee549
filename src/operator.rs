//! What the operator's long-running tasks share, and the set they run in. `cli::run` builds one
//! [`Shared`] and hands it to `sources::spawn`, `controller::spawn` and
//! `webhook::certs::spawn`; each adds its tasks to the one [`Tasks`] set, whose first task to
//! end stops the process.

use crate::measure::MeasurementStore;
use crate::proxyconfig::ResolvedProxyConfig;
use kube::Client;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The shared context of the operator's tasks. Cloning is cheap (handles only).
#[derive(Clone)]
pub struct Shared {
    /// The Kubernetes API client.
    pub client: Client,
    /// Cancelled when the process shuts down.
    pub stop: CancellationToken,
    /// True while this replica holds the lease (always true without leader election).
    pub leader: watch::Receiver<bool>,
    /// The rolling measurement: sources record into it, the controller reads it.
    pub store: Arc<Mutex<MeasurementStore>>,
    /// The measurement generation: bumped by a source after each recorded round.
    pub generation: watch::Sender<u64>,
    /// A receiver of [`Shared::generation`] made with it, so that a bump before a consumer
    /// starts still counts as a change for that consumer.
    pub measured: watch::Receiver<u64>,
    /// kube-proxy's configuration (minSyncPeriod, mode) as a source last resolved it.
    pub proxy: Arc<RwLock<ResolvedProxyConfig>>,
    /// Keeps the leadership channel open when there is no election (the lease task keeps it
    /// open otherwise).
    _always_leader: Option<Arc<watch::Sender<bool>>>,
}

impl Shared {
    /// A context around `store`; `leader` from [`elect`] (or [`Leadership::always`]).
    pub fn new(client: Client, stop: CancellationToken, leader: Leadership, store: MeasurementStore) -> Self {
        let (generation, measured) = watch::channel(0u64);
        Self {
            client,
            stop,
            leader: leader.rx,
            store: Arc::new(Mutex::new(store)),
            generation,
            measured,
            proxy: Arc::new(RwLock::new(ResolvedProxyConfig::default())),
            _always_leader: leader.always,
        }
    }
}

/// This replica's leadership: a receiver that is true while it leads.
pub struct Leadership {
    rx: watch::Receiver<bool>,
    always: Option<Arc<watch::Sender<bool>>>,
}

impl Leadership {
    /// Leads for the process's life (`--no-leader-election`: one replica only).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self { rx, always: Some(Arc::new(tx)) }
    }
}

/// Joins the lease `lease_name` in `namespace` as `identity` and spawns the lease task into
/// `tasks`. Errors: the lease manager could not be built.
pub async fn elect(
    client: Client,
    namespace: &str,
    lease_name: &str,
    identity: String,
    tasks: &mut Tasks,
) -> Result<Leadership, kube_lease_manager::LeaseManagerError> {
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client, lease_name)
        .with_namespace(namespace)
        .with_identity(identity)
        .with_field_manager("safe-termination-lease")
        .build()
        .await?;
    let (rx, handle) = manager.watch().await;
    let stop = tasks.stop.clone();
    tasks.spawn("lease", async move {
        tokio::select! {
            _ = stop.cancelled() => {}
            r = handle => tracing::error!(result = ?r.map(|r| r.map(|_| ())), "the lease task ended"),
        }
    });
    Ok(Leadership { rx, always: None })
}

/// The operator's tasks, each named for the log line when it ends.
pub struct Tasks {
    set: JoinSet<&'static str>,
    stop: CancellationToken,
}

impl Tasks {
    /// An empty set whose tasks stop on `stop`.
    pub fn new(stop: CancellationToken) -> Self {
        Self { set: JoinSet::new(), stop }
    }

    /// Runs `task` as `name`.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        self.set.spawn(async move {
            task.await;
            name
        });
    }

    /// The name of the next task to end (`None` when there is none).
    pub async fn next_ended(&mut self) -> Option<&'static str> {
        self.set.join_next().await.map(|r| r.unwrap_or("a task"))
    }

    /// Cancels every task and waits up to `timeout` for them, then aborts the rest.
    pub async fn stop(mut self, timeout: Duration) {
        self.stop.cancel();
        let drain = tokio::time::timeout(timeout, async { while self.set.join_next().await.is_some() {} });
        if drain.await.is_err() {
            self.set.abort_all();
        }
    }
}
