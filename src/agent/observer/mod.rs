//! The node agent's observer of removals: one reader per data plane behind one trait
//! ([`DataPlaneReader`]), each answering which endpoints a Service port's rules send new
//! connections to on this node, or an error that is no sample. The per-removal arithmetic the
//! reads feed (read bounds, censoring, the p99, coverage) is pure: [`crate::core::removals`].
//!
//! - [`nft_netlink`]: kube-proxy's nftables mode, the Service port's chain and its `numgen` map
//!   dumped over netlink (the default: `--nftables-reader netlink`);
//! - [`nftables`]: the same through `nft list chain ip kube-proxy <service chain>`
//!   (`--nftables-reader nft`);
//! - [`iptables`]: kube-proxy's iptables mode, either backend (`iptables -t nat -S` of the
//!   Service port's `KUBE-SVC-` chain, whose name is computed as kube-proxy computes it, and of
//!   each `KUBE-SEP-` chain it jumps to, for the DNAT target);
//! - [`cilium`]: Cilium's kube-proxy replacement, the frontend's slots in its pinned BPF
//!   load-balancer maps (`cilium_lb4_services_v2`, `cilium_lb4_backends_v3`), looked up key by
//!   key through aya.
//!
//! The readers run the distribution's own binaries through a [`Runner`] that bounds each read's
//! time and output; the unit tests give them captured output instead ([`Canned`]), and
//! [`Faulty`] fails a share of reads to show that a failed read is never taken for a removal.

pub mod cilium;
pub mod iptables;
pub mod metrics;
pub mod nft_netlink;
pub mod nftables;
pub mod watch;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

pub use crate::core::removals::ServicePort;

/// Why a read gave no sample: it says nothing about which endpoints the rules hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{command}: {how}")]
pub struct ReadError {
    /// The command as run.
    pub command: String,
    /// How it failed: cannot start, timed out, exit status with its standard error, output too
    /// large, the chain absent, unparsable output.
    pub how: String,
}

/// One data plane's reader.
pub trait DataPlaneReader: Send {
    /// The data plane's name (`iptables-nft`, `iptables-legacy`, `nftables`, `cilium`).
    fn data_plane(&self) -> &'static str;
    /// The endpoint IPs the rules of `service` send new connections to, read now; None when the
    /// Service port's own chain is not in the rules at all (its Service deleted, or its last
    /// endpoint gone: the rules then send it to no endpoint). Only the reader knows which of its
    /// commands lists that chain and how its program says "absent".
    fn endpoints(&mut self, service: &ServicePort) -> Result<Option<BTreeSet<IpAddr>>, ReadError>;
}

/// Runs one read command: its standard output, or why it gave none.
pub trait Runner: Send {
    /// Runs `program` with `args`.
    fn run(&self, program: &str, args: &[&str]) -> Result<String, ReadError>;
}

/// The most a read's output may hold, bytes: a Service chain of 10,000 endpoints lists in about
/// 1 MiB.
pub const MAX_OUTPUT_BYTES: usize = 4 << 20;
/// The longest a read may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the binaries of the agent's image as child processes, each bounded by
/// [`READ_TIMEOUT`] and [`MAX_OUTPUT_BYTES`].
#[derive(Debug, Clone, Default)]
pub struct Processes;

impl Runner for Processes {
    fn run(&self, program: &str, args: &[&str]) -> Result<String, ReadError> {
        use std::io::Read;
        use std::process::{Command, Stdio};
        let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
        let error = |how: String| ReadError { command: command.clone(), how };
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| error(format!("cannot start: {e}")))?;
        let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
        // past the limit the reader stops reading and says so: the child, blocked on a full
        // pipe, is then ended at once (not left to the timeout)
        let too_large = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = too_large.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let n = out.as_mut().map(|o| o.take(MAX_OUTPUT_BYTES as u64 + 1).read_to_end(&mut buf));
            if buf.len() > MAX_OUTPUT_BYTES {
                flag.store(true, std::sync::atomic::Ordering::Relaxed);
                return (n.map(|r| r.is_ok()), buf, Vec::new());
            }
            let mut e = Vec::new();
            let _ = err.as_mut().map(|s| s.take(4096).read_to_end(&mut e));
            (n.map(|r| r.is_ok()), buf, e)
        });
        let deadline = std::time::Instant::now() + READ_TIMEOUT;
        let status = loop {
            if too_large.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(error(format!("output larger than {MAX_OUTPUT_BYTES} bytes")));
            }
            match child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(error(format!("timed out after {} s", READ_TIMEOUT.as_secs())));
                }
                Err(e) => return Err(error(format!("cannot wait: {e}"))),
            }
        };
        let (_, out, err) = reader.join().map_err(|_| error("the output reader panicked".into()))?;
        if !status.success() {
            return Err(error(format!("{status}: {}", String::from_utf8_lossy(&err).trim())));
        }
        if out.len() > MAX_OUTPUT_BYTES {
            return Err(error(format!("output larger than {MAX_OUTPUT_BYTES} bytes")));
        }
        String::from_utf8(out).map_err(|e| error(format!("output is not UTF-8 at byte {}", e.utf8_error().valid_up_to())))
    }
}

/// Answers each command line from a table (the unit tests' captured outputs); a command not in
/// the table fails as a missing binary would.
#[derive(Debug, Clone, Default)]
pub struct Canned {
    /// `program args...` -> its output, or the failure's `how`.
    pub answers: std::collections::BTreeMap<String, Result<String, String>>,
}

impl Runner for Canned {
    fn run(&self, program: &str, args: &[&str]) -> Result<String, ReadError> {
        let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
        match self.answers.get(&command) {
            Some(Ok(out)) => Ok(out.clone()),
            Some(Err(how)) => Err(ReadError { command, how: how.clone() }),
            None => Err(ReadError { command, how: "cannot start: No such file or directory".into() }),
        }
    }
}

/// Fails every `every`-th read of the reader it wraps (1: every read), as a read that failed
/// (permission, a binary missing, a chain absent) would: the fault-injecting decorator.
pub struct Faulty<R> {
    inner: R,
    every: u32,
    count: u32,
}

impl<R: DataPlaneReader> Faulty<R> {
    /// Wraps `inner`; `every` 0 counts as 1.
    pub fn new(inner: R, every: u32) -> Self {
        Self { inner, every: every.max(1), count: 0 }
    }
}

impl<R: DataPlaneReader> DataPlaneReader for Faulty<R> {
    fn data_plane(&self) -> &'static str {
        self.inner.data_plane()
    }

    fn endpoints(&mut self, service: &ServicePort) -> Result<Option<BTreeSet<IpAddr>>, ReadError> {
        self.count = self.count.wrapping_add(1);
        if self.count.is_multiple_of(self.every) {
            return Err(ReadError { command: format!("{} read of {}/{}", self.data_plane(), service.namespace, service.name), how: "injected fault".into() });
        }
        self.inner.endpoints(service)
    }
}

/// The read failed because the program said the chain it listed is not there: `nft` exits 1 with
/// `Error: No such file or directory`, `iptables` with `No chain/target/match by that name` (a
/// program that cannot start is another failure: `cannot start: ...`).
fn chain_absent(e: &ReadError) -> bool {
    e.how.starts_with("exit status") && (e.how.contains("Error: No such file or directory") || e.how.contains("No chain/target/match by that name"))
}

/// At most 120 characters of `s`, quoted, for an error message.
fn excerpt(s: &str) -> String {
    let cut: String = s.chars().take(120).collect();
    if cut.len() < s.len() { format!("{cut:?}...") } else { format!("{cut:?}") }
}

/// A TCP Service port `namespace/name:port_name` on ClusterIP 10.96.0.1:443, for the readers'
/// tests.
#[cfg(test)]
fn test_service(namespace: &str, name: &str, port_name: &str) -> ServicePort {
    ServicePort {
        namespace: namespace.into(),
        name: name.into(),
        port_name: port_name.into(),
        protocol: "TCP".into(),
        cluster_ip: "10.96.0.1".parse().unwrap(),
        port: 443,
    }
}

/// The IP of an `IP:port` or `[IPv6]:port` destination.
fn ip_of_destination(s: &str) -> Option<IpAddr> {
    let host = match s.strip_prefix('[') {
        Some(rest) => rest.split_once(']')?.0,
        None => s.rsplit_once(':').map_or(s, |(h, _)| h),
    };
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_runner_bounds_and_reports_each_failure() {
        let p = Processes;
        assert_eq!(p.run("sh", &["-c", "printf 'a b'"]).unwrap(), "a b");
        let e = p.run("sh", &["-c", "echo 'No chain/target/match by that name.' >&2; exit 1"]).unwrap_err();
        assert_eq!(e.command, "sh -c echo 'No chain/target/match by that name.' >&2; exit 1");
        assert!(e.how.contains("exit status: 1") && e.how.contains("No chain/target/match"), "{}", e.how);
        assert!(p.run("/nonexistent/nft", &[]).unwrap_err().how.starts_with("cannot start"));
        let big = p.run("sh", &["-c", &format!("head -c {} /dev/zero", MAX_OUTPUT_BYTES + 1)]).unwrap_err();
        assert!(big.how.contains("larger than"), "{}", big.how);
        // far past the limit (more than a pipe holds), and a writer that never ends: refused at
        // the limit, long before the timeout
        for writer in [format!("head -c {} /dev/zero", 5 * MAX_OUTPUT_BYTES), "cat /dev/zero".to_string()] {
            let t0 = std::time::Instant::now();
            let e = p.run("sh", &["-c", &writer]).unwrap_err();
            assert!(e.how.contains("larger than") && t0.elapsed() < READ_TIMEOUT / 2, "{writer}: {} after {:?}", e.how, t0.elapsed());
        }
        assert!(p.run("sh", &["-c", "printf '\\377'"]).unwrap_err().how.contains("not UTF-8"));
    }

    #[test]
    fn destinations_name_their_ip() {
        assert_eq!(ip_of_destination("10.244.1.5:8080"), Some("10.244.1.5".parse().unwrap()));
        assert_eq!(ip_of_destination("[fd00::5]:8080"), Some("fd00::5".parse().unwrap()));
        assert_eq!(ip_of_destination("10.244.1.5"), Some("10.244.1.5".parse().unwrap()));
        assert_eq!(ip_of_destination("web:8080"), None);
    }
}

/// The programs the readers run (names looked up on `PATH`, or paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// `nft`.
    pub nft: String,
    /// `iptables` of the nft backend (`iptables-nft`).
    pub iptables_nft: String,
    /// `iptables` of the legacy backend (`iptables-legacy`).
    pub iptables_legacy: String,
}

/// A data plane the agent can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plane {
    /// kube-proxy's nftables mode.
    Nftables,
    /// kube-proxy's iptables mode on the nft backend.
    IptablesNft,
    /// kube-proxy's iptables mode on the legacy backend.
    IptablesLegacy,
    /// Cilium's kube-proxy replacement (its pinned BPF load-balancer maps).
    Cilium,
}

/// How rules kept in nf_tables are read: kube-proxy's nftables mode, and iptables-nft's
/// Service chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum NftablesVia {
    /// The kernel's own dumps of the one chain ([`nft_netlink`]), about 0.1 ms a read whatever
    /// the table's size: nftables mode's chain and its map; iptables-nft's `KUBE-SVC-` chain
    /// (each new `KUBE-SEP-` chain's target is still read once with `iptables`).
    #[default]
    Netlink,
    /// The programs: `nft list chain` ([`nftables`], which loads the whole table first: 0.5 s a
    /// read at 4,000 Services) and `iptables -S`.
    Nft,
}

/// The reader of `plane`: nftables as `nftables_via` says, iptables running `binaries` as
/// child processes ([`Processes`]), Cilium's maps pinned under `bpf_root`.
pub fn reader(plane: Plane, binaries: &Binaries, nftables_via: NftablesVia, bpf_root: &std::path::Path) -> Box<dyn DataPlaneReader> {
    match plane {
        Plane::Cilium => Box::new(cilium::CiliumReader::pinned(bpf_root)),
        Plane::Nftables if nftables_via == NftablesVia::Netlink => Box::new(nft_netlink::NetlinkNftablesReader::new(nft_netlink::Kernel::default())),
        Plane::Nftables => Box::new(nftables::NftablesReader::new(Processes, &binaries.nft)),
        Plane::IptablesNft if nftables_via == NftablesVia::Netlink => Box::new(
            iptables::IptablesReader::new(Processes, &binaries.iptables_nft, false)
                .with_netlink(Box::new(nft_netlink::NetlinkNftablesReader::new(nft_netlink::Kernel::default()))),
        ),
        Plane::IptablesNft => Box::new(iptables::IptablesReader::new(Processes, &binaries.iptables_nft, false)),
        Plane::IptablesLegacy => Box::new(iptables::IptablesReader::new(Processes, &binaries.iptables_legacy, true)),
    }
}

/// Why the agent has no data plane to read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaneError {
    /// kube-proxy's mode is one no reader reads (`ipvs`, `kernelspace`, ...).
    #[error("kube-proxy's proxy mode {mode:?} has no reader (nftables and iptables have)")]
    NoReader {
        /// The mode as `/proxyMode` answered it, trimmed.
        mode: String,
    },
    /// iptables mode, and neither backend lists kube-proxy's `KUBE-SERVICES` chain.
    #[error("kube-proxy's KUBE-SERVICES chain in neither iptables backend: {nft}; {legacy}")]
    NoIptablesBackend {
        /// The nft backend's failed listing.
        nft: ReadError,
        /// The legacy backend's failed listing.
        legacy: ReadError,
    },
    /// No kube-proxy answers, and Cilium's services map is not pinned either.
    #[error("{kube_proxy}; nor is Cilium's {} pinned (with Cilium's kube-proxy replacement, mount the host's bpffs and set --cilium-bpf-root)", pin.display())]
    NoKubeProxyNorCilium {
        /// kube-proxy's failure, as the agent's fetch said it.
        kube_proxy: String,
        /// The services map's pin looked for.
        pin: std::path::PathBuf,
    },
}

/// The data plane of kube-proxy's `mode` (its `/proxyMode`): nftables, or for iptables the
/// backend whose `nat` table holds kube-proxy's `KUBE-SERVICES` chain (the nft backend tried
/// first, as kube-proxy itself prefers it).
///
/// Errors: a mode without a reader, or both backends' listings failed ([`PlaneError`]).
pub fn plane_of_mode(mode: &str, binaries: &Binaries, runner: &dyn Runner) -> Result<Plane, PlaneError> {
    match mode.trim() {
        "nftables" => Ok(Plane::Nftables),
        "iptables" => {
            let list = |program: &str| runner.run(program, &["-t", "nat", "-S", "KUBE-SERVICES"]);
            match list(&binaries.iptables_nft) {
                Ok(_) => Ok(Plane::IptablesNft),
                Err(nft) => list(&binaries.iptables_legacy).map(|_| Plane::IptablesLegacy).map_err(|legacy| PlaneError::NoIptablesBackend { nft, legacy }),
            }
        }
        other => Err(PlaneError::NoReader { mode: other.to_string() }),
    }
}

/// The data plane of a node where kube-proxy is absent (nothing listens on its metrics
/// address): Cilium's kube-proxy replacement when its services map is pinned under
/// `bpf_root`.
///
/// Errors: the map is not pinned either ([`PlaneError::NoKubeProxyNorCilium`], with
/// `kube_proxy`, kube-proxy's failure).
pub fn plane_without_kube_proxy(kube_proxy: &str, bpf_root: &std::path::Path) -> Result<Plane, PlaneError> {
    if cilium::pinned(bpf_root) {
        return Ok(Plane::Cilium);
    }
    Err(PlaneError::NoKubeProxyNorCilium { kube_proxy: kube_proxy.to_string(), pin: bpf_root.join(cilium::PIN_DIR).join(cilium::SERVICES_MAP) })
}

#[cfg(test)]
mod plane_tests {
    use super::*;

    fn binaries() -> Binaries {
        Binaries { nft: "nft".into(), iptables_nft: "iptables-nft".into(), iptables_legacy: "iptables-legacy".into() }
    }

    #[test]
    fn the_mode_and_the_backend_holding_kube_proxys_chain_choose_the_reader() {
        let mut canned = Canned::default();
        assert_eq!(plane_of_mode("nftables\n", &binaries(), &canned), Ok(Plane::Nftables));
        let e = plane_of_mode("ipvs\n", &binaries(), &canned).unwrap_err();
        assert_eq!(e, PlaneError::NoReader { mode: "ipvs".into() });
        assert_eq!(e.to_string(), "kube-proxy's proxy mode \"ipvs\" has no reader (nftables and iptables have)");
        let e = plane_of_mode("iptables", &binaries(), &canned).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kube-proxy's KUBE-SERVICES chain in neither iptables backend: iptables-nft -t nat -S KUBE-SERVICES: cannot start: No such file or directory; iptables-legacy -t nat -S KUBE-SERVICES: cannot start: No such file or directory"
        );
        canned.answers.insert("iptables-legacy -t nat -S KUBE-SERVICES".into(), Ok("-N KUBE-SERVICES\n".into()));
        assert_eq!(plane_of_mode("iptables", &binaries(), &canned), Ok(Plane::IptablesLegacy));
        canned.answers.insert("iptables-nft -t nat -S KUBE-SERVICES".into(), Ok("-N KUBE-SERVICES\n".into()));
        assert_eq!(plane_of_mode("iptables", &binaries(), &canned), Ok(Plane::IptablesNft));
        let root = std::path::Path::new(cilium::DEFAULT_BPF_ROOT);
        assert_eq!(reader(Plane::IptablesLegacy, &binaries(), NftablesVia::Netlink, root).data_plane(), "iptables-legacy");
        assert_eq!(reader(Plane::Nftables, &binaries(), NftablesVia::Nft, root).data_plane(), "nftables");
        assert_eq!(reader(Plane::Cilium, &binaries(), NftablesVia::Netlink, root).data_plane(), "cilium");
    }

    /// Without kube-proxy, Cilium's services map pinned under the bpffs root says Cilium; a
    /// root without it is an error naming kube-proxy's failure and the pin looked for.
    #[test]
    fn without_kube_proxy_the_pinned_services_map_says_cilium() {
        let root = tempfile::tempdir().unwrap();
        let e = plane_without_kube_proxy("kube-proxy at http://127.0.0.1:10249/proxyMode: connection refused", root.path()).unwrap_err();
        let pin = root.path().join("tc/globals/cilium_lb4_services_v2");
        assert_eq!(
            e,
            PlaneError::NoKubeProxyNorCilium { kube_proxy: "kube-proxy at http://127.0.0.1:10249/proxyMode: connection refused".into(), pin: pin.clone() }
        );
        assert_eq!(
            e.to_string(),
            format!(
                "kube-proxy at http://127.0.0.1:10249/proxyMode: connection refused; nor is Cilium's {} pinned (with Cilium's kube-proxy replacement, mount the host's bpffs and set --cilium-bpf-root)",
                pin.display()
            )
        );
        std::fs::create_dir_all(root.path().join("tc/globals")).unwrap();
        std::fs::write(root.path().join("tc/globals/cilium_lb4_services_v2"), b"").unwrap();
        assert_eq!(plane_without_kube_proxy("refused", root.path()), Ok(Plane::Cilium));
    }
}
