//! The rolling measurement window: recent scrapes per node, so that every analysis uses the
//! delta of cumulative histogram buckets over (at least) the window rather than kube-proxy's
//! whole lifetime. Pure: the scraper records, the controller reads.

use crate::exposition::KubeProxyScrape;
use crate::model::{NodeInput, ProxyMode};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};

/// One successful scrape of a node.
#[derive(Debug, Clone)]
pub struct Sample {
    /// When it was taken, Unix seconds.
    pub at_unix_seconds: f64,
    /// The parsed scrape.
    pub scrape: KubeProxyScrape,
    /// `/proxyMode` answer, when read.
    pub proxy_mode: Option<ProxyMode>,
}

/// Why a node's last scrape failed.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeFailure {
    /// Short reason label: `connection_refused`, `timeout`, `http_status`, `parse`, `other`.
    pub reason: String,
    /// Full message, with a hint where one helps.
    pub message: String,
    /// When, Unix seconds.
    pub at_unix_seconds: f64,
}

/// A process-wide new revision (see [`MeasurementStore::revision`]).
fn next_revision() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Scrapes per node over a rolling window, plus the last failure of each failing node.
#[derive(Debug, Clone, Default)]
pub struct MeasurementStore {
    window_seconds: f64,
    nodes: BTreeMap<String, VecDeque<Sample>>,
    failures: BTreeMap<String, NodeFailure>,
    revision: u64,
}

impl MeasurementStore {
    /// An empty store analysing `window_seconds` (default 600).
    pub fn new(window_seconds: f64) -> Self {
        Self { window_seconds, ..Default::default() }
    }

    /// The window, seconds.
    pub fn window_seconds(&self) -> f64 {
        self.window_seconds
    }

    /// Records a successful scrape and clears the node's failure. Keeps every sample inside the
    /// window plus the newest one at or before the window's start (the baseline of the delta).
    pub fn record(&mut self, node: &str, sample: Sample) {
        self.revision = next_revision();
        self.failures.remove(node);
        let q = self.nodes.entry(node.to_string()).or_default();
        let now = sample.at_unix_seconds;
        q.push_back(sample);
        let start = now - self.window_seconds;
        while q.len() > 2 && q[1].at_unix_seconds <= start {
            q.pop_front();
        }
    }

    /// Records a failed scrape. The node's earlier samples stay (a transient failure does not
    /// lose the window), but it is reported as failed until its next success.
    pub fn record_failure(&mut self, node: &str, failure: NodeFailure) {
        self.failures.insert(node.to_string(), failure);
    }

    /// Drops nodes (and failures) not in `present` (kube-proxy pods that went away).
    pub fn retain_nodes(&mut self, present: &[String]) {
        self.revision = next_revision();
        self.nodes.retain(|n, _| present.contains(n));
        self.failures.retain(|n, _| present.contains(n));
    }

    /// The measurement generation of the samples: it changes whenever [`Self::inputs`] may
    /// (a sample recorded, nodes dropped), so an analysis of the inputs can be reused while it
    /// stays the same. Unique in the process: two stores never share a revision with samples.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Nodes whose last scrape failed, with why.
    pub fn failures(&self) -> &BTreeMap<String, NodeFailure> {
        &self.failures
    }

    /// Number of nodes with at least one sample.
    pub fn nodes_with_data(&self) -> usize {
        self.nodes.values().filter(|q| !q.is_empty()).count()
    }

    /// Time of the newest sample of any node, Unix seconds.
    pub fn last_scrape_unix_seconds(&self) -> Option<f64> {
        self.nodes.values().filter_map(|q| q.back()).map(|s| s.at_unix_seconds).reduce(f64::max)
    }

    /// The analysis inputs: per node, the newest sample and (when there are two or more) the
    /// oldest kept one as the earlier scrape. Failed nodes with old samples still contribute
    /// their last known window.
    pub fn inputs(&self) -> Vec<NodeInput> {
        self.nodes
            .iter()
            .filter_map(|(node, q)| {
                let later = q.back()?;
                let earlier = (q.len() >= 2).then(|| q.front()).flatten();
                Some(NodeInput {
                    node: node.clone(),
                    later: later.scrape.clone(),
                    earlier: earlier.map(|e| e.scrape.clone()),
                    proxy_mode: later.proxy_mode.or(earlier.and_then(|e| e.proxy_mode)),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: f64) -> Sample {
        Sample { at_unix_seconds: at, scrape: KubeProxyScrape::default(), proxy_mode: None }
    }

    #[test]
    fn keeps_baseline_at_window_start() {
        let mut m = MeasurementStore::new(600.0);
        for t in (0..=1200).step_by(30) {
            m.record("a", s(f64::from(t)));
        }
        let q = &m.nodes["a"];
        // window start = 600: the baseline is the sample at 600, the newest 1200
        assert_eq!(q.front().unwrap().at_unix_seconds, 600.0);
        assert_eq!(q.back().unwrap().at_unix_seconds, 1200.0);
        assert_eq!(m.inputs().len(), 1);
        assert!(m.inputs()[0].earlier.is_some());
    }

    #[test]
    fn single_sample_is_lifetime_and_failures_clear_on_success() {
        let mut m = MeasurementStore::new(600.0);
        m.record_failure("b", NodeFailure { reason: "timeout".into(), message: "t".into(), at_unix_seconds: 1.0 });
        m.record("a", s(10.0));
        assert!(m.inputs()[0].earlier.is_none());
        assert_eq!(m.failures().len(), 1);
        m.record("b", s(11.0));
        assert!(m.failures().is_empty());
        m.retain_nodes(&["b".into()]);
        assert_eq!(m.nodes_with_data(), 1);
    }
}
