//! kube-proxy's nftables mode: a Service port's rules are the chain `service-<hash>-<namespace>/
//! <name>/<protocol>/<port>` in table `ip kube-proxy` (`ip6 kube-proxy` for IPv6), whose
//! `numgen random mod N` picks the endpoint: a dnat map of `IP . port` entries (`dnat ip to
//! numgen random mod 4 map { 0 : 10.244.1.4 . 8080, ... }`, 1.37) or a vmap of `goto
//! endpoint-<hash>-...__IP/port` chains (earlier releases); a Service port with one endpoint
//! has a plain `dnat to IP:port` instead (`tests/data/rules/`: both captured from 1.37.2).
//!
//! The chain's name is computed as kube-proxy computes it (`pkg/proxy/nftables/proxier.go`
//! `servicePortChainNameBase` and `hashAndTruncate`: the first 8 characters of the base32 of
//! the SHA-256 of the name), so each read lists that chain alone (`nft list chain`), never the
//! ruleset (an `nft` older than the tables it lists can crash on objects it does not know). The
//! endpoint chains are not read: the proxier flushes a removed endpoint's chain and deletes it a
//! sync later, so a chain being present says nothing; the service chain's map is what sends
//! new connections.

use super::{DataPlaneReader, ReadError, Runner, ServicePort, chain_absent, excerpt, ip_of_destination};
use std::collections::BTreeSet;
use std::net::IpAddr;

/// The service chain of a Service port.
pub fn service_chain(service: &ServicePort) -> String {
    let base = format!("{}/{}/{}/{}", service.namespace, service.name, service.protocol.to_ascii_lowercase(), service.port_name);
    let digest = ring::digest::digest(&ring::digest::SHA256, base.as_bytes());
    format!("service-{}-{base}", &data_encoding::BASE32.encode(digest.as_ref())[..8])
}

/// Why a `nft list chain` listing says nothing: what in it is not what kube-proxy writes. Lines
/// and entries are quoted excerpts of at most 120 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ListingError {
    /// No `chain <chain> {` line: the listing is not of that chain.
    #[error("no 'chain {chain} {{' line")]
    NoChainHeader {
        /// The chain listed.
        chain: String,
    },
    /// The last line is not `}`.
    #[error("the listing does not end with '}}' (cut short?)")]
    CutShort,
    /// A `numgen` rule without a ` map {` or ` vmap {`.
    #[error("a numgen rule without a map: {line}")]
    NumgenWithoutMap {
        /// The rule.
        line: String,
    },
    /// A map whose `{` is not closed on its line.
    #[error("an unterminated map: {line}")]
    UnterminatedMap {
        /// The rule.
        line: String,
    },
    /// A map entry without its ` : ` between key and value.
    #[error("a map entry without ' : ': {entry}")]
    EntryWithoutColon {
        /// The entry.
        entry: String,
    },
    /// A map entry whose value is neither `IP . port` nor an endpoint chain.
    #[error("a map entry that names no endpoint: {entry}")]
    EntryWithoutEndpoint {
        /// The entry.
        entry: String,
    },
    /// A `dnat to` whose target is not `IP:port`.
    #[error("a dnat target that is not IP:port: {line}")]
    DnatNotIpPort {
        /// The rule.
        line: String,
    },
    /// A `goto endpoint-...` whose chain name ends with no `__IP/port`.
    #[error("an endpoint chain that names no endpoint: {line}")]
    EndpointChainWithoutEndpoint {
        /// The rule.
        line: String,
    },
}

/// The endpoint IPs of a `nft list chain <family> kube-proxy <chain>` listing: every entry of its
/// `numgen` map or vmap, or the one endpoint of a plain `dnat to IP:port` or `goto endpoint-...`.
/// The listing must hold the chain's header and end with `}`; a chain with none of these has no
/// endpoint (kube-proxy rejects or drops there).
///
/// Errors: no header, a listing cut short, a rule or entry that names no endpoint ([`ListingError`]).
pub fn parse_service_chain(text: &str, chain: &str) -> Result<BTreeSet<IpAddr>, ListingError> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    if !lines.contains(&format!("chain {chain} {{").as_str()) {
        return Err(ListingError::NoChainHeader { chain: chain.to_string() });
    }
    if lines.last() != Some(&"}") {
        return Err(ListingError::CutShort);
    }
    let mut ips = BTreeSet::new();
    for line in &lines {
        if line.contains("numgen ") {
            let (_, entries) =
                line.split_once(" map {").or_else(|| line.split_once(" vmap {")).ok_or_else(|| ListingError::NumgenWithoutMap { line: excerpt(line) })?;
            let entries = entries.trim_end().strip_suffix('}').ok_or_else(|| ListingError::UnterminatedMap { line: excerpt(line) })?;
            for entry in entries.split(',').map(str::trim).filter(|e| !e.is_empty()) {
                let (_, value) = entry.split_once(" : ").ok_or_else(|| ListingError::EntryWithoutColon { entry: excerpt(entry) })?;
                ips.insert(entry_ip(value.trim()).ok_or_else(|| ListingError::EntryWithoutEndpoint { entry: excerpt(entry) })?);
            }
        } else if let Some((_, to)) = line.split_once(" dnat to ").or_else(|| line.split_once(" dnat ip to ")).or_else(|| line.split_once(" dnat ip6 to ")) {
            let dest = to.split_whitespace().next().unwrap_or_default();
            ips.insert(ip_of_destination(dest).ok_or_else(|| ListingError::DnatNotIpPort { line: excerpt(line) })?);
        } else if let Some((_, target)) = line.split_once("goto endpoint-") {
            ips.insert(entry_ip(&format!("goto endpoint-{target}")).ok_or_else(|| ListingError::EndpointChainWithoutEndpoint { line: excerpt(line) })?);
        }
    }
    Ok(ips)
}

/// The IP of a map value: `10.244.1.5 . 8080` (dnat map) or `goto endpoint-...__10.244.1.5/8080`
/// (vmap).
fn entry_ip(value: &str) -> Option<IpAddr> {
    if let Some(target) = value.strip_prefix("goto ").or_else(|| value.strip_prefix("jump ")) {
        return entry_ip_of_chain(target.trim());
    }
    let (ip, port) = value.split_once(" . ")?;
    port.trim().parse::<u16>().ok()?;
    ip_of_destination(ip.trim())
}

/// The endpoint IP an endpoint chain's name ends with: `endpoint-<hash>-<ns>/<name>/<protocol>/
/// <port>__<IP>/<port>` (`servicePortEndpointChainNameBase`).
pub fn entry_ip_of_chain(chain: &str) -> Option<IpAddr> {
    let (_, endpoint) = chain.rsplit_once("__")?;
    let (ip, _) = endpoint.rsplit_once('/')?;
    ip.parse().ok()
}

/// kube-proxy nftables mode's reader, running `program` (the node's `nft`).
pub struct NftablesReader<R: Runner> {
    runner: R,
    program: String,
}

impl<R: Runner> NftablesReader<R> {
    /// A reader running `program` through `runner`.
    pub fn new(runner: R, program: &str) -> Self {
        Self { runner, program: program.to_string() }
    }
}

impl<R: Runner> DataPlaneReader for NftablesReader<R> {
    fn data_plane(&self) -> &'static str {
        "nftables"
    }

    fn endpoints(&mut self, service: &ServicePort) -> Result<Option<BTreeSet<IpAddr>>, ReadError> {
        let chain = service_chain(service);
        let family = if service.cluster_ip.is_ipv6() { "ip6" } else { "ip" };
        let args = ["list", "chain", family, "kube-proxy", chain.as_str()];
        let text = match self.runner.run(&self.program, &args) {
            Err(e) if chain_absent(&e) => return Ok(None),
            other => other?,
        };
        parse_service_chain(&text, &chain)
            .map(Some)
            .map_err(|how| ReadError { command: format!("{} {}", self.program, args.join(" ")), how: format!("unparsable output: {how}") })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Canned, test_service as svc};
    use super::*;

    /// The chain names a real 1.37.2 kube-proxy wrote (its `service-ips` map on the local
    /// cluster's nftables node).
    #[test]
    fn the_chain_name_is_kube_proxys() {
        assert_eq!(service_chain(&svc("default", "kubernetes", "https")), "service-2QRHZV4L-default/kubernetes/tcp/https");
        assert_eq!(service_chain(&svc("exp-a-baseline", "web", "http")), "service-JFDYN7UY-exp-a-baseline/web/tcp/http");
    }

    const CHAIN: &str = "service-JFDYN7UY-exp-a-baseline/web/tcp/http";

    fn listing(rule: &str) -> String {
        format!(
            "table ip kube-proxy {{\n\tchain {CHAIN} {{\n\t\tip daddr 10.96.209.169 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n\t\t{rule}\n\t}}\n}}\n"
        )
    }

    #[test]
    fn the_endpoints_are_the_entries_of_the_numgen_map() {
        let dnat = listing("meta l4proto tcp dnat to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.7 . 8080 }");
        let want: BTreeSet<IpAddr> = ["10.244.1.5".parse().unwrap(), "10.244.2.7".parse().unwrap()].into();
        assert_eq!(parse_service_chain(&dnat, CHAIN).unwrap(), want);
        let vmap = listing(&format!(
            "numgen random mod 2 vmap {{ 0 : goto endpoint-AAAA-exp-a-baseline/web/tcp/http__10.244.1.5/8080, 1 : goto endpoint-BBBB-{}__10.244.2.7/8080 }}",
            "exp-a-baseline/web/tcp/http"
        ));
        assert_eq!(parse_service_chain(&vmap, CHAIN).unwrap(), want);
        // no numgen rule: no endpoint, from a successful read
        assert!(parse_service_chain(&listing("reject"), CHAIN).unwrap().is_empty());
        let mut canned = Canned::default();
        canned.answers.insert(format!("nft list chain ip kube-proxy {CHAIN}"), Ok(dnat));
        let mut r = NftablesReader::new(canned, "nft");
        assert_eq!(
            r.endpoints(&ServicePort { cluster_ip: "10.96.209.169".parse().unwrap(), port: 80, ..svc("exp-a-baseline", "web", "http") }).unwrap(),
            Some(want)
        );
    }

    /// Listings a real 1.37.2 kube-proxy in nftables mode wrote: a Service of 4 endpoints and
    /// one of a single endpoint (a plain dnat, no numgen map).
    #[test]
    fn real_listings() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rules");
        let four = std::fs::read_to_string(dir.join("nft-1.37.2-service-chain-4-endpoints.txt")).unwrap();
        let chain = service_chain(&svc("e2e-window", "web", "http"));
        assert_eq!(chain, "service-HF42FAS5-e2e-window/web/tcp/http");
        let ips: Vec<String> = parse_service_chain(&four, &chain).unwrap().iter().map(IpAddr::to_string).collect();
        assert_eq!(ips, ["10.244.1.4", "10.244.1.5", "10.244.2.4", "10.244.2.5"]);
        let one = std::fs::read_to_string(dir.join("nft-1.37.2-service-chain-1-endpoint.txt")).unwrap();
        let ips: Vec<String> = parse_service_chain(&one, "service-2QRHZV4L-default/kubernetes/tcp/https").unwrap().iter().map(IpAddr::to_string).collect();
        assert_eq!(ips, ["10.213.254.1"]);
    }

    #[test]
    fn a_failed_or_unparsable_read_is_no_sample() {
        let full = listing("meta l4proto tcp dnat to numgen random mod 2 map { 0 : 10.244.1.5 . 8080, 1 : 10.244.2.7 . 8080 }");
        let cut = full.lines().take(3).collect::<Vec<_>>().join("\n");
        assert_eq!(parse_service_chain(&cut, CHAIN), Err(ListingError::CutShort));
        assert_eq!(ListingError::CutShort.to_string(), "the listing does not end with '}' (cut short?)");
        let e = parse_service_chain(&listing("x"), "service-OTHER").unwrap_err();
        assert_eq!(e.to_string(), "no 'chain service-OTHER {' line");
        for (bad, why) in [
            ("numgen random mod 2 map { 0 : web . 8080 }", "a map entry that names no endpoint: \"0 : web . 8080\""),
            ("numgen random mod 2 map { 0 : 10.244.1.5 . 8080", "an unterminated map: \"numgen random mod 2 map { 0 : 10.244.1.5 . 8080\""),
            ("numgen random mod 2 map { 0 10.244.1.5 }", "a map entry without ' : ': \"0 10.244.1.5\""),
            ("numgen random mod 2", "a numgen rule without a map: \"numgen random mod 2\""),
            ("meta l4proto tcp dnat to web:8080", "a dnat target that is not IP:port: \"meta l4proto tcp dnat to web:8080\""),
            ("goto endpoint-AAAA-exp-a-baseline/web/tcp/http", "an endpoint chain that names no endpoint: \"goto endpoint-AAAA-exp-a-baseline/web/tcp/http\""),
        ] {
            assert_eq!(parse_service_chain(&listing(bad), CHAIN).unwrap_err().to_string(), why, "{bad}");
        }
        let mut r = NftablesReader::new(Canned::default(), "nft");
        let e = r.endpoints(&svc("exp-a-baseline", "web", "http")).unwrap_err();
        assert_eq!(e.command, format!("nft list chain ip kube-proxy {CHAIN}"));
        // the Service port's chain not there: no rule sends to any endpoint of it (a binary that
        // cannot start, above, is a failed read)
        let mut absent = Canned::default();
        absent.answers.insert(format!("nft list chain ip kube-proxy {CHAIN}"), Err("exit status: 1: Error: No such file or directory".into()));
        assert_eq!(NftablesReader::new(absent, "nft").endpoints(&svc("exp-a-baseline", "web", "http")), Ok(None));
        let mut denied = Canned::default();
        denied
            .answers
            .insert(format!("nft list chain ip kube-proxy {CHAIN}"), Err("exit status: 1: Error: Could not process rule: Operation not permitted".into()));
        assert!(NftablesReader::new(denied, "nft").endpoints(&svc("exp-a-baseline", "web", "http")).is_err(), "no permission is a failed read");
    }
}
