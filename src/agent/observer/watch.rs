//! The agent's watches: which removals the operator asked it to watch, and what this node's
//! reads showed of each ([`Watches`], no I/O), and the loop that reads the data plane while any
//! watch is open ([`Observer`]).
//!
//! One read per Service port per round, then a pause of [`ROUND_INTERVAL`], or
//! [`PAUSE_PER_READ_TIME`] times the CPU time the round took (the agent's and its readers'
//! processes': [`cpu_seconds`]) when that is longer, cut short when a
//! request brings a new watch (its first read bounds its removal); a Service port whose watches
//! a request removed during a round is not read: a round reads only the Service ports with a watch neither removed nor expired, and nothing is
//! read while none is (the loop then waits for the next request, no timer). The bounds of a
//! removal follow `core::removals`: only a successful read counts; the removal happened after
//! the start of the last successful read that held the endpoint and by the end of the first
//! that did not.

use super::metrics::ObserverMetrics;
use super::{DataPlaneReader, ReadError, ServicePort};
use crate::agent_contract::observer::{AnswerMark, OBSERVER_PROTOCOL, ObserveRequest, ObserveResponse, UNREAD_AFTER_FAILED_READS, WatchRecord, WatchState};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The shortest pause between two rounds of reads.
pub const ROUND_INTERVAL: Duration = Duration::from_millis(50);
/// A round is followed by a pause of at least this many times the CPU time it took: the reads
/// take at most a fifth of one core however costly the data plane's listing is (`nft` loads the
/// whole table for any read: seconds at 12,000 Services). CPU time, not the round's length: an
/// `iptables -S` that waits while kube-proxy's restore holds the table costs nothing, and a
/// pause of 4 times that wait would widen every bound (3.8 s at 4,000 Services).
pub const PAUSE_PER_READ_TIME: u32 = 4;

/// A watch's record is sent again (protocol 3) when a read still holds the endpoint this long
/// after the last one sent, seconds: the operator's view of the last read holding it stays this
/// fresh, well within `core::removals::CENSORED_FRESH_SECONDS`.
pub const HELD_REFRESH_SECONDS: f64 = 2.0;

/// A watch of the same Service port and endpoint whose deletion is this far from the one kept,
/// seconds, is another removal (the estimates of one deletion differ by a request's latency).
pub const REDELETION_SECONDS: f64 = 1.0;

/// A watch the operator drops unremoved this close to its deadline, seconds, was dropped for
/// its deadline (censored): the operator's clock and its requests' latencies put the two
/// deadlines up to a moment apart.
pub const DROP_SLACK_SECONDS: f64 = 1.0;

/// The CPU seconds this process and its waited-for children (the readers' `iptables`) used so
/// far: `utime + stime + cutime + cstime` of `/proc/self/stat`, in clock ticks of 100 Hz (the
/// kernel's USER_HZ). None where `/proc` cannot be read (the pause then follows the round's
/// length).
pub fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // the fields after the parenthesised command: utime, stime, cutime, cstime are the 14th to
    // 17th of the line, the 12th to 15th after it
    let after: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: i64 = [11, 12, 13, 14].iter().map(|i| after.get(*i)?.parse::<i64>().ok()).sum::<Option<i64>>()?;
    Some(ticks as f64 / 100.0)
}

#[derive(Debug, Clone, Default)]
struct Entry {
    /// Agent unix seconds after which the watch expires.
    deadline: f64,
    /// The pod's deletion on the agent's clock (the earliest of receipt time less the request's
    /// `deletionAgeSeconds`: each estimate is late by its request's latency), when a request
    /// carried it.
    deletion: Option<f64>,
    /// Counted censored already (past its deadline, never removed).
    censored: bool,
    /// Its removal counted in the deletion-to-removed histogram already.
    counted: bool,
    /// The generation of its record's last change (protocol 3's answers of the changed records).
    changed: u64,
    /// The last read holding the endpoint when its record last changed.
    sent_with: Option<f64>,
    last_with: Option<f64>,
    first_without: Option<f64>,
    reads: u32,
    failed_reads: u32,
    last_error: Option<String>,
}

/// The watches of this agent, keyed by (Service port, endpoint).
#[derive(Debug, Default)]
pub struct Watches {
    entries: BTreeMap<(ServicePort, IpAddr), Entry>,
    /// Changes of the records so far: a new watch, its first successful read, its
    /// [`UNREAD_AFTER_FAILED_READS`]th failed read before any success, its removal, its expiry.
    generation: u64,
    /// The operator's id of the set kept (protocol 3).
    set_id: Option<u64>,
}

impl Watches {
    /// Replaces the watches with `request`'s at `now` (agent unix seconds): a watch already
    /// kept keeps its reads and takes the new deadline; one not in the request is forgotten.
    /// The request is checked by the caller ([`ObserveRequest::check`]).
    /// Returns how many watches are new; the deletion-to-removed windows (seconds) of the
    /// removals read before a request brought their deletion's age (an operator that had not
    /// yet heard this agent's protocol sends none), each given once; and how many watches the
    /// request dropped unremoved within [`DROP_SLACK_SECONDS`] of their deadline (censored; one
    /// dropped earlier, as for a deleted Service, is not).
    pub fn set(&mut self, request: &ObserveRequest, now: f64) -> (usize, Vec<f64>, usize) {
        let mut next = BTreeMap::new();
        let (mut new, mut late, mut censored) = (0, Vec::new(), 0);
        for w in &request.watches {
            let key = (w.service.clone(), w.endpoint);
            let same_removal = |e: &Entry| {
                // the same (Service port, endpoint) again after its watch's deadline, or with a
                // deletion more than REDELETION_SECONDS away from the one kept, is another
                // removal (a pod with a fixed IP replaced): it starts afresh, never inheriting
                // the earlier one's removal
                now < e.deadline && w.deletion_age_seconds.is_none_or(|age| e.deletion.is_none_or(|d| ((now - age) - d).abs() <= REDELETION_SECONDS))
            };
            let mut e = match self.entries.remove(&key).filter(same_removal) {
                Some(e) => e,
                None => {
                    new += 1;
                    self.generation += 1;
                    Entry { changed: self.generation, ..Entry::default() }
                }
            };
            e.deadline = now + w.remaining_seconds;
            if let Some(age) = w.deletion_age_seconds {
                let deletion = now - age;
                e.deletion = Some(e.deletion.map_or(deletion, |d: f64| d.min(deletion)));
            }
            if let (Some(first_without), Some(deletion), false) = (e.first_without, e.deletion, e.counted) {
                e.counted = true;
                late.push(first_without - deletion);
            }
            next.insert(key, e);
        }
        // a watch the request drops, unremoved, at its deadline: the operator's deadline passed
        // (its clock and this request's latency put it up to a moment before this agent's)
        for e in self.entries.values_mut().filter(|e| e.first_without.is_none() && !e.censored && now + DROP_SLACK_SECONDS >= e.deadline) {
            e.censored = true;
            censored += 1;
        }
        self.entries = next;
        self.set_id = request.set_id;
        (new, late, censored)
    }

    /// The operator's id of the set kept (protocol 3), None when it named none.
    pub fn set_id(&self) -> Option<u64> {
        self.set_id
    }

    /// The generation of the records' last change.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// `service` still has a watch to read at `now` (a request since the round began may have
    /// removed it).
    pub fn is_due(&self, service: &ServicePort, now: f64) -> bool {
        self.entries.iter().any(|((s, _), e)| s == service && e.first_without.is_none() && now < e.deadline)
    }

    /// The Service ports to read at `now`: those with a watch neither removed nor expired.
    pub fn due(&self, now: f64) -> Vec<ServicePort> {
        let ports: BTreeSet<&ServicePort> = self.entries.iter().filter(|(_, e)| e.first_without.is_none() && now < e.deadline).map(|((s, _), _)| s).collect();
        ports.into_iter().cloned().collect()
    }

    /// One read of `service`'s rules, started at `started` and ended at `ended` (agent unix
    /// seconds): a success moves each open watch of the port (held, or removed); the port's
    /// chain absent (`Ok(None)`) removes each watch a read held before; a failure is counted and
    /// says nothing.
    /// Returns the endpoints this read found removed: (endpoint, last read with it, this read's
    /// end, the deletion when known).
    pub fn apply(&mut self, service: &ServicePort, read: &Result<Option<BTreeSet<IpAddr>>, ReadError>, started: f64, ended: f64) -> Vec<Removed> {
        let mut removed = Vec::new();
        let generation = &mut self.generation;
        let mut change = |e: &mut Entry| {
            *generation += 1;
            e.changed = *generation;
        };
        for ((_, ip), e) in self.entries.iter_mut().filter(|((s, _), e)| s == service && e.first_without.is_none()) {
            match read {
                Ok(Some(held)) if held.contains(ip) => {
                    // the first read, and then a read at least HELD_REFRESH_SECONDS after the
                    // last one sent: a removal censored at its deadline is precise only when its
                    // last read holding the endpoint came close to it (core::removals)
                    if e.reads == 0 || e.sent_with.is_none_or(|t| started - t >= HELD_REFRESH_SECONDS) {
                        change(e);
                        e.sent_with = Some(started);
                    }
                    e.reads = e.reads.saturating_add(1);
                    e.last_with = Some(started);
                }
                Ok(Some(_)) => {
                    change(e);
                    e.reads = e.reads.saturating_add(1);
                    e.first_without = Some(ended);
                    e.counted = e.deletion.is_some();
                    removed.push(Removed { endpoint: *ip, last_with: e.last_with, first_without: ended, deletion: e.deletion });
                }
                // the port's chain gone after a read that held the endpoint: no rule sends it new
                // connections any more
                Ok(None) if e.last_with.is_some() => {
                    change(e);
                    e.reads = e.reads.saturating_add(1);
                    e.first_without = Some(ended);
                    e.counted = e.deletion.is_some();
                    removed.push(Removed { endpoint: *ip, last_with: e.last_with, first_without: ended, deletion: e.deletion });
                }
                // the chain absent before any read held the endpoint says nothing (a chain not yet
                // written, or a name that is not kube-proxy's): neither a read nor a failed one,
                // so the node keeps holding the removal open (it would not, unread), and the
                // record says why
                Ok(None) => {
                    e.last_error = Some("the Service port's chain is not in the rules".into());
                }
                Err(err) => {
                    e.failed_reads = e.failed_reads.saturating_add(1);
                    if e.reads == 0 && e.failed_reads == UNREAD_AFTER_FAILED_READS {
                        change(e);
                    }
                    e.last_error = Some(err.to_string());
                }
            }
        }
        removed
    }

    /// Marks the watches past their deadline at `now` that no read found removed (censored), each
    /// once; returns how many were newly marked.
    pub fn mark_censored(&mut self, now: f64) -> usize {
        let mut n = 0;
        for e in self.entries.values_mut().filter(|e| e.first_without.is_none() && !e.censored && now >= e.deadline) {
            e.censored = true;
            self.generation += 1;
            e.changed = self.generation;
            n += 1;
        }
        n
    }

    /// The records of every watch at `now`.
    pub fn records(&self, now: f64) -> Vec<WatchRecord> {
        self.records_since(now, None)
    }

    /// The records at `now` of the watches changed after generation `since` (every watch when
    /// None).
    pub fn records_since(&self, now: f64, since: Option<u64>) -> Vec<WatchRecord> {
        self.entries
            .iter()
            .filter(|(_, e)| since.is_none_or(|g| e.changed > g))
            .map(|((service, endpoint), e)| WatchRecord {
                service: service.clone(),
                endpoint: *endpoint,
                state: match e.first_without {
                    Some(_) => WatchState::Removed,
                    None if now >= e.deadline => WatchState::Expired,
                    None => WatchState::Held,
                },
                last_with_unix_seconds: e.last_with,
                first_without_unix_seconds: e.first_without,
                reads: e.reads,
                failed_reads: e.failed_reads,
                last_error: e.last_error.clone(),
            })
            .collect()
    }

    /// Watches kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No watch kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A removal one read found: the endpoint, the start of the last read with it, the end of this
/// read, and the pod's deletion when a request carried it (agent unix seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Removed {
    /// The endpoint.
    pub endpoint: IpAddr,
    /// Start of the last successful read that held it.
    pub last_with: Option<f64>,
    /// End of this read.
    pub first_without: f64,
    /// The pod's deletion.
    pub deletion: Option<f64>,
}

/// Finds this node's data plane reader, or says why there is none yet (asked again at the
/// next round).
pub type ReaderSource = Box<dyn FnMut() -> Result<Box<dyn DataPlaneReader>, String> + Send>;

/// The agent's observer: the watches, the reader, and the reading loop ([`Observer::run`]).
pub struct Observer {
    watches: Mutex<Watches>,
    wake: tokio::sync::Notify,
    /// The reader once found; taken out while a round reads.
    reader: Mutex<Option<Box<dyn DataPlaneReader>>>,
    /// How to find it (asked at each round until it gives one).
    find: Mutex<ReaderSource>,
    data_plane: Mutex<Option<&'static str>>,
    metrics: Mutex<ObserverMetrics>,
    /// Drawn at the start: a mark of another epoch is answered in full.
    epoch: u64,
    clock: fn() -> f64,
}

/// An epoch unlikely to repeat across the agent's restarts: the start time's nanoseconds and
/// the process id.
fn draw_epoch() -> u64 {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 40)
}

/// Now, unix seconds.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl Observer {
    /// An observer reading through the reader `find` gives (called until it gives one).
    pub fn new(find: ReaderSource) -> Arc<Self> {
        Arc::new(Self {
            watches: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            reader: Mutex::new(None),
            find: Mutex::new(find),
            data_plane: Mutex::new(None),
            metrics: Mutex::default(),
            epoch: draw_epoch(),
            clock: unix_now,
        })
    }

    /// Takes the operator's `request` (checked by the caller) and answers the records: all of
    /// them, or those changed since `since` when it is a mark of this agent's epoch (protocol 3;
    /// [`crate::agent_contract::observer`]). A `sameSet` request naming a set other than the one
    /// kept (this agent restarted) changes nothing: the answer's `setId` tells the operator to
    /// send the set.
    pub fn observe(&self, request: &ObserveRequest, since: Option<AnswerMark>) -> ObserveResponse {
        let now = (self.clock)();
        let mut w = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        let censored = w.mark_censored(now);
        let (new, late, dropped) = if request.same_set { (0, Vec::new(), 0) } else { w.set(request, now) };
        let since = since.filter(|m| m.epoch == self.epoch).map(|m| m.generation);
        let records = w.records_since(now, since);
        let (set_id, generation) = (w.set_id(), w.generation());
        drop(w);
        let mut metrics = self.metrics();
        metrics.censored(censored + dropped);
        for seconds in late {
            metrics.removed(seconds);
        }
        drop(metrics);
        // a new watch is read at the next round, not after the pause: its first read is what
        // bounds a removal early; repeats of known watches leave the pause alone
        if new > 0 {
            self.wake.notify_one();
        }
        ObserveResponse {
            protocol: OBSERVER_PROTOCOL,
            agent_unix_seconds: (self.clock)(),
            data_plane: self.data_plane.lock().unwrap_or_else(PoisonError::into_inner).map(str::to_string),
            records,
            set_id,
            mark: Some(AnswerMark { epoch: self.epoch, generation }),
            complete: since.is_none(),
        }
    }

    /// Reads while watches are due, until `stop`. The reader is found first, before any watch:
    /// asking kube-proxy's mode and listing its chains takes time the first removal cannot
    /// spare (a failure is asked again at the first due watch).
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let me = self.clone();
        let _ = tokio::task::spawn_blocking(move || me.prepare()).await;
        loop {
            // with none due, every watch is removed or past its deadline: each censored one is
            // counted here before the loop waits
            let (censored, due) = self.censored_and_due((self.clock)());
            self.metrics().censored(censored);
            if due.is_empty() {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = self.wake.notified() => continue,
                }
            }
            let me = self.clone();
            // the reads run the data plane's binaries: off the runtime's thread
            let (started, cpu) = (std::time::Instant::now(), cpu_seconds());
            let round = tokio::task::spawn_blocking(move || me.round(&due));
            if round.await.is_err() {
                tracing::warn!("a round of data plane reads panicked");
            }
            let spent = match (cpu, cpu_seconds()) {
                (Some(a), Some(b)) => Duration::from_secs_f64((b - a).max(0.0)),
                _ => started.elapsed(),
            };
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ROUND_INTERVAL.max(spent * PAUSE_PER_READ_TIME)) => {}
                () = self.wake.notified() => {}
            }
        }
    }

    /// Marks the watches censored at `now` and gives how many were, with the Service ports due.
    fn censored_and_due(&self, now: f64) -> (usize, Vec<ServicePort>) {
        let mut w = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
        (w.mark_censored(now), w.due(now))
    }

    /// The observer's counts, locked.
    fn metrics(&self) -> std::sync::MutexGuard<'_, ObserverMetrics> {
        self.metrics.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The observer's metrics ([`super::metrics`]) in the protobuf exposition when `protobuf`,
    /// else text; `node` labels every series when known.
    pub fn exposition(&self, protobuf: bool, node: Option<&str>) -> Vec<u8> {
        self.metrics().exposition(protobuf, node)
    }

    /// The reader: the one found before, or found now (the first time it is found, its data
    /// plane is what the answers name).
    fn take_reader(&self) -> Result<Box<dyn DataPlaneReader>, String> {
        if let Some(reader) = self.reader.lock().unwrap_or_else(PoisonError::into_inner).take() {
            return Ok(reader);
        }
        let reader = (self.find.lock().unwrap_or_else(PoisonError::into_inner))()?;
        *self.data_plane.lock().unwrap_or_else(PoisonError::into_inner) = Some(reader.data_plane());
        tracing::info!(data_plane = reader.data_plane(), "observer reading removals");
        Ok(reader)
    }

    /// Finds the reader and keeps it for the first round.
    fn prepare(&self) {
        match self.take_reader() {
            Ok(reader) => *self.reader.lock().unwrap_or_else(PoisonError::into_inner) = Some(reader),
            Err(how) => tracing::info!(%how, "observer: no data plane reader yet (asked again when a watch is due)"),
        }
    }

    /// One read of each Service port of `due`; without a reader, one failed read of each.
    fn round(&self, due: &[ServicePort]) {
        let mut reader = match self.take_reader() {
            Ok(reader) => reader,
            Err(how) => {
                let e: Result<Option<BTreeSet<IpAddr>>, ReadError> = Err(ReadError { command: "finding the data plane".into(), how });
                let now = (self.clock)();
                let mut w = self.watches.lock().unwrap_or_else(PoisonError::into_inner);
                for s in due {
                    w.apply(s, &e, now, now);
                }
                return;
            }
        };
        for s in due {
            let started = (self.clock)();
            // the watches may have been replaced since the round began
            if !self.watches.lock().unwrap_or_else(PoisonError::into_inner).is_due(s, started) {
                continue;
            }
            let read = reader.endpoints(s);
            let ended = (self.clock)();
            match &read {
                Err(e) => tracing::debug!(error = %e, "data plane read failed"),
                Ok(None) => tracing::debug!(service = %format!("{}/{}:{}", s.namespace, s.name, s.port_name), "the Service port's chain is not in the rules"),
                Ok(Some(_)) => {}
            }
            let removed = self.watches.lock().unwrap_or_else(PoisonError::into_inner).apply(s, &read, started, ended);
            let mut metrics = self.metrics();
            metrics.read(read.is_ok());
            for r in removed {
                if let Some(deletion) = r.deletion {
                    metrics.removed(r.first_without - deletion);
                }
                // the read bound of each removal on the agent's clock (None: no read held it; the
                // operator then bounds it from the deletion)
                let bound_seconds = r.last_with.map(|lw| r.first_without - lw);
                tracing::debug!(service = %format!("{}/{}:{}", s.namespace, s.name, s.port_name), endpoint = %r.endpoint, ?bound_seconds, read_seconds = ended - started, "removal read");
            }
            drop(metrics);
        }
        *self.reader.lock().unwrap_or_else(PoisonError::into_inner) = Some(reader);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_contract::observer::WatchRequest;

    use crate::core::removals::test_port as port;

    fn request(ips: &[(&str, &str)], remaining: f64) -> ObserveRequest {
        ObserveRequest {
            watches: ips
                .iter()
                .map(|(s, ip)| WatchRequest { service: port(s), endpoint: ip.parse().unwrap(), remaining_seconds: remaining, deletion_age_seconds: None })
                .collect(),
            set_id: None,
            same_set: false,
        }
    }

    fn ips(list: &[&str]) -> Result<Option<BTreeSet<IpAddr>>, ReadError> {
        Ok(Some(list.iter().map(|s| s.parse().unwrap()).collect()))
    }

    #[test]
    fn a_watch_is_removed_by_the_end_of_the_first_successful_read_without_it() {
        let mut w = Watches::default();
        w.set(&request(&[("web", "10.244.1.2"), ("web", "10.244.1.3"), ("api", "10.244.1.2")], 10.0), 100.0);
        assert_eq!(w.due(100.0), vec![port("api"), port("web")], "one read per Service port");
        w.apply(&port("web"), &ips(&["10.244.1.2", "10.244.1.3"]), 100.1, 100.12);
        w.apply(&port("web"), &Err(ReadError { command: "nft".into(), how: "exit status: 1".into() }), 100.2, 100.21);
        w.apply(&port("web"), &ips(&["10.244.1.3"]), 100.3, 100.32);
        let r = w.records(100.4);
        let web2 = r.iter().find(|r| r.service.name == "web" && r.endpoint.to_string() == "10.244.1.2").unwrap();
        assert_eq!((web2.state, web2.last_with_unix_seconds, web2.first_without_unix_seconds), (WatchState::Removed, Some(100.1), Some(100.32)));
        assert_eq!((web2.reads, web2.failed_reads), (2, 1), "a failed read is counted, never taken for a removal");
        assert_eq!(web2.last_error.as_deref(), Some("nft: exit status: 1"));
        let api = r.iter().find(|r| r.service.name == "api").unwrap();
        assert_eq!((api.state, api.reads), (WatchState::Held, 0), "another Service port's read says nothing of it");
        // a removed watch is read no more; the one still held is
        w.apply(&port("web"), &ips(&["10.244.1.2"]), 100.5, 100.52);
        assert_eq!(
            w.records(100.6).iter().find(|r| r.endpoint.to_string() == "10.244.1.2" && r.service.name == "web").unwrap().first_without_unix_seconds,
            Some(100.32)
        );
        assert_eq!(w.records(111.0).iter().find(|r| r.service.name == "api").unwrap().state, WatchState::Expired);
        assert!(w.due(111.0).is_empty(), "nothing is read past the deadlines");
    }

    #[test]
    fn a_chain_gone_after_a_read_that_held_the_endpoint_is_its_removal() {
        let absent = || Ok(None);
        let mut w = Watches::default();
        w.set(&request(&[("web", "10.244.1.2"), ("api", "10.244.1.3")], 10.0), 100.0);
        w.apply(&port("web"), &ips(&["10.244.1.2"]), 100.1, 100.12);
        w.apply(&port("web"), &absent(), 100.3, 100.31);
        w.apply(&port("api"), &absent(), 100.3, 100.31);
        let mut r = w.records(100.4);
        r.sort_by_key(|r| r.service.name != "web");
        assert_eq!((r[0].state, r[0].first_without_unix_seconds, r[0].reads), (WatchState::Removed, Some(100.31), 2), "held, then its chain gone");
        assert_eq!(
            (r[1].state, r[1].reads, r[1].failed_reads, r[1].last_error.as_deref()),
            (WatchState::Held, 0, 0, Some("the Service port's chain is not in the rules")),
            "never seen held: an absent chain says nothing (a wrong name reads the same), and is not a failed read: the node still holds the removal"
        );
    }

    #[test]
    fn a_new_request_keeps_the_reads_of_the_watches_it_repeats_and_forgets_the_rest() {
        let mut w = Watches::default();
        w.set(&request(&[("web", "10.244.1.2"), ("web", "10.244.1.3")], 10.0), 100.0);
        w.apply(&port("web"), &ips(&["10.244.1.2"]), 100.1, 100.2);
        assert_eq!(w.set(&request(&[("web", "10.244.1.3"), ("api", "10.244.1.9")], 10.0), 101.0).0, 1, "one new watch");
        assert!(w.is_due(&port("api"), 101.0) && !w.is_due(&port("web"), 101.0), "web's watch was removed by its read");
        w.set(&request(&[("web", "10.244.1.3")], 10.0), 101.0);
        assert_eq!(w.len(), 1);
        assert_eq!(w.records(101.0)[0].first_without_unix_seconds, Some(100.2));
        w.set(&request(&[], 10.0), 102.0);
        assert!(w.is_empty());
    }

    fn aged(ips: &[(&str, &str)], remaining: f64, age: Option<f64>) -> ObserveRequest {
        let mut r = request(ips, remaining);
        r.watches.iter_mut().for_each(|w| w.deletion_age_seconds = age);
        r
    }

    #[test]
    fn a_removal_is_timed_from_the_earliest_deletion_estimate_and_counted_once() {
        let mut w = Watches::default();
        // the same deletion, 0.5 s old at 100.0 and 0.4 s old at 100.2: the second request was
        // 0.1 s late, and the earlier estimate is kept
        w.set(&aged(&[("web", "10.244.1.2")], 10.0, Some(0.5)), 100.0);
        w.set(&aged(&[("web", "10.244.1.2")], 10.0, Some(0.4)), 100.2);
        let removed = w.apply(&port("web"), &ips(&[]), 100.3, 100.35);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].deletion, Some(99.5));
        assert!((removed[0].first_without - removed[0].deletion.unwrap() - 0.85).abs() < 1e-9);
        assert!(w.set(&aged(&[("web", "10.244.1.2")], 10.0, Some(0.9)), 100.4).1.is_empty(), "counted when read, not again");
    }

    #[test]
    fn a_removal_read_before_its_age_arrived_is_counted_when_it_does() {
        let mut w = Watches::default();
        w.set(&aged(&[("web", "10.244.1.2")], 10.0, None), 100.0);
        let removed = w.apply(&port("web"), &ips(&[]), 100.1, 100.2);
        assert_eq!(removed[0].deletion, None, "no age yet: not in the histogram at the read");
        let (_, late, _) = w.set(&aged(&[("web", "10.244.1.2")], 10.0, Some(1.0)), 100.25);
        assert_eq!(late.len(), 1);
        assert!((late[0] - 0.95).abs() < 1e-9, "{late:?}");
        assert!(w.set(&aged(&[("web", "10.244.1.2")], 10.0, Some(1.1)), 100.5).1.is_empty(), "once");
    }

    #[test]
    fn a_watch_past_its_deadline_unremoved_is_censored_once() {
        let mut w = Watches::default();
        w.set(&aged(&[("web", "10.244.1.2"), ("web", "10.244.1.3")], 5.0, Some(0.0)), 100.0);
        w.apply(&port("web"), &ips(&["10.244.1.2"]), 100.1, 100.2);
        assert_eq!(w.mark_censored(104.9), 0, "before the deadline");
        assert_eq!(w.mark_censored(105.0), 1, "10.244.1.2 held by every read, 10.244.1.3 removed");
        assert_eq!(w.mark_censored(106.0), 0, "once");
        assert_eq!(w.set(&aged(&[], 5.0, Some(0.0)), 106.0).2, 0, "dropped after it was counted");
        // dropped unremoved: at its deadline (the operator's came first) censored, long before not
        w.set(&aged(&[("web", "10.244.1.4"), ("api", "10.244.1.5")], 5.0, Some(0.0)), 200.0);
        assert_eq!(w.set(&aged(&[("api", "10.244.1.5")], 5.0, Some(0.0)), 204.5).2, 1, "0.5 s before its deadline");
        assert_eq!(w.set(&aged(&[], 5.0, Some(0.0)), 205.0).2, 0, "api's deadline moved to 209.5 by the last request");
    }

    #[test]
    fn the_records_changed_since_a_generation_are_the_state_changes_only() {
        let mut w = Watches::default();
        let since = |w: &Watches, g: u64| w.records_since(100.5, Some(g)).iter().map(|r| r.endpoint.to_string()).collect::<Vec<_>>();
        w.set(&aged(&[("web", "10.244.1.2"), ("web", "10.244.1.3")], 10.0, Some(0.1)), 100.0);
        let g0 = w.generation();
        assert_eq!((g0, since(&w, 0).len(), since(&w, g0).len()), (2, 2, 0), "two new watches, two changes");
        w.apply(&port("web"), &ips(&["10.244.1.2", "10.244.1.3"]), 100.1, 100.12);
        let g1 = w.generation();
        assert_eq!((g1, since(&w, g0).len()), (4, 2), "the first read of each");
        w.apply(&port("web"), &ips(&["10.244.1.2", "10.244.1.3"]), 100.2, 100.22);
        assert_eq!(w.generation(), g1, "another read that holds both: no change");
        w.apply(&port("web"), &ips(&["10.244.1.3"]), 100.3, 100.32);
        assert_eq!(since(&w, g1), vec!["10.244.1.2"], "the removal");
        let g2 = w.generation();
        w.set(&aged(&[("web", "10.244.1.2"), ("web", "10.244.1.3")], 10.0, Some(0.4)), 100.4);
        assert_eq!(w.generation(), g2, "the same set again: no change");
        w.mark_censored(111.0);
        assert_eq!(since(&w, g2), vec!["10.244.1.3"], "the expiry");
        let mut f = Watches::default();
        f.set(&aged(&[("api", "10.244.1.9")], 10.0, None), 100.0);
        let e = Err(ReadError { command: "nft".into(), how: "exit status: 1".into() });
        for i in 0..4 {
            f.apply(&port("api"), &e, 100.1 + f64::from(i), 100.2 + f64::from(i));
            assert_eq!(f.generation(), if i < 2 { 1 } else { 2 }, "new, then unread at its third failed read in a row, not before or after");
        }
    }

    #[test]
    fn a_held_watch_is_sent_again_every_two_seconds_and_a_reused_endpoint_starts_afresh() {
        let mut w = Watches::default();
        w.set(&aged(&[("web", "10.244.1.2")], 60.0, Some(0.0)), 100.0);
        w.apply(&port("web"), &ips(&["10.244.1.2"]), 100.1, 100.12);
        let g = w.generation();
        w.apply(&port("web"), &ips(&["10.244.1.2"]), 101.0, 101.02);
        assert_eq!(w.generation(), g, "1 s later: not sent again");
        w.apply(&port("web"), &ips(&["10.244.1.2"]), 102.2, 102.22);
        assert_eq!(w.records_since(102.3, Some(g))[0].last_with_unix_seconds, Some(102.2), "2.1 s later: sent again, fresh");
        // removed, then the same endpoint deleted again 20 s later (a pod with a fixed IP)
        w.apply(&port("web"), &ips(&[]), 103.0, 103.02);
        let (new, _, _) = w.set(&aged(&[("web", "10.244.1.2")], 60.0, Some(0.0)), 120.0);
        assert_eq!(new, 1, "another removal: a new watch");
        let r = &w.records(120.0)[0];
        assert_eq!((r.state, r.reads, r.first_without_unix_seconds), (WatchState::Held, 0, None), "never the earlier removal's: {r:?}");
        // the same deletion again (ages differ by latency): kept
        assert_eq!(w.set(&aged(&[("web", "10.244.1.2")], 60.0, Some(0.3)), 120.3).0, 0);
    }

    /// A reader that answers from a list of reads in turn.
    struct Script(Vec<Result<Option<BTreeSet<IpAddr>>, ReadError>>);

    impl DataPlaneReader for Script {
        fn data_plane(&self) -> &'static str {
            "nftables"
        }
        fn endpoints(&mut self, _: &ServicePort) -> Result<Option<BTreeSet<IpAddr>>, ReadError> {
            if self.0.len() > 1 { self.0.remove(0) } else { self.0[0].clone() }
        }
    }

    #[tokio::test]
    async fn the_loop_finds_its_reader_at_the_start_or_at_the_first_watch_and_keeps_it() {
        let found = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let count = found.clone();
        let obs = Observer::new(Box::new(move || {
            if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 {
                return Err("kube-proxy's /proxyMode: connection refused".into());
            }
            Ok(Box::new(Script(vec![ips(&["10.244.1.2"]), ips(&["10.244.1.2"]), ips(&[])])) as Box<dyn DataPlaneReader>)
        }));
        let stop = CancellationToken::new();
        let task = tokio::spawn(obs.clone().run(stop.clone()));
        let first = obs.observe(&request(&[("web", "10.244.1.2")], 30.0), None);
        assert_eq!((first.records.len(), first.records[0].state, first.data_plane.as_deref()), (1, WatchState::Held, None));
        let mut last = first;
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            last = obs.observe(&request(&[("web", "10.244.1.2")], 30.0), None);
            if last.records[0].state == WatchState::Removed {
                break;
            }
        }
        let r = &last.records[0];
        assert_eq!((r.state, last.data_plane.as_deref()), (WatchState::Removed, Some("nftables")), "{last:?}");
        // the reader is asked for at the start (failing here: kube-proxy not up yet), and again
        // at the first due watch; the failure at the start is no read of any watch
        assert_eq!((r.reads, r.failed_reads), (3, 0), "{r:?}");
        assert!(r.last_with_unix_seconds.unwrap() < r.first_without_unix_seconds.unwrap());
        assert_eq!(found.load(std::sync::atomic::Ordering::SeqCst), 2, "the reader is found once, then kept");
        stop.cancel();
        task.await.unwrap();
    }
}
