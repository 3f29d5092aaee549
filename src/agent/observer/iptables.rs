//! kube-proxy's iptables mode (either backend: `iptables-nft` or `iptables-legacy`, the same
//! binary kube-proxy runs). A Service port's rules are its `KUBE-SVC-` chain in the `nat` table,
//! one rule per endpoint jumping to a `KUBE-SEP-` chain whose DNAT target is the endpoint.
//!
//! The chain's name is computed as kube-proxy computes it (`pkg/proxy/iptables/proxier.go`
//! `servicePortChainName`: `KUBE-SVC-` and the first 16 characters of the base32 of the SHA-256
//! of `namespace/name:port` (`:port` only for a named port) followed by the lower-case
//! protocol), so each read lists that chain alone, never the whole table. A `KUBE-SEP-` name is
//! a hash of its endpoint, so its IP is read once and kept.

use super::nft_netlink::{ChainJumps, Family};
use super::{DataPlaneReader, ReadError, Runner, ServicePort, chain_absent, excerpt, ip_of_destination};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The `KUBE-SVC-` chain of a Service port.
pub fn service_chain(service: &ServicePort) -> String {
    let mut port_name = format!("{}/{}", service.namespace, service.name);
    if !service.port_name.is_empty() {
        port_name = format!("{port_name}:{}", service.port_name);
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, format!("{port_name}{}", service.protocol.to_ascii_lowercase()).as_bytes());
    let encoded = data_encoding::BASE32.encode(digest.as_ref());
    format!("KUBE-SVC-{}", &encoded[..16])
}

/// Why an `iptables -t nat -S <chain>` listing says nothing: what in it is not what kube-proxy
/// writes. Lines and values are quoted excerpts of at most 120 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    /// A line that neither declares nor appends to the chain listed.
    #[error("a line that is not chain {chain}'s: {line}")]
    ForeignLine {
        /// The chain listed.
        chain: String,
        /// The line.
        line: String,
    },
    /// No `-N <chain>` line: the listing is not of that chain.
    #[error("no '-N {chain}' line")]
    NotDeclared {
        /// The chain listed.
        chain: String,
    },
    /// A `--to-destination` as the rule's last word.
    #[error("--to-destination without a value: {line}")]
    DestinationWithoutValue {
        /// The rule.
        line: String,
    },
    /// A DNAT destination that is not `IP:port` or `[IPv6]:port`.
    #[error("DNAT destination {destination} is not IP:port")]
    DestinationNotIp {
        /// The destination.
        destination: String,
    },
    /// An endpoint chain without a DNAT rule.
    #[error("no DNAT rule in chain {chain}")]
    NoDnat {
        /// The chain listed.
        chain: String,
    },
}

/// The `KUBE-SEP-` chains a `iptables -t nat -S <chain>` listing of `chain` jumps to. The listing
/// must declare the chain (`-N <chain>`) and hold only its own rules.
///
/// Errors: a line of another chain, or no `-N` line ([`ListingError`]).
pub fn parse_service_chain(text: &str, chain: &str) -> Result<Vec<String>, ListingError> {
    let mut declared = false;
    let mut seps = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("-N"), Some(c)) if c == chain => declared = true,
            (Some("-A"), Some(c)) if c == chain => {
                let all: Vec<&str> = line.split_whitespace().collect();
                if let Some(i) = all.iter().position(|w| *w == "-j")
                    && let Some(target) = all.get(i + 1)
                    && target.starts_with("KUBE-SEP-")
                {
                    seps.push(target.to_string());
                }
            }
            _ => return Err(ListingError::ForeignLine { chain: chain.to_string(), line: excerpt(line) }),
        }
    }
    if !declared {
        return Err(ListingError::NotDeclared { chain: chain.to_string() });
    }
    Ok(seps)
}

/// The endpoint of a `iptables -t nat -S <KUBE-SEP chain>` listing: its DNAT target's IP.
///
/// Errors: no DNAT rule, or a destination that is missing or no IP ([`ListingError`]).
pub fn parse_endpoint_chain(text: &str, chain: &str) -> Result<IpAddr, ListingError> {
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() != Some(&"-A") || words.get(1) != Some(&chain) {
            continue;
        }
        if let Some(i) = words.iter().position(|w| *w == "--to-destination") {
            let dest = words.get(i + 1).ok_or_else(|| ListingError::DestinationWithoutValue { line: excerpt(line) })?;
            return ip_of_destination(dest).ok_or_else(|| ListingError::DestinationNotIp { destination: excerpt(dest) });
        }
    }
    Err(ListingError::NoDnat { chain: chain.to_string() })
}

/// kube-proxy iptables mode's reader: `program` is the node's `iptables` of the backend
/// kube-proxy uses (`iptables-nft` or `iptables-legacy`).
pub struct IptablesReader<R: Runner> {
    runner: R,
    program: String,
    legacy: bool,
    /// `KUBE-SEP-` chain -> its endpoint (the name is a hash of the endpoint, so it never
    /// changes); at most [`MAX_KNOWN_ENDPOINT_CHAINS`].
    endpoints: BTreeMap<String, IpAddr>,
    /// iptables-nft only: the `KUBE-SVC-` chain's jumps read over netlink (about 0.1 ms)
    /// instead of `iptables -S` (3 ms idle, up to a second while kube-proxy's restore commits
    /// at 4,000 Services); the program still reads each new `KUBE-SEP-` chain's DNAT target
    /// once (an xtables extension, whose layout follows the iptables version).
    netlink: Option<Box<dyn ChainJumps>>,
}

/// Endpoint chains remembered at most (the oldest are not tracked: a full map is cleared).
pub const MAX_KNOWN_ENDPOINT_CHAINS: usize = 100_000;

impl<R: Runner> IptablesReader<R> {
    /// A reader running `program` (e.g. `iptables-nft`, `iptables-legacy`) through `runner`;
    /// `legacy` names the backend in [`DataPlaneReader::data_plane`].
    pub fn new(runner: R, program: &str, legacy: bool) -> Self {
        Self { runner, program: program.to_string(), legacy, endpoints: BTreeMap::new(), netlink: None }
    }

    /// The same reader listing each `KUBE-SVC-` chain through `netlink` (iptables-nft).
    pub fn with_netlink(mut self, netlink: Box<dyn ChainJumps>) -> Self {
        self.netlink = Some(netlink);
        self
    }

    fn list(&self, chain: &str) -> Result<String, ReadError> {
        self.runner.run(&self.program, &["-t", "nat", "-S", chain])
    }
}

impl<R: Runner> DataPlaneReader for IptablesReader<R> {
    fn data_plane(&self) -> &'static str {
        if self.legacy { "iptables-legacy" } else { "iptables-nft" }
    }

    fn endpoints(&mut self, service: &ServicePort) -> Result<Option<BTreeSet<IpAddr>>, ReadError> {
        let chain = service_chain(service);
        let command = |c: &str| format!("{} -t nat -S {c}", self.program);
        if service.cluster_ip.is_ipv6() {
            // kube-proxy writes an IPv6 Service's chains with ip6tables, which this reader does
            // not run: a failed read, never a removal
            return Err(ReadError {
                command: command(&chain),
                how: format!("IPv6 Service {}/{}: its rules are ip6tables', not read", service.namespace, service.name),
            });
        }
        let seps = if let Some(n) = self.netlink.as_mut() {
            // IPv4 only: an IPv6 Service was refused above
            match n.jumps("nat", &chain, Family::V4, "KUBE-SEP-") {
                Ok(Some(seps)) => seps,
                Ok(None) => return Ok(None),
                Err(how) => return Err(ReadError { command: format!("netlink read of chain nat {chain}"), how }),
            }
        } else {
            let text = match self.list(&chain) {
                Err(e) if chain_absent(&e) => return Ok(None),
                other => other?,
            };
            parse_service_chain(&text, &chain).map_err(|how| ReadError { command: command(&chain), how: format!("unparsable output: {how}") })?
        };
        let mut ips = BTreeSet::new();
        for sep in seps {
            if let Some(ip) = self.endpoints.get(&sep) {
                ips.insert(*ip);
                continue;
            }
            // an endpoint chain gone between the two listings is a read that failed
            let text = self.list(&sep)?;
            let ip = parse_endpoint_chain(&text, &sep).map_err(|how| ReadError { command: command(&sep), how: format!("unparsable output: {how}") })?;
            if self.endpoints.len() >= MAX_KNOWN_ENDPOINT_CHAINS {
                self.endpoints.clear();
            }
            self.endpoints.insert(sep, ip);
            ips.insert(ip);
        }
        Ok(Some(ips))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Canned, Faulty, test_service as svc};
    use super::*;

    /// The chain names of a real cluster (`KUBE-SVC-NPX46M4PTMTKRN6Y` is default/kubernetes:https
    /// on every kube-proxy).
    #[test]
    fn the_chain_name_is_kube_proxys() {
        assert_eq!(service_chain(&svc("default", "kubernetes", "https")), "KUBE-SVC-NPX46M4PTMTKRN6Y");
    }

    /// Listings a real 1.37.2 kube-proxy in iptables-nft mode wrote: a Service of 4 endpoints
    /// and one of its endpoint chains.
    #[test]
    fn real_listings() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rules");
        let chain = service_chain(&svc("e2e-window", "web", "http"));
        assert_eq!(chain, "KUBE-SVC-VHW22QZZHONJHOLS");
        let text = std::fs::read_to_string(dir.join("iptables-nft-1.37.2-svc-chain-4-endpoints.txt")).unwrap();
        assert_eq!(
            parse_service_chain(&text, &chain).unwrap(),
            ["KUBE-SEP-PUYW6OWAMK5J6CXM", "KUBE-SEP-WQVR6DJU7BALZEYX", "KUBE-SEP-K4Z633L42WB6U5RM", "KUBE-SEP-DB3K4L57COFBIHPD"]
        );
        let sep = std::fs::read_to_string(dir.join("iptables-nft-1.37.2-sep-chain.txt")).unwrap();
        assert_eq!(parse_endpoint_chain(&sep, "KUBE-SEP-PUYW6OWAMK5J6CXM").unwrap(), "10.244.1.4".parse::<IpAddr>().unwrap());
    }

    const SVC: &str = "-N KUBE-SVC-NPX46M4PTMTKRN6Y
-A KUBE-SVC-NPX46M4PTMTKRN6Y ! -s 10.244.0.0/16 -d 10.96.0.1/32 -p tcp -m comment --comment \"default/kubernetes:https cluster IP\" -m tcp --dport 443 -j KUBE-MARK-MASQ
-A KUBE-SVC-NPX46M4PTMTKRN6Y -m comment --comment \"default/kubernetes:https -> 10.213.255.254:6443\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-AAAA
-A KUBE-SVC-NPX46M4PTMTKRN6Y -m comment --comment \"default/kubernetes:https -> 10.213.255.253:6443\" -j KUBE-SEP-BBBB
";

    fn sep(name: &str, ip: &str) -> String {
        format!(
            "-N {name}\n-A {name} -s {ip}/32 -m comment --comment \"default/kubernetes:https\" -j KUBE-MARK-MASQ\n-A {name} -p tcp -m comment --comment \"default/kubernetes:https\" -m tcp -j DNAT --to-destination {ip}:6443\n"
        )
    }

    fn canned(svc_out: Result<&str, &str>) -> Canned {
        let mut c = Canned::default();
        c.answers.insert("iptables-nft -t nat -S KUBE-SVC-NPX46M4PTMTKRN6Y".into(), svc_out.map(str::to_string).map_err(str::to_string));
        c.answers.insert("iptables-nft -t nat -S KUBE-SEP-AAAA".into(), Ok(sep("KUBE-SEP-AAAA", "10.213.255.254")));
        c.answers.insert("iptables-nft -t nat -S KUBE-SEP-BBBB".into(), Ok(sep("KUBE-SEP-BBBB", "10.213.255.253")));
        c
    }

    #[test]
    fn the_endpoints_are_the_dnat_targets_of_the_chains_jumped_to() {
        let mut r = IptablesReader::new(canned(Ok(SVC)), "iptables-nft", false);
        let ips = r.endpoints(&svc("default", "kubernetes", "https")).unwrap().unwrap();
        assert_eq!(ips, ["10.213.255.253".parse().unwrap(), "10.213.255.254".parse().unwrap()].into());
        assert_eq!(r.data_plane(), "iptables-nft");
        // no endpoint rule left: an empty set, from a successful read
        let empty = "-N KUBE-SVC-NPX46M4PTMTKRN6Y\n";
        let mut r = IptablesReader::new(canned(Ok(empty)), "iptables-nft", false);
        assert!(r.endpoints(&svc("default", "kubernetes", "https")).unwrap().unwrap().is_empty());
    }

    /// Every failure is an error, never an empty set taken for a removal: a listing cut short or
    /// of another chain, a binary missing, a DNAT target that is no IP, an endpoint chain gone
    /// between two listings. Only the Service port's own chain absent reads as None.
    #[test]
    fn a_failed_read_is_no_sample() {
        let s = svc("default", "kubernetes", "https");
        let no_chain = "exit status: 1: iptables: No chain/target/match by that name.";
        assert_eq!(IptablesReader::new(canned(Err(no_chain)), "iptables-nft", false).endpoints(&s), Ok(None));
        let mut sep_gone = canned(Ok(SVC));
        sep_gone.answers.insert("iptables-nft -t nat -S KUBE-SEP-AAAA".into(), Err(no_chain.into()));
        assert!(IptablesReader::new(sep_gone, "iptables-nft", false).endpoints(&s).unwrap_err().how.contains("No chain"), "an endpoint chain gone mid-read");
        let other = "-N KUBE-SVC-OTHER\n-A KUBE-SVC-OTHER -j KUBE-SEP-AAAA\n";
        assert!(IptablesReader::new(canned(Ok(other)), "iptables-nft", false).endpoints(&s).unwrap_err().how.contains("unparsable"));
        assert!(IptablesReader::new(canned(Ok("")), "iptables-nft", false).endpoints(&s).unwrap_err().how.contains("no '-N"));
        let missing = IptablesReader::new(Canned::default(), "iptables-legacy", true).endpoints(&s).unwrap_err();
        assert_eq!(
            (missing.command.as_str(), missing.how.as_str()),
            ("iptables-legacy -t nat -S KUBE-SVC-NPX46M4PTMTKRN6Y", "cannot start: No such file or directory")
        );
        let e = parse_endpoint_chain("-N KUBE-SEP-X\n-A KUBE-SEP-X -j DNAT --to-destination web:80\n", "KUBE-SEP-X").unwrap_err();
        assert_eq!(e, ListingError::DestinationNotIp { destination: "\"web:80\"".into() });
        assert_eq!(e.to_string(), "DNAT destination \"web:80\" is not IP:port");
        let e = parse_endpoint_chain("-N KUBE-SEP-X\n-A KUBE-SEP-X -j DNAT --to-destination\n", "KUBE-SEP-X").unwrap_err();
        assert_eq!(e.to_string(), "--to-destination without a value: \"-A KUBE-SEP-X -j DNAT --to-destination\"");
        assert_eq!(parse_endpoint_chain("-N KUBE-SEP-X\n", "KUBE-SEP-X"), Err(ListingError::NoDnat { chain: "KUBE-SEP-X".into() }));
        let e = parse_service_chain("-N KUBE-SVC-A\n-A KUBE-SVC-B -j KUBE-SEP-X\n", "KUBE-SVC-A").unwrap_err();
        assert_eq!(e.to_string(), "a line that is not chain KUBE-SVC-A's: \"-A KUBE-SVC-B -j KUBE-SEP-X\"");
        let mut faulty = Faulty::new(IptablesReader::new(canned(Ok(SVC)), "iptables-nft", false), 2);
        assert!(faulty.endpoints(&s).is_ok());
        assert_eq!(faulty.endpoints(&s).unwrap_err().how, "injected fault");
    }

    /// A `KUBE-SVC-` chain's jumps as a netlink read answers them (see nft_netlink's tests for
    /// the messages): a list, the chain absent, or a failure.
    struct Jumps(Result<Option<Vec<String>>, String>);

    impl ChainJumps for Jumps {
        fn jumps(&mut self, table: &str, chain: &str, family: Family, prefix: &str) -> Result<Option<Vec<String>>, String> {
            assert_eq!((table, chain, family, prefix), ("nat", "KUBE-SVC-NPX46M4PTMTKRN6Y", Family::V4, "KUBE-SEP-"));
            self.0.clone()
        }
    }

    /// With netlink, the Service chain is never listed with the program (the canned runner has
    /// no answer for it); each endpoint chain's target still is, once.
    #[test]
    fn with_netlink_the_service_chain_is_read_over_netlink_and_each_endpoint_chain_once() {
        let s = svc("default", "kubernetes", "https");
        let mut runner = canned(Err("not asked"));
        runner.answers.remove("iptables-nft -t nat -S KUBE-SVC-NPX46M4PTMTKRN6Y");
        let seps = Ok(Some(vec!["KUBE-SEP-AAAA".to_string(), "KUBE-SEP-BBBB".to_string()]));
        let mut r = IptablesReader::new(runner.clone(), "iptables-nft", false).with_netlink(Box::new(Jumps(seps)));
        let want: BTreeSet<IpAddr> = ["10.213.255.253".parse().unwrap(), "10.213.255.254".parse().unwrap()].into();
        assert_eq!(r.endpoints(&s).unwrap(), Some(want.clone()));
        assert_eq!(r.endpoints.len(), 2, "both endpoint chains' targets kept");
        assert_eq!(IptablesReader::new(runner.clone(), "iptables-nft", false).with_netlink(Box::new(Jumps(Ok(None)))).endpoints(&s), Ok(None));
        let e = IptablesReader::new(runner.clone(), "iptables-nft", false)
            .with_netlink(Box::new(Jumps(Err("NFT_MSG_GETGEN: Operation not permitted".into()))))
            .endpoints(&s);
        assert_eq!(e.unwrap_err().command, "netlink read of chain nat KUBE-SVC-NPX46M4PTMTKRN6Y");
        // an IPv6 Service: its rules are ip6tables', which the reader does not run
        let v6 = ServicePort { cluster_ip: "fd00::1".parse().unwrap(), ..s };
        let e = IptablesReader::new(runner, "iptables-nft", false).with_netlink(Box::new(Jumps(Ok(None)))).endpoints(&v6).unwrap_err();
        assert!(e.how.contains("IPv6 Service default/kubernetes"), "{e}");
    }
}
