//! `--source auto`: which source measures a node. Pure: what each source gave for the node in,
//! the next source to try or the choice (and why) out; the fetching is in
//! [`super::scrape_loop::Fallbacks`].
//!
//! The order, per node ([`ORDER`]):
//! 1. **kube-proxy directly** (`http://<node IP>:10249`): no extra component, the same numbers;
//! 2. **the node's agent**, when one runs on the node: kube-proxy's numbers too, read on the
//!    node's loopback, for the common case of kube-proxy bound to `127.0.0.1` (kubeadm's
//!    default);
//! 3. **Prometheus**, when `--prometheus-url` is set: a window of the same series, but only as
//!    fresh and complete as Prometheus' own scrapes, so it comes last.
//!
//! Any failure of a source moves on to the next (a kube-proxy that answers with an error may be
//! a proxy in the way; the agent then reports what kube-proxy itself said). A node whose every
//! source failed or was unavailable is reported with each source's story and, when kube-proxy
//! refused and no agent runs there, the fixes.

use crate::core::measure::{NodeFailure, NodeSource};

/// The order in which `--source auto` tries the sources of a node.
pub const ORDER: [NodeSource; 3] = [NodeSource::KubeProxy, NodeSource::Agent, NodeSource::Prometheus];

/// What one source gave for a node in this cycle; `T` is the measurement (a sample).
#[derive(Debug, Clone, PartialEq)]
pub enum Tried<T> {
    /// Not tried yet.
    Pending,
    /// Cannot be tried for this node, and why: no agent pod on the node, no client certificate
    /// for the agents, no `--prometheus-url`.
    Unavailable(String),
    /// Tried and failed.
    Failed(NodeFailure),
    /// Tried and measured.
    Got(T),
}

/// What each source of [`ORDER`] gave for one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Attempts<T> {
    /// kube-proxy scraped directly.
    pub kube_proxy: Tried<T>,
    /// The node's agent.
    pub agent: Tried<T>,
    /// Prometheus.
    pub prometheus: Tried<T>,
}

impl<T> Attempts<T> {
    /// Nothing tried yet; the agent and Prometheus `Unavailable` with their reason when given.
    pub fn new(agent_unavailable: Option<String>, prometheus_unavailable: Option<String>) -> Self {
        Self {
            kube_proxy: Tried::Pending,
            agent: agent_unavailable.map_or(Tried::Pending, Tried::Unavailable),
            prometheus: prometheus_unavailable.map_or(Tried::Pending, Tried::Unavailable),
        }
    }

    /// What `source` gave (`File` is no source of `auto`; it reads as Prometheus' slot).
    pub fn get(&self, source: NodeSource) -> &Tried<T> {
        match source {
            NodeSource::KubeProxy => &self.kube_proxy,
            NodeSource::Agent => &self.agent,
            NodeSource::Prometheus | NodeSource::File => &self.prometheus,
        }
    }

    /// Records what `source` gave.
    pub fn set(&mut self, source: NodeSource, tried: Tried<T>) {
        match source {
            NodeSource::KubeProxy => self.kube_proxy = tried,
            NodeSource::Agent => self.agent = tried,
            NodeSource::Prometheus | NodeSource::File => self.prometheus = tried,
        }
    }

    /// Takes the measurement of `source` out (leaving `Pending`), when it has one.
    pub fn take(&mut self, source: NodeSource) -> Option<T> {
        let slot = match source {
            NodeSource::KubeProxy => &mut self.kube_proxy,
            NodeSource::Agent => &mut self.agent,
            NodeSource::Prometheus | NodeSource::File => &mut self.prometheus,
        };
        match std::mem::replace(slot, Tried::Pending) {
            Tried::Got(v) => Some(v),
            other => {
                *slot = other;
                None
            }
        }
    }
}

/// The next step for one node under `--source auto`.
#[derive(Debug, Clone, PartialEq)]
pub enum NextStep {
    /// Fetch this source next, then ask for the next step again.
    Try(NodeSource),
    /// Measured through `source`; `passed_over` says why the sources before it were not used
    /// (`kube-proxy: <failure>`), for the logs.
    Chosen {
        /// The source whose measurement is used.
        source: NodeSource,
        /// The earlier sources' failures or unavailability, one line each.
        passed_over: Vec<String>,
    },
    /// No source measured the node: the failure to report. Its reason is the last failed
    /// source's (the one that was expected to work); its message tells every source's story,
    /// joined by `; `, and the fix when kube-proxy refused and no agent runs on the node.
    Failed(NodeFailure),
}

/// The hint added when kube-proxy refused the direct scrape and no agent runs on the node.
pub const NO_AGENT_FIX: &str = "to measure this node without reconfiguring kube-proxy, run the safe-termination agent on it (Helm value agent.enabled)";

/// The next step for a node: the first source of [`ORDER`] not tried yet (sources before it
/// all failed or unavailable), the first that measured, or the failure when none is left.
pub fn next_step<T>(attempts: &Attempts<T>) -> NextStep {
    let mut story = Vec::new();
    let mut last_failure: Option<&NodeFailure> = None;
    for source in ORDER {
        match attempts.get(source) {
            Tried::Pending => return NextStep::Try(source),
            Tried::Got(_) => return NextStep::Chosen { source, passed_over: story },
            Tried::Unavailable(why) => story.push(format!("{}: {why}", source.as_str())),
            Tried::Failed(f) => {
                story.push(format!("{}: {}", source.as_str(), f.message));
                last_failure = Some(f);
            }
        }
    }
    let refused = matches!(&attempts.kube_proxy, Tried::Failed(f) if f.reason == crate::core::measure::reason::CONNECTION_REFUSED);
    if refused && matches!(attempts.agent, Tried::Unavailable(_)) {
        story.push(NO_AGENT_FIX.to_string());
    }
    let at = ORDER
        .iter()
        .filter_map(|s| match attempts.get(*s) {
            Tried::Failed(f) => Some(f.at_unix_seconds),
            _ => None,
        })
        .fold(0.0, f64::max);
    NextStep::Failed(NodeFailure {
        reason: last_failure.map_or_else(|| crate::core::measure::reason::OTHER.to_string(), |f| f.reason.clone()),
        message: story.join("; "),
        at_unix_seconds: at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::measure::reason;

    fn failed(reason: &str, message: &str, at: f64) -> Tried<u8> {
        Tried::Failed(NodeFailure { reason: reason.into(), message: message.into(), at_unix_seconds: at })
    }

    #[test]
    fn kube_proxy_first_then_the_agent_then_prometheus() {
        let mut a: Attempts<u8> = Attempts::new(None, None);
        assert_eq!(next_step(&a), NextStep::Try(NodeSource::KubeProxy));
        a.kube_proxy = Tried::Got(1);
        assert_eq!(next_step(&a), NextStep::Chosen { source: NodeSource::KubeProxy, passed_over: vec![] }, "the agent is not asked");
        a.kube_proxy = failed(reason::CONNECTION_REFUSED, "refused", 1.0);
        assert_eq!(next_step(&a), NextStep::Try(NodeSource::Agent));
        a.agent = Tried::Got(2);
        assert_eq!(next_step(&a), NextStep::Chosen { source: NodeSource::Agent, passed_over: vec!["kube-proxy: refused".into()] });
        a.agent = failed(reason::TIMEOUT, "agent timed out", 2.0);
        assert_eq!(next_step(&a), NextStep::Try(NodeSource::Prometheus));
        a.prometheus = Tried::Got(3);
        assert_eq!(
            next_step(&a),
            NextStep::Chosen { source: NodeSource::Prometheus, passed_over: vec!["kube-proxy: refused".into(), "agent: agent timed out".into()] }
        );
        assert_eq!(a.take(NodeSource::Prometheus), Some(3));
        assert_eq!(a.take(NodeSource::Agent), None);
        assert!(matches!(a.agent, Tried::Failed(_)), "a failure is not taken");
    }

    #[test]
    fn unavailable_sources_are_skipped() {
        let mut a: Attempts<u8> = Attempts::new(Some("no agent pod on this node".into()), None);
        a.kube_proxy = failed(reason::TIMEOUT, "t", 1.0);
        assert_eq!(next_step(&a), NextStep::Try(NodeSource::Prometheus));
        let mut b: Attempts<u8> = Attempts::new(None, Some("not configured (--prometheus-url)".into()));
        b.kube_proxy = failed(reason::TIMEOUT, "t", 1.0);
        b.agent = Tried::Got(1);
        assert_eq!(next_step(&b), NextStep::Chosen { source: NodeSource::Agent, passed_over: vec!["kube-proxy: t".into()] });
    }

    #[test]
    fn a_refused_node_without_an_agent_is_reported_with_the_fixes() {
        let mut a: Attempts<u8> = Attempts::new(Some("no agent pod on this node".into()), Some("not configured (--prometheus-url)".into()));
        a.kube_proxy = failed(reason::CONNECTION_REFUSED, "http://10.0.0.1:10249/metrics: connection refused (set metricsBindAddress ...)", 5.0);
        let NextStep::Failed(f) = next_step(&a) else { panic!() };
        assert_eq!(f.reason, reason::CONNECTION_REFUSED);
        assert_eq!(f.at_unix_seconds, 5.0);
        assert_eq!(
            f.message,
            format!(
                "kube-proxy: http://10.0.0.1:10249/metrics: connection refused (set metricsBindAddress ...); agent: no agent pod on this node; prometheus: not configured (--prometheus-url); {NO_AGENT_FIX}"
            )
        );
    }

    #[test]
    fn a_failed_agent_gives_the_reason_and_no_install_hint() {
        let mut a: Attempts<u8> = Attempts::new(None, Some("not configured".into()));
        a.kube_proxy = failed(reason::CONNECTION_REFUSED, "refused", 5.0);
        a.agent = failed(reason::OTHER, "agent https://10.0.0.1:10349: refused", 6.0);
        let NextStep::Failed(f) = next_step(&a) else { panic!() };
        assert_eq!((f.reason.as_str(), f.at_unix_seconds), (reason::OTHER, 6.0));
        assert_eq!(f.message, "kube-proxy: refused; agent: agent https://10.0.0.1:10349: refused; prometheus: not configured");
    }
}
