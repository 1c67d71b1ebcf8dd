//! The egress policy of tool calls: which addresses a tenant's tool URL may reach.
//!
//! By default only public addresses: loopback, private (RFC 1918), shared (CGNAT), unique-local,
//! link-local (cloud metadata at 169.254.169.254 and fd00:ec2::254), multicast, unspecified,
//! documentation, benchmarking and reserved ranges are refused, also when written as an
//! IPv4-mapped, IPv4-compatible, NAT64 or 6to4 IPv6 address. The operator's allowlist
//! (`egress.allow`) opens what a deployment needs.
//!
//! Where it is enforced:
//! - on the URL (every request and every redirect hop): a literal IP host is judged with its
//!   port; a host name that the allowlist names is allowed only on the ports listed for it;
//! - on the addresses a host name resolves to, when the connection is made (so a name that
//!   resolves to a public address at submission and to 127.0.0.1 later, DNS rebinding, is
//!   refused): public addresses, and addresses in allowlisted ranges listed *without* a port.
//!   A range listed with a port is open to literal-IP URLs on that port only, since the
//!   resolver does not see the port; to reach an internal name on one port, list the name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use reqwest::Url;

/// What a tool call sees when the policy refuses its address: the same text whatever the
/// address or the network, so a tool URL cannot be used to map the internal network.
pub const DENIED_MESSAGE: &str =
    "egress_denied: the tool's address is not allowed by this deployment's egress policy";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Net { net: IpNet, port: Option<u16> },
    Host { name: String, port: Option<u16> },
}

/// The parsed `egress.allow` list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    allow: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{DENIED_MESSAGE}")]
pub struct EgressDenied;

impl EgressPolicy {
    /// Parses a comma-separated allowlist: CIDRs or IPs (`10.0.0.0/8`, `127.0.0.1`,
    /// `[::1]:8080`, `10.1.2.3/32:443`) and host names (`tools.internal`, `tools.internal:8443`).
    pub fn parse(list: &str) -> Result<EgressPolicy, String> {
        let mut allow = Vec::new();
        for raw in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            allow.push(parse_entry(raw).map_err(|e| format!("`{raw}`: {e}"))?);
        }
        Ok(EgressPolicy { allow })
    }

    /// Judges a URL before a request (and each redirect hop) is sent. A host name that the
    /// allowlist does not name passes here and is judged on its addresses when it resolves.
    pub fn check_url(&self, url: &Url) -> Result<(), EgressDenied> {
        let port = url.port_or_known_default().ok_or(EgressDenied)?;
        // The URL parser has already normalised every IPv4 spelling (2130706433, 0x7f.1) to
        // dotted form, and IPv6 literals keep their brackets.
        let host = url.host_str().ok_or(EgressDenied)?;
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            return self.check_ip(ip, Some(port));
        }
        let mut named = self.host_entries(host).peekable();
        if named.peek().is_none() {
            return Ok(()); // judged on its addresses when it resolves
        }
        if named.any(|p| p.is_none_or(|p| p == port)) {
            Ok(())
        } else {
            Err(EgressDenied)
        }
    }

    /// Whether a tool URL names, literally, an address the policy refuses: such a URL can never
    /// be called, so a submission carrying it is refused at once. Host names are judged only
    /// when they resolve, at call time.
    pub fn refuses_literal(&self, url: &str) -> bool {
        let Ok(url) = Url::parse(url) else {
            return false; // syntax is checked elsewhere
        };
        let literal = url.host_str().is_some_and(|h| {
            h.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
                .is_ok()
        });
        literal && self.check_url(&url).is_err()
    }

    /// Whether the allowlist itself opens this URL's address: a literal IP in a listed range
    /// (on the listed port, if one is), or a listed host name (likewise). Such an address is
    /// the operator's own network, where plain `http://` webhook URLs are accepted.
    pub fn lists(&self, url: &Url) -> bool {
        let (Some(port), Some(host)) = (url.port_or_known_default(), url.host_str()) else {
            return false;
        };
        if let Ok(ip) = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            let ip = canonical(ip);
            return self.allow.iter().any(|e| {
                matches!(e, Entry::Net { net, port: want }
                    if net.contains(&ip) && want.is_none_or(|w| w == port))
            });
        }
        self.host_entries(host).any(|p| p.is_none_or(|p| p == port))
    }

    /// Whether the allowlist names `host` (then its addresses are trusted). Only a URL whose
    /// port the entry allows gets this far (`check_url`).
    pub fn trusts_name(&self, host: &str) -> bool {
        self.host_entries(host).next().is_some()
    }

    /// An address a host name resolved to: public, or in a range listed without a port.
    pub fn allows_resolved(&self, ip: IpAddr) -> bool {
        self.check_ip(ip, None).is_ok()
    }

    /// An address with the port it will be reached on (`None`: unknown, at resolution).
    pub fn check_ip(&self, ip: IpAddr, port: Option<u16>) -> Result<(), EgressDenied> {
        let ip = canonical(ip);
        let listed = self.allow.iter().any(|e| match e {
            Entry::Net { net, port: want } => {
                net.contains(&ip) && want.is_none_or(|w| port == Some(w))
            }
            Entry::Host { .. } => false,
        });
        if listed || is_public(ip) {
            Ok(())
        } else {
            Err(EgressDenied)
        }
    }

    fn host_entries<'a>(&'a self, host: &'a str) -> impl Iterator<Item = Option<u16>> + 'a {
        let host = host.trim_end_matches('.');
        self.allow.iter().filter_map(move |e| match e {
            Entry::Host { name, port } if name.eq_ignore_ascii_case(host) => Some(*port),
            _ => None,
        })
    }
}

fn parse_entry(raw: &str) -> Result<Entry, String> {
    let parse_port = |p: &str| {
        p.parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("`{p}` is not a port"))
    };
    // [v6] or [v6]:port or [v6/len]:port
    if let Some(rest) = raw.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or("unclosed `[`")?;
        let port = match after {
            "" => None,
            p => Some(parse_port(
                p.strip_prefix(':').ok_or("expected `:port` after `]`")?,
            )?),
        };
        return Ok(Entry::Net {
            net: parse_net(inside)?,
            port,
        });
    }
    if let Ok(net) = parse_net(raw) {
        return Ok(Entry::Net { net, port: None });
    }
    let (host, port) = match raw.rsplit_once(':') {
        Some((h, p)) => (h, Some(parse_port(p)?)),
        None => (raw, None),
    };
    if let Ok(net) = parse_net(host) {
        return Ok(Entry::Net { net, port });
    }
    let valid = !host.is_empty()
        && host.len() <= 253
        && host
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if !valid {
        return Err("not an IP, a CIDR or a host name".into());
    }
    Ok(Entry::Host {
        name: host.to_ascii_lowercase(),
        port,
    })
}

fn parse_net(s: &str) -> Result<IpNet, String> {
    if let Ok(net) = s.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    s.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| format!("`{s}` is not an IP or a CIDR"))
}

/// The IPv4 address an IPv6 address stands for, where it embeds one (mapped, compatible,
/// NAT64, 6to4): a refusal of 127.0.0.1 must also refuse ::ffff:127.0.0.1.
fn canonical(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let s = v6.segments();
    let embedded = |hi: u16, lo: u16| {
        IpAddr::V4(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        ))
    };
    match s {
        // IPv4-compatible (deprecated), ::a.b.c.d (not :: or ::1).
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 => embedded(hi, lo),
        // NAT64 well-known prefix 64:ff9b::/96.
        [0x64, 0xff9b, 0, 0, 0, 0, hi, lo] => embedded(hi, lo),
        // 6to4 2002:a.b.c.d::/48.
        [0x2002, hi, lo, ..] => embedded(hi, lo),
        _ => ip,
    }
}

/// Whether an address is on the public internet.
pub fn is_public(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

/// The IPv4 ranges that are not public (network, prefix length).
const DENIED_V4: [(u32, u8); 15] = [
    (0x0000_0000, 8),  // 0.0.0.0/8 "this network", unspecified
    (0x0a00_0000, 8),  // 10/8 private
    (0x6440_0000, 10), // 100.64/10 shared address space (CGNAT)
    (0x7f00_0000, 8),  // 127/8 loopback
    (0xa9fe_0000, 16), // 169.254/16 link-local, cloud metadata
    (0xac10_0000, 12), // 172.16/12 private
    (0xc000_0000, 24), // 192.0.0/24 IETF protocol assignments
    (0xc000_0200, 24), // 192.0.2/24 documentation
    (0xc058_6300, 24), // 192.88.99/24 6to4 relay anycast (deprecated)
    (0xc0a8_0000, 16), // 192.168/16 private
    (0xc612_0000, 15), // 198.18/15 benchmarking
    (0xc633_6400, 24), // 198.51.100/24 documentation
    (0xcb00_7100, 24), // 203.0.113/24 documentation
    (0xe000_0000, 4),  // 224/4 multicast
    (0xf000_0000, 4),  // 240/4 reserved, and 255.255.255.255 broadcast
];

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let bits = u32::from(ip);
    !DENIED_V4
        .iter()
        .any(|&(net, len)| bits >> (32 - len) == net >> (32 - len))
}

/// The dotted IPv4 addresses `is_public` accepts, as a regex (each octet in decimal without
/// leading zeros, as URLs write them): what the OpenAPI document gives a URL's literal host
/// when `egress.allow` is empty, derived from the same ranges.
pub fn public_ipv4_pattern() -> String {
    format!("({})", allowed_below(0, 0))
}

/// The addresses whose first `octets` octets are those of `base` (the rest zero) that no
/// refused range covers, as the regex of their remaining octets.
fn allowed_below(base: u32, octets: u32) -> String {
    let shift = 24 - 8 * octets;
    let rest = |n: u32| "(\\.(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9]))".repeat(n as usize);
    let (mut parts, mut clean) = (Vec::new(), None::<(u32, u32)>);
    let flush = |clean: &mut Option<(u32, u32)>, parts: &mut Vec<String>| {
        if let Some((lo, hi)) = clean.take() {
            parts.push(format!("({}){}", octet_range(lo, hi), rest(3 - octets)));
        }
    };
    for v in 0..=255u32 {
        let block = base | v << shift;
        let bits = 8 * (octets + 1);
        let covered = DENIED_V4
            .iter()
            .any(|&(net, len)| u32::from(len) <= bits && block >> (32 - len) == net >> (32 - len));
        let inside = DENIED_V4
            .iter()
            .any(|&(net, len)| u32::from(len) > bits && net >> (32 - bits) == block >> (32 - bits));
        if covered || inside {
            flush(&mut clean, &mut parts);
            if !covered {
                parts.push(format!("{v}\\.({})", allowed_below(block, octets + 1)));
            }
        } else {
            clean = Some((clean.map_or(v, |(lo, _)| lo), v));
        }
    }
    flush(&mut clean, &mut parts);
    parts.join("|")
}

/// The decimal numbers `lo..=hi` (within 0..=255), without leading zeros, as a regex.
fn octet_range(lo: u32, hi: u32) -> String {
    let mut alternatives = Vec::new();
    for (from, to) in [(0, 9), (10, 99), (100, 255)] {
        let (a, b) = (lo.max(from), hi.min(to));
        if a <= b {
            alternatives.extend(same_length(&a.to_string(), &b.to_string()));
        }
    }
    alternatives.join("|")
}

/// The numbers from `lo` to `hi`, both of one length, digit by digit.
fn same_length(lo: &str, hi: &str) -> Vec<String> {
    let (l, h) = (lo.as_bytes()[0], hi.as_bytes()[0]);
    let class = |a: u8, b: u8| match a == b {
        true => (a as char).to_string(),
        false => format!("[{}-{}]", a as char, b as char),
    };
    if lo.len() == 1 {
        return vec![class(l, h)];
    }
    let (lo_rest, hi_rest) = (&lo[1..], &hi[1..]);
    let zeros = "0".repeat(lo_rest.len());
    let nines = "9".repeat(lo_rest.len());
    if l == h {
        return same_length(lo_rest, hi_rest)
            .into_iter()
            .map(|r| format!("{}{r}", l as char))
            .collect();
    }
    let mut out = Vec::new();
    let (mut first, mut last) = (l, h);
    if lo_rest != zeros {
        out.extend(
            same_length(lo_rest, &nines)
                .into_iter()
                .map(|r| format!("{}{r}", l as char)),
        );
        first += 1;
    }
    let tail = (hi_rest != nines).then(|| {
        last -= 1;
        same_length(&zeros, hi_rest)
            .into_iter()
            .map(|r| format!("{}{r}", h as char))
            .collect::<Vec<_>>()
    });
    if first <= last {
        out.push(format!("{}[0-9]{{{}}}", class(first, last), lo_rest.len()));
    }
    out.extend(tail.into_iter().flatten());
    out
}

fn is_public_v6(ip: Ipv6Addr) -> bool {
    const DENIED: [(u128, u8); 10] = [
        (0, 96),                      // ::/96 unspecified, loopback, compatible
        (0xffff_0000 << 32, 96),      // ::ffff:0:0/96 IPv4-translated (SIIT)
        (0x0064_ff9b_0001 << 80, 48), // 64:ff9b:1::/48 local-use NAT64
        (0x0100 << 112, 64),          // 100::/64 discard
        (0x2001_0000 << 96, 32),      // 2001::/32 Teredo
        (0x2001_0db8 << 96, 32),      // 2001:db8::/32 documentation
        (0xfc00 << 112, 7),           // fc00::/7 unique local (fd00:ec2::254)
        (0xfe80 << 112, 10),          // fe80::/10 link-local
        (0xfec0 << 112, 10),          // fec0::/10 site-local (deprecated)
        (0xff00 << 112, 8),           // ff00::/8 multicast
    ];
    let bits = u128::from(ip);
    !DENIED
        .iter()
        .any(|&(net, len)| bits >> (128 - len) == net >> (128 - len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Url {
        Url::parse(s).unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_in_every_spelling() {
        let p = EgressPolicy::default();
        for u in [
            "http://127.0.0.1:8080/",
            "http://2130706433:8080/",
            "http://0x7f.1/",
            "http://0.0.0.0:80/",
            "http://10.1.2.3/",
            "http://172.31.255.255/",
            "http://192.168.0.1/",
            "http://100.64.0.1/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::1]/",
            "http://[::]/",
            "http://[::ffff:127.0.0.1]/",
            "http://[::ffff:169.254.169.254]/",
            "http://[::ffff:0:a9fe:a9fe]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[2002:7f00:1::]/",
            "http://[fd00:ec2::254]/",
            "http://[fe80::1]/",
            "http://224.0.0.1/",
            "http://255.255.255.255/",
            "http://192.0.2.10/",
        ] {
            assert_eq!(p.check_url(&url(u)), Err(EgressDenied), "{u}");
        }
        for u in [
            "https://93.184.215.14/",
            "https://[2606:4700::1111]/",
            "https://example.com/",
        ] {
            assert_eq!(p.check_url(&url(u)), Ok(()), "{u}");
        }
        assert!(!p.allows_resolved("127.0.0.1".parse().unwrap()));
        assert!(p.allows_resolved("8.8.8.8".parse().unwrap()));
    }

    #[test]
    fn the_allowlist_opens_ranges_names_and_ports() {
        let p =
            EgressPolicy::parse("127.0.0.1:9000, 10.0.0.0/8, tools.internal:8443, [::1]").unwrap();
        assert_eq!(p.check_url(&url("http://127.0.0.1:9000/x")), Ok(()));
        assert_eq!(
            p.check_url(&url("http://127.0.0.1:9001/x")),
            Err(EgressDenied),
            "another port of an allowlisted address"
        );
        assert_eq!(p.check_url(&url("http://10.9.8.7:22/")), Ok(()));
        assert_eq!(p.check_url(&url("http://[::1]:5432/")), Ok(()));
        assert_eq!(p.check_url(&url("https://tools.internal:8443/")), Ok(()));
        assert_eq!(
            p.check_url(&url("http://tools.internal:22/")),
            Err(EgressDenied),
            "a listed name on another port"
        );
        assert!(p.trusts_name("TOOLS.internal."));
        assert!(!p.trusts_name("other.internal"));
        assert!(p.allows_resolved("10.1.1.1".parse().unwrap()));
        assert!(
            !p.allows_resolved("127.0.0.1".parse().unwrap()),
            "a range listed with a port is not open to names resolving into it"
        );
    }

    #[test]
    fn literal_refusals_are_known_at_submission() {
        let p = EgressPolicy::parse("127.0.0.1:9000").unwrap();
        assert!(p.refuses_literal("http://127.0.0.1:8080/"));
        assert!(p.refuses_literal("http://[::ffff:10.0.0.1]/"));
        assert!(!p.refuses_literal("http://127.0.0.1:9000/"));
        assert!(
            !p.refuses_literal("http://localhost:8080/"),
            "names are judged when resolved"
        );
        assert!(!p.refuses_literal("https://8.8.8.8/"));
    }

    #[test]
    fn listed_addresses_are_known_as_such() {
        let p = EgressPolicy::parse("127.0.0.1:9000, 10.0.0.0/8, hooks.internal").unwrap();
        assert!(p.lists(&url("http://127.0.0.1:9000/h")));
        assert!(!p.lists(&url("http://127.0.0.1:9001/h")));
        assert!(p.lists(&url("http://10.2.3.4/h")));
        assert!(p.lists(&url("http://hooks.internal:8080/h")));
        assert!(!p.lists(&url("http://example.com/h")), "public, not listed");
        assert!(!p.lists(&url("http://8.8.8.8/h")));
    }

    #[test]
    fn bad_entries_are_named() {
        assert!(EgressPolicy::parse("").unwrap().allow.is_empty());
        let e = EgressPolicy::parse("10.0.0.0/8, bad host").unwrap_err();
        assert!(e.contains("`bad host`"), "{e}");
        assert!(EgressPolicy::parse("host:0").is_err());
        assert!(EgressPolicy::parse("[::1").is_err());
    }
}
