//! The operator's side of the observer (adapter): while removals are open
//! ([`crate::core::removals::RemovalStore`], opened by the Service index as it joins each pod's
//! deletion with its endpoint change), every [`ROUND_INTERVAL`] each node agent is asked to watch
//! all of them (`POST /removals`: [`crate::agent_contract::observer`]), its records are moved to
//! the operator's clock ([`ClockOffset`]: within half the request's round trip, taken late) and
//! reported into the store, and the removals every node has dropped, or whose deadline passed,
//! are closed. The leader alone asks; nothing is sent while no removal is open. A closed
//! removal bumps the measurement generation, so every policy is reconciled with it.

use super::service_index::{ClusterIndex, now_unix};
use crate::agent_contract::observer::{ObserveRequest, WatchRecord, WatchRequest, WatchState};
use crate::core::removals::Watch;
use crate::core::removals::{ClockOffset, NodeReport};
use crate::runtime::Shared;
use crate::sources::agent_client::{AgentSource, observe_agent_body};
use crate::sources::targets::Target;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The pause between two rounds of requests to the agents.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(250);
/// A failing agent is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What an agent's record says, its times moved to the operator's clock by `clock`: removed,
/// held, unread (only failed reads: its reader cannot run, or the chain is not there), or not
/// read yet (the answer came before the agent's first round for it).
pub fn report_of(record: &WatchRecord, clock: &ClockOffset) -> NodeReport {
    match (record.state, record.first_without_unix_seconds) {
        (WatchState::Removed, Some(fw)) => {
            NodeReport::Removed { last_with: record.last_with_unix_seconds.map(|t| clock.early(t)), first_without: clock.late(fw) }
        }
        _ if record.reads == 0 && record.failed_reads > 0 => NodeReport::Unread,
        _ if record.reads == 0 => NodeReport::NotYetRead,
        _ => NodeReport::Held { last_with: record.last_with_unix_seconds.map(|t| clock.early(t)) },
    }
}

/// How long the agents found are reused: with agent pods, finding them is a list of pods, which a
/// 250 ms round would otherwise repeat four times a second while removals are open.
pub const TARGETS_TTL: Duration = Duration::from_secs(10);

/// The agents last found, and when.
#[derive(Default)]
struct CachedTargets(Option<(Instant, BTreeMap<String, Target>)>);

impl CachedTargets {
    /// The agents, found again when the last find is older than [`TARGETS_TTL`].
    async fn get(&mut self, agents: &AgentSource) -> Result<BTreeMap<String, Target>, crate::sources::error::SourceError> {
        if let Some((at, t)) = &self.0
            && at.elapsed() < TARGETS_TTL
        {
            return Ok(t.clone());
        }
        let t = agents.targets().await?;
        self.0 = Some((Instant::now(), t.clone()));
        Ok(t)
    }
}

/// Logs a failing agent (or the client, or the agents' discovery) at most every [`WARN_EVERY`].
#[derive(Default)]
struct Warnings(HashMap<String, Instant>);

impl Warnings {
    fn warn(&mut self, what: &str, error: &str) {
        if self.0.get(what).is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.0.insert(what.to_string(), Instant::now());
            tracing::warn!(agent = what, error, "observer: an agent could not be asked");
        }
    }
}

/// The request to every agent, serialized once per protocol: with the deletions' ages
/// (protocol 2) for the agents whose last answer said they read them, without for the others
/// (an agent refuses a field it does not know; one not asked yet is sent protocol 1's).
struct Requests {
    with_ages: bytes::Bytes,
    without: bytes::Bytes,
}

impl Requests {
    fn of(watches: &[Watch<'_>]) -> Result<Self, serde_json::Error> {
        let request = |ages: bool| ObserveRequest {
            watches: watches
                .iter()
                .map(|(service, endpoint, remaining_seconds, age)| WatchRequest {
                    service: (*service).clone(),
                    endpoint: *endpoint,
                    remaining_seconds: *remaining_seconds,
                    deletion_age_seconds: ages.then_some(*age),
                })
                .collect(),
        };
        Ok(Self { with_ages: serde_json::to_vec(&request(true))?.into(), without: serde_json::to_vec(&request(false))?.into() })
    }

    fn for_protocol(&self, protocol: Option<&u32>) -> bytes::Bytes {
        if protocol.is_some_and(|p| *p >= 2) { self.with_ages.clone() } else { self.without.clone() }
    }
}

/// Asks every agent to watch `requests`' removals and reports their records into `cluster`;
/// returns the nodes whose agent answered. `protocols` holds each agent's protocol from its
/// last answer.
async fn ask_agents(
    cluster: &ClusterIndex,
    agents: &AgentSource,
    targets: &mut CachedTargets,
    requests: &Requests,
    protocols: &mut HashMap<String, u32>,
    warnings: &mut Warnings,
) -> BTreeSet<String> {
    let mut answering = BTreeSet::new();
    let client = match agents.client() {
        Ok(c) => c,
        Err(e) => {
            warnings.warn("client certificate", &e);
            return answering;
        }
    };
    let found = match targets.get(agents).await {
        Ok(t) => t,
        Err(e) => {
            warnings.warn("finding the agents", &e.to_string());
            return answering;
        }
    };
    let asks = found.values().map(|t| {
        let (client, body) = (client.clone(), requests.for_protocol(protocols.get(&t.node)));
        async move { (t.node.clone(), observe_agent_body(&client, t, body).await) }
    });
    for (node, answer) in futures::future::join_all(asks).await {
        let o = match answer {
            Ok(o) => o,
            Err(e) => {
                warnings.warn(&node, &e);
                continue;
            }
        };
        protocols.insert(node.clone(), o.response.protocol);
        let clock = ClockOffset::of(o.response.agent_unix_seconds, o.sent_unix_seconds, o.received_unix_seconds);
        cluster.with_removals(|s| {
            for r in &o.response.records {
                s.report(&node, &r.service, r.endpoint, report_of(r, &clock));
            }
        });
        answering.insert(node);
    }
    answering
}

/// Runs the observer until `shared.stop`: asks `agents` while removals are open in `cluster`.
pub async fn run(cluster: Arc<ClusterIndex>, agents: AgentSource, shared: Shared) {
    cluster.start_observing();
    let (mut targets, mut warnings, mut protocols) = (CachedTargets::default(), Warnings::default(), HashMap::new());
    loop {
        tokio::select! {
            () = shared.stop.cancelled() => return,
            () = tokio::time::sleep(ROUND_INTERVAL) => {}
        }
        if !*shared.leader.borrow() {
            continue;
        }
        let now = now_unix();
        let requests = cluster.with_removals(|s| {
            let watches = s.watches(now);
            (!watches.is_empty()).then(|| Requests::of(&watches))
        });
        let answering = match requests {
            None => BTreeSet::new(),
            Some(Ok(requests)) => ask_agents(&cluster, &agents, &mut targets, &requests, &mut protocols, &mut warnings).await,
            Some(Err(e)) => {
                warnings.warn("serializing the request", &e.to_string());
                BTreeSet::new()
            }
        };
        let closed = cluster.with_removals(|s| s.close(now_unix(), &answering));
        if closed > 0 {
            tracing::debug!(closed, "observed removals closed");
            shared.generation.send_modify(|g| *g += 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::removals::ServicePort;

    #[test]
    fn a_record_is_a_report_on_the_operators_clock() {
        let service = ServicePort {
            namespace: "ns".into(),
            name: "web".into(),
            port_name: "".into(),
            protocol: "TCP".into(),
            cluster_ip: "10.96.0.9".parse().unwrap(),
            port: 80,
        };
        let mut r = WatchRecord {
            service,
            endpoint: "10.244.1.2".parse().unwrap(),
            state: WatchState::Removed,
            last_with_unix_seconds: Some(101.0),
            first_without_unix_seconds: Some(101.5),
            reads: 3,
            failed_reads: 0,
            last_error: None,
        };
        let clock = ClockOffset::of(100.0, 99.0, 99.2);
        let NodeReport::Removed { last_with, first_without } = report_of(&r, &clock) else { panic!("removed") };
        assert!((last_with.unwrap() - 100.0).abs() < 1e-9 && (first_without - 100.7).abs() < 1e-9, "{last_with:?} {first_without}");
        r.state = WatchState::Expired;
        assert_eq!(report_of(&r, &clock), NodeReport::Held { last_with: Some(100.0) });
        r.reads = 0;
        assert_eq!(report_of(&r, &clock), NodeReport::NotYetRead, "asked, not read yet: it holds the removal open");
        r.failed_reads = 2;
        assert_eq!(report_of(&r, &clock), NodeReport::Unread, "only failed reads: the node says nothing");
    }

    #[test]
    fn the_deletions_ages_go_only_to_agents_that_said_they_read_them() {
        let service = crate::core::removals::test_port("web");
        let requests = Requests::of(&[(&service, "10.244.1.2".parse().unwrap(), 59.0, 1.25)]).unwrap();
        let parse = |b: bytes::Bytes| serde_json::from_slice::<ObserveRequest>(&b).unwrap().watches[0].deletion_age_seconds;
        assert_eq!(parse(requests.for_protocol(None)), None, "an agent not asked yet");
        assert_eq!(parse(requests.for_protocol(Some(&1))), None, "an agent of protocol 1 refuses the field");
        assert_eq!(parse(requests.for_protocol(Some(&2))), Some(1.25));
    }
}
