//! kube-proxy's configuration (minSyncPeriod, proxy mode) read from the cluster: its
//! `/configz` ([`fetch_configz`]), its ConfigMap ([`read_proxy_configmap`]), and the best of
//! them with the source named ([`resolve_proxy_config`]); the parsing is the core's
//! [`crate::core::proxyconfig`].

use super::error::SourceError;
use super::fetch::get_limited;
use super::scrape::{failure, text};
use super::targets::{Discovery, Target, detect_dataplane};
use crate::core::proxyconfig::{self, ModeOrigin, ProxyConfig, ResolvedProxyConfig};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use std::time::Duration;

/// Reads kube-proxy's effective configuration from its `/configz` (metrics port) and parses it
/// with [`proxyconfig::parse_configz`]. Best effort: any failure (refused, timeout, HTTP error,
/// not kube-proxy's JSON) is an `Err` with a one-line message, and callers fall back to the
/// ConfigMap.
pub async fn fetch_configz(client: &reqwest::Client, target: &Target, timeout: Duration) -> Result<ProxyConfig, SourceError> {
    let url = target.url("/configz");
    let fetched = async { text(&url, get_limited(client, &url, 1024 * 1024).await.map_err(|e| failure(&url, e))?) };
    let text = match tokio::time::timeout(timeout, fetched).await {
        Err(_) => return Err(SourceError::Config(format!("{url}: no answer within {:.1} s", timeout.as_secs_f64()))),
        Ok(Err(f)) => return Err(SourceError::Config(f.message)),
        Ok(Ok(t)) => t,
    };
    proxyconfig::parse_configz(&text).map_err(|e| SourceError::Config(format!("{url}: {e}")))
}

/// The ConfigMaps kube-proxy's configuration is looked for in, in order: kubeadm's
/// `kube-proxy` (key `config.conf`), then EKS's `kube-proxy-config` (key `config`).
pub const CONFIGMAPS: [(&str, &str); 2] = [("kube-proxy", "config.conf"), ("kube-proxy-config", "config")];

/// Reads kube-proxy's configuration from the first of [`CONFIGMAPS`] present in `namespace`.
/// Returns the source (`ConfigMap kube-system/kube-proxy`) and the parsed configuration.
///
/// Errors: the API call failed (RBAC needs `get configmaps` in the namespace), neither
/// ConfigMap has its key, or the text is not a valid KubeProxyConfiguration.
pub async fn read_proxy_configmap(client: &kube::Client, namespace: &str) -> Result<(String, ProxyConfig), SourceError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    for (name, key) in CONFIGMAPS {
        let cm = api.get_opt(name).await.map_err(|source| SourceError::Kube { what: format!("reading ConfigMap {namespace}/{name}"), source })?;
        let Some(text) = cm.and_then(|cm| cm.data).and_then(|mut d| d.remove(key)) else { continue };
        let source = format!("ConfigMap {namespace}/{name}");
        return proxyconfig::parse_kube_proxy_config(&text).map(|c| (source.clone(), c)).map_err(|e| SourceError::Config(format!("{source} key {key}: {e}")));
    }
    Err(SourceError::Config(format!("no ConfigMap kube-proxy (key config.conf) or kube-proxy-config (key config) in {namespace}")))
}

/// kube-proxy's minSyncPeriod and mode, from the best source available: `/configz` of the
/// first of `targets` that answers (at most three are tried), else the ConfigMap (when a
/// client is given), else the default 1 s. The result names its source and says why better
/// sources were skipped. With a client and no target at all (no kube-proxy pod), Cilium agent
/// pods are looked for first ([`detect_dataplane`]); when found the result carries the
/// [`Dataplane`] (mode `ebpf`) and its source is `Cilium agent pods`.
///
/// `/configz` holds the mode kube-proxy runs, already defaulted ([`ModeOrigin::Unknown`]): with
/// a client, the ConfigMap then says whether the mode was set or defaulted, when it names the
/// same mode (kube-proxy reads its configuration file there); otherwise the origin stays
/// unknown, and a ConfigMap that cannot be read adds no note (the values came from `/configz`).
///
/// [`Dataplane`]: proxyconfig::Dataplane
pub async fn resolve_proxy_config(
    http: &reqwest::Client,
    targets: &[Target],
    kube: Option<(&kube::Client, &Discovery)>,
    timeout: Duration,
) -> ResolvedProxyConfig {
    let mut notes = Vec::new();
    for t in targets.iter().take(3) {
        match fetch_configz(http, t, timeout).await {
            Ok(mut c) => {
                if let (ModeOrigin::Unknown, Some((client, discovery))) = (c.mode_origin, kube)
                    && let Ok((_, file)) = read_proxy_configmap(client, &discovery.namespace).await
                    && file.mode == c.mode
                {
                    c.mode_origin = file.mode_origin;
                }
                return ResolvedProxyConfig::from_config(c, format!("configz {}", t.node), notes);
            }
            Err(e) => notes.push(format!("configz: {e}")),
        }
    }
    if targets.is_empty() {
        notes.push("configz: no kube-proxy target".into());
        if let Some((client, discovery)) = kube {
            match detect_dataplane(client, discovery).await {
                Ok(Some(dataplane)) => {
                    return ResolvedProxyConfig { source: "Cilium agent pods".into(), notes, dataplane: Some(dataplane), ..ResolvedProxyConfig::default() };
                }
                Ok(None) => {}
                Err(e) => notes.push(e.to_string()),
            }
        }
    }
    if let Some((client, discovery)) = kube {
        let ns = discovery.namespace.as_str();
        match read_proxy_configmap(client, ns).await {
            Ok((source, c)) => return ResolvedProxyConfig::from_config(c, source, notes),
            Err(e) => notes.push(e.to_string()),
        }
    }
    ResolvedProxyConfig { notes, ..ResolvedProxyConfig::default() }
}
