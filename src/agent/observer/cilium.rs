//! Cilium's kube-proxy replacement, read from its pinned BPF load-balancer maps (Cilium
//! 1.20.2): the backends a Service port's frontend sends new connections to on this node.
//!
//! **The maps** (`bpf/lib/lb.h`, written by `pkg/loadbalancer/reconciler/bpf_reconciler.go`
//! through the types of `pkg/loadbalancer/maps/types.go`), two hash maps pinned under
//! `<bpf-root>/tc/globals/` (`--cilium-bpf-root`, default `/sys/fs/bpf`; Cilium's
//! `pkg/bpf/bpffs_linux.go` `TCGlobalsPath`):
//! - `cilium_lb4_services_v2`: key `struct lb4_key` ([`ServiceKey`], 12 bytes: the frontend's
//!   IPv4 address, its port, the backend slot, the L4 protocol, the lookup scope, 2 bytes of
//!   padding), value `struct lb4_service` ([`ServiceValue`], 12 bytes). Slot 0 is the
//!   frontend's master entry: `count` is the number of active backends, `qcount` the number of
//!   terminating and quarantined ones. Slots `1..=count` hold the active backends' ids, slots
//!   `count+1..=count+qcount` the others (`updateFrontend`: backends sorted healthy first, then
//!   by state, active < terminating < quarantined, then by address; when no backend is active
//!   the terminating ones count as active, KEP-1669).
//! - `cilium_lb4_backends_v3`: key the backend id (`__u32`), value `struct lb4_backend`
//!   ([`Backend`], 12 bytes: the endpoint's IPv4 address, port, protocol, state flags, cluster
//!   id, zone, 1 byte of padding).
//!
//! **What receives new connections**: the datapath's `lb4_local` picks, for a new connection,
//! `slot = random % count + 1` (`lb4_select_backend_id_random`), or a Maglev table built from
//! the same first `count` backends (`updateMaglev(fe, feID, orderedBackends[:activeCount])`),
//! and drops it when `count` is 0. So the answer is the addresses of the backends in slots
//! `1..=count`; a terminating backend left in the later slots serves only the connections it
//! already has. A ClusterIP frontend always has scope 0 (`LB_LOOKUP_SCOPE_EXT`: Cilium gives a
//! second scope only to NodePort and LoadBalancer frontends, `reflectors/conversions.go`).
//!
//! **Byte order**, as Cilium's Go writes the values (`ToNetwork` swaps only the ports and
//! `rev_nat_index`): addresses as in the packet, `dport`, the backend's `port` and
//! `rev_nat_index` in network order; `backend_slot`, `backend_id`, `count`, `qcount`,
//! `cluster_id` and the backends map's key in the host's order.
//!
//! **One read looks up only the keys concerned**, never a dump (a dump of a map that Cilium
//! rewrites restarts its walk, and costs the whole map at thousands of Services):
//! 1. the master entry (slot 0); absent: the frontend is not in the maps (`Ok(None)`: its Service
//!    deleted; Cilium's `deleteFrontend` deletes the master first);
//! 2. slots `1..=count` (pass A), and each backend id of them in the backends map;
//! 3. slots `1..=count` again (pass B), then the master entry again.
//!
//! **The consistency rule.** Cilium rewrites a frontend in place while the datapath and this
//! reader read it (`updateFrontend`): orphaned backends are deleted from the backends map
//! first, then slots `1..n` are written in increasing slot order, each once, then the master
//! entry (`upsertMaster`, written on every reconcile), then the slots past the new total are
//! deleted (`cleanupSlots`, in increasing order). A read is a sample only when both masters are
//! equal (all 12 bytes), pass B gives the same backend id as pass A in every slot, and every
//! slot and backend id is present; otherwise it is read again, at most [`MAX_ATTEMPTS`] times in
//! all, and after that it is no sample (`Err`). Since each slot is written at most once per
//! reconcile and in slot order, a slot equal in both passes held that id from its pass-A to its
//! pass-B lookup, so the ids read are the slots' contents at one moment: a state the datapath
//! itself had. Such a state can still be a moment inside a reconcile: a new backend whose
//! address sorts first shifts the others up one slot per write, and for the few microseconds
//! between two writes one of them is in no active slot. That moment is not a removal, so a
//! read that lost an address the previous read of the same frontend held, or the frontend's
//! first read, is confirmed by a second read [`CONFIRM_PAUSE`] later, whose answer is the one
//! given. The rule's limit: a Cilium writer stalled between two slot writes for longer than
//! the pause and a read is read as it stands (the tests show both sides). A slot or backend id
//! absent, or the master entry deleted, between two lookups is a rewrite seen (read again): the
//! datapath drops that packet (`no_service`), but a removal is only ever taken from a whole,
//! consistent read.
//!
//! **Bounds.** `count` is a `u16`: an attempt is at most `3 count + 2` lookups (two passes over
//! the slots, the backends, the master twice), a read at most [`MAX_ATTEMPTS`] attempts, and
//! twice that when confirmed. A `count + qcount` that the services map cannot hold (its
//! `max_entries`: Cilium's `--bpf-lb-map-max`, 65,536 by default) is an error, not a loop.
//!
//! **Errors** (each is no sample, a [`ReadError`]): an IPv6 Service (its frontend is in
//! `cilium_lb6_services_v2`, which this reader does not read), a protocol other than TCP, UDP
//! and SCTP, the pins absent or not maps of these sizes (`BPF_OBJ_GET`, then aya's key and value
//! size check: a Cilium whose layouts changed is refused), a frontend redirected to Cilium's L7
//! proxy (`flags2 & SVC_FLAG_L7_LOADBALANCER`: Envoy picks the backend), a failed lookup, a
//! read that never settled.
//!
//! **Privileges** (kernel 6.18): `BPF_MAP_LOOKUP_ELEM` and `BPF_OBJ_GET_INFO_BY_FD` need no
//! capability, whatever `kernel.unprivileged_bpf_disabled` says (tests/cilium_bpf.rs reads real
//! maps from a thread that dropped every capability, with the sysctl at 2). `BPF_OBJ_GET` checks
//! only the pin's file permissions (kernel/bpf/inode.c `bpf_obj_do_get`:
//! `path_permission(&path, ACC_MODE(flags))`; read from the source, not run here, which has no
//! bpffs): aya opens the pin read-write, so read and write permission on the pins (Cilium pins
//! them `0600`, owned by root: the agent's root user has both without a capability) and search
//! permission on `<bpf-root>/tc/globals` (`0755`, `MkdirBPF`). The pins are the host's bpffs,
//! mounted into the agent's container. The container runtime's RuntimeDefault seccomp profile
//! (containerd's `contrib/seccomp`) allows the `bpf` system call only to a container with
//! `CAP_BPF` (or `CAP_SYS_ADMIN`) in its bounding set: the chart adds `CAP_BPF` for that.
//!
//! The BPF system calls are aya's ([`aya::maps::MapData::from_pin`] opens a pin by path,
//! [`aya::maps::HashMap::get`] looks up one key): pure Rust, no libbpf to link (libbpf-rs would
//! build the C library), and no `unsafe` here: keys and values are byte arrays, which aya's
//! `Pod` already covers, encoded and decoded field by field. The reads go through [`LbMaps`]: [`Pinned`] opens the pins anew for each
//! read (a map that Cilium recreated is pinned anew, and a descriptor kept would read the old one
//! forever), [`KernelMaps`] reads maps already open (the root-only test's own maps), and
//! [`Table`] is the in-memory fake that the unit tests and the fuzz target rewrite between
//! lookups as Cilium would.

use super::{DataPlaneReader, ReadError, ServicePort};
use aya::maps::{HashMap, Map, MapData, MapError};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The services map's pin name (`Service4MapV2Name`).
pub const SERVICES_MAP: &str = "cilium_lb4_services_v2";
/// The backends map's pin name (`Backend4MapV3Name`).
pub const BACKENDS_MAP: &str = "cilium_lb4_backends_v3";
/// The folder of Cilium's pins under the bpffs root (`defaults.TCGlobalsPath`).
pub const PIN_DIR: &str = "tc/globals";
/// Where bpffs is mounted on a node.
pub const DEFAULT_BPF_ROOT: &str = "/sys/fs/bpf";

/// `sizeof(struct lb4_key)`.
pub const SERVICE_KEY_LEN: usize = 12;
/// `sizeof(struct lb4_service)`.
pub const SERVICE_VALUE_LEN: usize = 12;
/// `sizeof(__u32)`: the backends map's key.
pub const BACKEND_KEY_LEN: usize = 4;
/// `sizeof(struct lb4_backend)`.
pub const BACKEND_VALUE_LEN: usize = 12;

/// `LB_LOOKUP_SCOPE_EXT`: the scope of every ClusterIP frontend.
pub const SCOPE_EXT: u8 = 0;
/// `SVC_FLAG_L7_LOADBALANCER` of `flags2`: the frontend's connections go to Cilium's L7 proxy.
pub const FLAG2_L7_LOADBALANCER: u8 = 1 << 2;
/// Attempts at a consistent read before it is no sample.
pub const MAX_ATTEMPTS: u32 = 3;
/// The pause before a read that confirms a loss (the consistency rule, module doc): a few of
/// the scheduler's time slices, far longer than Cilium's rewrite of one frontend (microseconds
/// of system calls) unless its writer is stalled mid-rewrite.
pub const CONFIRM_PAUSE: Duration = Duration::from_millis(10);
/// Frontends whose last answer is remembered at most (a full memory is cleared).
pub const MAX_REMEMBERED: usize = 100_000;

/// The L4 protocol number of a Service's protocol (`u8proto`: TCP 6, UDP 17, SCTP 132).
pub fn protocol_number(protocol: &str) -> Option<u8> {
    match protocol.to_ascii_uppercase().as_str() {
        "TCP" => Some(6),
        "UDP" => Some(17),
        "SCTP" => Some(132),
        _ => None,
    }
}

/// `struct lb4_key` (lb.h): the services map's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceKey {
    /// `__be32 address`, offset 0: the frontend's address.
    pub address: Ipv4Addr,
    /// `__be16 dport`, offset 4, network order.
    pub port: u16,
    /// `__u16 backend_slot`, offset 6, host order: 0 is the master entry.
    pub slot: u16,
    /// `__u8 proto`, offset 8.
    pub proto: u8,
    /// `__u8 scope`, offset 9: `LB_LOOKUP_SCOPE_EXT` (0) or `_INT` (1).
    pub scope: u8,
    /// `__u8 pad[2]`, offsets 10-11 (Cilium writes zeros).
    pub pad: [u8; 2],
}

impl ServiceKey {
    /// The bytes of the key.
    pub fn encode(&self) -> [u8; SERVICE_KEY_LEN] {
        let mut b = [0; SERVICE_KEY_LEN];
        b[0..4].copy_from_slice(&self.address.octets());
        b[4..6].copy_from_slice(&self.port.to_be_bytes());
        b[6..8].copy_from_slice(&self.slot.to_ne_bytes());
        b[8] = self.proto;
        b[9] = self.scope;
        b[10..12].copy_from_slice(&self.pad);
        b
    }

    /// The key of `b`.
    pub fn decode(b: &[u8; SERVICE_KEY_LEN]) -> Self {
        Self {
            address: Ipv4Addr::new(b[0], b[1], b[2], b[3]),
            port: u16::from_be_bytes([b[4], b[5]]),
            slot: u16::from_ne_bytes([b[6], b[7]]),
            proto: b[8],
            scope: b[9],
            pad: [b[10], b[11]],
        }
    }
}

/// `struct lb4_service` (lb.h): the services map's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServiceValue {
    /// The union at offset 0, host order: a slot's `backend_id`; in the master entry the
    /// algorithm and affinity timeout, or the L7 proxy port.
    pub backend_id: u32,
    /// `__u16 count`, offset 4, host order: the master entry's active backends.
    pub count: u16,
    /// `__u16 rev_nat_index`, offset 6 (Cilium writes it in network order).
    pub rev_nat_index: u16,
    /// `__u8 flags`, offset 8 (`SVC_FLAG_*`).
    pub flags: u8,
    /// `__u8 flags2`, offset 9.
    pub flags2: u8,
    /// `__u16 qcount`, offset 10, host order: the master entry's terminating and quarantined
    /// backends.
    pub qcount: u16,
}

impl ServiceValue {
    /// The bytes of the value.
    pub fn encode(&self) -> [u8; SERVICE_VALUE_LEN] {
        let mut b = [0; SERVICE_VALUE_LEN];
        b[0..4].copy_from_slice(&self.backend_id.to_ne_bytes());
        b[4..6].copy_from_slice(&self.count.to_ne_bytes());
        b[6..8].copy_from_slice(&self.rev_nat_index.to_be_bytes());
        b[8] = self.flags;
        b[9] = self.flags2;
        b[10..12].copy_from_slice(&self.qcount.to_ne_bytes());
        b
    }

    /// The value of `b`.
    pub fn decode(b: &[u8; SERVICE_VALUE_LEN]) -> Self {
        Self {
            backend_id: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            count: u16::from_ne_bytes([b[4], b[5]]),
            rev_nat_index: u16::from_be_bytes([b[6], b[7]]),
            flags: b[8],
            flags2: b[9],
            qcount: u16::from_ne_bytes([b[10], b[11]]),
        }
    }
}

/// `struct lb4_backend` (lb.h): the backends map's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backend {
    /// `__be32 address`, offset 0: the endpoint's address.
    pub address: Ipv4Addr,
    /// `__be16 port`, offset 4, network order.
    pub port: u16,
    /// `__u8 proto`, offset 6.
    pub proto: u8,
    /// `__u8 flags`, offset 7: `BE_STATE_ACTIVE` 0, `_TERMINATING` 1, `_QUARANTINED` 2,
    /// `_MAINTENANCE` 3.
    pub flags: u8,
    /// `__u16 cluster_id`, offset 8, host order.
    pub cluster_id: u16,
    /// `__u8 zone`, offset 10.
    pub zone: u8,
    /// `__u8 pad`, offset 11.
    pub pad: u8,
}

impl Backend {
    /// The bytes of the value.
    pub fn encode(&self) -> [u8; BACKEND_VALUE_LEN] {
        let mut b = [0; BACKEND_VALUE_LEN];
        b[0..4].copy_from_slice(&self.address.octets());
        b[4..6].copy_from_slice(&self.port.to_be_bytes());
        b[6] = self.proto;
        b[7] = self.flags;
        b[8..10].copy_from_slice(&self.cluster_id.to_ne_bytes());
        b[10] = self.zone;
        b[11] = self.pad;
        b
    }

    /// The value of `b`.
    pub fn decode(b: &[u8; BACKEND_VALUE_LEN]) -> Self {
        Self {
            address: Ipv4Addr::new(b[0], b[1], b[2], b[3]),
            port: u16::from_be_bytes([b[4], b[5]]),
            proto: b[6],
            flags: b[7],
            cluster_id: u16::from_ne_bytes([b[8], b[9]]),
            zone: b[10],
            pad: b[11],
        }
    }
}

/// A ClusterIP frontend: the services map's keys of one Service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Frontend {
    /// The ClusterIP.
    pub address: Ipv4Addr,
    /// The Service port.
    pub port: u16,
    /// The L4 protocol number ([`protocol_number`]).
    pub proto: u8,
}

/// Why a Service port has no frontend this reader looks up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrontendError {
    /// An IPv6 ClusterIP: its frontend is in `cilium_lb6_services_v2`, not read.
    #[error("IPv6 Service {namespace}/{name}: its frontend is in cilium_lb6_services_v2, which this reader does not read")]
    Ipv6 {
        /// The Service's namespace.
        namespace: String,
        /// The Service's name.
        name: String,
    },
    /// A protocol with no number in Cilium's keys.
    #[error("protocol {protocol:?} is none of TCP, UDP, SCTP")]
    Protocol {
        /// The Service port's protocol.
        protocol: String,
    },
}

impl Frontend {
    /// The frontend of `service`: an IPv4 ClusterIP and TCP, UDP or SCTP.
    ///
    /// Errors: an IPv6 ClusterIP, another protocol ([`FrontendError`]).
    pub fn of(service: &ServicePort) -> Result<Self, FrontendError> {
        let IpAddr::V4(address) = service.cluster_ip else {
            return Err(FrontendError::Ipv6 { namespace: service.namespace.clone(), name: service.name.clone() });
        };
        let proto = protocol_number(&service.protocol).ok_or_else(|| FrontendError::Protocol { protocol: service.protocol.clone() })?;
        Ok(Self { address, port: service.port, proto })
    }

    /// The key of `slot` (scope [`SCOPE_EXT`]).
    pub fn key(&self, slot: u16) -> ServiceKey {
        ServiceKey { address: self.address, port: self.port, slot, proto: self.proto, scope: SCOPE_EXT, pad: [0; 2] }
    }
}

impl std::fmt::Display for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = match self.proto {
            6 => "TCP".to_string(),
            17 => "UDP".to_string(),
            132 => "SCTP".to_string(),
            n => format!("proto {n}"),
        };
        write!(f, "{}:{}/{proto}", self.address, self.port)
    }
}

/// Why the maps cannot be opened or looked up. Messages carry aya's error and its sources,
/// `: `-separated (the failed system call and its errno).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MapsError {
    /// A pin cannot be opened as a map (`BPF_OBJ_GET`: absent, no permission, not a map).
    #[error("{}: {message}", path.display())]
    Pin {
        /// The pin's path.
        path: PathBuf,
        /// aya's error.
        message: String,
    },
    /// The services map's information (`max_entries`) cannot be read.
    #[error("{map}'s information: {message}", map = SERVICES_MAP)]
    Info {
        /// aya's error.
        message: String,
    },
    /// A map is not a hash map of Cilium's key and value sizes.
    #[error("{map}: {message}")]
    NotCiliums {
        /// The map's name.
        map: &'static str,
        /// aya's error.
        message: String,
    },
    /// A lookup failed other than by an absent key.
    #[error("lookup in {map}: {message}")]
    Lookup {
        /// The map's name.
        map: &'static str,
        /// aya's error.
        message: String,
    },
    /// A lookup without a successful [`LbMaps::open`] first.
    #[error("the maps are not open")]
    NotOpen,
}

/// The two maps, looked up one key at a time. Errors name the map and the failed system call
/// with its errno, or a map that is not what Cilium pins ([`MapsError`]).
pub trait LbMaps: Send {
    /// Readies the maps for one read ([`Pinned`] opens the pins anew).
    fn open(&mut self) -> Result<(), MapsError>;
    /// The services map's value at `key`; None when it has no such entry.
    fn service(&mut self, key: &[u8; SERVICE_KEY_LEN]) -> Result<Option<[u8; SERVICE_VALUE_LEN]>, MapsError>;
    /// The backends map's value of backend `id`; None when it has no such entry.
    fn backend(&mut self, id: u32) -> Result<Option<[u8; BACKEND_VALUE_LEN]>, MapsError>;
    /// The services map's `max_entries`.
    fn capacity(&self) -> u32;
    /// Where the maps are, for error messages.
    fn describe(&self) -> String;
    /// Waits `pause` (the in-memory maps count it as time their writer had).
    fn pause(&mut self, pause: Duration) {
        std::thread::sleep(pause);
    }
}

/// `e` and its sources, `: `-separated (aya's `SyscallError` keeps the errno in its source).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        s = format!("{s}: {e}");
        source = e.source();
    }
    s
}

/// One of aya's lookups: the value, None for `ENOENT`, else the failure.
fn found<V>(r: Result<V, MapError>, map: &'static str) -> Result<Option<V>, MapsError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(MapError::KeyNotFound) => Ok(None),
        Err(e) => Err(MapsError::Lookup { map, message: chain(&e) }),
    }
}

/// The two maps, already open (file descriptors), read through aya.
pub struct KernelMaps {
    services: HashMap<MapData, [u8; SERVICE_KEY_LEN], [u8; SERVICE_VALUE_LEN]>,
    backends: HashMap<MapData, [u8; BACKEND_KEY_LEN], [u8; BACKEND_VALUE_LEN]>,
    capacity: u32,
    describe: String,
}

impl KernelMaps {
    /// The maps `services` and `backends`, described as `describe` in errors.
    ///
    /// Errors: the services map's information cannot be read, or a map is not a hash map of
    /// Cilium's key and value sizes ([`MapsError`]).
    pub fn new(services: MapData, backends: MapData, describe: &str) -> Result<Self, MapsError> {
        let capacity = services.info().map_err(|e| MapsError::Info { message: chain(&e) })?.max_entries();
        let not_ciliums = |map| move |e: MapError| MapsError::NotCiliums { map, message: chain(&e) };
        let services = Map::from_map_data(services).and_then(HashMap::try_from).map_err(not_ciliums(SERVICES_MAP))?;
        let backends = Map::from_map_data(backends).and_then(HashMap::try_from).map_err(not_ciliums(BACKENDS_MAP))?;
        Ok(Self { services, backends, capacity, describe: describe.to_string() })
    }

    /// The maps pinned in `dir` (`<bpf-root>/tc/globals`).
    ///
    /// Errors: a pin cannot be opened ([`MapsError::Pin`]), and those of [`KernelMaps::new`].
    pub fn from_pins(dir: &Path) -> Result<Self, MapsError> {
        let open = |name: &str| {
            let path = dir.join(name);
            MapData::from_pin(&path).map_err(|e| MapsError::Pin { message: chain(&e), path })
        };
        Self::new(open(SERVICES_MAP)?, open(BACKENDS_MAP)?, &dir.display().to_string())
    }
}

impl LbMaps for KernelMaps {
    fn open(&mut self) -> Result<(), MapsError> {
        Ok(())
    }

    fn service(&mut self, key: &[u8; SERVICE_KEY_LEN]) -> Result<Option<[u8; SERVICE_VALUE_LEN]>, MapsError> {
        found(self.services.get(key, 0), SERVICES_MAP)
    }

    fn backend(&mut self, id: u32) -> Result<Option<[u8; BACKEND_VALUE_LEN]>, MapsError> {
        found(self.backends.get(&id.to_ne_bytes(), 0), BACKENDS_MAP)
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn describe(&self) -> String {
        self.describe.clone()
    }
}

/// The maps Cilium pins under `<bpf-root>/tc/globals`, opened anew for each read.
pub struct Pinned {
    dir: PathBuf,
    maps: Option<KernelMaps>,
}

impl Pinned {
    /// The pins under `bpf_root` (e.g. [`DEFAULT_BPF_ROOT`]).
    pub fn new(bpf_root: &Path) -> Self {
        Self { dir: bpf_root.join(PIN_DIR), maps: None }
    }
}

/// The services map is pinned under `bpf_root`: Cilium's kube-proxy replacement runs on this
/// node (a file of that name, not yet opened as a map).
pub fn pinned(bpf_root: &Path) -> bool {
    std::fs::symlink_metadata(bpf_root.join(PIN_DIR).join(SERVICES_MAP)).is_ok()
}

impl LbMaps for Pinned {
    fn open(&mut self) -> Result<(), MapsError> {
        self.maps = None;
        self.maps = Some(KernelMaps::from_pins(&self.dir)?);
        Ok(())
    }

    fn service(&mut self, key: &[u8; SERVICE_KEY_LEN]) -> Result<Option<[u8; SERVICE_VALUE_LEN]>, MapsError> {
        self.maps.as_mut().ok_or(MapsError::NotOpen)?.service(key)
    }

    fn backend(&mut self, id: u32) -> Result<Option<[u8; BACKEND_VALUE_LEN]>, MapsError> {
        self.maps.as_mut().ok_or(MapsError::NotOpen)?.backend(id)
    }

    fn capacity(&self) -> u32 {
        self.maps.as_ref().map_or(0, LbMaps::capacity)
    }

    fn describe(&self) -> String {
        self.dir.display().to_string()
    }
}

/// A change of the maps, as Cilium makes them one system call at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// A services map entry written (`Some`) or deleted (`None`).
    Service([u8; SERVICE_KEY_LEN], Option<[u8; SERVICE_VALUE_LEN]>),
    /// A backends map entry written or deleted.
    Backend(u32, Option<[u8; BACKEND_VALUE_LEN]>),
}

/// The two maps in memory, for the tests and the fuzz target, on a clock of their own that
/// each lookup moves by one tick and a pause by [`Table::pause_ticks`]: the edits of
/// [`Table::pending`] are made once the clock reaches their tick (a writer rewriting the maps
/// between the reader's lookups, at whatever pace the test sets).
#[derive(Debug, Clone)]
pub struct Table {
    /// The services map.
    pub services: BTreeMap<[u8; SERVICE_KEY_LEN], [u8; SERVICE_VALUE_LEN]>,
    /// The backends map.
    pub backends: BTreeMap<u32, [u8; BACKEND_VALUE_LEN]>,
    /// The services map's `max_entries`.
    pub capacity: u32,
    /// Lookups answered so far.
    pub lookups: u64,
    /// The clock, ticks.
    pub now: u64,
    /// What a pause is worth, ticks (1,000 by default: a writer that is not stalled finishes a
    /// frontend's rewrite within a pause).
    pub pause_ticks: u64,
    /// (tick, edit), in the order made.
    pub pending: std::collections::VecDeque<(u64, Edit)>,
}

impl Default for Table {
    fn default() -> Self {
        Self { services: BTreeMap::new(), backends: BTreeMap::new(), capacity: 65_536, lookups: 0, now: 0, pause_ticks: 1_000, pending: Default::default() }
    }
}

impl Table {
    /// Makes `edit` now.
    pub fn apply(&mut self, edit: &Edit) {
        match edit {
            Edit::Service(k, Some(v)) => {
                self.services.insert(*k, *v);
            }
            Edit::Service(k, None) => {
                self.services.remove(k);
            }
            Edit::Backend(id, Some(v)) => {
                self.backends.insert(*id, *v);
            }
            Edit::Backend(id, None) => {
                self.backends.remove(id);
            }
        }
    }

    /// Makes the pending edits due by now.
    fn catch_up(&mut self) {
        while self.pending.front().is_some_and(|(n, _)| *n <= self.now) {
            if let Some((_, e)) = self.pending.pop_front() {
                self.apply(&e);
            }
        }
    }

    /// Makes the pending edits due by this lookup, counts it and moves the clock.
    fn tick(&mut self) {
        self.catch_up();
        self.lookups += 1;
        self.now += 1;
    }
}

impl LbMaps for Table {
    fn open(&mut self) -> Result<(), MapsError> {
        Ok(())
    }

    fn service(&mut self, key: &[u8; SERVICE_KEY_LEN]) -> Result<Option<[u8; SERVICE_VALUE_LEN]>, MapsError> {
        self.tick();
        Ok(self.services.get(key).copied())
    }

    fn backend(&mut self, id: u32) -> Result<Option<[u8; BACKEND_VALUE_LEN]>, MapsError> {
        self.tick();
        Ok(self.backends.get(&id).copied())
    }

    fn capacity(&self) -> u32 {
        self.capacity
    }

    fn describe(&self) -> String {
        "the in-memory maps".into()
    }

    fn pause(&mut self, _: Duration) {
        self.now = self.now.saturating_add(self.pause_ticks);
        self.catch_up();
    }
}

/// A backend of a frontend as Cilium's reconciler holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CiliumBackend {
    /// Its id (the backends map's key).
    pub id: u32,
    /// The endpoint's address.
    pub address: Ipv4Addr,
    /// The endpoint's port.
    pub port: u16,
    /// Its state: `BE_STATE_ACTIVE` 0, `_TERMINATING` 1, `_QUARANTINED` 2 (`_MAINTENANCE` 3 is in
    /// the backends map but in no slot).
    pub state: u8,
}

impl CiliumBackend {
    fn value(&self, proto: u8) -> [u8; BACKEND_VALUE_LEN] {
        Backend { address: self.address, port: self.port, proto, flags: self.state, cluster_id: 0, zone: 0, pad: 0 }.encode()
    }
}

/// The edits Cilium 1.20.2's `updateFrontend` makes, in its order, when `frontend` (reverse NAT
/// id `rev_nat`) goes from the backends `before` to `after`: each backend of `before` not in
/// `after` deleted from the backends map; then, in the sorted order (state, then address and
/// port), each new or changed backend written to the backends map just before its slot, slots
/// `1..n` written with the backend ids (`count` and `qcount` 0, as Cilium writes slots); the
/// master entry with the active count (the terminating ones when none is active) and the rest
/// as `qcount`; the slots past the new total deleted. For the tests and the fuzz target: the
/// reconciler's order is what the consistency rule leans on.
pub fn cilium_update(frontend: &Frontend, rev_nat: u16, before: &[CiliumBackend], after: &[CiliumBackend]) -> Vec<Edit> {
    let mut edits = Vec::new();
    for b in before.iter().filter(|b| !after.iter().any(|a| a.id == b.id)) {
        edits.push(Edit::Backend(b.id, None));
    }
    let mut sorted: Vec<CiliumBackend> = after.iter().filter(|b| b.state != 3).copied().collect();
    sorted.sort_by_key(|b| (b.state.min(2), b.address, b.port));
    let (mut active, mut terminating, mut inactive) = (0u16, 0u16, 0u16);
    for (i, b) in sorted.iter().enumerate() {
        if !before.contains(b) {
            edits.push(Edit::Backend(b.id, Some(b.value(frontend.proto))));
        }
        let slot = ServiceValue { backend_id: b.id, count: 0, rev_nat_index: rev_nat, flags: 0, flags2: 0, qcount: 0 };
        edits.push(Edit::Service(frontend.key(i as u16 + 1).encode(), Some(slot.encode())));
        match b.state {
            0 => active += 1,
            1 => terminating += 1,
            _ => inactive += 1,
        }
    }
    for b in after.iter().filter(|b| b.state == 3 && !before.contains(b)) {
        edits.push(Edit::Backend(b.id, Some(b.value(frontend.proto))));
    }
    if active == 0 {
        active = terminating;
    } else {
        inactive += terminating;
    }
    let master = ServiceValue { backend_id: 0, count: active, rev_nat_index: rev_nat, flags: 0, flags2: 0, qcount: inactive };
    edits.push(Edit::Service(frontend.key(0).encode(), Some(master.encode())));
    if after.len() != before.len() {
        for slot in sorted.len()..before.len() {
            edits.push(Edit::Service(frontend.key(slot as u16 + 1).encode(), None));
        }
    }
    edits
}

/// How one attempt at a read ended.
enum Attempt {
    /// A consistent read: the addresses of slots `1..=count`, or None without a master entry.
    Read(Option<BTreeSet<Ipv4Addr>>),
    /// The maps changed under the read (said in words): read again.
    Moved(String),
}

/// Why a frontend's read is no sample.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrontendReadError {
    /// A lookup failed.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// The master entry sends the frontend to Cilium's L7 proxy, which picks the backends.
    #[error("the frontend is redirected to Cilium's L7 proxy (flags2 SVC_FLAG_L7_LOADBALANCER): Envoy picks its backends")]
    L7Proxy,
    /// The master entry counts more slots than the services map holds.
    #[error("master entry with count {count} and qcount {qcount}: more slots than the map's {capacity} entries hold")]
    TooManySlots {
        /// Active backends' slots.
        count: u16,
        /// Terminating and quarantined backends' slots.
        qcount: u16,
        /// The services map's `max_entries`.
        capacity: u32,
    },
    /// Every attempt saw the maps change under it.
    #[error("the maps changed during each of {attempts} reads (last: {last})")]
    Inconsistent {
        /// The attempts made ([`MAX_ATTEMPTS`]).
        attempts: u32,
        /// What the last attempt saw change (`slot 1 of 2 absent`, `master entry rewritten`).
        last: String,
    },
}

/// One attempt: master, pass A with the backends, pass B, master again (module doc).
fn attempt(maps: &mut dyn LbMaps, frontend: &Frontend) -> Result<Attempt, FrontendReadError> {
    let master_key = frontend.key(0).encode();
    let Some(first) = maps.service(&master_key)? else { return Ok(Attempt::Read(None)) };
    let master = ServiceValue::decode(&first);
    if master.flags2 & FLAG2_L7_LOADBALANCER != 0 {
        return Err(FrontendReadError::L7Proxy);
    }
    let slots = u32::from(master.count) + u32::from(master.qcount);
    if slots >= maps.capacity() {
        return Err(FrontendReadError::TooManySlots { count: master.count, qcount: master.qcount, capacity: maps.capacity() });
    }
    let mut ids = Vec::with_capacity(usize::from(master.count));
    for slot in 1..=master.count {
        match maps.service(&frontend.key(slot).encode())? {
            Some(v) => ids.push(ServiceValue::decode(&v).backend_id),
            None => return Ok(Attempt::Moved(format!("slot {slot} of {} absent", master.count))),
        }
    }
    let mut ips = BTreeSet::new();
    for (slot, id) in (1..=master.count).zip(&ids) {
        match maps.backend(*id)? {
            Some(b) => ips.insert(Backend::decode(&b).address),
            None => return Ok(Attempt::Moved(format!("backend {id} of slot {slot} absent"))),
        };
    }
    for (slot, id) in (1..=master.count).zip(&ids) {
        match maps.service(&frontend.key(slot).encode())? {
            Some(v) if ServiceValue::decode(&v).backend_id == *id => {}
            Some(_) => return Ok(Attempt::Moved(format!("slot {slot} rewritten"))),
            None => return Ok(Attempt::Moved(format!("slot {slot} deleted"))),
        }
    }
    Ok(match maps.service(&master_key)? {
        Some(last) if last == first => Attempt::Read(Some(ips)),
        Some(_) => Attempt::Moved("master entry rewritten".into()),
        None => Attempt::Moved("master entry deleted".into()),
    })
}

/// The addresses of the backends in `frontend`'s active slots, read consistently (module doc),
/// or None when the frontend has no master entry.
///
/// Errors: no attempt of [`MAX_ATTEMPTS`] was consistent, a lookup failed, or the master entry
/// is not one this reader reads (the L7 proxy's, more slots than the map) ([`FrontendReadError`]).
pub fn read_frontend(maps: &mut dyn LbMaps, frontend: &Frontend) -> Result<Option<BTreeSet<Ipv4Addr>>, FrontendReadError> {
    let mut why = String::new();
    for _ in 0..MAX_ATTEMPTS {
        match attempt(maps, frontend)? {
            Attempt::Read(ips) => return Ok(ips),
            Attempt::Moved(w) => why = w,
        }
    }
    Err(FrontendReadError::Inconsistent { attempts: MAX_ATTEMPTS, last: why })
}

/// Cilium's kube-proxy replacement's reader: `maps` ([`Pinned`] on a node).
pub struct CiliumReader<M: LbMaps> {
    maps: M,
    /// Each frontend's last answer, for the confirmation of a loss.
    last: BTreeMap<Frontend, BTreeSet<Ipv4Addr>>,
    confirm_pause: Duration,
}

impl<M: LbMaps> CiliumReader<M> {
    /// A reader of `maps`.
    pub fn new(maps: M) -> Self {
        Self { maps, last: BTreeMap::new(), confirm_pause: CONFIRM_PAUSE }
    }

    /// The same reader, pausing `pause` before a confirming read.
    pub fn with_confirm_pause(mut self, pause: Duration) -> Self {
        self.confirm_pause = pause;
        self
    }

    /// The maps.
    pub fn maps(&mut self) -> &mut M {
        &mut self.maps
    }
}

impl CiliumReader<Pinned> {
    /// The reader of the maps pinned under `bpf_root`.
    pub fn pinned(bpf_root: &Path) -> Self {
        Self::new(Pinned::new(bpf_root))
    }
}

impl<M: LbMaps> DataPlaneReader for CiliumReader<M> {
    fn data_plane(&self) -> &'static str {
        "cilium"
    }

    fn endpoints(&mut self, service: &ServicePort) -> Result<Option<BTreeSet<IpAddr>>, ReadError> {
        let place = self.maps.describe();
        let command = |what: &str| format!("lookups in {place}/{{{SERVICES_MAP},{BACKENDS_MAP}}} of {what}");
        let frontend = Frontend::of(service)
            .map_err(|e| ReadError { command: command(&format!("{}:{}/{}", service.cluster_ip, service.port, service.protocol)), how: e.to_string() })?;
        let error = |e: FrontendReadError| ReadError { command: command(&frontend.to_string()), how: e.to_string() };
        self.maps.open().map_err(|e| error(e.into()))?;
        let mut read = read_frontend(&mut self.maps, &frontend).map_err(error)?;
        // a loss, or a frontend's first read, is confirmed by a second read a moment later: a
        // consistent read can still be a moment inside a reconcile that shifts the slots
        // (module doc)
        if let Some(now) = &read
            && self.last.get(&frontend).is_none_or(|before| !before.is_subset(now))
        {
            self.maps.pause(self.confirm_pause);
            read = read_frontend(&mut self.maps, &frontend).map_err(error)?;
        }
        match &read {
            Some(ips) => {
                if self.last.len() >= MAX_REMEMBERED && !self.last.contains_key(&frontend) {
                    self.last.clear();
                }
                self.last.insert(frontend, ips.clone());
            }
            None => {
                self.last.remove(&frontend);
            }
        }
        Ok(read.map(|ips| ips.into_iter().map(IpAddr::V4).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Faulty, test_service};
    use super::*;
    use std::mem::{offset_of, size_of};

    // The C structs of Cilium 1.20.2's bpf/lib/lb.h, field for field (`__be32`/`__u32` as u32,
    // `__be16`/`__u16` as u16, the union of `struct lb4_service` as its u32 members): `repr(C)`
    // lays them out as the C compiler does, so their offsets are lb.h's.
    #[allow(dead_code)]
    #[repr(C)]
    struct Lb4Key {
        address: u32,
        dport: u16,
        backend_slot: u16,
        proto: u8,
        scope: u8,
        pad: [u8; 2],
    }

    #[allow(dead_code)]
    #[repr(C)]
    struct Lb4Service {
        backend_id: u32,
        count: u16,
        rev_nat_index: u16,
        flags: u8,
        flags2: u8,
        qcount: u16,
    }

    #[allow(dead_code)]
    #[repr(C)]
    struct Lb4Backend {
        address: u32,
        port: u16,
        proto: u8,
        flags: u8,
        cluster_id: u16,
        zone: u8,
        pad: u8,
    }

    /// Each field of each encoding sits at its C offset with its C width, in the byte order
    /// Cilium writes (module doc), and decodes back.
    #[test]
    fn the_byte_layouts_are_lb_h_s() {
        assert_eq!((size_of::<Lb4Key>(), size_of::<Lb4Service>(), size_of::<Lb4Backend>()), (SERVICE_KEY_LEN, SERVICE_VALUE_LEN, BACKEND_VALUE_LEN));
        assert_eq!(BACKEND_KEY_LEN, size_of::<u32>());
        // the offsets written out from lb.h (no padding in any of the three)
        assert_eq!([offset_of!(Lb4Key, address), offset_of!(Lb4Key, dport), offset_of!(Lb4Key, backend_slot)], [0, 4, 6]);
        assert_eq!([offset_of!(Lb4Key, proto), offset_of!(Lb4Key, scope), offset_of!(Lb4Key, pad)], [8, 9, 10]);
        assert_eq!([offset_of!(Lb4Service, backend_id), offset_of!(Lb4Service, count), offset_of!(Lb4Service, rev_nat_index)], [0, 4, 6]);
        assert_eq!([offset_of!(Lb4Service, flags), offset_of!(Lb4Service, flags2), offset_of!(Lb4Service, qcount)], [8, 9, 10]);
        assert_eq!([offset_of!(Lb4Backend, address), offset_of!(Lb4Backend, port), offset_of!(Lb4Backend, proto), offset_of!(Lb4Backend, flags)], [0, 4, 6, 7]);
        assert_eq!([offset_of!(Lb4Backend, cluster_id), offset_of!(Lb4Backend, zone), offset_of!(Lb4Backend, pad)], [8, 10, 11]);
        let at = |b: &[u8], offset: usize, len: usize| b[offset..offset + len].to_vec();

        let key = ServiceKey { address: "10.96.0.1".parse().unwrap(), port: 443, slot: 0x0102, proto: 6, scope: 1, pad: [0xAA, 0xBB] };
        let k = key.encode();
        assert_eq!(at(&k, offset_of!(Lb4Key, address), 4), [10, 96, 0, 1], "the address as in the packet");
        assert_eq!(at(&k, offset_of!(Lb4Key, dport), 2), 443u16.to_be_bytes(), "__be16 dport");
        assert_eq!(at(&k, offset_of!(Lb4Key, backend_slot), 2), 0x0102u16.to_ne_bytes(), "__u16 backend_slot, host order");
        assert_eq!((k[offset_of!(Lb4Key, proto)], k[offset_of!(Lb4Key, scope)]), (6, 1));
        assert_eq!(at(&k, offset_of!(Lb4Key, pad), 2), [0xAA, 0xBB]);
        assert_eq!(ServiceKey::decode(&k), key);

        let value = ServiceValue { backend_id: 0x0A0B_0C0D, count: 0x0102, rev_nat_index: 0x0304, flags: 0x41, flags2: 0x04, qcount: 0x0506 };
        let v = value.encode();
        assert_eq!(at(&v, offset_of!(Lb4Service, backend_id), 4), 0x0A0B_0C0Du32.to_ne_bytes());
        assert_eq!(at(&v, offset_of!(Lb4Service, count), 2), 0x0102u16.to_ne_bytes());
        assert_eq!(at(&v, offset_of!(Lb4Service, rev_nat_index), 2), 0x0304u16.to_be_bytes(), "Service4Value.ToNetwork swaps RevNat");
        assert_eq!((v[offset_of!(Lb4Service, flags)], v[offset_of!(Lb4Service, flags2)]), (0x41, 0x04));
        assert_eq!(at(&v, offset_of!(Lb4Service, qcount), 2), 0x0506u16.to_ne_bytes());
        assert_eq!(ServiceValue::decode(&v), value);

        let backend = Backend { address: "10.244.1.5".parse().unwrap(), port: 8080, proto: 6, flags: 1, cluster_id: 0x0102, zone: 7, pad: 0 };
        let b = backend.encode();
        assert_eq!(at(&b, offset_of!(Lb4Backend, address), 4), [10, 244, 1, 5]);
        assert_eq!(at(&b, offset_of!(Lb4Backend, port), 2), 8080u16.to_be_bytes(), "Backend4ValueV3.ToNetwork swaps Port");
        assert_eq!((b[offset_of!(Lb4Backend, proto)], b[offset_of!(Lb4Backend, flags)]), (6, 1));
        assert_eq!(at(&b, offset_of!(Lb4Backend, cluster_id), 2), 0x0102u16.to_ne_bytes());
        assert_eq!((b[offset_of!(Lb4Backend, zone)], b[offset_of!(Lb4Backend, pad)]), (7, 0));
        assert_eq!(Backend::decode(&b), backend);
    }

    /// The slot 0 master entry of the spike's bpftool dump (cilium.md "Where a removal is
    /// visible": count a little-endian u16 at byte 4, qcount at bytes 10-11).
    #[cfg(target_endian = "little")]
    #[test]
    fn a_master_entry_as_bpftool_prints_it() {
        let v = ServiceValue::decode(&[0, 0, 0, 0, 5, 0, 0, 7, 0, 0, 1, 0]);
        assert_eq!((v.count, v.qcount, v.rev_nat_index, v.backend_id), (5, 1, 7, 0));
        let k = ServiceKey::decode(&[10, 96, 0, 10, 0, 53, 2, 0, 17, 0, 0, 0]);
        assert_eq!((k.address, k.port, k.slot, k.proto), ("10.96.0.10".parse().unwrap(), 53, 2, 17));
    }

    fn fe() -> Frontend {
        Frontend { address: "10.96.0.1".parse().unwrap(), port: 443, proto: 6 }
    }

    fn be(id: u32, ip: &str, state: u8) -> CiliumBackend {
        CiliumBackend { id, address: ip.parse().unwrap(), port: 8080, state }
    }

    fn ips(list: &[&str]) -> BTreeSet<Ipv4Addr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// `table` after Cilium's edits from `before` to `after`, all made at once.
    fn update(table: &mut Table, before: &[CiliumBackend], after: &[CiliumBackend]) {
        for e in cilium_update(&fe(), 7, before, after) {
            table.apply(&e);
        }
    }

    #[test]
    fn the_active_slots_are_the_endpoints_and_a_removal_shows_as_cilium_makes_it() {
        let mut t = Table::default();
        assert_eq!(read_frontend(&mut t, &fe()), Ok(None), "no master entry: the frontend is not in the maps");
        let three = [be(1, "10.244.1.5", 0), be(2, "10.244.2.4", 0), be(3, "10.244.1.4", 0)];
        update(&mut t, &[], &three);
        // the slots in Cilium's order: by address
        let slot = |t: &Table, s: u16| t.services.get(&fe().key(s).encode()).map(|v| ServiceValue::decode(v).backend_id);
        assert_eq!([slot(&t, 1), slot(&t, 2), slot(&t, 3), slot(&t, 4)], [Some(3), Some(1), Some(2), None]);
        let master = ServiceValue::decode(&t.services[&fe().key(0).encode()]);
        assert_eq!((master.count, master.qcount, master.rev_nat_index), (3, 0, 7));
        assert_eq!(read_frontend(&mut t, &fe()), Ok(Some(ips(&["10.244.1.4", "10.244.1.5", "10.244.2.4"]))));
        // the middle one terminating: it moves to the last slot, out of slots 1..count
        let terminating = [be(1, "10.244.1.5", 1), be(2, "10.244.2.4", 0), be(3, "10.244.1.4", 0)];
        update(&mut t, &three, &terminating);
        assert_eq!([slot(&t, 1), slot(&t, 2), slot(&t, 3)], [Some(3), Some(2), Some(1)]);
        let master = ServiceValue::decode(&t.services[&fe().key(0).encode()]);
        assert_eq!((master.count, master.qcount), (2, 1));
        assert_eq!(read_frontend(&mut t, &fe()), Ok(Some(ips(&["10.244.1.4", "10.244.2.4"]))));
        // gone from the EndpointSlice: its backend and its slot deleted
        let two = [be(2, "10.244.2.4", 0), be(3, "10.244.1.4", 0)];
        update(&mut t, &terminating, &two);
        assert_eq!((slot(&t, 3), t.backends.contains_key(&1)), (None, false));
        assert_eq!(read_frontend(&mut t, &fe()), Ok(Some(ips(&["10.244.1.4", "10.244.2.4"]))));
        // only terminating backends left: they take new connections (KEP-1669)
        let draining = [be(2, "10.244.2.4", 1), be(3, "10.244.1.4", 1)];
        update(&mut t, &two, &draining);
        assert_eq!(read_frontend(&mut t, &fe()), Ok(Some(ips(&["10.244.1.4", "10.244.2.4"]))));
        // quarantined (unhealthy) ones never do; none left: an empty set
        update(&mut t, &draining, &[be(2, "10.244.2.4", 2)]);
        assert_eq!(read_frontend(&mut t, &fe()), Ok(Some(BTreeSet::new())));
        update(&mut t, &[be(2, "10.244.2.4", 2)], &[]);
        assert_eq!(read_frontend(&mut t, &fe()), Ok(Some(BTreeSet::new())));
        // another port, protocol or address is another frontend
        for other in [Frontend { port: 80, ..fe() }, Frontend { proto: 17, ..fe() }, Frontend { address: "10.96.0.2".parse().unwrap(), ..fe() }] {
            assert_eq!(read_frontend(&mut t, &other), Ok(None), "{other}");
        }
    }

    /// The reader on a Service port: the frontend's endpoints as IPs, `cilium` its data plane.
    #[test]
    fn the_reader_answers_a_service_port() {
        let mut t = Table::default();
        update(&mut t, &[], &[be(1, "10.244.1.5", 0), be(2, "10.244.2.4", 1)]);
        let mut r = CiliumReader::new(t);
        assert_eq!(r.data_plane(), "cilium");
        let s = test_service("default", "kubernetes", "https");
        assert_eq!(r.endpoints(&s), Ok(Some(["10.244.1.5".parse().unwrap()].into())));
        let udp = ServicePort { protocol: "udp".into(), ..s.clone() };
        assert_eq!(r.endpoints(&udp), Ok(None), "UDP is another frontend");
        // the Service deleted: Cilium deletes the master entry first
        r.maps().apply(&Edit::Service(fe().key(0).encode(), None));
        assert_eq!(r.endpoints(&s), Ok(None));
        let mut faulty = Faulty::new(r, 1);
        assert_eq!(faulty.endpoints(&s).unwrap_err().how, "injected fault");
    }

    /// Every failure is an error, never an empty set taken for a removal.
    #[test]
    fn a_failed_read_is_no_sample() {
        let s = test_service("default", "kubernetes", "https");
        let mut t = Table::default();
        update(&mut t, &[], &[be(1, "10.244.1.5", 0), be(2, "10.244.2.4", 0)]);
        let v6 = ServicePort { cluster_ip: "fd00::1".parse().unwrap(), ..s.clone() };
        let e = CiliumReader::new(t.clone()).endpoints(&v6).unwrap_err();
        assert!(e.how.contains("IPv6 Service default/kubernetes") && e.how.contains("cilium_lb6_services_v2"), "{e}");
        assert!(e.command.contains("fd00::1:443/TCP"), "{e}");
        let icmp = ServicePort { protocol: "ICMP".into(), ..s.clone() };
        assert!(CiliumReader::new(t.clone()).endpoints(&icmp).unwrap_err().how.contains("none of TCP, UDP, SCTP"));
        // a slot whose backend is not in the backends map, for good
        let mut dangling = t.clone();
        dangling.backends.remove(&2);
        let e = CiliumReader::new(dangling).endpoints(&s).unwrap_err();
        assert_eq!(e.command, "lookups in the in-memory maps/{cilium_lb4_services_v2,cilium_lb4_backends_v3} of 10.96.0.1:443/TCP");
        assert_eq!(e.how, "the maps changed during each of 3 reads (last: backend 2 of slot 2 absent)");
        // an active slot missing, for good
        let mut holed = t.clone();
        holed.services.remove(&fe().key(1).encode());
        assert_eq!(read_frontend(&mut holed, &fe()), Err(FrontendReadError::Inconsistent { attempts: 3, last: "slot 1 of 2 absent".into() }));
        // a master entry that says more slots than the map holds: an error, not 65,535 lookups
        let mut huge = t.clone();
        huge.capacity = 100;
        huge.services.insert(fe().key(0).encode(), ServiceValue { count: 60, qcount: 40, ..Default::default() }.encode());
        let e = read_frontend(&mut huge, &fe()).unwrap_err();
        assert_eq!(e, FrontendReadError::TooManySlots { count: 60, qcount: 40, capacity: 100 });
        assert_eq!(e.to_string(), "master entry with count 60 and qcount 40: more slots than the map's 100 entries hold");
        assert_eq!(huge.lookups, 1, "refused at the master entry");
        // a frontend redirected to the L7 proxy: Envoy picks the backend
        let mut l7 = t.clone();
        let master = ServiceValue { count: 2, flags2: FLAG2_L7_LOADBALANCER, ..Default::default() };
        l7.services.insert(fe().key(0).encode(), master.encode());
        assert_eq!(read_frontend(&mut l7, &fe()), Err(FrontendReadError::L7Proxy));
        // pins that are not there: the path and the errno
        let root = tempfile::tempdir().unwrap();
        let e = CiliumReader::pinned(root.path()).endpoints(&s).unwrap_err();
        let pin = root.path().join("tc/globals/cilium_lb4_services_v2");
        assert!(e.how.starts_with(&format!("{}: ", pin.display())) && e.how.contains("BPF_OBJ_GET"), "{e}");
        assert!(e.how.contains("No such file or directory"), "{e}");
    }

    /// A frontend's first read is confirmed too: caught inside a rewrite (a backend added first
    /// in the order, the one after it not yet rewritten into its new slot), it is read again
    /// after the pause, once the writer is done.
    #[test]
    fn a_first_read_inside_a_rewrite_is_confirmed() {
        let (a, b, c) = (be(1, "10.244.1.5", 0), be(2, "10.244.1.9", 0), be(3, "10.244.1.3", 0));
        let s = test_service("default", "kubernetes", "https");
        for (pause_ticks, want) in [(1_000, ips(&["10.244.1.3", "10.244.1.5", "10.244.1.9"])), (0, ips(&["10.244.1.3", "10.244.1.9"]))] {
            let mut t = Table { pause_ticks, ..Table::default() };
            update(&mut t, &[], &[a, b]);
            let edits = cilium_update(&fe(), 7, &[a, b], &[c, a, b]);
            // the new backend and slot 1 written; slots 2 and 3 and the master entry later
            t.apply(&edits[0]);
            t.apply(&edits[1]);
            t.pending = edits[2..].iter().map(|e| (100, e.clone())).collect();
            let got = CiliumReader::new(t).endpoints(&s).unwrap().unwrap();
            let got: BTreeSet<Ipv4Addr> = got.into_iter().map(|ip| if let IpAddr::V4(v4) = ip { v4 } else { unreachable!() }).collect();
            assert_eq!(got, want, "a pause worth {pause_ticks} ticks");
        }
    }

    /// A writer that never stops: each attempt sees the master entry move, and the read is no
    /// sample after [`MAX_ATTEMPTS`].
    #[test]
    fn a_frontend_rewritten_during_every_attempt_is_no_sample() {
        let mut t = Table::default();
        update(&mut t, &[], &[be(1, "10.244.1.5", 0)]);
        for n in 0..100 {
            let master = ServiceValue { count: 1, rev_nat_index: n, ..Default::default() };
            t.pending.push_back((n.into(), Edit::Service(fe().key(0).encode(), Some(master.encode()))));
        }
        let e = read_frontend(&mut t, &fe()).unwrap_err();
        assert_eq!(e.to_string(), "the maps changed during each of 3 reads (last: master entry rewritten)");
        assert_eq!(t.lookups, 15, "3 attempts of master, slot, backend, slot, master");
    }

    /// Reads while Cilium rewrites the frontend, its edits interleaved with the lookups at every
    /// start and pace: a read is no sample, or a set the frontend had before or after the
    /// rewrite; an endpoint active before and after is never missing (a new backend whose
    /// address sorts first shifts the others through the slots). Without the confirming read
    /// (a writer stalled mid-rewrite for longer than [`CONFIRM_PAUSE`]), a moment inside the
    /// rewrite is read: the limit of the rule.
    #[test]
    fn reads_during_cilium_s_rewrites_are_consistent_or_no_sample() {
        let (samples, refused, mid_rewrite) = interleaved_reads(1_000);
        eprintln!("{samples} samples, {refused} reads refused");
        assert_eq!(mid_rewrite, Vec::<String>::new());
        assert!(samples > 10 * refused, "most reads are samples: {samples} samples, {refused} refused");
        let (_, _, mid_rewrite) = interleaved_reads(0);
        assert!(mid_rewrite.iter().any(|m| m.starts_with("a backend added first in the order")), "{mid_rewrite:?}");
    }

    type Scenario = (&'static str, Vec<CiliumBackend>, Vec<CiliumBackend>, Vec<BTreeSet<Ipv4Addr>>);

    /// [`reads_during_cilium_s_rewrites_are_consistent_or_no_sample`]'s reads, a pause worth
    /// `pause_ticks`: the samples, the reads refused, and each read of a set the frontend had
    /// neither before nor after the rewrite.
    fn interleaved_reads(pause_ticks: u64) -> (usize, usize, Vec<String>) {
        let (a, b, c) = (be(1, "10.244.1.5", 0), be(2, "10.244.1.9", 0), be(3, "10.244.1.3", 0));
        // (what, before, after, the sets the frontend had)
        let scenarios: [Scenario; 4] = [
            (
                "a backend added first in the order",
                vec![a, b],
                vec![c, a, b],
                vec![ips(&["10.244.1.5", "10.244.1.9"]), ips(&["10.244.1.3", "10.244.1.5", "10.244.1.9"])],
            ),
            (
                "a backend terminating",
                vec![c, a, b],
                vec![c, be(1, "10.244.1.5", 1), b],
                vec![ips(&["10.244.1.3", "10.244.1.5", "10.244.1.9"]), ips(&["10.244.1.3", "10.244.1.9"])],
            ),
            ("a backend deleted", vec![c, a, b], vec![c, b], vec![ips(&["10.244.1.3", "10.244.1.5", "10.244.1.9"]), ips(&["10.244.1.3", "10.244.1.9"])]),
            ("one replaced by another", vec![a, b], vec![c, b], vec![ips(&["10.244.1.5", "10.244.1.9"]), ips(&["10.244.1.3", "10.244.1.9"])]),
        ];
        let s = test_service("default", "kubernetes", "https");
        let (mut samples, mut refused, mut mid_rewrite) = (0, 0, Vec::new());
        for (name, before, after, allowed) in &scenarios {
            for start in 0..40u64 {
                for pace in 1..=6u64 {
                    let mut t = Table { pause_ticks, ..Table::default() };
                    update(&mut t, &[], before);
                    let mut r = CiliumReader::new(t);
                    assert!(r.endpoints(&s).unwrap().is_some(), "the read before");
                    let base = r.maps().now;
                    for (i, e) in cilium_update(&fe(), 7, before, after).into_iter().enumerate() {
                        r.maps().pending.push_back((base + start + pace * i as u64, e));
                    }
                    for _ in 0..3 {
                        match r.endpoints(&s) {
                            Ok(Some(got)) => {
                                let got: BTreeSet<Ipv4Addr> = got.into_iter().map(|ip| if let IpAddr::V4(v4) = ip { v4 } else { unreachable!() }).collect();
                                if !allowed.contains(&got) {
                                    mid_rewrite.push(format!("{name}, start {start}, pace {pace}: {got:?}"));
                                }
                                samples += 1;
                            }
                            Ok(None) => panic!("{name}, start {start}, pace {pace}: the master entry is never absent"),
                            Err(e) => {
                                assert!(e.how.starts_with("the maps changed during each of 3 reads"), "{e}");
                                refused += 1;
                            }
                        }
                    }
                }
            }
        }
        (samples, refused, mid_rewrite)
    }

    /// Real BPF hash maps of Cilium's key and value sizes, created here through aya (root or
    /// CAP_BPF; skipped, saying why, where `bpf()` refuses), never pinned: filled as Cilium fills
    /// a frontend of 3 backends, read through [`KernelMaps`] on descriptors of their own, then a
    /// backend removed as Cilium removes it (terminating: slots rewritten, count decremented;
    /// then deleted with its slot), read again. The maps are freed with their last descriptor.
    #[test]
    fn on_real_bpf_maps_a_removal_reads_as_cilium_writes_it() {
        use aya::maps::IterableMap as _;
        use std::os::fd::AsFd as _;
        let mut services = match HashMap::<MapData, [u8; SERVICE_KEY_LEN], [u8; SERVICE_VALUE_LEN]>::create(1024, 0) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("skipped: BPF_MAP_CREATE refused (the test needs root or CAP_BPF): {}", chain(&e));
                return;
            }
        };
        let mut backends = HashMap::<MapData, [u8; BACKEND_KEY_LEN], [u8; BACKEND_VALUE_LEN]>::create(1024, 0).unwrap();
        let dup = |m: &MapData| MapData::from_fd(m.fd().as_fd().try_clone_to_owned().unwrap()).unwrap();
        let maps = KernelMaps::new(dup(services.map()), dup(backends.map()), "the test's maps").unwrap();
        assert_eq!(maps.capacity(), 1024);
        let mut reader = CiliumReader::new(maps);
        let mut write = |edits: Vec<Edit>| {
            for e in edits {
                match e {
                    Edit::Service(k, Some(v)) => services.insert(k, v, 0).unwrap(),
                    Edit::Service(k, None) => services.remove(&k).unwrap(),
                    Edit::Backend(id, Some(v)) => backends.insert(id.to_ne_bytes(), v, 0).unwrap(),
                    Edit::Backend(id, None) => backends.remove(&id.to_ne_bytes()).unwrap(),
                }
            }
        };
        let s = test_service("default", "kubernetes", "https");
        let set = |list: &[&str]| -> BTreeSet<IpAddr> { list.iter().map(|s| s.parse().unwrap()).collect() };
        assert_eq!(reader.endpoints(&s), Ok(None), "an empty map: no frontend");
        let three = [be(11, "10.244.1.5", 0), be(12, "10.244.2.4", 0), be(13, "10.244.1.4", 0)];
        write(cilium_update(&fe(), 7, &[], &three));
        assert_eq!(reader.endpoints(&s), Ok(Some(set(&["10.244.1.4", "10.244.1.5", "10.244.2.4"]))));
        let terminating = [be(11, "10.244.1.5", 1), be(12, "10.244.2.4", 0), be(13, "10.244.1.4", 0)];
        write(cilium_update(&fe(), 7, &three, &terminating));
        assert_eq!(reader.endpoints(&s), Ok(Some(set(&["10.244.1.4", "10.244.2.4"]))));
        let master = ServiceValue::decode(&reader_lookup(&mut reader, fe().key(0)).unwrap());
        assert_eq!((master.count, master.qcount), (2, 1), "count decremented, the terminating backend in the tail");
        assert_eq!(ServiceValue::decode(&reader_lookup(&mut reader, fe().key(3)).unwrap()).backend_id, 11);
        let two = [be(12, "10.244.2.4", 0), be(13, "10.244.1.4", 0)];
        write(cilium_update(&fe(), 7, &terminating, &two));
        assert_eq!(reader_lookup(&mut reader, fe().key(3)), None, "its slot deleted");
        assert_eq!(reader.endpoints(&s), Ok(Some(set(&["10.244.1.4", "10.244.2.4"]))));
        // the Service deleted: Cilium deletes the master entry first, then the slots
        write(vec![Edit::Service(fe().key(0).encode(), None), Edit::Service(fe().key(1).encode(), None), Edit::Service(fe().key(2).encode(), None)]);
        assert_eq!(reader.endpoints(&s), Ok(None));
        // a map whose values are not lb4_service's size is refused by aya's size check
        let wrong = HashMap::<MapData, [u8; SERVICE_KEY_LEN], [u8; 16]>::create(16, 0).unwrap();
        let e = KernelMaps::new(dup(wrong.map()), dup(backends.map()), "wrong").err().unwrap();
        let MapsError::NotCiliums { map, message } = &e else { panic!("{e:?}") };
        assert_eq!(*map, "cilium_lb4_services_v2");
        assert!(message.contains("16") && message.contains("12"), "{e}");
    }

    /// One lookup in the reader's services map.
    fn reader_lookup(reader: &mut CiliumReader<KernelMaps>, key: ServiceKey) -> Option<[u8; SERVICE_VALUE_LEN]> {
        reader.maps().service(&key.encode()).unwrap()
    }
}
