//! kube-proxy's nftables mode read over netlink: the same question as [`super::nftables`] (which
//! endpoints does a Service port's chain send new connections to), asked of the kernel directly
//! instead of through `nft`.
//!
//! Why: `nft list chain` loads the whole `kube-proxy` table before it prints one chain. At 4,000
//! Services that is 0.5 s per read, 0.43 s of it kernel time, and 7 s at 12,000 (docs/benchmarks/observed-removals.md
//! "Observed removals"), so every removal's read bound was coarser than the 0.5 s a precise one
//! needs. The kernel filters a rule dump by table and chain (`nf_tables_dump_rules`), and a
//! set-element dump by set, so a read here costs the Service's own rules whatever the table's size.
//!
//! One read (all on one `NETLINK_NETFILTER` socket, messages of `include/uapi/linux/netfilter/
//! nf_tables.h`, encoded and decoded by `netlink-packet-netfilter`):
//! 1. `NFT_MSG_GETGEN`: the ruleset generation;
//! 2. `NFT_MSG_GETRULE`, a dump filtered to table `kube-proxy` and the Service port's chain
//!    ([`super::nftables::service_chain`]); an empty dump is asked again as `NFT_MSG_GETCHAIN`,
//!    whose `ENOENT` says the chain is absent;
//! 3. for the rule holding a `numgen` expression, `NFT_MSG_GETSETELEM` of its anonymous map
//!    (`__map%d`): each element's data is the endpoint (`IP . port` bytes of a dnat map, or the
//!    `goto endpoint-...__IP/port` verdict of a vmap);
//! 4. `NFT_MSG_GETGEN` again: a generation that moved means kube-proxy committed during the read,
//!    and the read is no sample (as is a dump the kernel marks `NLM_F_DUMP_INTR`).
//!
//! A rule without `numgen` that has a `nat` expression is the one-endpoint form (`dnat ip to
//! IP:port`): its endpoint is the immediate of an address's length. The decoding of the kernel's
//! answers is pure ([`endpoints_of_rules`], [`endpoints_of_map`], [`decode`]); [`Kernel`] is the
//! socket, bounded like a child process ([`super::MAX_OUTPUT_BYTES`], [`super::READ_TIMEOUT`]).

use super::nftables::{entry_ip_of_chain, service_chain};
use super::{DataPlaneReader, ReadError, ServicePort};
use netlink_packet_core::{NLM_F_ACK, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkBuffer, NetlinkMessage, NetlinkPayload};
use netlink_packet_netfilter::nftables::{
    ChainAttribute, ChainMessage, DataAttribute, ExpressionAttribute, Expressions, GenAttribute, GenMessage, Immediate, ListAttribute, Lookup, NfTablesMessage,
    RuleAttribute, RuleMessage, SetElementAttribute, SetElementList, SetElementMessage, VerdictAttribute,
};
use netlink_packet_netfilter::{NetfilterHeader, NetfilterMessage, NetfilterProtoFamily};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// kube-proxy's table, in family `ip` or `ip6`.
pub const TABLE: &str = "kube-proxy";

/// The IP family of a table: which of `ip kube-proxy` / `ip6 kube-proxy`, and the length of its
/// addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `ip`: 4-byte addresses.
    V4,
    /// `ip6`: 16-byte addresses.
    V6,
}

impl Family {
    fn of(ip: IpAddr) -> Self {
        if ip.is_ipv6() { Self::V6 } else { Self::V4 }
    }

    fn proto(self) -> NetfilterProtoFamily {
        match self {
            Self::V4 => NetfilterProtoFamily::IPv4,
            Self::V6 => NetfilterProtoFamily::IPv6,
        }
    }

    /// The address at the start of `bytes` (a dnat map's `IP . port` value, an immediate): None
    /// when it is shorter than one.
    fn address(self, bytes: &[u8]) -> Option<IpAddr> {
        match self {
            Self::V4 => <[u8; 4]>::try_from(bytes.get(..4)?).ok().map(|b| IpAddr::V4(Ipv4Addr::from(b))),
            Self::V6 => <[u8; 16]>::try_from(bytes.get(..16)?).ok().map(|b| IpAddr::V6(Ipv6Addr::from(b))),
        }
    }

    fn len(self) -> usize {
        match self {
            Self::V4 => 4,
            Self::V6 => 16,
        }
    }
}

/// What a Service port's rules say: the endpoints they name themselves, and the anonymous maps
/// whose elements are endpoints.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ChainEndpoints {
    /// Endpoints written in the rules (a one-endpoint dnat, a `goto endpoint-...`).
    pub ips: BTreeSet<IpAddr>,
    /// The `numgen` maps (set names, `__map0`...) to read.
    pub maps: Vec<String>,
}

/// The expressions of `rule`: (name, data) pairs, in order.
fn expressions(rule: &RuleMessage) -> Vec<(&str, Option<&Expressions>)> {
    let mut out = Vec::new();
    for a in &rule.attributes {
        let RuleAttribute::Expressions(list) = a else { continue };
        for e in list {
            let ListAttribute::Element(attrs) = e else { continue };
            let name = attrs.iter().find_map(|a| if let ExpressionAttribute::Name(n) = a { Some(n.as_str()) } else { None });
            let data = attrs.iter().find_map(|a| if let ExpressionAttribute::Data(d) = a { Some(d) } else { None });
            out.push((name.unwrap_or(""), data));
        }
    }
    out
}

/// Why a chain's rules or a map's elements say nothing: the rule or element (0-based, in the
/// dump's order) that names no endpoint where kube-proxy's always names one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointsError {
    /// A rule's verdict goes to an `endpoint-` chain whose name ends with no `__IP/port`.
    #[error("rule {rule}: an endpoint chain that names no endpoint: {chain:?}")]
    RuleChainWithoutEndpoint {
        /// The rule's index.
        rule: usize,
        /// The chain's name.
        chain: String,
    },
    /// A `numgen` rule without a `lookup` of its map.
    #[error("rule {rule}: a numgen rule without a map lookup (expressions {expressions:?})")]
    NumgenWithoutLookup {
        /// The rule's index.
        rule: usize,
        /// The rule's expressions, by name.
        expressions: Vec<String>,
    },
    /// A `nat` rule with neither a `numgen` map nor an immediate of an address's length.
    #[error("rule {rule}: a nat rule without a numgen map or an immediate address (expressions {expressions:?})")]
    NatWithoutAddress {
        /// The rule's index.
        rule: usize,
        /// The rule's expressions, by name.
        expressions: Vec<String>,
    },
    /// An element whose value is shorter than the family's address.
    #[error("element {element}: a value of {len} bytes is no address")]
    ValueNotAddress {
        /// The element's index in its message.
        element: usize,
        /// The value's length, bytes.
        len: usize,
    },
    /// An element whose verdict names no chain.
    #[error("element {element}: a verdict without a chain")]
    VerdictWithoutChain {
        /// The element's index in its message.
        element: usize,
    },
    /// An element whose verdict goes to an `endpoint-` chain that names no endpoint.
    #[error("element {element}: an endpoint chain that names no endpoint: {chain:?}")]
    ElementChainWithoutEndpoint {
        /// The element's index in its message.
        element: usize,
        /// The chain's name.
        chain: String,
    },
    /// An element without data.
    #[error("element {element}: no data (a numgen map's elements each name an endpoint)")]
    NoData {
        /// The element's index in its message.
        element: usize,
    },
}

/// The endpoints of a Service port chain's rules (a dump of `NFT_MSG_NEWRULE` messages): the
/// `numgen` rule's map, the immediate address of a one-endpoint `nat` rule, and every
/// `goto endpoint-...` verdict.
///
/// Errors: the first rule that says none of what it should ([`EndpointsError`]).
pub fn endpoints_of_rules(rules: &[RuleMessage], family: Family) -> Result<ChainEndpoints, EndpointsError> {
    let mut out = ChainEndpoints::default();
    for (n, rule) in rules.iter().enumerate() {
        let exprs = expressions(rule);
        let names: Vec<&str> = exprs.iter().map(|e| e.0).collect();
        let immediates = exprs.iter().filter_map(|e| match e.1 {
            Some(Expressions::Immediate(attrs)) => Some(attrs),
            _ => None,
        });
        for attrs in immediates.clone() {
            for a in attrs.iter() {
                if let Immediate::Data(DataAttribute::Verdict(v)) = a {
                    for chain in v.iter().filter_map(|v| if let VerdictAttribute::Chain(c) = v { Some(c) } else { None }) {
                        if chain.starts_with("endpoint-") {
                            out.ips.insert(entry_ip_of_chain(chain).ok_or_else(|| EndpointsError::RuleChainWithoutEndpoint { rule: n, chain: chain.clone() })?);
                        }
                    }
                }
            }
        }
        if names.contains(&"numgen") {
            let set = exprs
                .iter()
                .find_map(|e| match e.1 {
                    Some(Expressions::Lookup(l)) => l.iter().find_map(|a| if let Lookup::Set(s) = a { Some(s.clone()) } else { None }),
                    _ => None,
                })
                .ok_or_else(|| EndpointsError::NumgenWithoutLookup { rule: n, expressions: names.iter().map(|s| s.to_string()).collect() })?;
            out.maps.push(set);
        } else if names.contains(&"nat") {
            let ip = immediates
                .flat_map(|attrs| attrs.iter())
                .find_map(|a| match a {
                    Immediate::Data(DataAttribute::Value(v)) if v.len() == family.len() => family.address(v),
                    _ => None,
                })
                .ok_or_else(|| EndpointsError::NatWithoutAddress { rule: n, expressions: names.iter().map(|s| s.to_string()).collect() })?;
            out.ips.insert(ip);
        }
    }
    Ok(out)
}

/// The endpoints of a `numgen` map's elements (a dump of `NFT_MSG_NEWSETELEM` messages): each
/// element's data, an `IP . port` value (dnat map) or a `goto endpoint-...__IP/port` verdict
/// (vmap).
///
/// Errors: the first element that names no endpoint, one without data included: every element
/// of such a map has one ([`EndpointsError`]).
pub fn endpoints_of_map(elements: &[SetElementMessage], family: Family) -> Result<BTreeSet<IpAddr>, EndpointsError> {
    let mut ips = BTreeSet::new();
    for m in elements {
        for list in &m.attributes {
            let SetElementList::Elements(elements) = list else { continue };
            for (n, e) in elements.iter().enumerate() {
                let ListAttribute::Element(attrs) = e else { continue };
                let data = attrs.iter().find_map(|a| if let SetElementAttribute::Data(d) = a { Some(d) } else { None });
                let ip = match data {
                    Some(DataAttribute::Value(v)) => family.address(v).ok_or(EndpointsError::ValueNotAddress { element: n, len: v.len() })?,
                    Some(DataAttribute::Verdict(v)) => {
                        let chain = v
                            .iter()
                            .find_map(|v| if let VerdictAttribute::Chain(c) = v { Some(c) } else { None })
                            .ok_or(EndpointsError::VerdictWithoutChain { element: n })?;
                        entry_ip_of_chain(chain).ok_or_else(|| EndpointsError::ElementChainWithoutEndpoint { element: n, chain: chain.clone() })?
                    }
                    _ => return Err(EndpointsError::NoData { element: n }),
                };
                ips.insert(ip);
            }
        }
    }
    Ok(ips)
}

/// How an exchange with the kernel ended without its messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// `ENOENT`: the object asked for does not exist.
    Absent,
    /// Anything else, said in words (an errno, an interrupted dump, bytes that do not decode).
    Other(String),
}

/// Decodes one datagram of the kernel's answer to request `seq`: appends its nftables messages
/// to `into`, and says whether the answer is complete (a `NLMSG_DONE`, or the ACK of a request
/// that is not a dump). Messages of another sequence number (an earlier request's, cut off by
/// its timeout) are skipped.
pub fn decode(datagram: &[u8], seq: u32, into: &mut Vec<NfTablesMessage>) -> Result<bool, Failure> {
    let mut at = 0;
    while at < datagram.len() {
        let rest = &datagram[at..];
        let buf = NetlinkBuffer::new_checked(rest).map_err(|e| Failure::Other(format!("a netlink header at byte {at}: {e}")))?;
        let len = buf.length() as usize;
        if len < 16 || len > rest.len() {
            return Err(Failure::Other(format!("a netlink message at byte {at} claims {len} bytes of {}", rest.len())));
        }
        let (kind, sequence) = (buf.message_type(), buf.sequence_number());
        let (bytes, start) = (&rest[..len], at);
        at += (len + 3) & !3;
        if sequence != seq {
            continue;
        }
        if let Err(e) = decodable(kind, &bytes[16..]) {
            return Err(Failure::Other(format!("a netlink message at byte {start}: {e}")));
        }
        let msg = NetlinkMessage::<NetfilterMessage>::deserialize(bytes).map_err(|e| Failure::Other(format!("a netlink message at byte {start}: {e}")))?;
        if msg.header.flags & NLM_F_DUMP_INTR != 0 {
            return Err(Failure::Other("the dump was interrupted by a ruleset change (NLM_F_DUMP_INTR)".into()));
        }
        // a dump that failed after it began ends with NLMSG_DONE carrying the errno
        // (`netlink_dump`): its messages so far are not the whole answer
        let errno = match msg.payload {
            NetlinkPayload::Done(d) if d.code == 0 => return Ok(true),
            NetlinkPayload::Done(d) => Some(d.code),
            NetlinkPayload::Error(e) => match e.code {
                None => return Ok(true),
                Some(c) => Some(c.get()),
            },
            NetlinkPayload::InnerMessage(NetfilterMessage { inner: netlink_packet_netfilter::NetfilterMessageInner::NfTables(m), .. }) => {
                into.push(m);
                None
            }
            _ => None,
        };
        if let Some(code) = errno {
            return match std::io::Error::from_raw_os_error(code.saturating_neg()) {
                e if e.kind() == std::io::ErrorKind::NotFound => Err(Failure::Absent),
                e => Err(Failure::Other(format!("the kernel answered {e}"))),
            };
        }
    }
    Ok(false)
}

/// The attributes of `buf` (type without its flag bits, payload), while they are well formed:
/// the first malformed one ends the walk (the library's own checked walk then fails on it).
fn attributes(buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = buf;
    std::iter::from_fn(move || {
        let len = usize::from(u16::from_ne_bytes([*rest.first()?, *rest.get(1)?]));
        let kind = u16::from_ne_bytes([*rest.get(2)?, *rest.get(3)?]) & 0x3fff;
        if len < 4 || len > rest.len() {
            return None;
        }
        let payload = &rest[4..len];
        rest = &rest[((len + 3) & !3).min(rest.len())..];
        Some((kind, payload))
    })
}

/// One well-formed attribute: what `netlink-packet-netfilter` 0.4 reads without checking where
/// an attribute holds a single nested one (`NlaBuffer::new`: a length under 4 or past the
/// payload panics inside it).
fn single(payload: &[u8], what: &str) -> Result<(), String> {
    match payload {
        [a, b, _, _, ..] if (4..=payload.len()).contains(&usize::from(u16::from_ne_bytes([*a, *b]))) => Ok(()),
        _ => Err(format!("{what}: not one well-formed attribute")),
    }
}

/// Checks an expression list (`NFTA_RULE_EXPRESSIONS`, `NFTA_SET_ELEM_EXPRESSIONS`): the data
/// attributes the library reads unchecked, per expression name (immediate's data, cmp's data,
/// bitwise's mask, xor and data).
fn expressions_decodable(list: &[u8]) -> Result<(), String> {
    for (kind, element) in attributes(list) {
        if kind != 1 {
            continue;
        }
        let mut name: &[u8] = b"";
        for (kind, value) in attributes(element) {
            match kind {
                1 => name = value.split(|b| *b == 0).next().unwrap_or_default(),
                2 => {
                    for (kind, data) in attributes(value) {
                        match (name, kind) {
                            (b"immediate", 2) | (b"cmp", 3) | (b"bitwise", 4 | 5 | 7) => single(data, "an expression's data")?,
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Whether `netlink-packet-netfilter` can decode a message of type `kind` with `payload` (the
/// bytes after the netlink header) without panicking: only the nftables messages an answer of
/// this reader holds (`NEWGEN`, `NEWCHAIN`, `NEWRULE`, `NEWSETELEM`) and the control messages,
/// with every attribute the library reads unchecked well formed (found by the `nft_netlink`
/// fuzz target: a set element's data of a length under 4).
fn decodable(kind: u16, payload: &[u8]) -> Result<(), String> {
    const NEWCHAIN: u16 = 0x0a03;
    const NEWRULE: u16 = 0x0a06;
    const NEWSETELEM: u16 = 0x0a0c;
    const NEWGEN: u16 = 0x0a0f;
    // after the 4 bytes of nfgenmsg
    let attrs = payload.get(4..).unwrap_or_default();
    match kind {
        // NLMSG_NOOP, NLMSG_ERROR, NLMSG_DONE, NLMSG_OVERRUN: read by netlink-packet-core
        1..=4 | NEWGEN | NEWCHAIN => Ok(()),
        NEWRULE => attributes(attrs).filter(|a| a.0 == 4).try_for_each(|(_, list)| expressions_decodable(list)),
        NEWSETELEM => {
            for (_, list) in attributes(attrs).filter(|a| a.0 == 3) {
                for (_, element) in attributes(list).filter(|a| a.0 == 1) {
                    for (kind, value) in attributes(element) {
                        match kind {
                            1 | 2 | 7 => single(value, "a set element's key, data or expression")?,
                            11 => expressions_decodable(value)?,
                            _ => {}
                        }
                    }
                }
            }
            Ok(())
        }
        other => Err(format!("message type {other:#06x} is none this reader asks for")),
    }
}

/// The request `message` to the nftables subsystem with sequence number `seq`: a dump, or a
/// single object with an ACK.
pub fn encode(message: NfTablesMessage, family: NetfilterProtoFamily, seq: u32, dump: bool) -> Vec<u8> {
    let mut msg = NetlinkMessage::from(NetfilterMessage::new(NetfilterHeader::new(family, 0, 0), message));
    msg.header.flags = NLM_F_REQUEST | if dump { NLM_F_DUMP } else { NLM_F_ACK };
    msg.header.sequence_number = seq;
    msg.finalize();
    let mut buf = vec![0; msg.buffer_len()];
    msg.serialize(&mut buf);
    buf
}

/// One request and its whole answer: the kernel's socket ([`Kernel`]), or the tests' canned one.
pub trait Exchange: Send {
    /// Sends `request` (numbered `seq`) and decodes the answer.
    fn exchange(&mut self, request: &[u8], seq: u32) -> Result<Vec<NfTablesMessage>, Failure>;
}

/// The agent's `NETLINK_NETFILTER` socket in its node's network namespace (opened at the first
/// read, again after a failure).
#[derive(Default)]
pub struct Kernel {
    socket: Option<netlink_sys::Socket>,
}

impl Kernel {
    fn open() -> Result<netlink_sys::Socket, Failure> {
        let fail = |what: &str, e: std::io::Error| Failure::Other(format!("{what}: {e}"));
        let mut s = netlink_sys::Socket::new(netlink_sys::protocols::NETLINK_NETFILTER).map_err(|e| fail("netlink socket", e))?;
        s.bind_auto().map_err(|e| fail("netlink bind", e))?;
        // recv wakes at least every second, so the deadline below is kept
        socket2::SockRef::from(&s).set_read_timeout(Some(std::time::Duration::from_secs(1))).map_err(|e| fail("netlink SO_RCVTIMEO", e))?;
        Ok(s)
    }
}

impl Exchange for Kernel {
    fn exchange(&mut self, request: &[u8], seq: u32) -> Result<Vec<NfTablesMessage>, Failure> {
        let socket = match self.socket.take() {
            Some(s) => s,
            None => Self::open()?,
        };
        let deadline = std::time::Instant::now() + super::READ_TIMEOUT;
        socket.send(request, 0).map_err(|e| Failure::Other(format!("netlink send: {e}")))?;
        let (mut messages, mut bytes) = (Vec::new(), 0usize);
        loop {
            if std::time::Instant::now() >= deadline {
                return Err(Failure::Other(format!("no complete answer within {} s", super::READ_TIMEOUT.as_secs())));
            }
            let datagram = match socket.recv_from_full() {
                Ok((d, _)) => d,
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut | std::io::ErrorKind::Interrupted) => continue,
                Err(e) => return Err(Failure::Other(format!("netlink recv: {e}"))),
            };
            bytes += datagram.len();
            if bytes > super::MAX_OUTPUT_BYTES {
                return Err(Failure::Other(format!("answer larger than {} bytes", super::MAX_OUTPUT_BYTES)));
            }
            match decode(&datagram, seq, &mut messages) {
                // the socket is kept after a complete answer (an errno ends one too: an absent
                // chain is read every round): nothing of this one is left
                Ok(true) => {
                    self.socket = Some(socket);
                    return Ok(messages);
                }
                Err(Failure::Absent) => {
                    self.socket = Some(socket);
                    return Err(Failure::Absent);
                }
                Err(f) => return Err(f),
                Ok(false) => {}
            }
        }
    }
}

/// Tries of one read while kube-proxy's commits move the generation (or interrupt a dump, or
/// replace the map between the two dumps).
pub const ATTEMPTS: usize = 3;

/// Why one try of a read failed: worth another try, or not.
enum Retry {
    Again(String),
    No(String),
}

/// kube-proxy nftables mode's reader over netlink ([`Kernel`], or a canned [`Exchange`]).
pub struct NetlinkNftablesReader<E: Exchange> {
    exchange: E,
    seq: u32,
}

impl<E: Exchange> NetlinkNftablesReader<E> {
    /// A reader asking `exchange`.
    pub fn new(exchange: E) -> Self {
        Self { exchange, seq: 0 }
    }

    fn ask(&mut self, message: NfTablesMessage, family: NetfilterProtoFamily, dump: bool) -> Result<Vec<NfTablesMessage>, Failure> {
        self.seq = self.seq.wrapping_add(1);
        let request = encode(message, family, self.seq, dump);
        self.exchange.exchange(&request, self.seq)
    }

    fn generation(&mut self) -> Result<u32, Failure> {
        let answer = self.ask(NfTablesMessage::GetGen(GenMessage { attributes: vec![] }), NetfilterProtoFamily::Unspec, false)?;
        answer
            .iter()
            .find_map(|m| match m {
                NfTablesMessage::NewGen(g) => g.attributes.iter().find_map(|a| if let GenAttribute::Id(id) = a { Some(*id) } else { None }),
                _ => None,
            })
            .ok_or_else(|| Failure::Other("no generation in the answer to NFT_MSG_GETGEN".into()))
    }

    /// `once`, tried up to [`ATTEMPTS`] times while kube-proxy's commits move the generation or
    /// interrupt a dump (each try costs about 0.1 ms; the last failure is the read's).
    fn retried<T>(&mut self, mut once: impl FnMut(&mut Self) -> Result<T, Retry>) -> Result<T, String> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            match once(self) {
                Err(Retry::Again(e)) => last = e,
                Err(Retry::No(e)) => return Err(e),
                Ok(r) => return Ok(r),
            }
        }
        Err(format!("{last} ({ATTEMPTS} tries)"))
    }

    /// The rules of `chain` in `table` (None: no such chain), between two reads of the
    /// generation, which must agree.
    fn rules_of(&mut self, table: &str, chain: &str, family: Family) -> Result<(u32, Option<Vec<RuleMessage>>), Retry> {
        let before = self.generation().map_err(|f| retry("NFT_MSG_GETGEN", f))?;
        let rule_request = NfTablesMessage::GetRule(RuleMessage { attributes: vec![RuleAttribute::Table(table.into()), RuleAttribute::Chain(chain.into())] });
        let rules: Vec<RuleMessage> = self
            .ask(rule_request, family.proto(), true)
            .map_err(|f| retry("NFT_MSG_GETRULE", f))?
            .into_iter()
            .filter_map(|m| if let NfTablesMessage::NewRule(r) = m { Some(r) } else { None })
            .collect();
        if rules.is_empty() {
            // an empty dump: the chain without rules, or no such chain
            let get = NfTablesMessage::GetChain(ChainMessage { attributes: vec![ChainAttribute::Table(table.into()), ChainAttribute::Name(chain.into())] });
            return match self.ask(get, family.proto(), false) {
                Err(Failure::Absent) => Ok((before, None)),
                Err(f) => Err(retry("NFT_MSG_GETCHAIN", f)),
                Ok(_) => Ok((before, Some(rules))),
            };
        }
        Ok((before, Some(rules)))
    }

    /// Fails with [`Retry::Again`] when the generation moved since `before`.
    fn same_generation(&mut self, before: u32) -> Result<(), Retry> {
        let after = self.generation().map_err(|f| retry("NFT_MSG_GETGEN", f))?;
        if after != before {
            return Err(Retry::Again(format!("the ruleset changed during the read (generation {before} -> {after})")));
        }
        Ok(())
    }

    fn read(&mut self, chain: &str, family: Family) -> Result<Option<BTreeSet<IpAddr>>, String> {
        self.retried(|r| r.read_once(chain, family))
    }

    fn read_once(&mut self, chain: &str, family: Family) -> Result<Option<BTreeSet<IpAddr>>, Retry> {
        let (before, rules) = self.rules_of(TABLE, chain, family)?;
        let Some(rules) = rules else {
            // an absent chain is a sample only of one generation, as a present one is
            self.same_generation(before)?;
            return Ok(None);
        };
        let found = endpoints_of_rules(&rules, family).map_err(|e| Retry::No(format!("the chain's rules: {e}")))?;
        let mut ips = found.ips;
        for map in &found.maps {
            let get =
                NfTablesMessage::GetSetElement(SetElementMessage { attributes: vec![SetElementList::Table(TABLE.into()), SetElementList::Set(map.clone())] });
            // the map gone since the rule dump: kube-proxy replaced the rule, try again
            let elements: Vec<SetElementMessage> = self
                .ask(get, family.proto(), true)
                .map_err(|f| match f {
                    Failure::Absent => Retry::Again(format!("NFT_MSG_GETSETELEM {map}: absent (ENOENT)")),
                    f => retry(&format!("NFT_MSG_GETSETELEM {map}"), f),
                })?
                .into_iter()
                .filter_map(|m| if let NfTablesMessage::NewSetElement(e) = m { Some(e) } else { None })
                .collect();
            ips.extend(endpoints_of_map(&elements, family).map_err(|e| Retry::No(format!("map {map}: {e}")))?);
        }
        self.same_generation(before)?;
        Ok(Some(ips))
    }
}

/// How a failed exchange of `what` ends a try: an interrupted dump is tried again.
fn retry(what: &str, f: Failure) -> Retry {
    match f {
        Failure::Absent => Retry::No(format!("{what}: absent (ENOENT)")),
        Failure::Other(s) if s.contains("NLM_F_DUMP_INTR") => Retry::Again(format!("{what}: {s}")),
        Failure::Other(s) => Retry::No(format!("{what}: {s}")),
    }
}

/// The chains the rules of `rules` jump or go to whose names start with `prefix` (iptables-nft
/// writes `-j KUBE-SEP-...` as a native `jump` verdict), in order.
pub fn jump_targets(rules: &[RuleMessage], prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    for rule in rules {
        for (_, data) in expressions(rule) {
            let Some(Expressions::Immediate(attrs)) = data else { continue };
            for a in attrs {
                if let Immediate::Data(DataAttribute::Verdict(v)) = a {
                    out.extend(
                        v.iter().filter_map(|v| if let VerdictAttribute::Chain(c) = v { Some(c.clone()) } else { None }).filter(|c| c.starts_with(prefix)),
                    );
                }
            }
        }
    }
    out
}

/// Which chains a chain's rules jump to, read over netlink: iptables-nft's `KUBE-SVC-` chains.
pub trait ChainJumps: Send {
    /// The chains `chain` of `table` jumps to whose names start with `prefix`; None when there
    /// is no such chain. Errors name what failed.
    fn jumps(&mut self, table: &str, chain: &str, family: Family, prefix: &str) -> Result<Option<Vec<String>>, String>;
}

impl<E: Exchange> ChainJumps for NetlinkNftablesReader<E> {
    fn jumps(&mut self, table: &str, chain: &str, family: Family, prefix: &str) -> Result<Option<Vec<String>>, String> {
        self.retried(|r| {
            let (before, rules) = r.rules_of(table, chain, family)?;
            let Some(rules) = rules else {
                r.same_generation(before)?;
                return Ok(None);
            };
            r.same_generation(before)?;
            Ok(Some(jump_targets(&rules, prefix)))
        })
    }
}

impl<E: Exchange> DataPlaneReader for NetlinkNftablesReader<E> {
    fn data_plane(&self) -> &'static str {
        "nftables"
    }

    fn endpoints(&mut self, service: &ServicePort) -> Result<Option<BTreeSet<IpAddr>>, ReadError> {
        let chain = service_chain(service);
        let family = Family::of(service.cluster_ip);
        let table = if family == Family::V6 { "ip6" } else { "ip" };
        self.read(&chain, family).map_err(|how| ReadError { command: format!("netlink read of chain {table} {TABLE} {chain}"), how })
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_service as svc;
    use super::*;
    use netlink_packet_core::{DoneMessage, ErrorMessage, NetlinkHeader};
    use netlink_packet_netfilter::nftables::{Register, Verdict};
    use std::collections::VecDeque;

    fn element(data: DataAttribute) -> ListAttribute<SetElementAttribute> {
        ListAttribute::Element(vec![SetElementAttribute::Key(DataAttribute::Value(vec![0, 0, 0, 0])), SetElementAttribute::Data(data)])
    }

    fn named(name: &str, data: Expressions) -> ListAttribute<ExpressionAttribute> {
        ListAttribute::Element(vec![ExpressionAttribute::Name(name.into()), ExpressionAttribute::Data(data)])
    }

    fn other(name: &str) -> ListAttribute<ExpressionAttribute> {
        named(name, Expressions::Other { expression_type: name.into(), attributes: vec![] })
    }

    fn rule(exprs: Vec<ListAttribute<ExpressionAttribute>>) -> RuleMessage {
        RuleMessage { attributes: vec![RuleAttribute::Table(TABLE.into()), RuleAttribute::Chain("c".into()), RuleAttribute::Expressions(exprs)] }
    }

    fn immediate(data: DataAttribute) -> ListAttribute<ExpressionAttribute> {
        named("immediate", Expressions::Immediate(vec![Immediate::DestinationRegister(Register::Reg1), Immediate::Data(data)]))
    }

    fn verdict(chain: &str) -> DataAttribute {
        DataAttribute::Verdict(vec![VerdictAttribute::Code(Verdict::Goto), VerdictAttribute::Chain(chain.into())])
    }

    /// The rules kube-proxy 1.37 writes in a service chain: the masquerade jump, then `meta
    /// l4proto tcp dnat ip to numgen random mod 2 map { ... }` (the map `__map3`).
    fn numgen_rules() -> Vec<RuleMessage> {
        vec![
            rule(vec![other("payload"), other("cmp"), immediate(DataAttribute::Verdict(vec![VerdictAttribute::Chain("mark-for-masquerade".into())]))]),
            rule(vec![
                other("meta"),
                other("cmp"),
                other("numgen"),
                named("lookup", Expressions::Lookup(vec![Lookup::Set("__map3".into()), Lookup::SourceRegister(Register::Reg1)])),
                other("nat"),
            ]),
        ]
    }

    fn map_of(values: &[[u8; 8]]) -> SetElementMessage {
        SetElementMessage {
            attributes: vec![
                SetElementList::Table(TABLE.into()),
                SetElementList::Set("__map3".into()),
                SetElementList::Elements(values.iter().map(|v| element(DataAttribute::Value(v.to_vec()))).collect()),
            ],
        }
    }

    fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn the_endpoints_are_the_numgen_maps_values_or_the_rules_own() {
        let found = endpoints_of_rules(&numgen_rules(), Family::V4).unwrap();
        assert_eq!(found, ChainEndpoints { ips: BTreeSet::new(), maps: vec!["__map3".into()] });
        let map = map_of(&[[10, 244, 1, 5, 0x1f, 0x90, 0, 0], [10, 244, 2, 7, 0x1f, 0x90, 0, 0]]);
        assert_eq!(endpoints_of_map(&[map], Family::V4).unwrap(), ips(&["10.244.1.5", "10.244.2.7"]));
        // a vmap of endpoint chains (kube-proxy before 1.37)
        let vmap = SetElementMessage { attributes: vec![SetElementList::Elements(vec![element(verdict("endpoint-AAAA-ns/web/tcp/http__10.244.1.5/8080"))])] };
        assert_eq!(endpoints_of_map(&[vmap], Family::V4).unwrap(), ips(&["10.244.1.5"]));
        // one endpoint: `dnat ip to 10.213.254.1:443` (an address immediate, then the port's)
        let one = rule(vec![
            other("meta"),
            other("cmp"),
            immediate(DataAttribute::Value(vec![10, 213, 254, 1])),
            immediate(DataAttribute::Value(vec![1, 0xbb])),
            other("nat"),
        ]);
        assert_eq!(endpoints_of_rules(&[one], Family::V4).unwrap().ips, ips(&["10.213.254.1"]));
        // one endpoint chain, IPv6
        let goto = rule(vec![immediate(verdict("endpoint-BBBB-ns/web/tcp/http__fd00::5/8080"))]);
        assert_eq!(endpoints_of_rules(&[goto], Family::V6).unwrap().ips, ips(&["fd00::5"]));
        let v6 = map_of(&[[0; 8]]);
        assert_eq!(endpoints_of_map(&[v6], Family::V6), Err(EndpointsError::ValueNotAddress { element: 0, len: 8 }));
        assert_eq!(EndpointsError::ValueNotAddress { element: 0, len: 8 }.to_string(), "element 0: a value of 8 bytes is no address");
    }

    #[test]
    fn rules_and_maps_that_name_no_endpoint_are_errors() {
        let no_lookup = rule(vec![other("numgen"), other("nat")]);
        let e = endpoints_of_rules(&[no_lookup], Family::V4).unwrap_err();
        assert_eq!(e.to_string(), r#"rule 0: a numgen rule without a map lookup (expressions ["numgen", "nat"])"#);
        let nat_alone = rule(vec![other("nat"), immediate(DataAttribute::Value(vec![1, 0xbb]))]);
        let e = endpoints_of_rules(&[nat_alone], Family::V4).unwrap_err();
        assert_eq!(e, EndpointsError::NatWithoutAddress { rule: 0, expressions: vec!["nat".into(), "immediate".into()] });
        let bad_chain = rule(vec![immediate(verdict("endpoint-CCCC-ns/web/tcp/http"))]);
        let e = endpoints_of_rules(&[bad_chain], Family::V4).unwrap_err();
        assert_eq!(e.to_string(), r#"rule 0: an endpoint chain that names no endpoint: "endpoint-CCCC-ns/web/tcp/http""#);
        let no_data = SetElementMessage {
            attributes: vec![SetElementList::Elements(vec![ListAttribute::Element(vec![SetElementAttribute::Key(DataAttribute::Value(vec![0; 4]))])])],
        };
        assert_eq!(endpoints_of_map(&[no_data], Family::V4), Err(EndpointsError::NoData { element: 0 }));
    }

    /// The kernel's side of a read, as encoded bytes: each request is checked against what the
    /// reader must ask, and answered with datagrams built like the kernel's.
    struct Scripted {
        steps: VecDeque<(u8, Result<Vec<NfTablesMessage>, i32>)>,
        asked: Vec<u8>,
    }

    fn datagram(messages: Vec<NfTablesMessage>, seq: u32, end: NetlinkPayload<NetfilterMessage>, flags: u16) -> Vec<u8> {
        let mut out = Vec::new();
        let payloads =
            messages.into_iter().map(|m| NetlinkPayload::InnerMessage(NetfilterMessage::new(NetfilterHeader::new(NetfilterProtoFamily::IPv4, 0, 0), m)));
        for p in payloads.chain(std::iter::once(end)) {
            let mut msg = NetlinkMessage::new(NetlinkHeader::default(), p);
            msg.header.sequence_number = seq;
            msg.header.flags = flags;
            msg.finalize();
            let mut buf = vec![0; msg.buffer_len()];
            msg.serialize(&mut buf);
            out.extend(buf);
        }
        out
    }

    impl Exchange for Scripted {
        fn exchange(&mut self, request: &[u8], seq: u32) -> Result<Vec<NfTablesMessage>, Failure> {
            let header = NetlinkBuffer::new_checked(request).unwrap();
            let kind = (header.message_type() & 0xff) as u8;
            self.asked.push(kind);
            let (want, answer) = self.steps.pop_front().expect("an unexpected request");
            assert_eq!(kind, want, "request type");
            // an earlier request's late message first: skipped by its sequence number
            let mut bytes = datagram(vec![], seq.wrapping_sub(1), NetlinkPayload::Done(DoneMessage::default()), 0);
            bytes.extend(match answer {
                Ok(messages) => datagram(messages, seq, NetlinkPayload::Done(DoneMessage::default()), 0),
                Err(errno) => {
                    let mut e = ErrorMessage::default();
                    e.code = std::num::NonZeroI32::new(-errno);
                    datagram(vec![], seq, NetlinkPayload::Error(e), 0)
                }
            });
            let mut out = Vec::new();
            decode(&bytes, seq, &mut out).map(|_| out)
        }
    }

    const GETGEN: u8 = 16;
    const GETRULE: u8 = 7;
    const GETCHAIN: u8 = 4;
    const GETSETELEM: u8 = 13;

    fn gen_(id: u32) -> NfTablesMessage {
        NfTablesMessage::NewGen(GenMessage { attributes: vec![GenAttribute::Id(id)] })
    }

    fn reader(steps: Vec<(u8, Result<Vec<NfTablesMessage>, i32>)>) -> NetlinkNftablesReader<Scripted> {
        NetlinkNftablesReader::new(Scripted { steps: steps.into(), asked: vec![] })
    }

    #[test]
    fn a_read_is_a_consistent_snapshot_or_no_sample() {
        let rules = || Ok(numgen_rules().into_iter().map(NfTablesMessage::NewRule).collect());
        let map = || Ok(vec![NfTablesMessage::NewSetElement(map_of(&[[10, 244, 1, 5, 0x1f, 0x90, 0, 0]]))]);
        let web = svc("ns", "web", "http");
        let mut r = reader(vec![(GETGEN, Ok(vec![gen_(7)])), (GETRULE, rules()), (GETSETELEM, map()), (GETGEN, Ok(vec![gen_(7)]))]);
        assert_eq!(r.endpoints(&web).unwrap(), Some(ips(&["10.244.1.5"])));
        // kube-proxy committed between the two generations: tried again
        let moved = |from: u32| vec![(GETGEN, Ok(vec![gen_(from)])), (GETRULE, rules()), (GETSETELEM, map()), (GETGEN, Ok(vec![gen_(from + 1)]))];
        let steady = vec![(GETGEN, Ok(vec![gen_(8)])), (GETRULE, rules()), (GETSETELEM, map()), (GETGEN, Ok(vec![gen_(8)]))];
        let mut r = reader([moved(7), steady].concat());
        assert_eq!(r.endpoints(&web).unwrap(), Some(ips(&["10.244.1.5"])));
        // ... and a failed read, no sample, when it moves at every try
        let mut r = reader([moved(7), moved(8), moved(9)].concat());
        let e = r.endpoints(&web).unwrap_err();
        assert!(e.how.contains("generation 9 -> 10) (3 tries)") && e.command.starts_with("netlink read of chain ip kube-proxy service-"), "{e}");
        // the map replaced between the dumps: tried again, and a failed read, never "absent"
        let gone = || vec![(GETGEN, Ok(vec![gen_(7)])), (GETRULE, rules()), (GETSETELEM, Err(2))];
        let mut r = reader([gone(), gone(), gone()].concat());
        assert!(r.endpoints(&web).unwrap_err().how.contains("NFT_MSG_GETSETELEM __map3: absent"));
        // an empty dump: the chain absent (ENOENT) in one generation is None; absent while the
        // generation moved is tried again (a table rewritten mid-read); present but empty is no
        // endpoint
        let mut r = reader(vec![(GETGEN, Ok(vec![gen_(7)])), (GETRULE, Ok(vec![])), (GETCHAIN, Err(2)), (GETGEN, Ok(vec![gen_(7)]))]);
        assert_eq!(r.endpoints(&web).unwrap(), None);
        let chain = NfTablesMessage::NewChain(ChainMessage { attributes: vec![] });
        let absent_moved = vec![(GETGEN, Ok(vec![gen_(7)])), (GETRULE, Ok(vec![])), (GETCHAIN, Err(2)), (GETGEN, Ok(vec![gen_(8)]))];
        let present = vec![(GETGEN, Ok(vec![gen_(8)])), (GETRULE, Ok(vec![])), (GETCHAIN, Ok(vec![chain.clone()])), (GETGEN, Ok(vec![gen_(8)]))];
        let mut r = reader([absent_moved, present].concat());
        assert_eq!(r.endpoints(&web).unwrap(), Some(BTreeSet::new()), "absent in a moving generation is read again, not taken for absent");
        let mut r = reader(vec![(GETGEN, Ok(vec![gen_(7)])), (GETRULE, Ok(vec![])), (GETCHAIN, Ok(vec![chain])), (GETGEN, Ok(vec![gen_(7)]))]);
        assert_eq!(r.endpoints(&web).unwrap(), Some(BTreeSet::new()));
        // no permission: a failed read
        let mut r = reader(vec![(GETGEN, Err(1))]);
        assert!(r.endpoints(&web).unwrap_err().how.contains("Operation not permitted"));
    }

    /// iptables-nft's `KUBE-SVC-` chain: a rule per endpoint, each a native jump to its
    /// `KUBE-SEP-` chain (the masquerade rule jumps to `KUBE-MARK-MASQ`, not listed).
    #[test]
    fn an_iptables_nft_service_chain_gives_its_endpoint_chains() {
        let jump = |chain: &str| immediate(DataAttribute::Verdict(vec![VerdictAttribute::Code(Verdict::Jump), VerdictAttribute::Chain(chain.into())]));
        let svc = vec![
            rule(vec![other("match"), other("payload"), other("cmp"), jump("KUBE-MARK-MASQ")]),
            rule(vec![other("match"), other("match"), jump("KUBE-SEP-MKDTF7QCLRRBX5YA")]),
            rule(vec![other("match"), jump("KUBE-SEP-F6WVCICFJW7ZS33A")]),
        ];
        assert_eq!(jump_targets(&svc, "KUBE-SEP-"), ["KUBE-SEP-MKDTF7QCLRRBX5YA", "KUBE-SEP-F6WVCICFJW7ZS33A"]);
        let dump = || Ok(svc.iter().cloned().map(NfTablesMessage::NewRule).collect());
        let mut r = reader(vec![(GETGEN, Ok(vec![gen_(3)])), (GETRULE, dump()), (GETGEN, Ok(vec![gen_(3)]))]);
        assert_eq!(r.jumps("nat", "KUBE-SVC-X", Family::V4, "KUBE-SEP-").unwrap().unwrap().len(), 2);
        let mut r = reader(vec![(GETGEN, Ok(vec![gen_(3)])), (GETRULE, Ok(vec![])), (GETCHAIN, Err(2)), (GETGEN, Ok(vec![gen_(3)]))]);
        assert_eq!(r.jumps("nat", "KUBE-SVC-X", Family::V4, "KUBE-SEP-"), Ok(None));
    }

    #[test]
    fn an_interrupted_or_garbled_answer_is_no_sample() {
        let mut out = Vec::new();
        let interrupted = datagram(vec![gen_(1)], 5, NetlinkPayload::Done(DoneMessage::default()), NLM_F_DUMP_INTR);
        assert!(matches!(decode(&interrupted, 5, &mut out), Err(Failure::Other(s)) if s.contains("NLM_F_DUMP_INTR")));
        let mut whole = datagram(vec![gen_(1)], 5, NetlinkPayload::Done(DoneMessage::default()), 0);
        for cut in [1, 15, 17, whole.len() - 1] {
            assert!(decode(&whole[..cut], 5, &mut Vec::new()).is_err(), "cut at {cut}");
        }
        // a dump that failed after it began: NLMSG_DONE with the errno, not a whole answer
        let mut failed = DoneMessage::default();
        failed.code = -28;
        let cut_short = datagram(vec![gen_(1)], 5, NetlinkPayload::Done(failed), 0);
        assert!(matches!(decode(&cut_short, 5, &mut Vec::new()), Err(Failure::Other(s)) if s.contains("No space left")));
        let mut gone = DoneMessage::default();
        gone.code = -2;
        assert_eq!(decode(&datagram(vec![], 5, NetlinkPayload::Done(gone), 0), 5, &mut Vec::new()), Err(Failure::Absent));
        // a length beyond the datagram
        whole[0] = 0xff;
        assert!(decode(&whole, 5, &mut Vec::new()).is_err());
        // a complete answer with nothing after it; an incomplete one asks for more
        let first = datagram(vec![gen_(1)], 5, NetlinkPayload::Done(DoneMessage::default()), 0);
        let only_messages = &first[..first.len() - 20];
        assert_eq!(decode(only_messages, 5, &mut out), Ok(false));
        assert_eq!(out.len(), 1);
    }

    /// The kernel's own answers (tests/data/rules/README.md: captured on the nftables node at
    /// 4,000 extra Services).
    #[test]
    fn real_answers() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rules");
        let answer = |file: &str, seq: u32| {
            let mut out = Vec::new();
            decode(&std::fs::read(dir.join(file)).unwrap(), seq, &mut out).map(|done| (done, out))
        };
        let (done, g) = answer("netlink-1.37.2-gen-seq100.bin", 100).unwrap();
        assert!(done && matches!(&g[..], [NfTablesMessage::NewGen(m)] if m.attributes.iter().any(|a| matches!(a, GenAttribute::Id(_)))), "{g:?}");
        let rules_of = |file: &str| -> Vec<RuleMessage> {
            let (done, m) = answer(file, 101).unwrap();
            assert!(done);
            m.into_iter().filter_map(|m| if let NfTablesMessage::NewRule(r) = m { Some(r) } else { None }).collect()
        };
        let two = rules_of("netlink-1.37.2-service-chain-2-endpoints-rules-seq101.bin");
        assert_eq!(two.len(), 1, "the numgen rule alone");
        assert_eq!(endpoints_of_rules(&two, Family::V4).unwrap(), ChainEndpoints { ips: BTreeSet::new(), maps: vec!["__map107".into()] });
        let (done, m) = answer("netlink-1.37.2-service-chain-2-endpoints-map-seq102.bin", 102).unwrap();
        let elements: Vec<SetElementMessage> = m.into_iter().filter_map(|m| if let NfTablesMessage::NewSetElement(e) = m { Some(e) } else { None }).collect();
        assert!(done);
        assert_eq!(endpoints_of_map(&elements, Family::V4).unwrap(), ips(&["10.244.100.11", "10.244.100.12"]));
        let one = rules_of("netlink-1.37.2-service-chain-1-endpoint-rules-seq101.bin");
        assert_eq!(endpoints_of_rules(&one, Family::V4).unwrap(), ChainEndpoints { ips: ips(&["10.213.254.1"]), maps: vec![] });
        assert_eq!(answer("netlink-1.37.2-chain-absent-seq103.bin", 103), Err(Failure::Absent));
        // another request's answer: skipped whole, so not complete
        assert_eq!(answer("netlink-1.37.2-chain-absent-seq103.bin", 7), Ok((false, vec![])));
    }

    /// What the `nft_netlink` fuzz target found: a set element whose data attribute holds an
    /// attribute of length under 4, which `netlink-packet-netfilter` 0.4 reads unchecked and
    /// panicked on; and message types no answer of this reader holds.
    #[test]
    fn what_the_library_would_panic_on_is_refused_first() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/rules");
        let crash = std::fs::read(dir.join("netlink-fuzz-set-element-data-length-under-4.bin")).unwrap();
        let seq = u32::from_ne_bytes(crash[8..12].try_into().unwrap());
        let e = decode(&crash, seq, &mut Vec::new()).unwrap_err();
        assert!(matches!(&e, Failure::Other(s) if s.contains("not one well-formed attribute")), "{e:?}");
        // a real answer passes the same check
        let map = std::fs::read(dir.join("netlink-1.37.2-service-chain-2-endpoints-map-seq102.bin")).unwrap();
        assert!(decode(&map, 102, &mut Vec::new()).is_ok());
        assert!(single(&[8, 0, 1, 0, 1, 2, 3, 4], "x").is_ok());
        for bad in [&[][..], &[3, 0, 1, 0][..], &[9, 0, 1, 0, 1, 2, 3, 4][..], &[8, 0, 1][..]] {
            assert!(single(bad, "x").is_err(), "{bad:?}");
        }
        // NFT_MSG_NEWSET (0x0a09): not asked for, not decoded
        assert!(decodable(0x0a09, &[2, 0, 0, 0]).unwrap_err().contains("0x0a09"));
    }

    /// The request bytes: nfnetlink's subsystem and type, the dump flags, table and chain.
    #[test]
    fn requests_are_what_nft_sends() {
        let get = NfTablesMessage::GetRule(RuleMessage { attributes: vec![RuleAttribute::Table(TABLE.into()), RuleAttribute::Chain("c".into())] });
        let bytes = encode(get, NetfilterProtoFamily::IPv4, 9, true);
        let b = NetlinkBuffer::new_checked(&bytes[..]).unwrap();
        assert_eq!((b.message_type(), b.flags(), b.sequence_number(), b.length() as usize), (0x0a07, NLM_F_REQUEST | NLM_F_DUMP, 9, bytes.len()));
        // nfgenmsg: family AF_INET (2), version 0, res_id 0; then NFTA_RULE_TABLE "kube-proxy"
        assert_eq!(&bytes[16..20], &[2, 0, 0, 0]);
        assert_eq!(&bytes[20..24], &[15, 0, 1, 0]);
        assert_eq!(&bytes[24..34], b"kube-proxy");
    }
}
