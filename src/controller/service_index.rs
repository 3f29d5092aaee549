//! Cluster counts for the advisor (Services, Service ports, endpoints), the live Service index
//! the webhook uses for scope ServiceBacked, and the control plane's part of each deletion
//! ([`crate::core::control_plane`]), kept by three watches: Services, EndpointSlices, and pods'
//! metadata (only a pod's deletion is read from it).
//!
//! Memory stays small: a Service is kept as its selector and port count, an EndpointSlice as its
//! endpoint count, a pod only while its deletion waits for its endpoint change; nothing else of
//! any object is retained.

use crate::core::annotations::ANNOTATION_PRESTOP_SECONDS;
use crate::core::control_plane::{DeletionLags, Joined, LagDistribution, SliceEndpoint};
use crate::core::removals::{DEFAULT_DEADLINE_SECONDS, DataPlaneSummary, PendingRemoval, RemovalStore, RemovalSummary, ServicePort};
use crate::core::selector::{Labels, ServiceIndex};
use crate::core::wait::{PodView, WaitRecord, WaitSummary};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::core::PartialObjectMeta;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Default)]
struct ServiceEntry {
    selector: Labels,
    ports: u64,
    /// The ClusterIP (None: headless, or not allocated): the data planes program no rule
    /// without one.
    cluster_ip: Option<std::net::IpAddr>,
    /// The port named `wait` (the chart's Service: the preStop waiters' endpoint).
    wait_port: Option<u16>,
    /// The first port: (name, protocol, port). One port's rules show an endpoint's removal: the
    /// proxiers program every port of a Service in the same sync.
    first_port: Option<(String, String, u16)>,
}

/// What is kept of one EndpointSlice.
#[derive(Debug, Clone, Default)]
struct SliceEntry {
    /// Its endpoints.
    endpoints: u64,
    /// Of them, ready ones (`conditions.ready` true or unset: "nil should be interpreted as
    /// true", EndpointConditions' API doc; a terminating endpoint is never ready).
    ready: u64,
    /// Its Service (`kubernetes.io/service-name`; empty when unlabelled).
    service: String,
}

/// A joined deletion, as a pod's waiter asks about it: when it was seen, and the removals it
/// opened (Service port, endpoint); none when no Service with a ClusterIP routes to the pod.
#[derive(Debug, Clone)]
struct JoinedDeletion {
    deleting_at: f64,
    namespace: String,
    removals: Vec<(ServicePort, std::net::IpAddr)>,
    services: Vec<String>,
    /// The Services with a ClusterIP and a port that selected the pod when its deletion was
    /// seen (by its labels): each must have a removal for the waiter to be told `Removed`.
    expected: Option<Vec<String>>,
    /// Whether the deletion was joined with its endpoint change.
    joined: bool,
    /// The pod's name and injected sleep (for the removals of its other Services).
    pod_name: String,
    sleep_seconds: Option<u32>,
}

/// pod UID -> its joined deletion, and (pod UID, when its deletion was seen) oldest first.
type JoinedForWaiters = (HashMap<String, JoinedDeletion>, std::collections::VecDeque<(String, f64)>);

/// Joined deletions kept for waiters at most (the oldest is dropped past it), and for how long,
/// seconds (a waiter asks within its pod's grace period, at most a few minutes).
const MAX_JOINED_FOR_WAITERS: usize = 10_000;
const JOINED_FOR_WAITERS_SECONDS: f64 = 900.0;

#[derive(Debug, Default)]
struct Inner {
    /// namespace -> name -> entry
    services: HashMap<String, HashMap<String, ServiceEntry>>,
    /// (namespace, name) -> the slice's counts
    slices: HashMap<(String, String), SliceEntry>,
    /// (namespace, Service) -> its ready endpoints, summed over its slices (a pod's waiter asks
    /// whether its Service has another: [`ClusterIndex::wait_view`])
    ready_by_service: HashMap<(String, String), u64>,
    services_synced: bool,
    slices_synced: bool,
}

/// Counts of what kube-proxy programs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    /// Services.
    pub services: u64,
    /// Service ports (sum over Services).
    pub service_ports: u64,
    /// Endpoints (sum over EndpointSlices).
    pub endpoints: u64,
}

/// The watched state. Cheap to share (`Arc<ClusterIndex>`); readers never wait on the network.
#[derive(Debug, Default)]
pub struct ClusterIndex {
    inner: RwLock<Inner>,
    deletions: Mutex<DeletionLags>,
    /// Observed removals (only while an observer runs: [`ClusterIndex::start_observing`]).
    removals: Mutex<RemovalStore>,
    observing: std::sync::atomic::AtomicBool,
    /// pod UID -> its joined deletion, while observing (for waiters), oldest first in `joined_order`.
    joined: Mutex<JoinedForWaiters>,
    /// Pod UIDs of `joined` whose other Services' removals are not opened yet (at most
    /// [`MAX_JOINED_FOR_WAITERS`]).
    incomplete: Mutex<Vec<String>>,
    /// Finished preStop waits reported to this replica, oldest first, at most
    /// [`MAX_WAIT_RECORDS`].
    waits: Mutex<std::collections::VecDeque<WaitRecord>>,
}

/// Finished waits kept for the status at most (the oldest is dropped past it).
pub const MAX_WAIT_RECORDS: usize = 20_000;

/// Drives one watch stream until it ends, handing each event to `on`; a watch error is logged
/// as `what`'s and the stream goes on (kube-runtime retries with its backoff).
async fn follow<K>(stream: impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>>, what: &str, mut on: impl FnMut(watcher::Event<K>)) {
    let mut s = std::pin::pin!(stream);
    while let Some(ev) = s.next().await {
        match ev {
            Ok(ev) => on(ev),
            Err(e) => tracing::warn!(error = %e, "{what} watch error"),
        }
    }
}

/// Now as unix seconds (the watches' clock: both times of a lag come from it, and the rolling
/// window of lags is read against it).
pub(crate) fn now_unix() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Inner {
    /// Moves a slice's ready endpoints in its Service's sum from `old` to `new` (either absent).
    fn move_ready(&mut self, namespace: &str, old: Option<&SliceEntry>, new: Option<&SliceEntry>) {
        if let Some(e) = old.filter(|e| !e.service.is_empty())
            && let Some(sum) = self.ready_by_service.get_mut(&(namespace.to_string(), e.service.clone()))
        {
            *sum = sum.saturating_sub(e.ready);
        }
        if let Some(e) = new.filter(|e| !e.service.is_empty()) {
            let sum = self.ready_by_service.entry((namespace.to_string(), e.service.clone())).or_insert(0);
            *sum = sum.saturating_add(e.ready);
        }
    }
}

impl ClusterIndex {
    /// Current counts; `None` until both watches have listed once.
    pub fn counts(&self) -> Option<ClusterCounts> {
        let g = self.inner.read().ok()?;
        if !(g.services_synced && g.slices_synced) {
            return None;
        }
        let services = g.services.values().map(|m| m.len() as u64).sum();
        let service_ports = g.services.values().flat_map(|m| m.values()).map(|e| e.ports).sum();
        let endpoints = g.slices.values().map(|e| e.endpoints).sum();
        Some(ClusterCounts { services, service_ports, endpoints })
    }

    /// The control plane's part of the deletions seen within `window_seconds` before `now`
    /// (unix seconds); None before the first.
    pub fn control_plane_lag(&self, now: f64, window_seconds: f64) -> Option<LagDistribution> {
        self.deletions.lock().ok()?.distribution(now, window_seconds)
    }

    /// From now on every joined deletion opens a removal for the observer to watch.
    pub fn start_observing(&self) {
        self.observing.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Runs `f` on the observed removals.
    pub fn with_removals<T>(&self, f: impl FnOnce(&mut RemovalStore) -> T) -> T {
        f(&mut self.removals.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// The removals observed within `window_seconds` before `now` per data plane; empty while no
    /// observer runs.
    pub fn observed_by_data_plane(&self, now: f64, window_seconds: f64) -> Vec<DataPlaneSummary> {
        if !self.observing.load(std::sync::atomic::Ordering::Relaxed) {
            return Vec::new();
        }
        self.with_removals(|r| r.summary_by_data_plane(now, window_seconds))
    }

    /// The removals observed within `window_seconds` before `now`; None while no observer runs.
    pub fn observed_removals(&self, now: f64, window_seconds: f64) -> Option<RemovalSummary> {
        self.observing.load(std::sync::atomic::Ordering::Relaxed).then(|| self.with_removals(|r| r.summary(now, window_seconds)))
    }

    /// The removal a joined deletion opens: its endpoint in the Service `service` (the slice's
    /// `kubernetes.io/service-name`) of `namespace`, when that Service has a ClusterIP and a
    /// port and the slice gave the endpoint's address.
    fn removal_of(&self, namespace: &str, service: &str, j: &Joined) -> Option<PendingRemoval> {
        let endpoint = j.address?;
        let g = self.inner.read().ok()?;
        let e = g.services.get(namespace)?.get(service)?;
        let (port_name, protocol, port) = e.first_port.clone()?;
        Some(PendingRemoval {
            service: ServicePort { namespace: namespace.to_string(), name: service.to_string(), port_name, protocol, cluster_ip: e.cluster_ip?, port },
            endpoint,
            pod: format!("{namespace}/{}", j.pod_name),
            deletion: j.deleting_at,
            sleep_seconds: j.sleep_seconds,
            deadline: j.deleting_at + DEFAULT_DEADLINE_SECONDS,
        })
    }

    /// The ClusterIP of Service `name` in `namespace` and its port named `wait`, from the watch
    /// (None: not known, or headless).
    pub fn service_address(&self, namespace: &str, name: &str) -> Option<(std::net::IpAddr, Option<u16>)> {
        let g = self.inner.read().ok()?;
        let e = g.services.get(namespace)?.get(name)?;
        Some((e.cluster_ip?, e.wait_port))
    }

    /// True once the Service watch has listed once (the webhook's scope check is trusted).
    pub fn services_synced(&self) -> bool {
        self.inner.read().map(|g| g.services_synced).unwrap_or(false)
    }

    /// Applies one Service (added or changed).
    pub fn apply_service(&self, s: &Service) {
        let ns = s.namespace().unwrap_or_default();
        let spec = s.spec.as_ref();
        let entry = ServiceEntry {
            selector: spec.and_then(|s| s.selector.clone()).unwrap_or_default().into_iter().collect(),
            ports: spec.and_then(|s| s.ports.as_ref()).map_or(0, |p| p.len() as u64),
            cluster_ip: spec.and_then(|s| s.cluster_ip.as_deref()).and_then(|ip| ip.parse().ok()),
            wait_port: spec
                .and_then(|s| s.ports.as_ref())
                .and_then(|ps| ps.iter().find(|p| p.name.as_deref() == Some("wait")))
                .and_then(|p| u16::try_from(p.port).ok()),
            first_port: spec
                .and_then(|s| s.ports.as_ref())
                .and_then(|p| p.first())
                .map(|p| (p.name.clone().unwrap_or_default(), p.protocol.clone().unwrap_or_else(|| "TCP".into()), u16::try_from(p.port).unwrap_or(0))),
        };
        if let Ok(mut g) = self.inner.write() {
            g.services.entry(ns).or_default().insert(s.name_any(), entry);
        }
    }

    /// Removes one Service, and drops the removals of its endpoints still open or deleted in its
    /// teardown ([`RemovalStore::forget_service`]).
    pub fn delete_service(&self, s: &Service) {
        let (ns, name) = (s.namespace().unwrap_or_default(), s.name_any());
        if self.observing.load(std::sync::atomic::Ordering::Relaxed) {
            let dropped = self.with_removals(|r| r.forget_service(&ns, &name, now_unix()));
            if dropped > 0 {
                tracing::debug!(namespace = %ns, service = %name, dropped, "the Service was deleted: its open removals and its teardown's are dropped");
            }
        }
        if let Ok(mut g) = self.inner.write()
            && let Some(m) = g.services.get_mut(&ns)
        {
            m.remove(&name);
        }
        // its ready count goes with it (its slices' deletions bring it to 0, not away)
        if let Ok(mut g) = self.inner.write() {
            g.ready_by_service.remove(&(ns, name));
        }
    }

    /// Applies one EndpointSlice seen at `at` (unix seconds).
    pub fn apply_slice(&self, e: &EndpointSlice, at: f64) {
        let (ns, name) = (e.namespace().unwrap_or_default(), e.name_any());
        if let Ok(mut d) = self.deletions.lock()
            && d.pending() > 0
        {
            let endpoints: Vec<SliceEndpoint> = e
                .endpoints
                .iter()
                .filter_map(|ep| {
                    let uid = ep.target_ref.as_ref()?.uid.clone()?;
                    Some(SliceEndpoint {
                        pod_uid: uid,
                        terminating: ep.conditions.as_ref().and_then(|c| c.terminating).unwrap_or(false),
                        address: ep.addresses.first().and_then(|a| a.parse().ok()),
                    })
                })
                .collect();
            let joined = d.slice(&ns, &name, &endpoints, at);
            drop(d);
            let service = e.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name"));
            for j in joined {
                tracing::debug!(namespace = %j.namespace, pod_uid = %j.pod_uid, lag_seconds = j.lag_seconds, how = j.how, slice = %name, "control plane's part of a deletion");
                if self.observing.load(std::sync::atomic::Ordering::Relaxed) {
                    let r = service.and_then(|svc| self.removal_of(&ns, svc, &j));
                    let key = r.as_ref().map(|r| (r.service.clone(), r.endpoint));
                    // opened before its waiter can see the join (else a question in between
                    // finds the removal neither open nor closed)
                    if let Some(r) = r {
                        self.with_removals(|s| s.open(r));
                    }
                    self.remember_joined(&j, service.map(String::as_str), key);
                }
            }
        }
        if self.observing.load(std::sync::atomic::Ordering::Relaxed)
            && self.incomplete.lock().is_ok_and(|g| !g.is_empty())
            && let Some(svc) = e.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name"))
        {
            self.join_other_services(e, &ns, svc, at);
        }
        let entry = SliceEntry {
            endpoints: e.endpoints.len() as u64,
            ready: e.endpoints.iter().filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true)).count() as u64,
            service: e.metadata.labels.as_ref().and_then(|l| l.get("kubernetes.io/service-name")).cloned().unwrap_or_default(),
        };
        if let Ok(mut g) = self.inner.write() {
            let old = g.slices.insert((ns.clone(), name), entry.clone());
            g.move_ready(&ns, old.as_ref(), Some(&entry));
        }
    }

    /// Runs `f` on the pod `uid`'s entry for its waiter (made at `deleting_at` in `namespace` when
    /// absent), bounded by [`MAX_JOINED_FOR_WAITERS`] and [`JOINED_FOR_WAITERS_SECONDS`].
    fn for_waiter(&self, uid: &str, namespace: &str, deleting_at: f64, f: impl FnOnce(&mut JoinedDeletion)) {
        let mut g = self.joined.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let (map, order) = &mut *g;
        while let Some((old, at)) = order.front() {
            if order.len() < MAX_JOINED_FOR_WAITERS && deleting_at - at <= JOINED_FOR_WAITERS_SECONDS {
                break;
            }
            if map.get(old).is_some_and(|d| d.deleting_at == *at) {
                map.remove(old);
            }
            order.pop_front();
        }
        let d = map.entry(uid.to_string()).or_insert_with(|| {
            order.push_back((uid.to_string(), deleting_at));
            JoinedDeletion {
                deleting_at,
                namespace: namespace.to_string(),
                removals: Vec::new(),
                services: Vec::new(),
                expected: None,
                joined: false,
                pod_name: String::new(),
                sleep_seconds: None,
            }
        });
        f(d);
    }

    /// Keeps `j` for its pod's waiter, with the removal it opened (None: no Service with a
    /// ClusterIP, or one not known).
    fn remember_joined(&self, j: &Joined, service: Option<&str>, removal: Option<(ServicePort, std::net::IpAddr)>) {
        let mut incomplete = false;
        self.for_waiter(&j.pod_uid, &j.namespace, j.deleting_at, |d| {
            d.joined = true;
            d.deleting_at = j.deleting_at;
            d.pod_name = j.pod_name.clone();
            d.sleep_seconds = j.sleep_seconds;
            d.removals.extend(removal);
            d.services.extend(service.map(str::to_string));
            incomplete = d.expected.as_ref().is_some_and(|e| e.iter().any(|svc| !d.removals.iter().any(|(p, _)| &p.name == svc)));
        });
        if incomplete {
            let mut g = self.incomplete.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if g.len() >= MAX_JOINED_FOR_WAITERS {
                g.remove(0);
            }
            g.push(j.pod_uid.clone());
        }
    }

    /// The removals of the other Services of pods joined on one Service's slice (a deletion
    /// joins once, on the first slice that shows it; a pod behind a headless Service and a
    /// ClusterIP one, or behind two, has a removal in each): `e`, a slice of Service `svc` seen at
    /// `at`, opens the removal of each such pod it shows terminating.
    fn join_other_services(&self, e: &EndpointSlice, namespace: &str, svc: &str, at: f64) {
        let uids: Vec<String> = self.incomplete.lock().map(|g| g.clone()).unwrap_or_default();
        for uid in uids {
            let Some(d) = self.joined.lock().ok().and_then(|g| g.0.get(&uid).cloned()) else {
                self.incomplete.lock().map(|mut g| g.retain(|u| u != &uid)).ok();
                continue;
            };
            let wanted =
                d.namespace == namespace && d.expected.as_ref().is_some_and(|x| x.iter().any(|s| s == svc)) && !d.removals.iter().any(|(p, _)| p.name == svc);
            let terminating = e
                .endpoints
                .iter()
                .find(|ep| ep.target_ref.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str()))
                .filter(|ep| ep.conditions.as_ref().and_then(|c| c.terminating).unwrap_or(false));
            let (true, Some(ep)) = (wanted, terminating) else { continue };
            let j = Joined {
                pod_uid: uid.clone(),
                namespace: namespace.to_string(),
                lag_seconds: (at - d.deleting_at).max(0.0),
                how: "terminating",
                pod_name: d.pod_name.clone(),
                sleep_seconds: d.sleep_seconds,
                deleting_at: d.deleting_at,
                address: ep.addresses.first().and_then(|a| a.parse().ok()),
            };
            let Some(r) = self.removal_of(namespace, svc, &j) else { continue };
            let key = (r.service.clone(), r.endpoint);
            self.with_removals(|s| s.open(r));
            let mut complete = false;
            self.for_waiter(&uid, namespace, d.deleting_at, |d| {
                d.removals.push(key);
                d.services.push(svc.to_string());
                complete = d.expected.as_ref().is_none_or(|e| e.iter().all(|s| d.removals.iter().any(|(p, _)| &p.name == s)));
            });
            if complete {
                self.incomplete.lock().map(|mut g| g.retain(|u| u != &uid)).ok();
            }
        }
    }

    /// The Services of `namespace` with a ClusterIP and a port (those a removal is opened for)
    /// whose selector matches `labels`; None until the Service watch has listed once.
    fn cluster_ip_services_selecting(&self, namespace: &str, labels: &Labels) -> Option<Vec<String>> {
        let g = self.inner.read().ok()?;
        if !g.services_synced {
            return None;
        }
        let Some(m) = g.services.get(namespace) else { return Some(Vec::new()) };
        Some(
            m.iter()
                .filter(|(_, e)| e.cluster_ip.is_some() && e.first_port.is_some() && crate::core::selector::service_selects(&e.selector, labels))
                .map(|(name, _)| name.clone())
                .collect(),
        )
    }

    /// The window of the pod `uid`'s deletion: the slowest of its observed removals, seconds;
    /// None while one is open or censored, or when none was joined or opened.
    pub fn pod_window(&self, uid: &str) -> Option<f64> {
        let j = self.joined.lock().ok()?.0.get(uid).cloned()?;
        if j.removals.is_empty() {
            return None;
        }
        self.with_removals(|s| j.removals.iter().map(|(svc, ip)| s.closed_window(svc, *ip, j.deleting_at)).try_fold(0.0_f64, |m, w| Some(m.max(w?))))
    }

    /// Keeps a finished wait (reported to this replica) for the status.
    pub fn record_wait(&self, r: WaitRecord) {
        let mut g = self.waits.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while g.len() >= MAX_WAIT_RECORDS {
            g.pop_front();
        }
        g.push_back(r);
    }

    /// The waits of `namespace`'s pods reported within `window_seconds` before `now`; None
    /// when there were none.
    pub fn wait_summary(&self, namespace: &str, now: f64, window_seconds: f64) -> Option<WaitSummary> {
        let g = self.waits.lock().ok()?;
        let s = crate::core::wait::summarise(g.iter().rev().take_while(|r| now - r.at <= window_seconds).filter(|r| r.namespace == namespace));
        (s.waits > 0).then_some(s)
    }

    /// What this replica knows of the pod `uid`'s deletion, for its waiter
    /// ([`crate::core::wait::decide`]): `leader` whether it leads, `first_asked` when the pod
    /// first asked (unix seconds).
    pub fn wait_view(&self, uid: &str, leader: bool, first_asked: f64) -> PodView {
        let observing = self.observing.load(std::sync::atomic::Ordering::Relaxed);
        let seen = self.deletions.lock().ok().and_then(|d| d.deletion_of(uid));
        let joined = self.joined.lock().ok().and_then(|g| g.0.get(uid).cloned());
        let (removals, ready_others, unobserved) = match joined.as_ref().filter(|j| j.joined) {
            Some(j) => {
                let removals = self.with_removals(|s| j.removals.iter().map(|(svc, ip)| s.progress(svc, *ip, j.deleting_at)).collect());
                let g = self.inner.read().ok();
                // counts from a half re-listed EndpointSlice watch are not trusted
                let synced = g.as_ref().is_some_and(|g| g.slices_synced);
                let ready = j
                    .services
                    .iter()
                    .map(|svc| g.as_ref().filter(|_| synced).and_then(|g| g.ready_by_service.get(&(j.namespace.clone(), svc.clone())).copied()))
                    .collect();
                // the Services that selected the pod at its deletion without a removal of theirs
                // (a second Service, a headless one's slice joined first): not observed; not
                // known at the deletion (the Service watch not listed): one, unless a removal is
                let unobserved = match &j.expected {
                    Some(expected) => expected.iter().filter(|e| !j.removals.iter().any(|(svc, _)| &svc.name == *e)).count(),
                    None => usize::from(j.removals.is_empty()),
                };
                (removals, ready, unobserved)
            }
            None => (Vec::new(), Vec::new(), 0),
        };
        PodView {
            observing,
            leader,
            deletion_seen: joined.as_ref().filter(|j| j.joined).map(|j| j.deleting_at).or(seen.map(|(at, _)| at)),
            joined: joined.as_ref().is_some_and(|j| j.joined),
            removals,
            ready_others,
            unobserved,
            first_asked,
        }
    }

    /// Removes one EndpointSlice.
    pub fn delete_slice(&self, e: &EndpointSlice) {
        let (ns, name) = (e.namespace().unwrap_or_default(), e.name_any());
        if let Ok(mut d) = self.deletions.lock() {
            d.slice_deleted(&ns, &name);
        }
        if let Ok(mut g) = self.inner.write() {
            let old = g.slices.remove(&(ns.clone(), name));
            g.move_ready(&ns, old.as_ref(), None);
        }
    }

    fn reset(&self, services: bool) {
        if let Ok(mut g) = self.inner.write() {
            if services {
                g.services.clear();
            } else {
                g.slices.clear();
                g.ready_by_service.clear();
                // until InitDone: the ready counts are being rebuilt
                g.slices_synced = false;
            }
        }
    }

    fn mark_synced(&self, services: bool) {
        if let Ok(mut g) = self.inner.write() {
            if services {
                g.services_synced = true;
            } else {
                g.slices_synced = true;
            }
        }
    }

    /// Watches Services, EndpointSlices and pods' metadata cluster-wide until `stop`. Watch
    /// errors are retried with kube-runtime's default backoff; the function returns only on
    /// `stop`.
    pub async fn run(self: Arc<Self>, client: Client, stop: CancellationToken) {
        let services = watcher(Api::<Service>::all(client.clone()), watcher::Config::default()).default_backoff();
        let slices = watcher(Api::<EndpointSlice>::all(client.clone()), watcher::Config::default()).default_backoff();
        let pods = watcher(Api::<PartialObjectMeta<Pod>>::all(client), watcher::Config::default()).default_backoff();
        let svc_loop = follow(services, "Service", |ev| self.on_service(ev));
        let slice_loop = follow(slices, "EndpointSlice", |ev| self.on_slice(ev, now_unix()));
        let pod_loop = follow(pods, "pod metadata", |ev| self.on_pod(ev, now_unix()));
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = async { tokio::join!(svc_loop, slice_loop, pod_loop) } => {}
        }
    }

    fn on_service(&self, ev: watcher::Event<Service>) {
        match ev {
            watcher::Event::Init => self.reset(true),
            watcher::Event::InitApply(s) | watcher::Event::Apply(s) => self.apply_service(&s),
            watcher::Event::InitDone => self.mark_synced(true),
            watcher::Event::Delete(s) => self.delete_service(&s),
        }
    }

    fn on_slice(&self, ev: watcher::Event<EndpointSlice>, at: f64) {
        match ev {
            watcher::Event::Init => self.reset(false),
            watcher::Event::InitApply(e) | watcher::Event::Apply(e) => self.apply_slice(&e, at),
            watcher::Event::InitDone => self.mark_synced(false),
            watcher::Event::Delete(e) => self.delete_slice(&e),
        }
    }

    /// A pod's metadata event at `at` (unix seconds). A deletion counts from the first event
    /// that shows `deletionTimestamp`; a pod already deleting when the watch (re)listed it was
    /// deleted at an unknown time before, and is not counted, nor is one replayed when the watch
    /// went live ([`DeletionLags::predates_watch`]).
    fn on_pod(&self, ev: watcher::Event<PartialObjectMeta<Pod>>, at: f64) {
        // for its waiter: which Services with a ClusterIP select the pod as it is deleted (its
        // labels are in the metadata watch), before the deletions' lock (no lock is nested)
        if let watcher::Event::Apply(p) = &ev
            && p.metadata.deletion_timestamp.is_some()
            && self.observing.load(std::sync::atomic::Ordering::Relaxed)
            && let Some(uid) = p.metadata.uid.as_deref()
            && !self.joined.lock().is_ok_and(|g| g.0.get(uid).is_some_and(|j| j.expected.is_some()))
        {
            let ns = p.metadata.namespace.as_deref().unwrap_or_default();
            let labels: Labels = p.metadata.labels.clone().unwrap_or_default().into_iter().collect();
            if let Some(expected) = self.cluster_ip_services_selecting(ns, &labels) {
                self.for_waiter(uid, ns, at, |j| j.expected = Some(expected));
            }
        }
        let Ok(mut d) = self.deletions.lock() else { return };
        match ev {
            watcher::Event::InitDone => d.watch_live(at),
            watcher::Event::Apply(p) if p.metadata.deletion_timestamp.is_some() => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    let m = &p.metadata;
                    let stamped =
                        m.deletion_timestamp.as_ref().map(|t| t.0.as_millisecond() as f64 / 1000.0 - m.deletion_grace_period_seconds.unwrap_or(0) as f64);
                    if stamped.is_some_and(|deleted_at| d.predates_watch(deleted_at, at)) {
                        return;
                    }
                    let sleep = m.annotations.as_ref().and_then(|a| a.get(ANNOTATION_PRESTOP_SECONDS)).and_then(|v| v.parse().ok());
                    d.pod_deleting(uid, m.namespace.as_deref().unwrap_or_default(), m.name.as_deref().unwrap_or_default(), sleep, at);
                }
            }
            watcher::Event::Delete(p) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    d.pod_gone(uid);
                }
            }
            _ => {}
        }
    }
}

impl ServiceIndex for ClusterIndex {
    /// Until the first list completes the index cannot know: it answers true (mutate rather than
    /// leave a service-backed pod unprotected; the sleep only delays termination).
    fn selects(&self, namespace: &str, labels: &Labels) -> bool {
        let Ok(g) = self.inner.read() else { return true };
        if !g.services_synced {
            return true;
        }
        g.services.get(namespace).is_some_and(|m| m.values().any(|e| crate::core::selector::service_selects(&e.selector, labels)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::Endpoint;

    fn svc(ns: &str, name: &str, sel: &[(&str, &str)], ports: usize) -> Service {
        let mut s = Service::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.spec = Some(ServiceSpec {
            selector: Some(sel.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ports: Some(vec![ServicePort::default(); ports]),
            ..Default::default()
        });
        s
    }

    /// The watches' events as kube-runtime delivers them: a pod listed while already deleting
    /// is not counted; a deletion seen on the pod watch and its endpoint turning terminating on
    /// the EndpointSlice watch give one lag, from the one clock.
    #[test]
    fn a_deletion_and_its_endpoint_change_give_the_control_planes_lag() {
        use k8s_openapi::api::core::v1::ObjectReference;
        use k8s_openapi::api::discovery::v1::EndpointConditions;
        use kube::core::ObjectMeta;
        let pod = |uid: &str, deleting: bool| PartialObjectMeta::<Pod> {
            metadata: ObjectMeta {
                namespace: Some("a".into()),
                name: Some(uid.into()),
                uid: Some(uid.into()),
                deletion_timestamp: deleting.then_some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            ..Default::default()
        };
        let slice = |endpoints: &[(&str, bool)]| {
            let mut s = EndpointSlice::default();
            s.metadata.namespace = Some("a".into());
            s.metadata.name = Some("web-abc".into());
            s.endpoints = endpoints
                .iter()
                .map(|(uid, terminating)| Endpoint {
                    target_ref: Some(ObjectReference { uid: Some(uid.to_string()), ..Default::default() }),
                    conditions: Some(EndpointConditions { terminating: Some(*terminating), ..Default::default() }),
                    ..Default::default()
                })
                .collect();
            s
        };
        let idx = ClusterIndex::default();
        idx.on_pod(watcher::Event::InitApply(pod("old", true)), 100.0);
        idx.on_pod(watcher::Event::Apply(pod("p1", false)), 100.0);
        idx.on_pod(watcher::Event::Apply(pod("p1", true)), 100.0);
        idx.on_pod(watcher::Event::Apply(pod("p1", true)), 100.05);
        idx.on_slice(watcher::Event::Apply(slice(&[("old", true), ("p1", false)])), 100.02);
        assert!(idx.control_plane_lag(100.1, 60.0).is_none(), "not terminating yet; `old` was deleting before the watch");
        idx.on_slice(watcher::Event::Apply(slice(&[("old", true), ("p1", true)])), 100.13);
        let lag = idx.control_plane_lag(100.2, 60.0).unwrap();
        assert_eq!(lag.samples(), 1);
        assert!((lag.max_seconds() - 0.13).abs() < 1e-9, "{lag:?}");
        assert!(idx.control_plane_lag(200.0, 60.0).is_none(), "outside the rolling window");
    }

    #[test]
    fn counts_and_selection() {
        let idx = ClusterIndex::default();
        let labels: Labels = [("app".to_string(), "web".to_string()), ("tier".to_string(), "x".to_string())].into();
        assert!(idx.selects("a", &labels), "unsynced index answers true");
        idx.on_service(watcher::Event::Init);
        idx.on_service(watcher::Event::InitApply(svc("a", "web", &[("app", "web")], 2)));
        idx.on_service(watcher::Event::InitApply(svc("a", "headless", &[], 1)));
        idx.on_service(watcher::Event::InitDone);
        assert_eq!(idx.counts(), None, "slices not listed yet");
        let mut slice = EndpointSlice::default();
        slice.metadata.namespace = Some("a".into());
        slice.metadata.name = Some("web-abc".into());
        slice.endpoints = vec![Endpoint::default(); 3];
        idx.on_slice(watcher::Event::Init, 0.0);
        idx.on_slice(watcher::Event::InitApply(slice.clone()), 0.0);
        idx.on_slice(watcher::Event::InitDone, 0.0);
        assert_eq!(idx.counts(), Some(ClusterCounts { services: 2, service_ports: 3, endpoints: 3 }));
        assert!(idx.selects("a", &labels));
        assert!(!idx.selects("b", &labels));
        idx.on_service(watcher::Event::Delete(svc("a", "web", &[("app", "web")], 2)));
        assert!(!idx.selects("a", &labels), "an empty selector selects nothing");
        idx.on_slice(watcher::Event::Delete(slice), 0.0);
        assert_eq!(idx.counts().unwrap().endpoints, 0);
    }
}

#[cfg(test)]
mod wait_tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ObjectReference, ServicePort as K8sPort, ServiceSpec};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use kube::core::ObjectMeta;

    fn svc(name: &str, cluster_ip: Option<&str>) -> Service {
        let mut s = Service::default();
        s.metadata.namespace = Some("a".into());
        s.metadata.name = Some(name.into());
        s.spec = Some(ServiceSpec {
            selector: Some([("app".to_string(), "web".to_string())].into()),
            ports: Some(vec![K8sPort { port: 80, ..Default::default() }]),
            cluster_ip: cluster_ip.map(str::to_string),
            ..Default::default()
        });
        s
    }

    fn pod(deleting: bool) -> PartialObjectMeta<Pod> {
        PartialObjectMeta::<Pod> {
            metadata: ObjectMeta {
                namespace: Some("a".into()),
                name: Some("web-0".into()),
                uid: Some("u1".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                deletion_timestamp: deleting.then_some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn slice(service: &str, terminating: bool, others_ready: usize) -> EndpointSlice {
        let mut s = EndpointSlice::default();
        s.metadata.namespace = Some("a".into());
        s.metadata.name = Some(format!("{service}-1"));
        s.metadata.labels = Some([("kubernetes.io/service-name".to_string(), service.to_string())].into());
        let me = Endpoint {
            addresses: vec!["10.244.1.5".into()],
            target_ref: Some(ObjectReference { uid: Some("u1".into()), ..Default::default() }),
            conditions: Some(EndpointConditions { ready: Some(!terminating), terminating: Some(terminating), ..Default::default() }),
            ..Default::default()
        };
        let other = Endpoint {
            addresses: vec!["10.244.1.9".into()],
            conditions: Some(EndpointConditions { ready: Some(true), ..Default::default() }),
            ..Default::default()
        };
        s.endpoints = std::iter::once(me).chain(std::iter::repeat_n(other, others_ready)).collect();
        s
    }

    /// A deleted pod's view: the Services that selected it at its deletion each need an observed
    /// removal (a pod in two ClusterIP Services joins on one slice: the other is doubt; a
    /// headless Service's slice joining first is doubt too); its Service's other ready endpoints
    /// (the last one: LastEndpoint).
    fn view_after(services: &[Service], joined_on: &str, others_ready: usize) -> crate::core::wait::PodView {
        view_after_both(services, joined_on, None, others_ready)
    }

    /// [`view_after`], with a later slice of `then` showing the pod terminating too.
    fn view_after_both(services: &[Service], joined_on: &str, then: Option<&str>, others_ready: usize) -> crate::core::wait::PodView {
        let idx = ClusterIndex::default();
        idx.start_observing();
        idx.on_service(watcher::Event::Init);
        for s in services {
            idx.on_service(watcher::Event::InitApply(s.clone()));
        }
        idx.on_service(watcher::Event::InitDone);
        idx.on_slice(watcher::Event::Init, 0.0);
        idx.on_slice(watcher::Event::InitDone, 0.0);
        let t = now_unix();
        idx.on_pod(watcher::Event::InitDone, t - 30.0);
        idx.on_slice(watcher::Event::Apply(slice(joined_on, false, others_ready)), t);
        idx.on_pod(watcher::Event::Apply(pod(true)), t + 0.1);
        idx.on_slice(watcher::Event::Apply(slice(joined_on, true, others_ready)), t + 0.2);
        if let Some(other) = then {
            idx.on_slice(watcher::Event::Apply(slice(other, true, others_ready)), t + 0.25);
        }
        idx.wait_view("u1", true, t + 0.3)
    }

    /// A deletion joins on the first slice that shows it; the pod's other Services' slices open
    /// their removals when they show it terminating, so a StatefulSet behind a headless and a
    /// ClusterIP Service, or a pod behind two, is observed on each.
    #[test]
    fn the_other_services_slices_open_their_removals_too() {
        let two = view_after_both(&[svc("web", Some("10.96.0.10")), svc("web-admin", Some("10.96.0.11"))], "web", Some("web-admin"), 1);
        assert_eq!((two.removals.len(), two.unobserved), (2, 0), "{two:?}");
        let headless = view_after_both(&[svc("web", Some("10.96.0.10")), svc("web-headless", Some("None"))], "web-headless", Some("web"), 1);
        assert_eq!((headless.removals.len(), headless.unobserved), (1, 0), "{headless:?}");
        assert_eq!(crate::core::wait::decide(&headless, now_unix(), 0).state, crate::core::wait::WaitState::Waiting, "open: every node must report it");
    }

    #[test]
    fn every_service_that_selected_the_pod_needs_an_observed_removal() {
        let one = view_after(&[svc("web", Some("10.96.0.10"))], "web", 1);
        assert_eq!((one.joined, one.removals.len(), one.unobserved), (true, 1, 0), "{one:?}");
        assert_eq!(one.ready_others, vec![Some(1)]);
        let two = view_after(&[svc("web", Some("10.96.0.10")), svc("web-admin", Some("10.96.0.11"))], "web", 1);
        assert_eq!((two.removals.len(), two.unobserved), (1, 1), "{two:?}");
        assert_eq!(crate::core::wait::decide(&two, now_unix(), 0).state, crate::core::wait::WaitState::Unknown);
        let headless_first = view_after(&[svc("web", Some("10.96.0.10")), svc("web-headless", Some("None"))], "web-headless", 1);
        assert_eq!((headless_first.removals.len(), headless_first.unobserved), (0, 1), "{headless_first:?}");
        let last = view_after(&[svc("web", Some("10.96.0.10"))], "web", 0);
        assert_eq!(crate::core::wait::decide(&last, now_unix(), 0).state, crate::core::wait::WaitState::LastEndpoint);
    }
}
