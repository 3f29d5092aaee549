//! What the operator's long-running tasks share: the Kubernetes client, the stop token, this
//! replica's leadership, the measurement store and its generation, and kube-proxy's resolved
//! configuration. `cli::run` builds one [`Shared`] and hands it to every task.

use crate::core::measure::MeasurementStore;
use crate::core::proxyconfig::ResolvedProxyConfig;
use kube::Client;
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::watch;
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
    /// A context around `store`; `leader` from [`super::lease::elect`] (or [`Leadership::always`]).
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
    /// True while this replica leads (the lease task's last published state).
    pub fn leading(&self) -> bool {
        *self.rx.borrow()
    }

    /// Leads while the lease task's channel `rx` says so ([`super::lease::elect`]).
    pub(super) fn elected(rx: watch::Receiver<bool>) -> Self {
        Self { rx, always: None }
    }

    /// Leads for the process's life (`--no-leader-election`: one replica only).
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self { rx, always: Some(Arc::new(tx)) }
    }
}
