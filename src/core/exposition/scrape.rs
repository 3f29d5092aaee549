//! What the operator reads from one kube-proxy scrape, whichever exposition it came in: the
//! families read (five histograms, the gauges and counters of [`SCALARS`], matched by exact
//! name), the [`KubeProxyScrape`] they fill, how one gauge or counter sample folds into it, and
//! the longest duration a histogram bound may stand for. The text reader ([`super::parse`]) and
//! the protobuf one ([`super::protobuf`]) both fill it. Pure, no I/O.

use super::histogram::Histogram;
use super::native::NativeHistogram;
use serde::Serialize;

/// The histogram families read from a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum HistogramFamily {
    /// `kubeproxy_sync_proxy_rules_duration_seconds`: every sync, every mode.
    Sync,
    /// `kubeproxy_sync_full_proxy_rules_duration_seconds` (iptables mode, 1.28+).
    SyncFull,
    /// `kubeproxy_sync_partial_proxy_rules_duration_seconds` (iptables mode, 1.28+).
    SyncPartial,
    /// `kubeproxy_network_programming_duration_seconds`: EndpointSlice trigger time to rules synced.
    NetworkProgramming,
    /// `kubeproxy_sync_proxy_rules_latency_microseconds` (before ~1.14), converted to seconds.
    SyncLegacyMicroseconds,
}

impl HistogramFamily {
    /// The exposition family name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sync => "kubeproxy_sync_proxy_rules_duration_seconds",
            Self::SyncFull => "kubeproxy_sync_full_proxy_rules_duration_seconds",
            Self::SyncPartial => "kubeproxy_sync_partial_proxy_rules_duration_seconds",
            Self::NetworkProgramming => "kubeproxy_network_programming_duration_seconds",
            Self::SyncLegacyMicroseconds => "kubeproxy_sync_proxy_rules_latency_microseconds",
        }
    }

    pub(super) const ALL: [HistogramFamily; 5] = [Self::Sync, Self::SyncFull, Self::SyncPartial, Self::NetworkProgramming, Self::SyncLegacyMicroseconds];

    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// Multiplier from the family's unit to seconds.
    pub(super) fn to_seconds(self) -> f64 {
        if self == Self::SyncLegacyMicroseconds { 1e-6 } else { 1.0 }
    }
}

/// The gauge and counter families read from a scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scalar {
    LastTimestamp,
    LastQueuedTimestamp,
    EndpointChangesPending,
    EndpointChangesTotal,
    ServiceChangesPending,
    ServiceChangesTotal,
    IptablesTotal,
    IptablesLast,
    IptablesRestoreFailures,
    IptablesPartialRestoreFailures,
    NftablesSyncFailures,
    NftablesCleanupFailures,
    BuildInfo,
}

/// The gauge and counter families read from a scrape, by exposition name: with
/// [`HistogramFamily::ALL`], the one list of what the readers read ([`read_families`]).
pub(super) const SCALARS: [(&str, Scalar); 13] = [
    ("kubeproxy_sync_proxy_rules_last_timestamp_seconds", Scalar::LastTimestamp),
    ("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", Scalar::LastQueuedTimestamp),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_pending", Scalar::EndpointChangesPending),
    ("kubeproxy_sync_proxy_rules_endpoint_changes_total", Scalar::EndpointChangesTotal),
    ("kubeproxy_sync_proxy_rules_service_changes_pending", Scalar::ServiceChangesPending),
    ("kubeproxy_sync_proxy_rules_service_changes_total", Scalar::ServiceChangesTotal),
    ("kubeproxy_sync_proxy_rules_iptables_total", Scalar::IptablesTotal),
    ("kubeproxy_sync_proxy_rules_iptables_last", Scalar::IptablesLast),
    ("kubeproxy_sync_proxy_rules_iptables_restore_failures_total", Scalar::IptablesRestoreFailures),
    ("kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total", Scalar::IptablesPartialRestoreFailures),
    ("kubeproxy_sync_proxy_rules_nftables_sync_failures_total", Scalar::NftablesSyncFailures),
    ("kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total", Scalar::NftablesCleanupFailures),
    ("kubernetes_build_info", Scalar::BuildInfo),
];

/// What a metric family name (not a sample name) is to the readers: one of the histograms, one
/// of the gauges or counters, or `None` (a family not read). The protobuf decoder
/// ([`super::protobuf`]) names families, not samples; the text reader classifies sample names.
pub(super) enum ReadFamily {
    Histogram(HistogramFamily),
    Scalar(Scalar),
}

/// The [`ReadFamily`] of the family `name`, matched exactly.
pub(super) fn read_family(name: &str) -> Option<ReadFamily> {
    if let Some((_, s)) = SCALARS.iter().find(|(n, _)| *n == name) {
        return Some(ReadFamily::Scalar(*s));
    }
    HistogramFamily::ALL.into_iter().find(|f| f.name() == name).map(ReadFamily::Histogram)
}

/// The names of every metric family [`super::parse_kube_proxy_metrics`] reads (the five histograms of
/// [`HistogramFamily`], then the gauges and counters), as they appear in `# HELP`/`# TYPE`
/// lines. The node agent serves only these ([`crate::core::exposition::filter`]): this list is the
/// one place that says what the operator needs from a scrape.
pub fn read_families() -> impl Iterator<Item = &'static str> {
    HistogramFamily::ALL.into_iter().map(HistogramFamily::name).chain(SCALARS.iter().map(|(n, _)| *n))
}

/// Everything this project reads from one kube-proxy scrape. Absent families are `None`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeProxyScrape {
    /// Sync duration in seconds: `kubeproxy_sync_proxy_rules_duration_seconds`, or the legacy
    /// microsecond histogram converted when only that one is present.
    pub sync: Option<Histogram>,
    /// True when [`Self::sync`] came from the legacy microsecond family.
    pub sync_from_legacy_microseconds: bool,
    /// Full syncs only (iptables mode, 1.28+).
    pub sync_full: Option<Histogram>,
    /// Partial syncs only (iptables mode, 1.28+).
    pub sync_partial: Option<Histogram>,
    /// Network programming latency in seconds.
    pub network_programming: Option<Histogram>,
    /// The native histogram of [`Self::sync`] (the `ip_family` series summed), when the scrape
    /// carried one: only the protobuf exposition does (kube-proxy 1.37+).
    pub sync_native: Option<NativeHistogram>,
    /// The native histogram of [`Self::network_programming`], when the scrape carried one.
    pub network_programming_native: Option<NativeHistogram>,
    /// `kubeproxy_sync_proxy_rules_last_timestamp_seconds` (Unix seconds); with several series
    /// (dual-stack), the oldest.
    pub last_sync_timestamp_seconds: Option<f64>,
    /// `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` (Unix seconds); with several
    /// series, the newest. Later than the oldest last sync: changes wait for a sync.
    pub last_queued_timestamp_seconds: Option<f64>,
    /// Endpoint changes waiting for the next sync.
    pub endpoint_changes_pending: Option<f64>,
    /// Endpoint changes seen since start (counter).
    pub endpoint_changes_total: Option<f64>,
    /// Service changes waiting for the next sync.
    pub service_changes_pending: Option<f64>,
    /// Service changes seen since start (counter).
    pub service_changes_total: Option<f64>,
    /// iptables rules owned by kube-proxy, summed over tables (`iptables_total{table}`).
    pub iptables_rules_total: Option<f64>,
    /// iptables rules written by the last sync, summed over tables.
    pub iptables_rules_last: Option<f64>,
    /// `iptables_restore_failures_total`.
    pub iptables_restore_failures_total: Option<f64>,
    /// `iptables_partial_restore_failures_total`.
    pub iptables_partial_restore_failures_total: Option<f64>,
    /// `nftables_sync_failures_total` (nftables mode only).
    pub nftables_sync_failures_total: Option<f64>,
    /// `nftables_cleanup_failures_total` (nftables mode only).
    pub nftables_cleanup_failures_total: Option<f64>,
    /// `git_version` (or pre-1.15 `gitVersion`) label of `kubernetes_build_info`, e.g. `v1.29.0`.
    pub kubernetes_version: Option<String>,
    /// kube-proxy's two sync timestamps per proxier (one per `ip_family`), paired: the newest
    /// queue of one family against the oldest sync of the other is no wait (an idle dual-stack
    /// 1.37.2 kube-proxy shows exactly that).
    pub sync_timestamps: Vec<SyncTimestamps>,
    /// When the scrape was taken, Unix seconds by the reader's clock: set by whoever read it (the
    /// measurement store, Prometheus' evaluation time, `analyze` for a URL); the parsers leave
    /// it None, and so does `analyze` for a file (a checkout resets its modification time).
    pub scraped_at_unix_seconds: Option<f64>,
    /// The oldest `last_queued` still waiting, Unix seconds: set by a reader that saw changes
    /// pending (last queued after last synced) in consecutive scrapes with no sync completed in
    /// between. None when this scrape alone is known; the model then takes `last_queued`, a lower
    /// bound of how long changes have waited.
    pub oldest_pending_queued_unix_seconds: Option<f64>,
}

/// One proxier's `kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds` and
/// `..._last_timestamp_seconds`, Unix seconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct SyncTimestamps {
    /// The `ip_family` label (`IPv4`, `IPv6`; empty when absent).
    pub ip_family: String,
    /// When changes were last queued for a sync.
    pub last_queued_seconds: Option<f64>,
    /// When a sync last completed.
    pub last_synced_seconds: Option<f64>,
}

impl KubeProxyScrape {
    /// Sets the classic histogram of `family`. The legacy microsecond sync histogram (before
    /// Kubernetes 1.13's seconds) stands in for the sync histogram only where that is absent:
    /// set it after [`HistogramFamily::Sync`], as the readers do (families in declaration order).
    pub fn set_classic(&mut self, family: HistogramFamily, histogram: Histogram) {
        match family {
            HistogramFamily::Sync => self.sync = Some(histogram),
            HistogramFamily::SyncFull => self.sync_full = Some(histogram),
            HistogramFamily::SyncPartial => self.sync_partial = Some(histogram),
            HistogramFamily::NetworkProgramming => self.network_programming = Some(histogram),
            HistogramFamily::SyncLegacyMicroseconds => {
                if self.sync.is_none() {
                    self.sync = Some(histogram);
                    self.sync_from_legacy_microseconds = true;
                }
            }
        }
    }

    /// The timestamps of `ip_family`, added when absent.
    pub fn sync_timestamps_of(&mut self, ip_family: &str) -> &mut SyncTimestamps {
        let i = match self.sync_timestamps.iter().position(|t| t.ip_family == ip_family) {
            Some(i) => i,
            None => {
                self.sync_timestamps.push(SyncTimestamps { ip_family: ip_family.to_string(), ..SyncTimestamps::default() });
                self.sync_timestamps.len() - 1
            }
        };
        &mut self.sync_timestamps[i]
    }

    /// Changes waiting for a sync: `(the earliest last queued among proxiers whose last queue
    /// is after their last sync, that proxier's last sync)`, Unix seconds. `Some(None)` when
    /// every proxier with both gauges has synced since its last queue; None when no proxier has
    /// both, or a pair is not finite.
    pub fn waiting(&self) -> Option<Option<(f64, f64)>> {
        let mut paired = false;
        let mut earliest: Option<(f64, f64)> = None;
        for t in &self.sync_timestamps {
            let (Some(queued), Some(synced)) = (t.last_queued_seconds, t.last_synced_seconds) else { continue };
            if !(queued - synced).is_finite() {
                return None;
            }
            paired = true;
            if queued > synced && earliest.is_none_or(|e| queued < e.0) {
                earliest = Some((queued, synced));
            }
        }
        paired.then_some(earliest)
    }
}

/// The longest duration a kube-proxy histogram bound may stand for, seconds (11.6 days; kube-proxy's
/// own top finite buckets are 16.384 s for syncs and a few minutes for network programming). A
/// bound above it is a corrupt or foreign scrape: taken at face value it made W infinite or
/// hundreds of digits long.
pub const MAX_DURATION_SECONDS: f64 = 1e6;

/// An error when a finite bucket bound of `seconds` is above [`MAX_DURATION_SECONDS`]; `what`
/// names the bound as the input wrote it.
pub(super) fn check_duration_bound(what: &str, seconds: f64) -> Result<(), String> {
    if seconds.is_finite() && seconds > MAX_DURATION_SECONDS {
        Err(format!(
            "{what} is {seconds:e} s, above {MAX_DURATION_SECONDS:e} s (11.6 days): no kube-proxy duration is that long; the scrape is corrupt or not kube-proxy's"
        ))
    } else {
        Ok(())
    }
}

/// Folds one sample `v` of the scalar family `s` into `out` (`git_version`: the sample's
/// `git_version`/`gitVersion` label, read for `kubernetes_build_info`; `ip_family`: its
/// `ip_family` label): the oldest last sync, the newest last queued, both per family too, the
/// build's version, and a sum over series for the rest.
pub(super) fn apply_scalar(out: &mut KubeProxyScrape, s: Scalar, v: f64, git_version: Option<&str>, ip_family: Option<&str>) {
    let add = |slot: &mut Option<f64>| *slot = Some(slot.unwrap_or(0.0) + v);
    match s {
        Scalar::LastTimestamp => {
            out.last_sync_timestamp_seconds = Some(out.last_sync_timestamp_seconds.map_or(v, |o| o.min(v)));
            out.sync_timestamps_of(ip_family.unwrap_or_default()).last_synced_seconds = Some(v);
        }
        Scalar::LastQueuedTimestamp => {
            out.last_queued_timestamp_seconds = Some(out.last_queued_timestamp_seconds.map_or(v, |o| o.max(v)));
            out.sync_timestamps_of(ip_family.unwrap_or_default()).last_queued_seconds = Some(v);
        }
        Scalar::EndpointChangesPending => add(&mut out.endpoint_changes_pending),
        Scalar::EndpointChangesTotal => add(&mut out.endpoint_changes_total),
        Scalar::ServiceChangesPending => add(&mut out.service_changes_pending),
        Scalar::ServiceChangesTotal => add(&mut out.service_changes_total),
        Scalar::IptablesTotal => add(&mut out.iptables_rules_total),
        Scalar::IptablesLast => add(&mut out.iptables_rules_last),
        Scalar::IptablesRestoreFailures => add(&mut out.iptables_restore_failures_total),
        Scalar::IptablesPartialRestoreFailures => add(&mut out.iptables_partial_restore_failures_total),
        Scalar::NftablesSyncFailures => add(&mut out.nftables_sync_failures_total),
        Scalar::NftablesCleanupFailures => add(&mut out.nftables_cleanup_failures_total),
        Scalar::BuildInfo => {
            if let Some(v) = git_version {
                out.kubernetes_version = Some(v.to_string());
            }
        }
    }
}
