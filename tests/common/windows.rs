//! W computed by a test itself from the real kube-proxies' scrapes, with native and with classic
//! histograms from the SAME two scrapes (tests/e2e_deploy.rs): the comparison the sizing model
//! is recalibrated on. The scrapes ask for protobuf first, as the operator does, so a 1.37
//! kube-proxy answers with both kinds in one body.

use super::rules::RealNode;
use safe_termination::core::control_plane::LagDistribution;
use safe_termination::core::exposition::{ACCEPT_PROTOBUF_FIRST, KubeProxyScrape, parse_scrape};
use safe_termination::core::model::{self, HistogramPreference, NodeInput, NodeWindow};
use serde_json::{Value, json};

/// One scrape of every real node's kube-proxy: (node, scrape); a Cilium node has none and is left
/// out. Panics when a node's network namespace is missing (its 10.x address would leave the
/// machine) or its kube-proxy does not answer.
pub async fn scrape_real_nodes(nodes: &[RealNode]) -> Vec<(String, KubeProxyScrape)> {
    let client = reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)).build().unwrap();
    let mut out = Vec::new();
    for n in nodes.iter().filter(|n| !n.is_cilium()) {
        assert!(std::path::Path::new(&format!("/run/netns/{}", n.netns)).exists(), "{}: network namespace {} is missing", n.name, n.netns);
        let url = format!("http://{}:10249/metrics", n.ip);
        let resp = client.get(&url).header("Accept", ACCEPT_PROTOBUF_FIRST).send().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_string);
        let body = resp.bytes().await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let scrape = parse_scrape(&body, content_type.as_deref()).unwrap_or_else(|e| panic!("{url}: {e}"));
        out.push((n.name.clone(), scrape));
    }
    out
}

/// W over the interval between two scrapes of every node, both kinds: per node the window and
/// p99 of each kind, and the cluster W (max over nodes) of each. `min_sync_period_seconds` is
/// kube-proxy's minSyncPeriod (1 s in both modes here). `lags` are the control plane's part of
/// the run's deletions as the test's own watches saw them (seconds): from the same scrapes, the
/// native W after them (`nativeWindowWithLagSeconds`, the convolution the operator computes) and
/// the sum of the two p99s (`nativeWindowSumOfP99sSeconds`), beside W without them.
pub fn windows_both_kinds(earlier: &[(String, KubeProxyScrape)], later: &[(String, KubeProxyScrape)], min_sync_period_seconds: f64, lags: &[f64]) -> Value {
    let lag = LagDistribution::from_samples(lags);
    let measure = |prefer: HistogramPreference, lag: Option<&LagDistribution>| -> Vec<NodeWindow> {
        later
            .iter()
            .map(|(node, l)| {
                let input =
                    NodeInput { node: node.clone(), later: l.clone(), earlier: earlier.iter().find(|(n, _)| n == node).map(|e| e.1.clone()), proxy_mode: None };
                model::measure_node_after(&input, min_sync_period_seconds, 1, Default::default(), prefer, lag)
            })
            .collect()
    };
    let (native, classic) = (measure(HistogramPreference::NativeFirst, None), measure(HistogramPreference::ClassicOnly, None));
    let with_lag = measure(HistogramPreference::NativeFirst, lag.as_ref());
    let cluster = |w: &[NodeWindow]| w.iter().filter_map(|n| n.propagation_window_seconds).reduce(f64::max);
    let nodes: serde_json::Map<String, Value> = native
        .iter()
        .zip(&classic)
        .map(|(n, c)| {
            (
                n.node.clone(),
                json!({
                    "histogramKind": n.histogram_kind,
                    "syncSamples": n.sync_samples,
                    "interval": n.interval,
                    "nativeSyncP99Seconds": n.sync_p99.filter(|q| q.kind == safe_termination::core::exposition::HistogramKind::Native).map(|q| q.seconds),
                    "classicSyncP99Seconds": c.sync_p99.map(|q| q.seconds),
                    "nativeNetworkProgrammingP99Seconds": n.network_programming_p99.filter(|q| q.kind == safe_termination::core::exposition::HistogramKind::Native).map(|q| q.seconds),
                    "classicNetworkProgrammingP99Seconds": c.network_programming_p99.map(|q| q.seconds),
                    "nativeWindowSeconds": n.propagation_window_seconds.filter(|_| n.histogram_kind == Some(safe_termination::core::exposition::HistogramKind::Native)),
                    "classicWindowSeconds": c.propagation_window_seconds,
                    // the model before minSyncPeriod + 2 x p99(sync), from the same native
                    // p99s: max(p99(network programming) - 1 s, minSyncPeriod + p99(sync))
                    "nativeWindowBeforeSeconds": n.sync_p99.filter(|q| q.kind == safe_termination::core::exposition::HistogramKind::Native).map(|s| {
                        let np = n.network_programming_p99.map_or(0.0, |q| q.seconds - model::TRIGGER_TIME_RESOLUTION_SECONDS);
                        np.max(min_sync_period_seconds + s.seconds)
                    }),
                }),
            )
        })
        .collect();
    let all_native = native.iter().all(|n| n.histogram_kind == Some(safe_termination::core::exposition::HistogramKind::Native));
    let lag_p99 = lag.as_ref().map(LagDistribution::p99_seconds);
    json!({
        "minSyncPeriodSeconds": min_sync_period_seconds,
        "controlPlaneLagSamples": lag.as_ref().map(LagDistribution::samples),
        "controlPlaneLagP99Seconds": lag_p99,
        "nativeWindowWithLagSeconds": if all_native && lag.is_some() { json!(cluster(&with_lag)) } else { Value::Null },
        "nativeWindowSumOfP99sSeconds": match (all_native, cluster(&native), lag_p99) {
            (true, Some(w), Some(l)) => json!(w + l),
            _ => Value::Null,
        },
        "nativeWindowSeconds": if all_native { json!(cluster(&native)) } else { Value::Null },
        "classicWindowSeconds": cluster(&classic),
        "nodes": nodes,
    })
}
