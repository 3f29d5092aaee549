//! The protobuf exposition reader on real kube-proxy 1.37.2 captures (tests/data/metrics, the
//! same scrape saved as text and as protobuf, node-a iptables-nft, node-b nftables) and on
//! bodies built here with the wire messages: equality with the text reader, the native parts
//! as read, and every error case of the module docs; the fast path for the families not read
//! (checked without being built) against the full prost decode of every family.
//!
//! Tests whose name ends in `_needs_native_add` sum the `ip_family` series with
//! `NativeHistogram::add`, which the native-maths work provides: until it is merged they fail
//! with `unimplemented`.

use proptest::prelude::*;
use prost::Message;
use safe_termination::core::exposition::format::{ACCEPT_PROTOBUF_FIRST, ACCEPT_TEXT, Format, PROTOBUF_CONTENT_TYPE, accepts_protobuf};
use safe_termination::core::exposition::protobuf::wire::{self, Bucket, BucketSpan, LabelPair, Metric, MetricFamily, MetricType, Value};
use safe_termination::core::exposition::protobuf::{
    decode_kube_proxy_protobuf, decode_kube_proxy_protobuf_full, family_name, filter_kube_proxy_protobuf, messages,
};
use safe_termination::core::exposition::{
    HistogramFamily, KubeProxyScrape, ScrapeError, parse_kube_proxy_metrics, parse_kube_proxy_protobuf, parse_scrape, parse_scrape_as, read_families,
};

const A_PB: &[u8] = include_bytes!("data/metrics/kube-proxy-v1.37.2-idle-node-a.pb");
const A_TXT: &str = include_str!("data/metrics/kube-proxy-v1.37.2-idle-node-a.txt");
const B_PB: &[u8] = include_bytes!("data/metrics/kube-proxy-v1.37.2-idle-node-b.pb");
const B_TXT: &str = include_str!("data/metrics/kube-proxy-v1.37.2-idle-node-b.txt");
const CAPTURES: [(&str, &[u8], &str); 2] = [("node-a", A_PB, A_TXT), ("node-b", B_PB, B_TXT)];
/// kube-proxy 1.37.2's answer to a protobuf Accept, as captured.
const KUBE_PROXY_CONTENT_TYPE: &str = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited; escaping=underscores";

const SYNC: &str = "kubeproxy_sync_proxy_rules_duration_seconds";

fn classic_families(s: &KubeProxyScrape) -> [(&'static str, Option<&safe_termination::core::exposition::Histogram>); 4] {
    [
        ("sync", s.sync.as_ref()),
        ("sync_full", s.sync_full.as_ref()),
        ("sync_partial", s.sync_partial.as_ref()),
        ("network_programming", s.network_programming.as_ref()),
    ]
}

#[test]
fn both_captures_decode_to_the_text_captures_scrape() {
    let mut compared = 0;
    for (node, pb, txt) in CAPTURES {
        let text = parse_kube_proxy_metrics(txt).unwrap();
        let decoded = decode_kube_proxy_protobuf(pb).unwrap_or_else(|e| panic!("{node}: {e}"));
        // every field: classic buckets and sums, timestamps, counters, version (natives are
        // kept apart in `decoded`, and the text has none)
        assert_eq!(decoded.scrape, text, "{node}");
        for ((name, p), (_, t)) in classic_families(&decoded.scrape).into_iter().zip(classic_families(&text)) {
            let (Some(p), Some(t)) = (p, t) else {
                assert_eq!(p.is_some(), t.is_some(), "{node} {name}");
                continue;
            };
            let (qp, qt) = (p.quantile(0.99), t.quantile(0.99));
            assert_eq!(qp.seconds.to_bits(), qt.seconds.to_bits(), "{node} {name}: classic p99 {} vs {}", qp.seconds, qt.seconds);
            assert_eq!(qp.samples, qt.samples, "{node} {name}");
            compared += 1;
        }
        assert_eq!(decoded.scrape.kubernetes_version.as_deref(), Some("v1.37.2"));
        assert!(decoded.scrape.last_sync_timestamp_seconds.is_some() && decoded.scrape.last_queued_timestamp_seconds.is_some(), "{node}");
    }
    // sync, full and partial on each node (no network-programming sample yet on these idle nodes)
    assert_eq!(compared, 6, "classic families compared");
}

/// The two `ip_family` series of the sync histogram, as read: schema 3, the zero threshold
/// 2^-128, and buckets that hold the series' observations (each sum lies between the lower and
/// upper bounds of its buckets, which only a right decoding of zigzag offsets and gaps gives).
#[test]
fn per_ip_family_native_parts_of_the_sync_histogram_are_as_read() {
    let mut checked = 0;
    for (node, pb, txt) in CAPTURES {
        let decoded = decode_kube_proxy_protobuf(pb).unwrap();
        for fam in [HistogramFamily::Sync, HistogramFamily::SyncFull, HistogramFamily::SyncPartial] {
            let series = decoded.native_series(fam);
            let classic = match fam {
                HistogramFamily::Sync => decoded.scrape.sync.as_ref(),
                HistogramFamily::SyncFull => decoded.scrape.sync_full.as_ref(),
                _ => decoded.scrape.sync_partial.as_ref(),
            };
            let Some(classic) = classic else {
                assert!(series.is_empty(), "{node} {fam:?}");
                continue;
            };
            // the series the text capture has for the family
            let prefix = format!("{}_count{{", fam.name());
            let in_text: Vec<&str> = txt.lines().filter_map(|l| l.strip_prefix(prefix.as_str())?.split_once('}').map(|(labels, _)| labels)).collect();
            let keys: Vec<&str> = series.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, in_text, "{node} {fam:?}");
            checked += keys.len();
            let mut native_count = 0.0;
            for (key, h) in series {
                assert_eq!(h.schema(), 3, "{node} {fam:?} {key}");
                assert_eq!(h.zero_threshold(), 2f64.powi(-128), "{node} {fam:?} {key}");
                assert!(h.negative().is_empty());
                let in_buckets: f64 = h.zero_count() + h.positive().iter().map(|b| b.1).sum::<f64>();
                assert_eq!(in_buckets, h.count(), "{node} {fam:?} {key}: every observation in a bucket");
                let base = 2f64.powf(2f64.powi(-3));
                let lower: f64 = h.positive().iter().map(|&(i, c)| c * base.powi(i - 1)).sum();
                let upper: f64 = h.zero_count() * h.zero_threshold() + h.positive().iter().map(|&(i, c)| c * base.powi(i)).sum::<f64>();
                assert!(lower < h.sum() && h.sum() <= upper, "{node} {fam:?} {key}: sum {} outside its buckets ({lower}, {upper}]", h.sum());
                native_count += h.count();
            }
            assert_eq!(native_count, classic.count(), "{node} {fam:?}: native and classic count the same syncs");
        }
    }
    assert_eq!(checked, 10, "series checked: sync 2, full 2, partial 1, on each node");
    // node-a's sync series as the capture holds them: IPv4 buckets -37 and -21 (a span, a gap
    // of 15, a span), one sync each; IPv6 one sync in bucket -21
    let a = decode_kube_proxy_protobuf(A_PB).unwrap();
    let sync = a.native_series(HistogramFamily::Sync);
    assert_eq!(sync[0].1.positive(), &[(-37, 1.0), (-21, 1.0)]);
    assert_eq!(sync[1].1.positive(), &[(-21, 1.0)]);
    assert_eq!((sync[0].1.count(), sync[0].1.zero_count(), sync[0].1.sum()), (2.0, 0.0, 0.195694925));
}

#[test]
fn the_sync_native_is_the_sum_of_the_ip_family_series_needs_native_add() {
    for (node, pb, txt) in CAPTURES {
        let scrape = parse_kube_proxy_protobuf(pb).unwrap();
        let native = scrape.sync_native.as_ref().unwrap_or_else(|| panic!("{node}: no sync_native"));
        let text = parse_kube_proxy_metrics(txt).unwrap();
        assert_eq!(native.count(), text.sync.as_ref().unwrap().count(), "{node}");
        assert_eq!(native.schema(), 3);
        assert_eq!(parse_scrape(pb, Some(KUBE_PROXY_CONTENT_TYPE)).unwrap(), scrape, "{node}");
    }
}

// --- the families not read: checked, not built ---

/// The same result as the full decode, family by family and whole, on both captures (the
/// 1.37.2 captures of /work/shared/cases/metrics are these files, byte for byte).
#[test]
fn the_fast_path_decodes_the_captures_as_the_full_decode() {
    for (node, pb, txt) in CAPTURES {
        let fast = decode_kube_proxy_protobuf(pb).unwrap();
        assert_eq!(fast, decode_kube_proxy_protobuf_full(pb).unwrap(), "{node}");
        assert_eq!(fast.scrape, parse_kube_proxy_metrics(txt).unwrap(), "{node}");
        let (mut unread, mut read) = (0, 0);
        for m in messages(pb).map(Result::unwrap) {
            let name = family_name(m.message).unwrap();
            // each message alone, as a body of one family
            assert_eq!(decode_kube_proxy_protobuf(m.raw), decode_kube_proxy_protobuf_full(m.raw), "{node} {name}");
            if read_families().any(|f| f == name) { read += 1 } else { unread += 1 }
        }
        assert!(unread > 150 && read >= 4, "{node}: {unread} families not read, {read} read");
    }
}

/// A garbled family the reader does not interpret is **rejected**, as the full decode rejects
/// it (the text reader rejects a garbled line of any family alike): the same message ordinal,
/// offset, family and prost error text. Well-formed variants prost accepts are accepted: unknown
/// fields (an exemplar), repeated fields packed, an empty family.
#[test]
fn a_garbled_family_not_read_is_rejected_as_the_full_decode_rejects_it() {
    let good = sync_body(classic(&[(0.5, 1)], 2, 1.0));
    let unread = |tail: &[u8]| {
        let mut m =
            MetricFamily { name: Some("rest_client_requests_total".into()), r#type: Some(MetricType::Counter as i32), ..Default::default() }.encode_to_vec();
        m.extend_from_slice(tail);
        let mut b = good.clone();
        prost::encoding::encode_varint(m.len() as u64, &mut b);
        b.extend_from_slice(&m);
        b
    };
    let metric = |inner: &[u8]| [&[0x22, inner.len() as u8][..], inner].concat();
    let histogram = |inner: &[u8]| metric(&[&[0x3a, inner.len() as u8][..], inner].concat());
    let rejected: [(&str, Vec<u8>, &str); 8] = [
        ("a label name not UTF-8", metric(&[0x0a, 0x03, 0x0a, 0x01, 0xff]), "invalid string value"),
        ("a metric cut inside (declares 5, 2 there)", vec![0x22, 0x05, 0x0a, 0x00], "buffer underflow"),
        ("a counter value of 4 bytes (a double is 8)", metric(&[0x1a, 0x05, 0x09, 1, 2, 3, 4]), "buffer underflow"),
        ("the type as a string", vec![0x1a, 0x01, 0x00], "invalid wire type"),
        ("a bucket bound as a varint", histogram(&[0x1a, 0x02, 0x10, 0x01]), "invalid wire type"),
        ("packed doubles not a multiple of 8", histogram(&[0x5a, 0x03, 1, 2, 3]), ""),
        ("a key of field 0", metric(&[0x00, 0x00]), "invalid tag"),
        ("an end group without a start (field 15)", vec![0x7c], "unexpected end group tag"),
    ];
    for (what, tail, why) in rejected {
        let b = unread(&tail);
        let (fast, full) = (decode_kube_proxy_protobuf(&b).unwrap_err(), decode_kube_proxy_protobuf_full(&b).unwrap_err());
        assert_eq!(fast, full, "{what}");
        assert_eq!((fast.message_index, fast.family.as_str()), (2, "rest_client_requests_total"), "{what}");
        assert!(
            fast.message.starts_with("not a valid MetricFamily message: failed to decode Protobuf message: ") && fast.message.contains(why),
            "{what}: {fast}"
        );
    }
    let accepted: [(&str, Vec<u8>); 5] = [
        ("an exemplar (counter field 2, not in the wire structs)", metric(&[0x1a, 0x0b, 0x09, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f, 0x12, 0x00])),
        ("packed deltas and counts", histogram(&[0x6a, 0x03, 0x02, 0x04, 0x01, 0x72, 0x08, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f])),
        ("an unknown group", vec![0x7b, 0x08, 0x01, 0x7c]),
        ("a second name", vec![0x0a, 0x03, b'g', b'o', b'_']),
        ("nothing more", vec![]),
    ];
    for (what, tail) in accepted {
        let b = unread(&tail);
        assert_eq!(decode_kube_proxy_protobuf(&b), decode_kube_proxy_protobuf_full(&b), "{what}");
        assert!(decode_kube_proxy_protobuf(&b).is_ok(), "{what}: {:?}", decode_kube_proxy_protobuf(&b));
    }
}

// --- the filter and the dispatcher ---

#[test]
fn the_filter_keeps_the_read_families_byte_for_byte_and_decodes_the_same() {
    for (node, pb, _) in CAPTURES {
        let filtered = filter_kube_proxy_protobuf(pb);
        assert!(filtered.len() * 5 < pb.len(), "{node}: {} of {} bytes kept", filtered.len(), pb.len());
        let kept: Vec<String> = messages(&filtered).map(|m| family_name(m.unwrap().message).unwrap()).collect();
        assert!(kept.iter().all(|n| read_families().any(|f| f == n)), "{node}: {kept:?}");
        assert!(kept.iter().any(|n| n == SYNC) && kept.iter().any(|n| n == "kubernetes_build_info"), "{node}: {kept:?}");
        // each kept message is a slice of the body, unchanged
        for m in messages(&filtered) {
            let raw = m.unwrap().raw;
            assert!(pb.windows(raw.len()).any(|w| w == raw), "{node}");
        }
        assert_eq!(decode_kube_proxy_protobuf(&filtered).unwrap(), decode_kube_proxy_protobuf(pb).unwrap(), "{node}");
    }
    assert!(filter_kube_proxy_protobuf(b"").is_empty());
}

#[test]
fn content_types_accept_headers_and_saved_files_choose_the_format() {
    assert_eq!(Format::from_content_type(Some(KUBE_PROXY_CONTENT_TYPE)).unwrap(), Format::Protobuf);
    assert_eq!(Format::from_content_type(Some(PROTOBUF_CONTENT_TYPE)).unwrap(), Format::Protobuf);
    assert_eq!(
        Format::from_content_type(Some("Application/Vnd.Google.Protobuf;proto=\"io.prometheus.client.MetricFamily\";ENCODING=delimited")).unwrap(),
        Format::Protobuf
    );
    for text in [None, Some("text/plain; version=0.0.4; charset=utf-8"), Some("application/openmetrics-text; version=1.0.0"), Some("")] {
        assert_eq!(Format::from_content_type(text).unwrap(), Format::Text, "{text:?}");
    }
    let other = Format::from_content_type(Some("application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=text")).unwrap_err();
    assert!(other.to_string().contains("encoding=text") && other.to_string().contains("delimited"), "{other}");
    // a text body read as text whatever else; protobuf only when the content type says so
    assert!(matches!(parse_scrape(A_PB, Some("text/plain; version=0.0.4")), Err(ScrapeError::NotUtf8(_))));
    assert_eq!(parse_scrape(A_TXT.as_bytes(), None).unwrap(), parse_kube_proxy_metrics(A_TXT).unwrap());

    assert!(accepts_protobuf(Some(ACCEPT_PROTOBUF_FIRST)));
    assert!(!accepts_protobuf(Some(ACCEPT_TEXT)));
    assert!(!accepts_protobuf(Some("*/*")) && !accepts_protobuf(None));
    assert!(!accepts_protobuf(Some("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;q=0,text/plain")));

    assert_eq!(Format::detect(A_PB), Format::Protobuf);
    assert_eq!(Format::detect(B_PB), Format::Protobuf);
    assert_eq!(Format::detect(&filter_kube_proxy_protobuf(A_PB)), Format::Protobuf);
    // a file cut inside its first message is still protobuf (its reader then says it was cut)
    let first = messages(A_PB).next().unwrap().unwrap();
    let name_end = 1 + first.raw.len() - first.message.len() + 1 + family_name(first.message).unwrap().len();
    assert_eq!(Format::detect(&A_PB[..name_end]), Format::Protobuf);
    assert_eq!(Format::detect(&A_PB[..name_end - 1]), Format::Text, "the name cut: nothing to tell it by");
    assert!(
        matches!(parse_scrape_as(&A_PB[..first.raw.len() - 1], Format::detect(&A_PB[..first.raw.len() - 1])), Err(ScrapeError::Protobuf(e)) if e.message.contains("cut off"))
    );
    for dir in std::fs::read_dir("tests/data/metrics").unwrap() {
        let path = dir.unwrap().path();
        if path.extension().is_some_and(|e| e == "txt") {
            assert_eq!(Format::detect(&std::fs::read(&path).unwrap()), Format::Text, "{}", path.display());
        }
    }
    for text in [&b""[..], b"\n", b"# HELP x y\n", b"  go_goroutines 3\n", b"_x 1\n", b":x 1\n", b"\xef\xbb\xbf# BOM\n", b"\x0a\x0ax 1\n"] {
        assert_eq!(Format::detect(text), Format::Text, "{text:?}");
    }
}

// --- bodies built here ---

fn label(name: &str, value: &str) -> LabelPair {
    LabelPair { name: Some(name.into()), value: Some(value.into()) }
}

fn bucket(le: f64, count: u64) -> Bucket {
    Bucket { cumulative_count: Some(count), cumulative_count_float: None, upper_bound: Some(le) }
}

fn span(offset: i32, length: u32) -> BucketSpan {
    BucketSpan { offset: Some(offset), length: Some(length) }
}

/// A classic histogram with `buckets` (le, cumulative count), `count` observations summing to `sum`.
fn classic(buckets: &[(f64, u64)], count: u64, sum: f64) -> wire::Histogram {
    wire::Histogram { sample_count: Some(count), sample_sum: Some(sum), bucket: buckets.iter().map(|&(le, c)| bucket(le, c)).collect(), ..Default::default() }
}

/// A native histogram of schema 3 and kube-proxy's zero threshold, one positive span.
fn native(offset: i32, deltas: &[i64], count: u64, sum: f64) -> wire::Histogram {
    wire::Histogram {
        sample_count: Some(count),
        sample_sum: Some(sum),
        schema: Some(3),
        zero_threshold: Some(2f64.powi(-128)),
        zero_count: Some(0),
        positive_span: vec![span(offset, deltas.len() as u32)],
        positive_delta: deltas.to_vec(),
        ..Default::default()
    }
}

fn series(labels: &[(&str, &str)], h: wire::Histogram) -> Metric {
    Metric { label: labels.iter().map(|(n, v)| label(n, v)).collect(), histogram: Some(h), ..Default::default() }
}

fn family(name: &str, ty: MetricType, metric: Vec<Metric>) -> MetricFamily {
    MetricFamily { name: Some(name.into()), help: Some("help".into()), r#type: Some(ty as i32), metric, unit: None }
}

fn body(families: &[MetricFamily]) -> Vec<u8> {
    families.iter().flat_map(|f| f.encode_length_delimited_to_vec()).collect()
}

fn sync_body(h: wire::Histogram) -> Vec<u8> {
    body(&[family(SYNC, MetricType::Histogram, vec![series(&[("ip_family", "IPv4")], h)])])
}

/// The error for `body`, as `(message ordinal, family, message)`.
fn err(body: &[u8]) -> (usize, String, String) {
    let e = decode_kube_proxy_protobuf(body).unwrap_err();
    (e.message_index, e.family, e.message)
}

#[test]
fn framing_errors_name_the_message_and_offset() {
    let good = sync_body(classic(&[(0.5, 1)], 2, 1.0));
    // a length prefix larger than the body: refused before anything is allocated
    let mut long = vec![0xe8, 0x07]; // 1000
    long.extend_from_slice(&[0x0a, 0x01, b'x']);
    let e = decode_kube_proxy_protobuf(&long).unwrap_err();
    assert_eq!((e.message_index, e.offset), (1, 0));
    assert!(e.message.contains("declares 1000 bytes but only 3 remain"), "{e}");
    let huge = [good.clone(), vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]].concat();
    let e = decode_kube_proxy_protobuf(&huge).unwrap_err();
    assert_eq!((e.message_index, e.offset), (2, good.len()));
    assert!(e.message.contains(&format!("declares {} bytes", u64::MAX)), "{e}");
    for (bad, why) in [
        (&[0xff; 11][..], "longer than 10 bytes"),
        (&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..], "beyond 64 bits"),
        (&[0x80][..], "ends inside a length prefix"),
    ] {
        assert!(err(bad).2.contains(why), "{bad:?}: {:?}", err(bad));
    }
    // garbage inside a well-framed message, and a family without a name
    let (_, _, m) = err(&[0x03, 0x0a, 0x05, b'a']);
    assert!(m.contains("not a valid MetricFamily message"), "{m}");
    assert!(err(&[0x00]).2.contains("without a name"));
    assert!(err(&[0x02, 0x1a, 0x00]).2.contains("not a valid MetricFamily"), "{:?}", err(&[0x02, 0x1a, 0x00]));
    // a garbled metric of a known family is named: a metric field declaring 5 bytes, 2 there
    let mut message = MetricFamily { name: Some(SYNC.into()), ..Default::default() }.encode_to_vec();
    message.extend_from_slice(&[0x22, 0x05, 0x0a, 0x00]);
    let garbled = [vec![message.len() as u8], message].concat();
    let (index, family, message) = err(&[good.clone(), garbled].concat());
    assert_eq!((index, family.as_str()), (2, SYNC));
    assert!(message.starts_with("not a valid MetricFamily message: ") && message.contains("Metric"), "{message}");
    // the display form
    let e = decode_kube_proxy_protobuf(&long).unwrap_err();
    assert_eq!(e.at("n.pb"), "n.pb: protobuf message 1 at byte 0: the message declares 1000 bytes but only 3 remain: the scrape was cut off");
}

#[test]
fn a_capture_cut_at_every_byte_is_an_error_unless_cut_between_messages() {
    let mut tried = 0;
    for (node, pb, _) in CAPTURES {
        let boundaries: Vec<usize> = messages(pb).map(|m| m.unwrap()).map(|m| m.offset + m.raw.len()).collect();
        for n in 0..pb.len() {
            let got = decode_kube_proxy_protobuf(&pb[..n]);
            if n == 0 || boundaries.contains(&n) {
                assert!(got.is_ok(), "{node} cut at {n}, a message boundary: {:?}", got.err());
            } else {
                let e = got.expect_err("a cut inside a message");
                assert!(e.message.contains("cut off"), "{node} cut at {n}: {e}");
            }
            tried += 1;
        }
    }
    assert_eq!(tried, A_PB.len() + B_PB.len());
}

/// Each message of node-a's capture cut at every byte with its length prefix made to fit: the
/// message decoder itself on truncated input (an error or a smaller family, never a panic).
#[test]
fn every_message_cut_inside_with_a_fitting_prefix_never_panics() {
    let mut tried = 0;
    for m in messages(A_PB).map(Result::unwrap).filter(|m| family_name(m.message).is_some_and(|n| n.starts_with("kubeproxy_") || n == "kubernetes_build_info"))
    {
        for n in 0..m.message.len() {
            let mut cut = Vec::new();
            prost::encoding::encode_varint(n as u64, &mut cut);
            cut.extend_from_slice(&m.message[..n]);
            let _ = decode_kube_proxy_protobuf(&cut);
            tried += 1;
        }
    }
    assert!(tried > 4000, "{tried}");
}

#[test]
fn impossible_classic_buckets_are_errors_naming_the_family() {
    let cases: Vec<(wire::Histogram, &str)> = vec![
        (classic(&[(0.5, 3), (1.0, 2)], 3, 1.0), "bucket le=\"1\" counts 2 but le=\"0.5\" counts 3"),
        (classic(&[(0.5, 3)], 2, 1.0), "counts 2 (the sample count)"),
        (classic(&[(f64::NAN, 3)], 3, 1.0), "upper bound NaN"),
        (classic(&[(-1.0, 0)], 3, 1.0), "negative upper bound -1"),
        (classic(&[(f64::NEG_INFINITY, 0)], 3, 1.0), "-Inf"),
        (classic(&[(0.5, 1), (0.5, 1)], 3, 1.0), "le=\"0.5\" appears twice"),
        (
            wire::Histogram { bucket: vec![Bucket { cumulative_count: Some(1), cumulative_count_float: None, upper_bound: None }], ..classic(&[], 1, 1.0) },
            "bucket 1 has no upper_bound",
        ),
        (
            wire::Histogram {
                bucket: vec![Bucket { cumulative_count: None, cumulative_count_float: Some(f64::NAN), upper_bound: Some(1.0) }],
                ..classic(&[], 1, 1.0)
            },
            "cumulative_count_float is NaN",
        ),
        (wire::Histogram { sample_count_float: Some(-2.0), ..classic(&[], 1, 1.0) }, "sample_count_float is -2"),
        // with an explicit +Inf bucket the sample count is not used, and is still checked
        (
            wire::Histogram { sample_count_float: Some(f64::NAN), ..classic(&[(0.5, 1), (f64::INFINITY, 1)], 1, 1.0) },
            "sample_count_float is NaN: a count is a finite number >= 0",
        ),
        (wire::Histogram { sample_count_float: Some(f64::NEG_INFINITY), ..classic(&[(f64::INFINITY, 1)], 1, 1.0) }, "sample_count_float is -inf"),
        (wire::Histogram { zero_count_float: Some(f64::NAN), ..classic(&[(0.5, 1)], 1, 1.0) }, "zero_count_float is NaN"),
    ];
    for (h, want) in cases {
        let (index, family, message) = err(&sync_body(h));
        assert_eq!((index, family.as_str()), (1, SYNC));
        assert!(message.contains(want) && message.contains("(series {ip_family=\"IPv4\"})"), "want {want:?} in {message:?}");
    }
    // the same histograms in a family we do not read: decoded, not interpreted (R12)
    let unrelated =
        body(&[family("rest_client_request_duration_seconds", MetricType::Histogram, vec![series(&[], classic(&[(f64::NAN, 3), (-1.0, 9)], 1, 1.0))])]);
    assert_eq!(decode_kube_proxy_protobuf(&unrelated).unwrap().scrape, KubeProxyScrape::default());
}

#[test]
fn impossible_native_parts_are_errors_naming_the_family() {
    let with = |f: &dyn Fn(&mut wire::Histogram)| {
        let mut h = native(-30, &[1, 1], 3, 0.1);
        f(&mut h);
        h
    };
    let cases: Vec<(wire::Histogram, &str)> = vec![
        (with(&|h| h.schema = Some(9)), "schema 9 is not an exponential schema"),
        (with(&|h| h.schema = Some(-53)), "schema -53 is not an exponential schema"),
        (with(&|h| h.positive_delta = vec![1]), "positive spans cover 2 buckets but 1 counts were given"),
        (with(&|h| h.positive_delta = vec![2, -3]), "positive delta 2 brings the bucket count to -1"),
        (with(&|h| h.positive_delta = vec![i64::MAX, 1]), "positive delta 2 overflows"),
        (with(&|h| h.positive_span = vec![span(-30, 1), span(-2, 1)]), "positive span 1 has a negative offset -2"),
        (with(&|h| h.sample_count = Some(2)), "count 2 is below the 3 observations"),
        (with(&|h| h.zero_threshold = Some(f64::NAN)), "zero threshold NaN"),
        (with(&|h| h.negative_span = vec![span(0, 1)]), "negative spans cover 1 buckets but 0 counts"),
        (with(&|h| h.positive_count = vec![1.0, f64::INFINITY]), "positive bucket -29 has count inf"),
        // a duration is never negative, nor longer than 1e6 s (a bucket index that overflows the
        // schema's range reads as an infinite bound): these were read as a p99 of -0.918 s, and
        // as no data at all
        (
            with(&|h| {
                h.negative_span = vec![span(0, 1)];
                h.negative_delta = vec![3];
                h.positive_span = vec![];
                h.positive_delta = vec![];
            }),
            "its negative buckets hold 3 observations: a duration is never below 0",
        ),
        (
            with(&|h| h.positive_span = vec![span(i32::MAX - 5, 2)]),
            "a bucket holding observations has an infinite upper bound (its index overflows the schema's range)",
        ),
        // bucket 201 at schema 3: (2^(200/8), 2^(201/8)] s
        (with(&|h| h.positive_span = vec![span(200, 2)]), "the upper bound of the highest bucket holding observations is 3.659136756119057e7 s, above 1e6 s"),
        (with(&|h| h.zero_threshold = Some(1e300)), "the zero threshold is 1e300 s, above 1e6 s (11.6 days)"),
    ];
    // an integer native histogram whose float counts are NaN: NaN is not "above 0", so the
    // integer counts would be read and the NaN skipped; it is refused instead
    for (h, want) in [
        (with(&|h| h.sample_count_float = Some(f64::NAN)), "sample_count_float is NaN: a count is a finite number >= 0"),
        (with(&|h| h.zero_count_float = Some(-1.0)), "zero_count_float is -1: a count is a finite number >= 0"),
    ] {
        let (index, family, message) = err(&sync_body(h));
        assert_eq!((index, family.as_str()), (1, SYNC));
        assert_eq!(message, format!("{want} (series {{ip_family=\"IPv4\"}})"));
    }
    for (h, want) in cases {
        let (index, family, message) = err(&sync_body(h));
        assert_eq!((index, family.as_str()), (1, SYNC));
        assert!(message.contains(want) && message.contains("native histogram (series {ip_family=\"IPv4\"})"), "want {want:?} in {message:?}");
    }
}

#[test]
fn native_or_classic_is_decided_as_prometheus_does() {
    let one = |h: wire::Histogram| decode_kube_proxy_protobuf(&sync_body(h)).unwrap();
    // classic only: no spans, zero threshold 0, zero count 0 (schema alone does not make one)
    let d = one(wire::Histogram { schema: Some(3), ..classic(&[(0.5, 1)], 2, 1.0) });
    assert!(d.native_series(HistogramFamily::Sync).is_empty());
    assert_eq!(d.scrape.sync.as_ref().unwrap().count(), 2.0, "the +Inf bucket from sample_count");
    // a no-op span makes an empty histogram native
    let d = one(wire::Histogram { positive_span: vec![span(0, 0)], schema: Some(3), ..classic(&[(0.5, 0)], 0, 0.0) });
    assert_eq!(d.native_series(HistogramFamily::Sync)[0].1.count(), 0.0);
    // a zero count alone too; schema absent reads 0
    let d = one(wire::Histogram { zero_count: Some(2), ..classic(&[], 2, 0.0) });
    let (_, h) = &d.native_series(HistogramFamily::Sync)[0];
    assert_eq!((h.schema(), h.zero_count()), (0, 2.0));
    assert!(d.scrape.sync.is_none(), "a native histogram without classic buckets has no classic series");
    // float histograms: absolute counts
    let d = one(wire::Histogram {
        sample_count_float: Some(3.0),
        positive_span: vec![span(-30, 2)],
        positive_count: vec![1.0, 2.0],
        positive_delta: vec![],
        ..native(-30, &[], 0, 0.2)
    });
    let d_h = &d.native_series(HistogramFamily::Sync)[0].1;
    assert_eq!((d_h.positive(), d_h.count()), (&[(-30, 1.0), (-29, 2.0)][..], 3.0));
    // classic float counts override integer ones when above 0
    let d = one(wire::Histogram {
        bucket: vec![Bucket { cumulative_count: Some(9), cumulative_count_float: Some(1.5), upper_bound: Some(1.0) }],
        sample_count_float: Some(2.5),
        ..classic(&[], 9, 1.0)
    });
    let b: Vec<(f64, f64)> = d.scrape.sync.unwrap().buckets().iter().map(|b| (b.upper_bound_seconds, b.count)).collect();
    assert_eq!(b, [(1.0, 1.5), (f64::INFINITY, 2.5)]);
    // one classic-only series among native ones: the family has no native sum
    let mixed = body(&[family(
        SYNC,
        MetricType::Histogram,
        vec![series(&[("ip_family", "IPv4")], native(-30, &[1], 1, 0.1)), series(&[("ip_family", "IPv6")], classic(&[(0.5, 1)], 1, 0.1))],
    )]);
    assert!(decode_kube_proxy_protobuf(&mixed).unwrap().native_series(HistogramFamily::Sync).is_empty());
}

#[test]
fn series_families_and_scalars_follow_the_text_readers_rules() {
    // two ip_family series (in two messages) are summed per bound; the same series twice is an error
    let v4 = family(SYNC, MetricType::Histogram, vec![series(&[("ip_family", "IPv4")], classic(&[(0.5, 1), (1.0, 2)], 2, 0.75))]);
    let v6 = family(SYNC, MetricType::Histogram, vec![series(&[("ip_family", "IPv6")], classic(&[(0.5, 3), (1.0, 3)], 4, 2.0))]);
    let s = decode_kube_proxy_protobuf(&body(&[v4.clone(), v6])).unwrap().scrape;
    let b: Vec<(f64, f64)> = s.sync.as_ref().unwrap().buckets().iter().map(|b| (b.upper_bound_seconds, b.count)).collect();
    assert_eq!(b, [(0.5, 4.0), (1.0, 5.0), (f64::INFINITY, 6.0)]);
    assert_eq!(s.sync.unwrap().sum_seconds, Some(2.75));
    let (index, family_name, message) = err(&body(&[v4.clone(), v4]));
    assert_eq!((index, family_name.as_str()), (2, SYNC));
    assert!(message.contains("series {ip_family=\"IPv4\"} appears twice"), "{message}");
    // the legacy microsecond family is converted, and names sharing a prefix are not read
    let legacy = family("kubeproxy_sync_proxy_rules_latency_microseconds", MetricType::Histogram, vec![series(&[], classic(&[(1000.0, 1)], 1, 500.0))]);
    let lookalike = family("kubeproxy_sync_proxy_rules_duration_seconds_extra", MetricType::Histogram, vec![series(&[], classic(&[(f64::NAN, 1)], 1, 1.0))]);
    let s = decode_kube_proxy_protobuf(&body(&[legacy, lookalike])).unwrap().scrape;
    assert!(s.sync_from_legacy_microseconds);
    assert_eq!(s.sync.as_ref().unwrap().buckets()[0].upper_bound_seconds, 1000.0 * 1e-6);
    assert_eq!(s.sync.unwrap().sum_seconds, Some(500.0 * 1e-6));
    // scalars: the oldest last sync, the newest last queued, sums, the build's version
    let gauge = |name: &str, values: &[(&str, f64)]| {
        let metric = values
            .iter()
            .map(|(fam, v)| Metric { label: vec![label("ip_family", fam)], gauge: Some(Value { value: Some(*v) }), ..Default::default() })
            .collect();
        family(name, MetricType::Gauge, metric)
    };
    let counter = |name: &str, v: f64| {
        family(name, MetricType::Counter, vec![Metric { label: vec![label("table", "nat")], counter: Some(Value { value: Some(v) }), ..Default::default() }])
    };
    let build = family(
        "kubernetes_build_info",
        MetricType::Gauge,
        vec![Metric { label: vec![label("git_version", "v1.37.2")], gauge: Some(Value { value: Some(1.0) }), ..Default::default() }],
    );
    let s = decode_kube_proxy_protobuf(&body(&[
        gauge("kubeproxy_sync_proxy_rules_last_timestamp_seconds", &[("IPv4", 20.0), ("IPv6", 10.0)]),
        gauge("kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds", &[("IPv4", 30.0), ("IPv6", 40.0)]),
        gauge("kubeproxy_sync_proxy_rules_iptables_total", &[("IPv4", 5.0), ("IPv6", 7.0)]),
        counter("kubeproxy_sync_proxy_rules_endpoint_changes_total", f64::NAN),
        build,
    ]))
    .unwrap()
    .scrape;
    assert_eq!((s.last_sync_timestamp_seconds, s.last_queued_timestamp_seconds, s.iptables_rules_total), (Some(10.0), Some(40.0), Some(12.0)));
    assert!(s.endpoint_changes_total.unwrap().is_nan(), "NaN values are accepted, as in text");
    assert_eq!(s.kubernetes_version.as_deref(), Some("v1.37.2"));
    // a scalar family without its type's value, or of a histogram type, is an error naming it
    let no_value = family(
        "kubeproxy_sync_proxy_rules_endpoint_changes_total",
        MetricType::Counter,
        vec![Metric { gauge: Some(Value { value: Some(1.0) }), ..Default::default() }],
    );
    assert_eq!(err(&body(&[no_value])).2, "series 1 of a counter family has no counter value");
    let histogram_typed = family("kubeproxy_sync_proxy_rules_endpoint_changes_total", MetricType::Histogram, vec![]);
    assert!(err(&body(&[histogram_typed])).2.contains("is a histogram where a counter or gauge is read"));
    let no_histogram = family(SYNC, MetricType::Histogram, vec![Metric { gauge: Some(Value { value: Some(1.0) }), ..Default::default() }]);
    assert_eq!(err(&body(&[no_histogram])), (1, SYNC.to_string(), "series 1 has no histogram".to_string()));
}

#[test]
fn formats_keep_their_own_error_forms() {
    let e = parse_scrape_as(b"kubeproxy_sync_proxy_rules_duration_seconds_bucket{le=\"+Inf\"} -1\n", Format::Text).unwrap_err();
    assert_eq!(e.at("f.txt"), "f.txt:1: kubeproxy_sync_proxy_rules_duration_seconds: bucket le=\"+Inf\" has a negative count -1");
    let e = parse_scrape_as(&sync_body(classic(&[(f64::NAN, 1)], 1, 1.0)), Format::Protobuf).unwrap_err();
    assert_eq!(
        e.at("f.pb"),
        "f.pb: protobuf message 1 at byte 0: kubeproxy_sync_proxy_rules_duration_seconds: bucket 1 has the upper bound NaN (series {ip_family=\"IPv4\"})"
    );
    assert!(parse_scrape_as(b"\xff", Format::Text).unwrap_err().to_string().starts_with("not UTF-8 text: "));
}

// --- property tests ---

/// One classic series: (bound, cumulative count) per bucket, the sample count, the sum.
type Series = (Vec<(f64, u64)>, u64, f64);

/// A classic histogram series: sorted distinct bounds with non-decreasing counts.
fn classic_series() -> impl Strategy<Value = Series> {
    (prop::collection::btree_set(0u32..2000, 0..6), prop::collection::vec(0u64..5, 7), 0u32..10_000).prop_map(|(bounds, steps, sum)| {
        let mut c = 0;
        let buckets: Vec<(f64, u64)> = bounds
            .into_iter()
            .zip(&steps)
            .map(|(b, s)| {
                c += s;
                (f64::from(b) / 128.0, c)
            })
            .collect();
        (buckets, c + steps[6], f64::from(sum) / 1000.0)
    })
}

fn text_of(name: &str, series: &[(&str, &Series)]) -> String {
    let mut t = format!("# TYPE {name} histogram\n");
    for (fam, (buckets, count, sum)) in series {
        for (le, c) in buckets {
            t.push_str(&format!("{name}_bucket{{ip_family=\"{fam}\",le=\"{le:?}\"}} {c}\n"));
        }
        t.push_str(&format!(
            "{name}_bucket{{ip_family=\"{fam}\",le=\"+Inf\"}} {count}\n{name}_sum{{ip_family=\"{fam}\"}} {sum:?}\n{name}_count{{ip_family=\"{fam}\"}} {count}\n"
        ));
    }
    t
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// The same classic histograms as protobuf and as text read to the same scrape.
    #[test]
    fn protobuf_and_text_of_the_same_histograms_read_the_same(v4 in classic_series(), v6 in classic_series()) {
        let pb = body(&[family(SYNC, MetricType::Histogram, vec![
            series(&[("ip_family", "IPv4")], classic(&v4.0, v4.1, v4.2)),
            series(&[("ip_family", "IPv6")], classic(&v6.0, v6.1, v6.2)),
        ])]);
        let text = text_of(SYNC, &[("IPv4", &v4), ("IPv6", &v6)]);
        let from_pb = decode_kube_proxy_protobuf(&pb).map_err(|e| TestCaseError::fail(e.to_string()))?.scrape;
        let from_text = parse_kube_proxy_metrics(&text).map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert!(from_pb.sync.is_some());
        prop_assert_eq!(from_pb, from_text);
    }

    /// A capture with bytes changed, removed or inserted: decoded or refused, never a panic, and
    /// alike by the fast path and the full decode.
    #[test]
    fn mutated_captures_never_panic(
        which in 0usize..2,
        edits in prop::collection::vec((any::<prop::sample::Index>(), 0u8..3, any::<u8>()), 1..8),
        sync_only in any::<bool>(),
    ) {
        let pb = CAPTURES[which].1;
        let mut bytes = if sync_only {
            // the sync family's message alone, so that edits land in the histogram fields
            messages(pb).map(Result::unwrap).find(|m| family_name(m.message).as_deref() == Some(SYNC)).unwrap().raw.to_vec()
        } else {
            pb.to_vec()
        };
        for (at, kind, byte) in edits {
            if bytes.is_empty() { break; }
            let i = at.index(bytes.len());
            match kind {
                0 => bytes[i] = byte,
                1 => { bytes.remove(i); }
                _ => bytes.insert(i, byte),
            }
        }
        // the fast path answers as the full decode: the same scrape, or the same error
        prop_assert_eq!(decode_kube_proxy_protobuf(&bytes), decode_kube_proxy_protobuf_full(&bytes));
        let _ = filter_kube_proxy_protobuf(&bytes);
        let _ = Format::detect(&bytes);
    }
}
