//! Cluster counts for the advisor (Services, Service ports, endpoints) and the live Service
//! index the webhook uses for scope ServiceBacked, both kept by two watches.
//!
//! Memory stays small: a Service is kept as its selector and port count, an EndpointSlice as its
//! endpoint count; nothing else of either object is retained.

use crate::core::selector::{Labels, ServiceIndex};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Clone, Default)]
struct ServiceEntry {
    selector: Labels,
    ports: u64,
}

#[derive(Debug, Default)]
struct Inner {
    /// namespace -> name -> entry
    services: HashMap<String, HashMap<String, ServiceEntry>>,
    /// (namespace, name) -> endpoint count
    slices: HashMap<(String, String), u64>,
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
        let endpoints = g.slices.values().sum();
        Some(ClusterCounts { services, service_ports, endpoints })
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
        };
        if let Ok(mut g) = self.inner.write() {
            g.services.entry(ns).or_default().insert(s.name_any(), entry);
        }
    }

    /// Removes one Service.
    pub fn delete_service(&self, s: &Service) {
        if let Ok(mut g) = self.inner.write()
            && let Some(m) = g.services.get_mut(&s.namespace().unwrap_or_default())
        {
            m.remove(&s.name_any());
        }
    }

    /// Applies one EndpointSlice.
    pub fn apply_slice(&self, e: &EndpointSlice) {
        if let Ok(mut g) = self.inner.write() {
            g.slices.insert((e.namespace().unwrap_or_default(), e.name_any()), e.endpoints.len() as u64);
        }
    }

    /// Removes one EndpointSlice.
    pub fn delete_slice(&self, e: &EndpointSlice) {
        if let Ok(mut g) = self.inner.write() {
            g.slices.remove(&(e.namespace().unwrap_or_default(), e.name_any()));
        }
    }

    fn reset(&self, services: bool) {
        if let Ok(mut g) = self.inner.write() {
            if services {
                g.services.clear();
            } else {
                g.slices.clear();
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

    /// Watches Services and EndpointSlices cluster-wide until `stop`. Watch errors are retried
    /// with kube-runtime's default backoff; the function returns only on `stop`.
    pub async fn run(self: Arc<Self>, client: Client, stop: CancellationToken) {
        let services = watcher(Api::<Service>::all(client.clone()), watcher::Config::default()).default_backoff();
        let slices = watcher(Api::<EndpointSlice>::all(client), watcher::Config::default()).default_backoff();
        let svc_loop = async {
            let mut s = std::pin::pin!(services);
            loop {
                match s.try_next().await {
                    Ok(Some(ev)) => self.on_service(ev),
                    Ok(None) => break,
                    Err(e) => tracing::warn!(error = %e, "Service watch error"),
                }
            }
        };
        let slice_loop = async {
            let mut s = std::pin::pin!(slices);
            while let Some(ev) = s.next().await {
                match ev {
                    Ok(ev) => self.on_slice(ev),
                    Err(e) => tracing::warn!(error = %e, "EndpointSlice watch error"),
                }
            }
        };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = async { tokio::join!(svc_loop, slice_loop) } => {}
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

    fn on_slice(&self, ev: watcher::Event<EndpointSlice>) {
        match ev {
            watcher::Event::Init => self.reset(false),
            watcher::Event::InitApply(e) | watcher::Event::Apply(e) => self.apply_slice(&e),
            watcher::Event::InitDone => self.mark_synced(false),
            watcher::Event::Delete(e) => self.delete_slice(&e),
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
        idx.on_slice(watcher::Event::Init);
        idx.on_slice(watcher::Event::InitApply(slice.clone()));
        idx.on_slice(watcher::Event::InitDone);
        assert_eq!(idx.counts(), Some(ClusterCounts { services: 2, service_ports: 3, endpoints: 3 }));
        assert!(idx.selects("a", &labels));
        assert!(!idx.selects("b", &labels));
        idx.on_service(watcher::Event::Delete(svc("a", "web", &[("app", "web")], 2)));
        assert!(!idx.selects("a", &labels), "an empty selector selects nothing");
        idx.on_slice(watcher::Event::Delete(slice));
        assert_eq!(idx.counts().unwrap().endpoints, 0);
    }
}
