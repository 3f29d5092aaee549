//! The command line, parsed by hand (a parser crate would be most of this binary's size).
//! `--name value` and `--name=value`; each option once.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::files::MAX_PRESTOP_SECONDS;

pub const DEFAULT_DIR: &str = "/safe-termination/wait";
pub const DEFAULT_POLL_SECONDS: u64 = 10;
/// The largest --deadline-seconds: a day (a pod's terminationGracePeriodSeconds may be long).
pub const MAX_DEADLINE_SECONDS: u64 = 86_400;

/// `wait`'s options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitArgs {
    pub url: String,
    pub policy: String,
    pub fallback_seconds: u64,
    pub deadline_seconds: u64,
    pub dir: PathBuf,
    pub poll_seconds: u64,
    /// `--address IP:PORT`: where every request connects instead of resolving the URL's host;
    /// TLS still verifies the certificate against the URL's host name (also the SNI) and the
    /// Host header stays the URL's. For pods in clusters without working DNS at deletion time,
    /// or with DNS down: they still reach the operator's Service by its ClusterIP, while the
    /// serving certificate is only issued for the Service's DNS name.
    pub address: Option<SocketAddr>,
}

pub fn parse_wait(args: &[String]) -> Result<WaitArgs, String> {
    let (mut url, mut policy, mut fallback, mut deadline, mut dir, mut poll, mut address) = (None, None, None, None, None, None, None);
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let slot = match name {
            "--url" => &mut url,
            "--policy" => &mut policy,
            "--fallback-seconds" => &mut fallback,
            "--deadline-seconds" => &mut deadline,
            "--dir" => &mut dir,
            "--poll-seconds" => &mut poll,
            "--address" => &mut address,
            _ if name.starts_with('-') => return Err(format!("unknown option {name}")),
            _ => return Err(format!("unexpected argument {arg:?}")),
        };
        let value = match inline {
            Some(v) => v,
            None => rest.next().cloned().ok_or_else(|| format!("{name} needs a value"))?,
        };
        if slot.replace(value).is_some() {
            return Err(format!("{name} given twice"));
        }
    }
    let url = url.ok_or("--url is required")?;
    check_url(&url)?;
    let policy = policy.ok_or("--policy is required")?;
    check_policy(&policy)?;
    let fallback_seconds = number("--fallback-seconds", fallback.ok_or("--fallback-seconds is required")?, 0, MAX_PRESTOP_SECONDS)?;
    let deadline_seconds = number("--deadline-seconds", deadline.ok_or("--deadline-seconds is required")?, 1, MAX_DEADLINE_SECONDS)?;
    let poll_seconds = match poll {
        Some(p) => number("--poll-seconds", p, 1, 3600)?,
        None => DEFAULT_POLL_SECONDS,
    };
    let dir = PathBuf::from(dir.unwrap_or_else(|| DEFAULT_DIR.to_string()));
    if dir.as_os_str().is_empty() {
        return Err("--dir is empty".into());
    }
    let address = address.map(|a| parse_address(&a)).transpose()?;
    Ok(WaitArgs { url, policy, fallback_seconds, deadline_seconds, dir, poll_seconds, address })
}

/// `IP:PORT`: an IPv4 address, or an IPv6 one in brackets (`[fd00::1]:443`), and a port other
/// than 0; no host name (it would need the DNS this option does without).
fn parse_address(value: &str) -> Result<SocketAddr, String> {
    match value.parse::<SocketAddr>() {
        Ok(a) if a.port() != 0 => Ok(a),
        _ => Err(format!("--address must be IPv4:PORT or [IPv6]:PORT with a port in 1..=65535, not {value:?}")),
    }
}

fn number(name: &str, value: String, min: u64, max: u64) -> Result<u64, String> {
    match value.parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) && value.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(format!("{name} must be an integer in {min}..={max}, not {value:?}")),
    }
}

/// https only (the token goes with every request), with a host, no query or fragment (the
/// program adds its own query), no whitespace.
fn check_url(url: &str) -> Result<(), String> {
    let Some(after) = url.strip_prefix("https://") else {
        return Err(format!("--url must start with https://, not {url:?}"));
    };
    if after.is_empty() || after.starts_with('/') || url.len() > 2048 {
        return Err(format!("--url has no host: {url:?}"));
    }
    if url.bytes().any(|b| !b.is_ascii_graphic() || b == b'?' || b == b'#') {
        return Err(format!("--url must have no query, fragment or whitespace: {url:?}"));
    }
    Ok(())
}

/// A Kubernetes object name (DNS-1123 subdomain): it names the file `<NAME>.preStopSeconds`.
fn check_policy(policy: &str) -> Result<(), String> {
    let ok_char = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.';
    let b = policy.as_bytes();
    let ok = !b.is_empty() && b.len() <= 253 && b.iter().all(|&c| ok_char(c)) && b[0].is_ascii_alphanumeric() && b[b.len() - 1].is_ascii_alphanumeric();
    if ok { Ok(()) } else { Err(format!("--policy must be a Kubernetes object name (lower-case letters, digits, '-', '.'), not {policy:?}")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(args: &[&str]) -> Vec<String> {
        args.iter().map(|s| s.to_string()).collect()
    }

    const MIN: &[&str] = &["--url", "https://op.ns.svc:8443/wait/v1", "--policy", "web", "--fallback-seconds", "15", "--deadline-seconds", "40"];

    #[test]
    fn defaults_and_both_spellings() {
        let a = parse_wait(&v(MIN)).unwrap();
        assert_eq!(
            a,
            WaitArgs {
                url: "https://op.ns.svc:8443/wait/v1".into(),
                policy: "web".into(),
                fallback_seconds: 15,
                deadline_seconds: 40,
                dir: PathBuf::from("/safe-termination/wait"),
                poll_seconds: 10,
                address: None,
            }
        );
        let a =
            parse_wait(&v(&["--policy=a.b-c", "--url=https://h/x", "--fallback-seconds=0", "--deadline-seconds=1", "--dir=/d", "--poll-seconds=3"])).unwrap();
        assert_eq!((a.policy.as_str(), a.fallback_seconds, a.deadline_seconds, a.dir, a.poll_seconds), ("a.b-c", 0, 1, PathBuf::from("/d"), 3));
    }

    #[test]
    fn errors() {
        let with = |extra: &[&str]| {
            let mut a = v(MIN);
            a.extend(v(extra));
            parse_wait(&a).unwrap_err()
        };
        assert_eq!(with(&["--poll-seconds", "0"]), "--poll-seconds must be an integer in 1..=3600, not \"0\"");
        assert_eq!(with(&["--url", "https://x"]), "--url given twice");
        assert_eq!(with(&["--verbose"]), "unknown option --verbose");
        assert_eq!(with(&["extra"]), "unexpected argument \"extra\"");
        assert_eq!(with(&["--dir"]), "--dir needs a value");
        assert_eq!(with(&["--dir="]), "--dir is empty");
        assert_eq!(parse_wait(&v(&MIN[2..])).unwrap_err(), "--url is required");
        assert_eq!(parse_wait(&v(&MIN[..6])).unwrap_err(), "--deadline-seconds is required");
        let replace = |i: usize, val: &str| {
            let mut a = v(MIN);
            a[i] = val.into();
            parse_wait(&a).unwrap_err()
        };
        assert_eq!(replace(1, "http://op/wait"), "--url must start with https://, not \"http://op/wait\"");
        assert_eq!(replace(1, "https:///x"), "--url has no host: \"https:///x\"");
        assert_eq!(replace(1, "https://op/wait?x=1"), "--url must have no query, fragment or whitespace: \"https://op/wait?x=1\"");
        assert!(replace(3, "../etc").starts_with("--policy must be"));
        assert!(replace(3, "Web").starts_with("--policy must be"));
        assert!(replace(3, "web-").starts_with("--policy must be"));
        assert!(replace(3, "").starts_with("--policy must be"));
        assert_eq!(replace(5, "3601"), "--fallback-seconds must be an integer in 0..=3600, not \"3601\"");
        assert_eq!(replace(5, "+5"), "--fallback-seconds must be an integer in 0..=3600, not \"+5\"");
        assert_eq!(replace(5, "-1"), "--fallback-seconds must be an integer in 0..=3600, not \"-1\"");
        assert_eq!(replace(7, "0"), "--deadline-seconds must be an integer in 1..=86400, not \"0\"");
    }

    #[test]
    fn every_policy_accepted_goes_in_the_query_unescaped() {
        // the GET sends `policy=NAME` as it is (the crate has no percent-encoder)
        for b in 0..=u8::MAX {
            let name = format!("a{}a", b as char);
            if check_policy(&name).is_ok() {
                assert_eq!(crate::http::check_query_value(&name), Ok(()), "{name:?}");
            }
        }
        assert_eq!(crate::http::check_query_value(&"a.b-c".repeat(50)), Ok(()));
    }

    #[test]
    fn addresses() {
        let address = |value: &str| {
            let mut a = v(MIN);
            a.extend(v(&["--address", value]));
            parse_wait(&a).map(|w| w.address.unwrap())
        };
        let ok = |value: &str| address(value).unwrap().to_string();
        assert_eq!(ok("10.96.0.20:443"), "10.96.0.20:443");
        assert_eq!(ok("[fd00:10:96::a]:8443"), "[fd00:10:96::a]:8443");
        assert_eq!(ok("[::1]:1"), "[::1]:1");
        assert_eq!(ok("[::ffff:10.96.0.20]:443"), "[::ffff:10.96.0.20]:443");
        assert_eq!(ok("127.0.0.1:65535"), "127.0.0.1:65535");
        // what std's parser also takes: a port's leading zeros, an IPv6 zone index
        assert_eq!(ok("10.96.0.20:0443"), "10.96.0.20:443");
        assert_eq!(ok("[fe80::1%2]:443"), "[fe80::1%2]:443");
        let mut a = v(MIN);
        a.push("--address=10.96.0.20:443".into());
        assert_eq!(parse_wait(&a).unwrap().address, Some("10.96.0.20:443".parse().unwrap()));
        assert_eq!(parse_wait(&v(MIN)).unwrap().address, None);

        for bad in [
            "",
            "10.96.0.20",
            "10.96.0.20:",
            "10.96.0.20:0",
            "10.96.0.20:65536",
            "10.96.0.20:-1",
            "10.96.0.20:https",
            " 10.96.0.20:443",
            "10.96.0.20:443 ",
            "10.96.0.256:443",
            "10.96.0:443",
            "fd00::a:443",
            "[fd00::a]",
            "[fd00::a]:0",
            "fd00::a",
            "[10.96.0.20]:443",
            "localhost:443",
            "op.ns.svc:443",
            "https://10.96.0.20:443",
            "10.96.0.20:443/wait",
        ] {
            assert_eq!(address(bad).unwrap_err(), format!("--address must be IPv4:PORT or [IPv6]:PORT with a port in 1..=65535, not {bad:?}"), "{bad:?}");
        }
        let mut a = v(MIN);
        a.extend(v(&["--address", "10.96.0.20:443", "--address=10.96.0.21:443"]));
        assert_eq!(parse_wait(&a).unwrap_err(), "--address given twice");
        let mut a = v(MIN);
        a.push("--address".into());
        assert_eq!(parse_wait(&a).unwrap_err(), "--address needs a value");
    }
}
