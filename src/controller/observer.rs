//! The operator's side of the observer (adapter): while removals are open
//! ([`crate::core::removals::RemovalStore`], opened by the Service index as it joins each pod's
//! deletion with its endpoint change), every [`ROUND_INTERVAL`] each node agent is asked to watch
//! all of them (`POST /removals`: [`crate::agent_contract::observer`]), its records are moved to
//! the operator's clock ([`ClockOffset`]: within half the request's round trip, taken late) and
//! reported into the store, and the removals every node that answered within [`RECENT_ANSWER`]
//! has dropped (or cannot read), or whose deadline passed, are closed. Each agent is sent what
//! its protocol reads, and with protocol 3 only a changed set and only the changed records
//! cross the wire ([`crate::agent_contract::observer`]). The leader alone asks; nothing is sent while no removal is open. A closed
//! removal bumps the measurement generation, so every policy is reconciled with it.

use super::service_index::{ClusterIndex, now_unix};
use crate::agent_contract::observer::{AnswerMark, ObserveRequest, UNREAD_AFTER_FAILED_READS, WatchRecord, WatchRequest, WatchState};
use crate::core::removals::{ClockOffset, NodeReport};
use crate::core::removals::{ServicePort, Watch};
use crate::runtime::Shared;
use crate::sources::agent_client::{AgentSource, observe_agent_body};
use crate::sources::targets::Target;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The pause between two rounds of requests to the agents.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(250);
/// A node whose agent answered within this long holds each open removal until it reports it
/// removed or unread (an agent that stops answering for longer no longer holds them: its
/// removals then close on the other nodes' reports, or at their deadline).
pub const RECENT_ANSWER: Duration = Duration::from_secs(5);
/// A failing agent is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// What an agent's record says, its times moved to the operator's clock by `clock`: removed,
/// held, unread (no successful read and [`UNREAD_AFTER_FAILED_READS`] failed ones: its reader
/// cannot run), or not read yet (the answer came before the agent's
/// first round for it, or its first failed reads).
pub fn report_of(record: &WatchRecord, clock: &ClockOffset) -> NodeReport {
    match (record.state, record.first_without_unix_seconds) {
        (WatchState::Removed, Some(fw)) => {
            NodeReport::Removed { last_with: record.last_with_unix_seconds.map(|t| clock.early(t)), first_without: clock.late(fw) }
        }
        _ if record.reads == 0 && record.failed_reads >= UNREAD_AFTER_FAILED_READS => NodeReport::Unread,
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

/// What the operator knows of one agent from its last answer: its protocol, the set it holds
/// and the mark to ask the changes since (protocol 3).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct AgentState {
    protocol: u32,
    set_id: Option<u64>,
    mark: Option<AnswerMark>,
}

/// The four request bodies of a round (their order indexes [`Requests`]' bodies).
#[derive(Debug, Clone, Copy)]
enum Body {
    /// The whole set without the deletions' ages.
    Protocol1,
    /// The whole set with them.
    Protocol2,
    /// The whole set with them and the set's id.
    WholeSet,
    /// Only the set's id: the agent holds it.
    SameSet,
}

/// One round's requests, each serialized at most once and only when some agent needs it: the
/// whole set without the deletions' ages (protocol 1, or an agent not asked yet), with them
/// (protocol 2), with them and the set's id (protocol 3), and the short one that keeps the set
/// (protocol 3, an agent that holds it). An agent refuses a field it does not know.
struct Requests<'a> {
    watches: &'a [Watch<'a>],
    set_id: u64,
    bodies: [std::sync::OnceLock<Result<bytes::Bytes, String>>; 4],
}

impl<'a> Requests<'a> {
    fn new(watches: &'a [Watch<'a>], set_id: u64) -> Self {
        Self { watches, set_id, bodies: Default::default() }
    }

    /// The body of `kind`, serialized at its first use this round.
    fn body(&self, kind: Body) -> Result<bytes::Bytes, String> {
        let (ages, set_id, same_set) = match kind {
            Body::Protocol1 => (false, None, false),
            Body::Protocol2 => (true, None, false),
            Body::WholeSet => (true, Some(self.set_id), false),
            Body::SameSet => (true, Some(self.set_id), true),
        };
        self.bodies[kind as usize]
            .get_or_init(|| {
                let watches = if same_set { &[][..] } else { self.watches };
                let request = ObserveRequest {
                    watches: watches
                        .iter()
                        .map(|(service, endpoint, remaining_seconds, age)| WatchRequest {
                            service: (*service).clone(),
                            endpoint: *endpoint,
                            remaining_seconds: *remaining_seconds,
                            deletion_age_seconds: ages.then_some(*age),
                        })
                        .collect(),
                    set_id,
                    same_set,
                };
                serde_json::to_vec(&request).map(bytes::Bytes::from).map_err(|e| e.to_string())
            })
            .clone()
    }

    /// The body for an agent of `state` (None: not asked yet), and the mark to send as `since`.
    fn for_agent(&self, state: Option<&AgentState>) -> (Result<bytes::Bytes, String>, Option<AnswerMark>) {
        match state {
            Some(s) if s.protocol >= 3 => (self.body(if s.set_id == Some(self.set_id) { Body::SameSet } else { Body::WholeSet }), s.mark),
            Some(s) if s.protocol == 2 => (self.body(Body::Protocol2), None),
            _ => (self.body(Body::Protocol1), None),
        }
    }
}

/// The set of watches and its id: a new id whenever the set's removals change.
struct WatchSet {
    /// Each removal: its Service port, endpoint, and deletion (milliseconds, the operator's
    /// clock), so that another removal of the same endpoint is another set.
    keys: Vec<(ServicePort, std::net::IpAddr, i64)>,
    id: u64,
}

impl WatchSet {
    /// A first id unlikely to match a set an agent holds from an earlier operator (which a
    /// first request replaces anyway: an agent not asked yet is sent protocol 1's).
    fn new() -> Self {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Self { keys: Vec::new(), id: nanos }
    }

    /// The id of `watches`' set, their ages taken at `now` (unix seconds).
    fn id_of(&mut self, watches: &[Watch<'_>], now: f64) -> u64 {
        let mut keys: Vec<(ServicePort, std::net::IpAddr, i64)> =
            watches.iter().map(|(s, ip, _, age)| ((*s).clone(), *ip, ((now - age) * 1000.0).round() as i64)).collect();
        keys.sort();
        if keys != self.keys {
            self.keys = keys;
            self.id = self.id.wrapping_add(1);
        }
        self.id
    }
}

/// Asks every agent to watch `requests`' removals and reports their records into `cluster`;
/// returns the nodes whose agent answered. `states` holds what each agent's last answer said.
async fn ask_agents(
    cluster: &ClusterIndex,
    agents: &AgentSource,
    targets: &mut CachedTargets,
    requests: &Requests<'_>,
    states: &mut HashMap<String, AgentState>,
    warnings: &mut Warnings,
) -> BTreeSet<String> {
    let mut answering = BTreeSet::new();
    let client = match agents.client() {
        Ok(c) => c,
        Err(e) => {
            warnings.warn("client certificate", &e.to_string());
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
    let asks: Vec<_> = found
        .values()
        .map(|t| {
            let (client, (body, since)) = (client.clone(), requests.for_agent(states.get(&t.node)));
            async move {
                let answer = match body {
                    Ok(body) => observe_agent_body(&client, t, body, since).await.map_err(|e| e.to_string()),
                    Err(e) => Err(format!("serializing the request: {e}")),
                };
                (t.node.clone(), answer)
            }
        })
        .collect();
    for (node, answer) in futures::future::join_all(asks).await {
        let o = match answer {
            Ok(o) => o,
            Err(e) => {
                // what it speaks is asked again: protocol 1's request, which every agent reads
                // (an agent rolled back to an older protocol refuses the newer fields)
                states.remove(&node);
                warnings.warn(&node, &e);
                continue;
            }
        };
        let r = &o.response;
        tracing::trace!(%node, records = r.records.len(), complete = r.complete, set_id = ?r.set_id, mark = ?r.mark, states = ?r.records.iter().map(|x| (x.endpoint, x.state, x.reads, x.failed_reads)).collect::<Vec<_>>(), "observer answer");
        states.insert(node.clone(), AgentState { protocol: r.protocol, set_id: r.set_id, mark: r.mark });
        let clock = ClockOffset::of(o.response.agent_unix_seconds, o.sent_unix_seconds, o.received_unix_seconds);
        cluster.with_removals(|s| {
            if let Some(plane) = &o.response.data_plane {
                s.set_data_plane(&node, plane);
            }
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
    let (mut targets, mut warnings, mut states, mut set) = (CachedTargets::default(), Warnings::default(), HashMap::new(), WatchSet::new());
    let mut recent: HashMap<String, Instant> = HashMap::new();
    loop {
        tokio::select! {
            () = shared.stop.cancelled() => return,
            () = tokio::time::sleep(ROUND_INTERVAL) => {}
        }
        if !*shared.leader.borrow() {
            continue;
        }
        let now = now_unix();
        // the watches are copied out of the store: it is locked only briefly
        let owned: Vec<(ServicePort, std::net::IpAddr, f64, f64)> =
            cluster.with_removals(|s| s.watches(now).into_iter().map(|(service, ip, remaining, age)| (service.clone(), ip, remaining, age)).collect());
        let watches: Vec<Watch<'_>> = owned.iter().map(|(service, ip, remaining, age)| (service, *ip, *remaining, *age)).collect();
        let answering = if watches.is_empty() {
            // the next set gets a new id even if it holds the same keys (another removal of the
            // same endpoint): the agents are sent it whole
            set.id_of(&[], now);
            BTreeSet::new()
        } else {
            let requests = Requests::new(&watches, set.id_of(&watches, now));
            ask_agents(&cluster, &agents, &mut targets, &requests, &mut states, &mut warnings).await
        };
        // a node that answered within RECENT_ANSWER holds a removal open until it reports it
        // removed (or unread), even through a round it missed: a removal is never closed on the
        // other nodes' word while one that reads was slow to answer once
        let at = Instant::now();
        recent.extend(answering.into_iter().map(|n| (n, at)));
        recent.retain(|_, t| t.elapsed() < RECENT_ANSWER);
        let nodes: BTreeSet<String> = recent.keys().cloned().collect();
        let closed = cluster.with_removals(|s| s.close(now_unix(), &nodes));
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
        assert_eq!(report_of(&r, &clock), NodeReport::NotYetRead, "two failed reads (an absent chain while kube-proxy rewrites): not yet");
        r.failed_reads = 3;
        assert_eq!(report_of(&r, &clock), NodeReport::Unread, "only failed reads: the node says nothing");
    }

    #[test]
    fn each_agent_is_sent_what_its_protocol_reads_and_a_known_set_is_not_sent_again() {
        let service = crate::core::removals::test_port("web");
        let watches = [(&service, "10.244.1.2".parse().unwrap(), 59.0, 1.25)];
        let requests = Requests::new(&watches, 7);
        let parse = |b: Result<bytes::Bytes, String>| serde_json::from_slice::<ObserveRequest>(&b.unwrap()).unwrap();
        let state = |protocol, set_id, mark| AgentState { protocol, set_id, mark };
        let (first, since) = requests.for_agent(None);
        let first = parse(first);
        assert_eq!((first.watches[0].deletion_age_seconds, first.set_id, since), (None, None, None), "an agent not asked yet: protocol 1");
        assert_eq!(parse(requests.for_agent(Some(&state(1, None, None))).0).watches[0].deletion_age_seconds, None);
        let v2 = parse(requests.for_agent(Some(&state(2, None, None))).0);
        assert_eq!((v2.watches[0].deletion_age_seconds, v2.set_id), (Some(1.25), None), "protocol 2 refuses setId");
        let mark = Some(AnswerMark { epoch: 3, generation: 9 });
        let (whole, since) = requests.for_agent(Some(&state(3, Some(6), mark)));
        let whole = parse(whole);
        assert_eq!((whole.watches.len(), whole.set_id, whole.same_set, since), (1, Some(7), false, mark), "another set held: the whole set");
        let (same, since) = requests.for_agent(Some(&state(3, Some(7), mark)));
        let same = parse(same);
        assert_eq!((same.watches.len(), same.set_id, same.same_set, since), (0, Some(7), true, mark), "the set held: only its id");
        same.check().unwrap();
        let mut set = WatchSet::new();
        let id = set.id_of(&watches, 100.0);
        assert_eq!(set.id_of(&[(&service, "10.244.1.2".parse().unwrap(), 58.0, 2.25)], 101.0), id, "the same removals, later: the same set");
        let again = set.id_of(&[(&service, "10.244.1.2".parse().unwrap(), 59.0, 0.5)], 130.0);
        assert_ne!(again, id, "the same endpoint deleted again: another set");
        assert_ne!(set.id_of(&[], 131.0), again, "another set");
    }
}
