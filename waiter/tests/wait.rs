//! `wait` as the kubelet runs it: the built binary against a scripted HTTPS server on
//! 127.0.0.1 (tests/common), with small seconds.

mod common;

use std::time::Duration;

use common::{Dir, INVALID_HOST, NOT_LEADER_BODY, Reply, Server, closed_port, pki, run_wait, token};
use serde_json::json;

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[test]
fn waiting_waiting_removed_ends_after_the_margin_well_before_the_fallback() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::State("Waiting", None), Reply::State("Waiting", None), Reply::State("Removed", Some(0.2))], Reply::Hold);
    let dir = Dir::new("removed", &pki.ca_pem, Some("6\n"));
    let run = run_wait(&dir.0, &server.url(), 9, 20, &[]);
    assert!(run.status.success(), "{run:?}", run = run.stderr);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.stderr.trim_end().ends_with("(fallback 6 s)"), "{}", run.stderr);
    // two quick Waiting answers paced 0.25 s each, then the margin of 0.2 s
    assert!(run.elapsed >= secs(0.7), "{:?}", run.elapsed);
    assert!(run.elapsed < secs(3.0), "{:?}", run.elapsed);

    let gets = server.gets();
    assert_eq!(gets.len(), 3);
    for g in &gets {
        assert_eq!(g.target, "/wait/v1?timeoutSeconds=10&policy=web");
        // the token file's content (trimmed), as a bearer token
        assert_eq!(g.authorization.as_deref(), Some(format!("Bearer {}", token("removed")).as_str()));
    }
    // one connection, kept alive (so the NotLeader test's new connections mean something)
    assert!(gets.iter().all(|g| g.conn == gets[0].conn), "{gets:?}");

    let reports = server.reports();
    assert_eq!(reports.len(), 1);
    let r = &reports[0];
    assert_eq!((&r["outcome"], &r["fallbackSeconds"], &r["reason"]), (&json!("Removed"), &json!(6), &json!("")));
    let waited = r["waitedSeconds"].as_f64().unwrap();
    assert!((0.7..3.0).contains(&waited), "{r}");
    let posts: Vec<_> = server.requests().into_iter().filter(|q| q.method == "POST").collect();
    assert_eq!(posts[0].authorization.as_deref(), Some(format!("Bearer {}", token("removed")).as_str()));
}

#[test]
fn server_down_waits_exactly_the_fallback_from_the_file() {
    let pki = pki();
    let dir = Dir::new("down", &pki.ca_pem, Some(" 2 \n"));
    let run = run_wait(&dir.0, &format!("https://localhost:{}/wait/v1", closed_port()), 5, 30, &[]);
    assert!(run.status.success());
    assert_eq!(run.outcome(), "Fallback", "{}", run.stderr);
    assert!(run.stderr.contains("(fallback 2 s): "), "{}", run.stderr);
    assert!(run.elapsed >= secs(2.0) && run.elapsed < secs(3.5), "{:?}", run.elapsed);
}

#[test]
fn no_policy_file_or_a_bad_one_falls_back_to_n() {
    let pki = pki();
    let url = format!("https://localhost:{}/wait/v1", closed_port());
    for (name, file) in [("nofile", None), ("badfile", Some("1.5")), ("bigfile", Some("4000"))] {
        let dir = Dir::new(name, &pki.ca_pem, file);
        let run = run_wait(&dir.0, &url, 1, 30, &[]);
        assert_eq!(run.outcome(), "Fallback", "{}", run.stderr);
        assert!(run.stderr.contains("(fallback 1 s)"), "{name}: {}", run.stderr);
        assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{name}: {:?}", run.elapsed);
    }
}

#[test]
fn wrong_ca_is_a_fallback_and_nothing_is_sent() {
    // another CA of the same name: the issuer matches, its signature does not
    let (pki, other) = (pki(), pki());
    let server = Server::start(&pki, vec![], Reply::State("Removed", None));
    let dir = Dir::new("wrongca", &other.ca_pem, Some("1"));
    let run = run_wait(&dir.0, &server.url(), 4, 30, &[]);
    assert_eq!(run.outcome(), "Fallback", "{}", run.stderr);
    assert!(run.stderr.contains("(fallback 1 s): ") && run.stderr.contains("invalid peer certificate"), "{}", run.stderr);
    assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{:?}", run.elapsed);
    assert!(server.requests().is_empty());
}

#[test]
fn http_500_is_a_fallback_and_is_reported() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::Raw(500, b"oops".to_vec())], Reply::State("Removed", None));
    let dir = Dir::new("http500", &pki.ca_pem, Some("1"));
    let run = run_wait(&dir.0, &server.url(), 4, 30, &[]);
    assert_eq!(run.stderr.lines().last().unwrap(), "safe-termination-wait: Fallback after 1.0 s (fallback 1 s): HTTP status 500");
    assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{:?}", run.elapsed);
    assert_eq!(server.gets().len(), 1);
    let reports = server.reports();
    assert_eq!(reports.len(), 1);
    assert_eq!((&reports[0]["outcome"], &reports[0]["fallbackSeconds"], &reports[0]["reason"]), (&json!("Fallback"), &json!(1), &json!("HTTP status 500")));
    assert_eq!(reports[0]["waitedSeconds"], json!(1.0));
}

#[test]
fn bad_json_and_a_huge_body_are_fallbacks() {
    let pki = pki();
    for (name, body, reason) in [
        ("badjson", b"{\"state\": ".to_vec(), "bad JSON: EOF while parsing a value"),
        ("hugebody", vec![b' '; 1 << 20], "body larger than 65536 bytes"),
        ("unknown", br#"{"state":"Unknown","detail":"node-b has no agent"}"#.to_vec(), "state Unknown: node-b has no agent"),
    ] {
        let server = Server::start(&pki, vec![Reply::Raw(200, body)], Reply::State("Removed", None));
        let dir = Dir::new(name, &pki.ca_pem, Some("1"));
        let run = run_wait(&dir.0, &server.url(), 4, 30, &[]);
        assert_eq!(run.outcome(), "Fallback", "{name}: {}", run.stderr);
        assert!(run.stderr.contains(&format!("(fallback 1 s): {reason}")), "{name}: {}", run.stderr);
        assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{name}: {:?}", run.elapsed);
    }
}

#[test]
fn a_deadline_shorter_than_the_fallback_ends_at_the_deadline() {
    let pki = pki();
    // the server holds every request for its timeoutSeconds, then answers Waiting
    let server = Server::start(&pki, vec![], Reply::Hold);
    let dir = Dir::new("deadline", &pki.ca_pem, Some("5"));
    let run = run_wait(&dir.0, &server.url(), 5, 2, &[]);
    assert_eq!(run.outcome(), "Deadline", "{}", run.stderr);
    assert!(run.stderr.trim_end().ends_with("(fallback 2 s)"), "{}", run.stderr);
    assert!(run.elapsed >= secs(2.0) && run.elapsed < secs(2.7), "{:?}", run.elapsed);
    assert_eq!(server.gets()[0].target, "/wait/v1?timeoutSeconds=2&policy=web");
    let reports = server.reports();
    assert_eq!(reports.len(), 1);
    assert_eq!((&reports[0]["outcome"], &reports[0]["fallbackSeconds"]), (&json!("Deadline"), &json!(2)));
}

#[test]
fn poll_seconds_bound_each_long_poll() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::Hold, Reply::State("LastEndpoint", None)], Reply::Hold);
    let dir = Dir::new("poll", &pki.ca_pem, Some("9"));
    let run = run_wait(&dir.0, &server.url(), 9, 30, &["--poll-seconds", "1"]);
    assert_eq!(run.outcome(), "LastEndpoint", "{}", run.stderr);
    assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{:?}", run.elapsed);
    let targets: Vec<String> = server.gets().into_iter().map(|g| g.target).collect();
    assert_eq!(targets, vec!["/wait/v1?timeoutSeconds=1&policy=web", "/wait/v1?timeoutSeconds=1&policy=web"]);
}

#[test]
fn last_endpoint_returns_at_once_and_is_reported() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::State("LastEndpoint", None)], Reply::Hold);
    let dir = Dir::new("last", &pki.ca_pem, Some("5"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "LastEndpoint", "{}", run.stderr);
    assert!(run.elapsed < secs(0.8), "{:?}", run.elapsed);
    let reports = server.reports();
    assert_eq!((&reports[0]["outcome"], &reports[0]["fallbackSeconds"]), (&json!("LastEndpoint"), &json!(5)));
    assert!(reports[0]["waitedSeconds"].as_f64().unwrap() < 0.8);
}

#[test]
fn not_leader_is_asked_again_on_a_new_connection() {
    let pki = pki();
    let script = vec![Reply::State("NotLeader", None), Reply::State("NotLeader", None), Reply::State("Removed", Some(0.0))];
    let server = Server::start(&pki, script, Reply::Hold);
    let dir = Dir::new("notleader", &pki.ca_pem, Some("5"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.elapsed < secs(1.0), "{:?}", run.elapsed);
    let conns: Vec<usize> = server.gets().iter().map(|g| g.conn).collect();
    assert_eq!(conns.len(), 3);
    assert!(conns[0] != conns[1] && conns[1] != conns[2] && conns[0] != conns[2], "{conns:?}");
}

#[test]
fn every_get_names_the_policy() {
    // the server adds the policy's extraSeconds to the margin: it is told which policy
    let pki = pki();
    let script = vec![Reply::State("Waiting", None), Reply::not_leader(), Reply::State("Removed", Some(0.0))];
    let server = Server::start(&pki, script, Reply::Hold);
    let dir = Dir::new("policyquery", &pki.ca_pem, None);
    std::fs::write(dir.0.join("web-2.prod.preStopSeconds"), "3").unwrap();
    let url = server.url();
    let args = ["wait", "--url", &url, "--policy", "web-2.prod", "--fallback-seconds", "7", "--deadline-seconds", "30", "--dir", dir.0.to_str().unwrap()];
    let run = common::run(&args);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    // the policy's file, not N: the same name
    assert!(run.stderr.trim_end().ends_with("(fallback 3 s)"), "{}", run.stderr);
    let gets = server.gets();
    assert_eq!(gets.len(), 3);
    for g in &gets {
        assert_eq!(g.target, "/wait/v1?timeoutSeconds=10&policy=web-2.prod");
        assert_eq!((g.query("timeoutSeconds"), g.query("policy")), (Some("10"), Some("web-2.prod")));
    }
    // the report's URL has no query
    assert_eq!(server.posts(1).iter().map(|p| p.target.as_str()).collect::<Vec<_>>(), ["/wait/v1/report"]);
}

#[test]
fn a_421_not_leader_is_asked_again_on_a_new_connection() {
    // the operator's replicas that do not lead answer HTTP 421 with {"state":"NotLeader"}
    let pki = pki();
    let script = vec![Reply::not_leader(), Reply::not_leader(), Reply::State("Removed", Some(0.0))];
    let server = Server::start(&pki, script, Reply::Hold);
    let dir = Dir::new("notleader421", &pki.ca_pem, Some("5"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.elapsed < secs(1.0), "{:?}", run.elapsed);
    let conns: Vec<usize> = server.gets().iter().map(|g| g.conn).collect();
    assert_eq!(conns.len(), 3);
    assert!(conns[0] != conns[1] && conns[1] != conns[2] && conns[0] != conns[2], "{conns:?}");

    // a 421 that does not say NotLeader is a doubt like any other status
    let server = Server::start(&pki, vec![Reply::Raw(421, b"Misdirected Request".to_vec())], Reply::State("Removed", None));
    let dir = Dir::new("misdirected", &pki.ca_pem, Some("1"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert!(run.stderr.ends_with("(fallback 1 s): HTTP status 421\n"), "{}", run.stderr);
    assert_eq!(server.gets().len(), 1);
}

#[test]
fn a_not_leader_report_is_sent_again_on_new_connections_until_the_leader_keeps_it() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::State("Removed", Some(0.0))], Reply::Hold);
    server.answer_reports(vec![Reply::not_leader(), Reply::not_leader()], Reply::Raw(204, Vec::new()));
    let dir = Dir::new("reportleader", &pki.ca_pem, Some("5"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.elapsed < secs(1.0), "{:?}", run.elapsed);

    let posts = server.posts(3);
    assert_eq!(posts.len(), 3, "{posts:?}");
    // three POSTs, each on a connection of its own (the Service balances each anew)
    let conns: Vec<usize> = posts.iter().map(|p| p.conn).collect();
    assert!(conns[0] != conns[1] && conns[1] != conns[2] && conns[0] != conns[2], "{conns:?}");
    // as many TLS connections as the requests came on: no other one was opened
    let mut all: Vec<usize> = server.requests().iter().map(|r| r.conn).collect();
    all.sort();
    all.dedup();
    assert_eq!(server.tls_connections(), all.len(), "{all:?}");
    assert!(server.tls_connections() >= 3);
    // the same report each time, with the token
    for p in &posts {
        assert_eq!(p.target, "/wait/v1/report");
        assert_eq!(p.body, posts[0].body);
        assert_eq!(p.authorization.as_deref(), Some(format!("Bearer {}", token("reportleader")).as_str()));
    }
    let report: serde_json::Value = serde_json::from_slice(&posts[0].body).unwrap();
    assert_eq!((&report["outcome"], &report["fallbackSeconds"], &report["reason"]), (&json!("Removed"), &json!(5), &json!("")));
    // nothing after the 204
    std::thread::sleep(secs(0.3));
    assert_eq!(server.posts(3).len(), 3);
}

#[test]
fn a_report_is_sent_eight_times_at_most() {
    let pki = pki();
    // a margin of 1 s: the hook lives as long as the report's bound
    let server = Server::start(&pki, vec![Reply::State("Removed", Some(1.0))], Reply::Hold);
    server.answer_reports(vec![], Reply::not_leader());
    let dir = Dir::new("report8", &pki.ca_pem, Some("5"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    std::thread::sleep(secs(0.3));
    let posts = server.posts(8);
    assert_eq!(posts.len(), 8, "{posts:?}");
    let mut conns: Vec<usize> = posts.iter().map(|p| p.conn).collect();
    conns.sort();
    conns.dedup();
    assert_eq!(conns.len(), 8, "{conns:?}");
    assert!(posts.iter().all(|p| p.body == posts[0].body));
}

#[test]
fn any_other_report_answer_ends_the_retries() {
    let pki = pki();
    for (name, answers, sent) in [
        ("report500", vec![Reply::not_leader(), Reply::Raw(500, b"oops".to_vec())], 2),
        ("report421", vec![Reply::Raw(421, br#"{"state":"Unknown"}"#.to_vec())], 1),
        ("report200", vec![Reply::Raw(200, NOT_LEADER_BODY.to_vec())], 1),
        ("reportclose", vec![Reply::not_leader(), Reply::Close], 2),
    ] {
        let server = Server::start(&pki, vec![Reply::State("Removed", Some(1.0))], Reply::Hold);
        server.answer_reports(answers, Reply::not_leader());
        let dir = Dir::new(name, &pki.ca_pem, Some("5"));
        let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
        assert_eq!(run.outcome(), "Removed", "{name}: {}", run.stderr);
        std::thread::sleep(secs(0.3));
        assert_eq!(server.posts(sent).len(), sent, "{name}");
    }
}

#[test]
fn the_report_retries_end_within_a_second_of_the_decision() {
    let pki = pki();
    // a margin of 3 s: the hook outlives the report's bound; each NotLeader takes 0.3 s
    let server = Server::start(&pki, vec![Reply::State("Removed", Some(3.0))], Reply::Hold);
    server.answer_reports(vec![], Reply::Slow(secs(0.3), Box::new(Reply::not_leader())));
    let dir = Dir::new("reportbound", &pki.ca_pem, Some("9"));
    let run = run_wait(&dir.0, &server.url(), 9, 30, &[]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.elapsed >= secs(3.0) && run.elapsed < secs(4.0), "{:?}", run.elapsed);
    let decided = server.gets()[0].at;
    let posts = server.posts(1);
    // POSTs started at about 0, 0.3, 0.6 and 0.9 s: none after 1 s
    assert!((2..=4).contains(&posts.len()), "{posts:?}");
    for p in &posts {
        assert!(p.at.duration_since(decided) < secs(1.15), "{:?}", p.at.duration_since(decided));
    }
}

#[test]
fn report_retries_do_not_keep_the_hook_past_the_wait_and_0_3_s() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::State("LastEndpoint", None)], Reply::Hold);
    server.answer_reports(vec![], Reply::Slow(secs(0.2), Box::new(Reply::not_leader())));
    let dir = Dir::new("reportgrace", &pki.ca_pem, Some("5"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "LastEndpoint", "{}", run.stderr);
    assert!(run.elapsed < secs(0.8), "{:?}", run.elapsed);
    // the first POST and perhaps a second, cut when the process ended
    assert!((1..=2).contains(&server.posts(1).len()));
}

#[test]
fn not_leader_nine_times_in_a_row_is_a_fallback() {
    let pki = pki();
    let server = Server::start(&pki, vec![], Reply::State("NotLeader", None));
    let dir = Dir::new("notleader9", &pki.ca_pem, Some("1"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert!(run.stderr.ends_with("(fallback 1 s): NotLeader 9 times in a row\n"), "{}", run.stderr);
    assert_eq!(server.gets().len(), 9);
}

#[test]
fn a_closed_connection_is_a_fallback() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::Close], Reply::State("Removed", None));
    let dir = Dir::new("closed", &pki.ca_pem, Some("1"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Fallback", "{}", run.stderr);
    assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{:?}", run.elapsed);
}

#[test]
fn a_missing_token_or_ca_is_a_fallback_without_a_request() {
    let pki = pki();
    let server = Server::start(&pki, vec![], Reply::State("Removed", None));
    for (name, remove, reason) in [("notoken", "token", "token: missing"), ("noca", "ca.crt", "ca.crt: missing; ca-admission.crt: missing")] {
        let dir = Dir::new(name, &pki.ca_pem, Some("1"));
        std::fs::remove_file(dir.0.join(remove)).unwrap();
        let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
        assert!(run.stderr.ends_with(&format!("(fallback 1 s): {reason}\n")), "{}", run.stderr);
        assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{:?}", run.elapsed);
    }
    let dir = Dir::new("badca", "not a certificate", Some("1"));
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert!(run.stderr.ends_with("(fallback 1 s): ca.crt: no usable certificate; ca-admission.crt: missing\n"), "{}", run.stderr);
    assert!(server.requests().is_empty());
}

#[test]
fn address_reaches_a_host_that_does_not_resolve_and_keeps_its_name() {
    let pki = pki();
    // NotLeader: the new connection (a new agent) goes to the address as well
    let script = vec![Reply::State("NotLeader", None), Reply::State("Waiting", None), Reply::State("Removed", Some(0.0))];
    let server = Server::start(&pki, script, Reply::Hold);
    let dir = Dir::new("address", &pki.ca_pem, Some("5"));
    let address = format!("127.0.0.1:{}", server.port);
    let run = run_wait(&dir.0, &server.invalid_url(), 5, 30, &["--address", &address]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.stderr.trim_end().ends_with("(fallback 5 s)"), "{}", run.stderr);
    assert!(run.elapsed < secs(2.0), "{:?}", run.elapsed);
    let reports = server.reports();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0]["outcome"], json!("Removed"));

    // every request (the GETs and the report) came with the URL's name as SNI and Host
    let requests = server.requests();
    assert_eq!(requests.iter().map(|r| r.method.as_str()).collect::<Vec<_>>(), ["GET", "GET", "GET", "POST"]);
    let host = format!("{INVALID_HOST}:{}", server.port);
    for r in &requests {
        assert_eq!(r.sni.as_deref(), Some(INVALID_HOST), "{r:?}");
        assert_eq!(r.host.as_deref(), Some(host.as_str()), "{r:?}");
    }
    assert_ne!(requests[0].conn, requests[1].conn, "{requests:?}");
}

#[test]
fn without_address_a_host_that_does_not_resolve_is_a_fallback() {
    let pki = pki();
    let server = Server::start(&pki, vec![], Reply::State("Removed", None));
    let dir = Dir::new("noaddress", &pki.ca_pem, Some("1"));
    let run = run_wait(&dir.0, &server.invalid_url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Fallback", "{}", run.stderr);
    // getaddrinfo's error ("io: failed to lookup address information: ..."), or ureq's when no address came back
    assert!(run.stderr.contains("(fallback 1 s): ") && (run.stderr.contains("lookup") || run.stderr.contains("host not found")), "{}", run.stderr);
    assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(3.0), "{:?}", run.elapsed);
    assert!(server.requests().is_empty());
}

#[test]
fn address_still_verifies_the_certificate_against_the_urls_host() {
    let pki = pki();
    let server = Server::start(&pki, vec![], Reply::State("Removed", None));
    let dir = Dir::new("addressname", &pki.ca_pem, Some("1"));
    let address = format!("127.0.0.1:{}", server.port);
    // the right server, the right CA, a name its certificate does not hold
    let url = format!("https://other.example.invalid:{}/wait/v1", server.port);
    let run = run_wait(&dir.0, &url, 5, 30, &["--address", &address]);
    assert_eq!(run.outcome(), "Fallback", "{}", run.stderr);
    assert!(run.stderr.contains("(fallback 1 s): ") && run.stderr.contains("invalid peer certificate"), "{}", run.stderr);
    assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{:?}", run.elapsed);
    assert!(server.requests().is_empty());
}

#[test]
fn address_in_ipv6() {
    let pki = pki();
    let Ok(server) = Server::start_on(&pki, "[::1]:0", vec![Reply::State("Removed", Some(0.0))], Reply::Hold) else {
        eprintln!("skipped: cannot listen on [::1] here");
        return;
    };
    let dir = Dir::new("address6", &pki.ca_pem, Some("5"));
    let address = format!("[::1]:{}", server.port);
    let run = run_wait(&dir.0, &server.invalid_url(), 5, 30, &["--address", &address]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.elapsed < secs(1.0), "{:?}", run.elapsed);
    let gets = server.gets();
    assert_eq!((gets.len(), gets[0].sni.as_deref()), (1, Some(INVALID_HOST)));
    assert_eq!(server.reports().len(), 1);
}

#[test]
fn only_ca_admission_crt_is_enough() {
    // a namespace of the cluster's default policy: no ConfigMap, so no ca.crt
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::State("Removed", Some(0.0))], Reply::Hold);
    let dir = Dir::new("admissiononly", &pki.ca_pem, Some("5"));
    std::fs::remove_file(dir.0.join("ca.crt")).unwrap();
    std::fs::write(dir.0.join("ca-admission.crt"), &pki.ca_pem).unwrap();
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.elapsed < secs(1.0), "{:?}", run.elapsed);
    assert_eq!(server.gets().len(), 1);
}

#[test]
fn an_empty_ca_crt_turns_to_ca_admission_crt() {
    let pki = pki();
    let server = Server::start(&pki, vec![Reply::State("Removed", Some(0.0))], Reply::Hold);
    let dir = Dir::new("emptyca", "", Some("5"));
    std::fs::write(dir.0.join("ca-admission.crt"), &pki.ca_pem).unwrap();
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Removed", "{}", run.stderr);
    assert!(run.elapsed < secs(1.0), "{:?}", run.elapsed);
    assert_eq!(server.gets().len(), 1);
}

#[test]
fn a_ca_crt_with_a_certificate_is_used_even_when_ca_admission_crt_is_there() {
    // ca.crt is the current CA (the ConfigMap follows rotation): it wins, right or wrong
    let (pki, other) = (pki(), pki());
    let server = Server::start(&pki, vec![], Reply::State("Removed", None));
    let dir = Dir::new("caprecedence", &other.ca_pem, Some("1"));
    std::fs::write(dir.0.join("ca-admission.crt"), &pki.ca_pem).unwrap();
    let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
    assert_eq!(run.outcome(), "Fallback", "{}", run.stderr);
    assert!(run.stderr.contains("invalid peer certificate"), "{}", run.stderr);
    assert!(server.requests().is_empty());
}

#[test]
fn neither_ca_file_is_a_fallback_naming_both() {
    let pki = pki();
    let server = Server::start(&pki, vec![], Reply::State("Removed", None));
    // the downward API's empty file for an absent annotation, and no or an empty ConfigMap key
    for (name, ca, reason) in [
        ("neither-missing", None, "ca.crt: missing; ca-admission.crt: empty"),
        ("neither-empty", Some("\n"), "ca.crt: empty; ca-admission.crt: empty"),
        ("neither-bad", Some("not a certificate"), "ca.crt: no usable certificate; ca-admission.crt: empty"),
    ] {
        let dir = Dir::new(name, ca.unwrap_or(""), Some("1"));
        if ca.is_none() {
            std::fs::remove_file(dir.0.join("ca.crt")).unwrap();
        }
        std::fs::write(dir.0.join("ca-admission.crt"), "").unwrap();
        let run = run_wait(&dir.0, &server.url(), 5, 30, &[]);
        assert!(run.stderr.ends_with(&format!("safe-termination-wait: Fallback after 1.0 s (fallback 1 s): {reason}\n")), "{name}: {}", run.stderr);
        assert!(run.elapsed >= secs(1.0) && run.elapsed < secs(2.5), "{name}: {:?}", run.elapsed);
    }
    assert!(server.requests().is_empty());
}

#[test]
fn a_usage_error_sleeps_ten_seconds_and_exits_2() {
    let run = common::run(&["wait", "--url", "http://op/wait/v1", "--policy", "web", "--fallback-seconds", "5", "--deadline-seconds", "30"]);
    assert_eq!(run.status.code(), Some(2));
    assert!(run.stderr.starts_with("error: --url must start with https://"), "{}", run.stderr);
    assert!(run.stderr.contains("usage:") && run.stderr.contains("must not\nturn into no wait at all"), "{}", run.stderr);
    assert!(run.elapsed >= secs(10.0) && run.elapsed < secs(11.5), "{:?}", run.elapsed);
}
