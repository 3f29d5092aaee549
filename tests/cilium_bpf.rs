//! The privileges of the Cilium reader's system calls, on real BPF maps: a thread that has
//! dropped every capability (as the agent's container runs: root's user id, capabilities
//! dropped but for two network ones) reads maps created here, while creating one is refused to
//! it. The maps are created through aya by the test's main thread (root or CAP_BPF; skipped,
//! saying why, where `bpf()` refuses), never pinned, and freed with their last descriptor.
//! `BPF_OBJ_GET` of a pin is not exercised: it needs a bpffs mount, which the test does not make
//! (its permission check is the pin's file mode: src/agent/observer/cilium.rs, "Privileges").

use aya::maps::{HashMap, IterableMap as _, MapData};
use safe_termination::agent::observer::DataPlaneReader as _;
use safe_termination::agent::observer::cilium::{
    BACKEND_KEY_LEN, BACKEND_VALUE_LEN, CiliumBackend, CiliumReader, Edit, Frontend, KernelMaps, SERVICE_KEY_LEN, SERVICE_VALUE_LEN, cilium_update,
};
use safe_termination::core::removals::ServicePort;
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::fd::AsFd as _;

/// Drops every capability of the calling thread (effective, permitted, inheritable: `capset(2)`
/// on thread id 0, which is the caller; capabilities are per thread).
fn drop_capabilities() -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two 32-bit words of each set
    let header = Header { version: 0x2008_0522, pid: 0 };
    let data = [Data { effective: 0, permitted: 0, inheritable: 0 }; 2];
    // SAFETY: capset reads a header and two data words, both valid for the call's length.
    let r = unsafe { libc::syscall(libc::SYS_capset, &header as *const Header, data.as_ptr()) };
    if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// The effective capabilities of the calling thread, from `/proc/thread-self/status`.
fn effective_capabilities() -> String {
    let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
    status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_string()
}

#[test]
fn a_thread_without_capabilities_reads_the_maps_and_cannot_create_one() {
    let mut services = match HashMap::<MapData, [u8; SERVICE_KEY_LEN], [u8; SERVICE_VALUE_LEN]>::create(64, 0) {
        Ok(m) => m,
        Err(e) => {
            let why = std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
            eprintln!("skipped: BPF_MAP_CREATE refused (the test needs root or CAP_BPF): {e}{why}");
            return;
        }
    };
    let mut backends = HashMap::<MapData, [u8; BACKEND_KEY_LEN], [u8; BACKEND_VALUE_LEN]>::create(64, 0).unwrap();
    let frontend = Frontend { address: "10.96.0.1".parse().unwrap(), port: 443, proto: 6 };
    let backend = |id: u32, ip: &str, state: u8| CiliumBackend { id, address: ip.parse().unwrap(), port: 8080, state };
    let list = [backend(1, "10.244.1.5", 0), backend(2, "10.244.2.4", 1), backend(3, "10.244.1.4", 0)];
    for e in cilium_update(&frontend, 9, &[], &list) {
        match e {
            Edit::Service(k, Some(v)) => services.insert(k, v, 0).unwrap(),
            Edit::Backend(id, Some(v)) => backends.insert(id.to_ne_bytes(), v, 0).unwrap(),
            other => panic!("no deletion in a first fill: {other:?}"),
        }
    }
    let dup = |m: &MapData| m.fd().as_fd().try_clone_to_owned().unwrap();
    let (services_fd, backends_fd) = (dup(services.map()), dup(backends.map()));
    let service = ServicePort {
        namespace: "default".into(),
        name: "web".into(),
        port_name: String::new(),
        protocol: "TCP".into(),
        cluster_ip: "10.96.0.1".parse().unwrap(),
        port: 443,
    };
    let unprivileged = std::thread::spawn(move || {
        drop_capabilities().expect("capset");
        assert_eq!(effective_capabilities(), "0000000000000000", "this thread has no capability left");
        let Err(refused) = HashMap::<MapData, [u8; 4], [u8; 4]>::create(1, 0) else { panic!("BPF_MAP_CREATE is refused without CAP_BPF") };
        let refused = match std::error::Error::source(&refused) {
            Some(why) => format!("{refused}: {why}"),
            None => refused.to_string(),
        };
        // the lookups (BPF_OBJ_GET_INFO_BY_FD, BPF_MAP_LOOKUP_ELEM) need none
        let maps = KernelMaps::new(MapData::from_fd(services_fd).unwrap(), MapData::from_fd(backends_fd).unwrap(), "the test's maps").unwrap();
        let mut reader = CiliumReader::new(maps);
        (refused, reader.endpoints(&service))
    });
    let (refused, read) = unprivileged.join().unwrap();
    eprintln!("without capabilities: map creation refused ({refused}), the frontend read: {read:?}");
    let active: BTreeSet<IpAddr> = ["10.244.1.4", "10.244.1.5"].iter().map(|s| s.parse().unwrap()).collect();
    assert_eq!(read, Ok(Some(active)), "the active backends, the terminating one left out");
    assert_ne!(effective_capabilities(), "0000000000000000", "the test's own thread kept its capabilities");
}
