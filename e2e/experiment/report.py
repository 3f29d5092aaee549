#!/usr/bin/env python3
"""Report on the rolling-deploy connection-error experiment.

Usage: python3 e2e/experiment/report.py OUTDIR

Reads OUTDIR/runs/<run>/{meta.json, load-<node>.csv, deletions.csv,
groundtruth.csv} for every run and writes

  OUTDIR/results.json  machine-readable numbers per run, with each deleted
                       pod's window per node (`pods`)
  OUTDIR/results.md    the tables (also printed on stdout)
  OUTDIR/results.svg   one timeline panel per run and each pod's windows
                       against its sleep (hand-written SVG)

The ground truth (groundtruth.csv, written by tests/e2e_deploy.rs): per
deleted pod and node, removed_at_unix is the end of the first successful read
of the node's rules that no longer showed the pod's IP, last_present_at_unix
the start of the last successful read that still did (the removal happened in
between); both empty when no successful read saw the IP go, a failed
measurement. A pod's window on a node is removed_at_unix minus its
deleted_at_unix (seconds), the conservative end of that bound.

The last line on stdout is the absolute path of results.json.
Missing files: the run is reported with what exists, with a warning on
stderr. A malformed line or file: an error naming the file and line on
stderr, exit status 2. Python 3.11 standard library only.
"""

import bisect
import csv
import json
import math
import os
import re
import sys
import time
from xml.sax.saxutils import escape

PROG = "report.py"
OUTCOMES = ("ok", "refused", "reset", "timeout", "unreachable", "empty", "bad_answer")
LOAD_COLUMNS = ("t_unix_seconds", "latency_ms", "outcome", "pod", "detail")
# the connection's source port (0: not sent); absent in runs before it was recorded
LOAD_OPTIONAL = ("local_port", "reused")
# the causes of a failed request (classify_failures), in report order
CAUSES = ("race", "pinned", "liveSynDropped", "keepAlive", "other", "notSent", "notRace", "unattributed")
DELETION_COLUMNS = ("pod", "ip", "node", "deleted_at_unix")
# the pod's preStop sleep and terminationGracePeriodSeconds (seconds; empty: none)
DELETION_OPTIONAL = ("sleep_seconds", "grace_seconds", "endpoint_terminating_at_unix")
GROUNDTRUTH_COLUMNS = ("pod", "ip", "proxy_node", "removed_at_unix")
# the last successful read that still showed the IP; `poll` or `monitor`
GROUNDTRUTH_OPTIONAL = ("last_present_at_unix", "reader")
HISTOGRAM_KINDS = ("native", "classic")
BIN_SECONDS = 0.1


class Malformed(Exception):
    """Input that cannot be trusted: reported as 'FILE line N: why', exit 2."""

    def __init__(self, path, line, why):
        where = f"{path} line {line}" if line else str(path)
        super().__init__(f"{where}: {why}")


def warn(msg):
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


# ---------------------------------------------------------------- reading


def read_csv(path, columns, optional=()):
    """Rows of a CSV file as (line number, {column: text}).

    The header must name every column in `columns` (extra columns are
    allowed); every row must have as many fields as the header. Columns in
    `optional` are read when the header has them (absent: ""). Blank lines
    are skipped. Returns None if the file is empty (not even a header)."""
    rows = []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f, strict=True)
            try:
                header = next(reader, None)
                if header is None:
                    return None
                header = [h.strip() for h in header]
                missing = [c for c in columns if c not in header]
                if missing:
                    raise Malformed(path, 1, f"header {','.join(header)!r} lacks column(s) {', '.join(missing)} "
                                    f"(expected {','.join(columns)})")
                index = {c: header.index(c) for c in tuple(columns) + tuple(optional) if c in header}
                for fields in reader:
                    line = reader.line_num
                    if not fields or (len(fields) == 1 and fields[0].strip() == ""):
                        continue
                    if len(fields) != len(header):
                        raise Malformed(path, line, f"{len(fields)} fields, the header has {len(header)}")
                    row = {c: "" for c in optional}
                    row.update({c: fields[i] for c, i in index.items()})
                    rows.append((line, row))
            except csv.Error as e:
                raise Malformed(path, reader.line_num, f"CSV syntax: {e}") from None
    except UnicodeDecodeError as e:
        raise Malformed(path, None, f"not UTF-8 text: {e}") from None
    return rows


def parse_float(path, line, column, text, allow_empty=False):
    text = text.strip()
    if text == "" and allow_empty:
        return None
    try:
        value = float(text)
    except ValueError:
        raise Malformed(path, line, f"{column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise Malformed(path, line, f"{column} {text!r} is not a finite number")
    return value


def is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_meta(path, dirname):
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as e:
        raise Malformed(path, None, f"not UTF-8 text: {e}") from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as e:
        raise Malformed(path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(meta, dict):
        raise Malformed(path, 1, "must be a JSON object")

    def check(key, ok, what):
        if key in meta and meta[key] is not None and not ok(meta[key]):
            raise Malformed(path, None, f"{key} must be {what}, got {json.dumps(meta[key])}")

    check("name", lambda v: isinstance(v, str) and v != "", "a non-empty string")
    check("order", is_number, "a number")
    check("protected", lambda v: isinstance(v, bool), "true or false")
    check("proxyModes", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")
    check("extraServices", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
          "a non-negative integer")
    for key in ("replicas", "ratePerNodePerSecond", "timeoutMs", "startedAtUnix", "finishedAtUnix",
                "injectedSleepSeconds", "terminationGracePeriodSeconds", "measuredWindowSeconds"):
        check(key, is_number, "a number or null")
    check("rollouts", lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v), "a list of objects")
    check("histogramKind", lambda v: v in HISTOGRAM_KINDS, "native, classic or null")
    for key in ("failedReads", "ruleReads"):
        check(key, lambda v: isinstance(v, dict) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                         for n in v.values()), "an object of node -> count")
    for i, r in enumerate(meta.get("rollouts") or []):
        for key in ("startedAtUnix", "finishedAtUnix"):
            if r.get(key) is not None and not is_number(r[key]):
                raise Malformed(path, None, f"rollouts[{i}].{key} must be a number or null, got {json.dumps(r[key])}")
    return meta


# ---------------------------------------------------------------- statistics


def percentile(values, q):
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def r3(v):
    return None if v is None else round(v + 0.0, 3)


def whole(v):
    """An integral float as an int (seconds the API takes in whole numbers)."""
    return int(v) if v is not None and v == int(v) else v


def r6(v):
    return None if v is None else round(v + 0.0, 6)


def summary(values):
    if not values:
        return {"min": None, "p50": None, "max": None}
    return {"min": r3(min(values)), "p50": r3(percentile(values, 0.5)), "max": r3(max(values))}


# ---------------------------------------------------------------- one run


def load_run(rundir):
    """Everything known about one run: the meta, the raw events, the numbers."""
    dirname = os.path.basename(rundir.rstrip("/"))
    warnings = []

    def w(msg):
        warnings.append(msg)

    meta_path = os.path.join(rundir, "meta.json")
    meta = read_meta(meta_path, dirname)
    if meta is None:
        w("no meta.json: run settings unknown")
        meta = {}
    name = meta.get("name") or dirname

    # Load: one file per node.
    requests = []  # (t, outcome, node)
    failed_requests = []  # dicts: t, outcome, node, latencySeconds, port
    load_files = sorted(f for f in os.listdir(rundir) if f.startswith("load-") and f.endswith(".csv"))
    nodes = []
    per_node_rate = 0.0
    rate_known = False
    for fname in load_files:
        node = fname[len("load-"):-len(".csv")]
        path = os.path.join(rundir, fname)
        rows = read_csv(path, LOAD_COLUMNS, LOAD_OPTIONAL)
        if rows is None:
            w(f"{fname} is empty (no header)")
            continue
        nodes.append(node)
        ts = []
        for line, row in rows:
            t = parse_float(path, line, "t_unix_seconds", row["t_unix_seconds"])
            latency_ms = parse_float(path, line, "latency_ms", row["latency_ms"], allow_empty=True)
            outcome = row["outcome"].strip()
            if outcome not in OUTCOMES:
                raise Malformed(path, line, f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
            requests.append((t, outcome, node))
            if outcome != "ok":
                port = (row.get("local_port") or "").strip()
                if port and not (port.isdigit() and int(port) <= 65535):
                    raise Malformed(path, line, f"local_port {port!r} is not a port number")
                reused = (row.get("reused") or "0").strip()
                if reused not in ("0", "1"):
                    raise Malformed(path, line, f"reused {reused!r} is not 0 or 1")
                failed_requests.append({"t": t, "outcome": outcome, "node": node,
                                        "latencySeconds": (latency_ms or 0.0) / 1000.0,
                                        "port": int(port) if port else None, "reused": reused == "1",
                                        # local_port 0: never sent (st-testapp load: it waited past
                                        # the timeout for a worker, the client overloaded)
                                        "notSent": port == "0"})
            ts.append(t)
        if len(ts) >= 2 and max(ts) > min(ts):
            per_node_rate += (len(ts) - 1) / (max(ts) - min(ts))
            rate_known = True
    if not load_files:
        w("no load-<node>.csv: no requests")
    requests.sort()

    # Deletions.
    deletions = {}  # pod -> (ip, node, t)
    pod_info = {}  # pod -> {"sleep": seconds or None, "grace": seconds or None}
    path = os.path.join(rundir, "deletions.csv")
    if os.path.exists(path):
        rows = read_csv(path, DELETION_COLUMNS, DELETION_OPTIONAL)
        if rows is None:
            w("deletions.csv is empty (no header)")
            rows = []
        for line, row in rows:
            pod = row["pod"].strip()
            if not pod:
                raise Malformed(path, line, "pod is empty")
            t = parse_float(path, line, "deleted_at_unix", row["deleted_at_unix"])
            if pod in deletions:
                w(f"deletions.csv line {line}: pod {pod} listed again; the earlier deletion time is kept")
                if t >= deletions[pod][2]:
                    continue
            deletions[pod] = (row["ip"].strip(), row["node"].strip(), t)
            pod_info[pod] = {k: whole(parse_float(path, line, c, row[c], allow_empty=True))
                             for k, c in (("sleep", "sleep_seconds"), ("grace", "grace_seconds"))}
            # when the test's EndpointSlice watch saw the endpoint terminating (or gone)
            seen = parse_float(path, line, "endpoint_terminating_at_unix", row.get("endpoint_terminating_at_unix") or "", allow_empty=True)
            pod_info[pod]["lag"] = None if seen is None else max(0.0, seen - t)
    else:
        w("no deletions.csv: failure offsets and ground truth cannot be computed")

    # Ground truth.
    groundtruth = []  # dicts
    path = os.path.join(rundir, "groundtruth.csv")
    gt_nodes = set()
    gt_unknown_pods = set()
    if os.path.exists(path):
        rows = read_csv(path, GROUNDTRUTH_COLUMNS, GROUNDTRUTH_OPTIONAL)
        if rows is None:
            w("groundtruth.csv is empty (no header)")
            rows = []
        seen = set()
        for line, row in rows:
            pod = row["pod"].strip()
            node = row["proxy_node"].strip()
            removed = parse_float(path, line, "removed_at_unix", row["removed_at_unix"], allow_empty=True)
            present = parse_float(path, line, "last_present_at_unix", row["last_present_at_unix"], allow_empty=True)
            if present is not None and (removed is None or present > removed):
                raise Malformed(path, line, "last_present_at_unix must come with an equal or later removed_at_unix")
            if not pod or not node:
                raise Malformed(path, line, "pod and proxy_node must not be empty")
            gt_nodes.add(node)
            if pod not in deletions:
                gt_unknown_pods.add(pod)
                continue
            if (pod, node) in seen:
                raise Malformed(path, line, f"pod {pod} on node {node} listed twice")
            seen.add((pod, node))
            deleted_at = deletions[pod][2]
            groundtruth.append({
                "pod": pod,
                "ip": row["ip"].strip() or deletions[pod][0],
                "node": node,
                "seconds": None if removed is None else r3(removed - deleted_at),
                # (after, by): seconds from the deletion to the last read with the IP and the
                # first read without it; None without the lower end (older runs)
                "boundSeconds": None if present is None else [r6(present - deleted_at), r6(removed - deleted_at)],
                "reader": row["reader"].strip() or None,
                "_removed": removed,
                "_window": None if removed is None else removed - deleted_at,
            })
    else:
        w("no groundtruth.csv: no ground truth")
    if gt_unknown_pods:
        w(f"groundtruth.csv names {len(gt_unknown_pods)} pod(s) absent from deletions.csv (ignored): "
          + ", ".join(sorted(gt_unknown_pods)[:5]) + (" ..." if len(gt_unknown_pods) > 5 else ""))
    groundtruth.sort(key=lambda g: (g["pod"], g["node"]))
    never = [g for g in groundtruth if g["seconds"] is None]
    if never:
        w(f"{len(never)} pod/node pair(s) never left kube-proxy's rules within the observation "
          "(not in maxGroundTruthSeconds)")
    expected_pairs = len(deletions) * len(gt_nodes)
    if gt_nodes and len(groundtruth) < expected_pairs:
        w(f"ground truth covers {len(groundtruth)} of {expected_pairs} deleted-pod/node pairs")
    gt_seconds = [g["seconds"] for g in groundtruth if g["seconds"] is not None]
    pods = pod_windows(deletions, pod_info, groundtruth, sorted(gt_nodes))
    failed_measurements = [p["name"] for p in pods if p["maxWindowSeconds"] is None]
    if failed_measurements and gt_nodes:
        w(f"{len(failed_measurements)} pod(s) never seen removed by a successful read on some node (failed "
          "measurements: the ground truth is missing): " + ", ".join(failed_measurements[:5])
          + (" ..." if len(failed_measurements) > 5 else ""))

    # Failures relative to the nearest deletion.
    del_times = sorted(d[2] for d in deletions.values())
    failures = [(t, o, n) for (t, o, n) in requests if o != "ok"]
    offsets = []
    if del_times:
        for t, _, _ in failures:
            i = bisect.bisect_left(del_times, t)
            cands = [del_times[j] for j in (i - 1, i) if 0 <= j < len(del_times)]
            nearest = min(cands, key=lambda d: (abs(t - d), d))
            offsets.append(r3(t - nearest))
    elif failures:
        w("failures present but no deletions: no failure offsets")

    # Failures by cause: each failed request joined with its node's conntrack events
    conntrack = {}
    for node in nodes:
        path = os.path.join(rundir, f"conntrack-{node}.txt")
        if os.path.exists(path):
            conntrack[node] = read_conntrack(path)
    if failed_requests and not conntrack:
        w("no conntrack-<node>.txt: failures cannot be attributed to a cause")
    by_cause = classify_failures(failed_requests, conntrack, deletions, pod_info,
                                 spans=race_spans(deletions, pod_info, groundtruth, sorted(gt_nodes)))

    by_outcome = {}
    for _, o, _ in failures:
        by_outcome[o] = by_outcome.get(o, 0) + 1
    by_node = {n: 0 for n in nodes}
    for _, _, n in failures:
        by_node[n] += 1

    protected = meta.get("protected")
    if protected is None:
        protected = False
        if "protected" not in meta and meta:
            w("meta.json has no 'protected': taken as false")
    sleep = meta.get("injectedSleepSeconds")
    max_gt = r3(max(gt_seconds)) if gt_seconds else None
    if protected:
        limit = r3(max(3.0, 2 * max_gt)) if max_gt is not None else 3.0
        sleep_bound = {"limitSeconds": limit, "ok": None if sleep is None else bool(sleep <= limit)}
        if max_gt is None:
            w("protected run without ground truth: sleep bound limit taken as 3 s")
        if sleep is None:
            w("protected run without injectedSleepSeconds")
    else:
        sleep_bound = None

    pod_max = [p["maxWindowSeconds"] for p in pods if p["maxWindowSeconds"] is not None]
    p99 = percentile(pod_max, 0.99)
    window = meta.get("measuredWindowSeconds")
    kind = meta.get("histogramKind")
    if protected:
        uncovered = [p["name"] for p in pods if p["sleepSeconds"] is None
                     or (p["maxWindowSeconds"] is not None and p["sleepSeconds"] < p["maxWindowSeconds"])]
        # the 2 x bound is what tests/e2e_deploy.rs asserts with native histograms; with classic
        # ones a p99 inside a doubling bucket can read up to 2 x the true one
        sleep_bound["asserted"] = kind == "native"
    else:
        uncovered = None

    n_req = len(requests)
    result = {
        "name": name,
        "protected": bool(protected),
        # the preStop handler: "Wait" (each pod's sleepSeconds is then its measured wait, from
        # its kubelet's record of the hook's end), "Sleep", or "none" (unprotected)
        "handler": meta.get("handler") or ("Sleep" if protected else "none"),
        "proxyModes": list(meta.get("proxyModes") or []),
        "extraServices": int(meta.get("extraServices") or 0),
        "requests": n_req,
        "failures": len(failures),
        "injectedSleepSeconds": sleep,
        "measuredWindowSeconds": meta.get("measuredWindowSeconds"),
        # the removals the operator's node agents observed over its rolling window, as the
        # policy's status reported them at the run's end (protected runs; None without)
        "observedRemovals": meta.get("observedRemovals"),
        "maxGroundTruthSeconds": max_gt,
        "failureRate": (len(failures) / n_req) if n_req else None,
        "failuresByOutcome": dict(sorted(by_outcome.items())),
        # each failed request's cause (classify_failures): the race the sleep removes, a tuple
        # pinned by an earlier attempt's conntrack entry, a SYN dropped by a live pod, other,
        # and unattributed (no conntrack record of it)
        "failuresByCause": by_cause["counts"],
        "failuresByCauseAndOutcome": by_cause["byOutcome"],
        "unattributedByNode": by_cause["unattributedByNode"],
        # each failure left in `other`, with its evidence (at most 100)
        "otherEvidence": by_cause["otherEvidence"][:100],
        "failuresByNode": dict(sorted(by_node.items())),
        # each node's load generator goes through its own kube-proxy: failures per proxy mode
        "failuresByProxyMode": by_mode(by_node, meta.get("nodeModes")),
        "requestsPerSecond": round(per_node_rate, 1) if rate_known else None,
        "loadNodes": nodes,
        "rollouts": meta.get("rollouts") or [],
        "deletedPods": len(deletions),
        "groundTruth": [{k: v for k, v in g.items() if not k.startswith("_")} for g in groundtruth],
        "groundTruthP50Seconds": r3(percentile(gt_seconds, 0.5)),
        "groundTruthCoverage": {
            "proxyNodes": sorted(gt_nodes),
            "pairsRemoved": len(gt_seconds),
            "pairsNeverRemoved": len(never),
            "pairsMissing": max(0, expected_pairs - len(groundtruth)),
        },
        "failureOffsetsSeconds": offsets,
        "failureOffsetSummary": summary(offsets),
        "sleepBound": sleep_bound,
        # which kind of histogram the operator's p99 came from: native, classic, or null (not
        # reported by the operator)
        "histogramKind": kind,
        # W over the run from two scrapes of every node, native and classic from the same
        # scrapes (tests/common/windows.rs); null fields when the run did not record them
        "windowFromScrapes": {
            "nativeSeconds": (meta.get("windowFromScrapes") or {}).get("nativeWindowSeconds"),
            # the same after the control plane's part of the run's deletions (the test's own
            # watches): composed by convolution, as the operator does, and as a sum of p99s
            "nativeWithLagSeconds": (meta.get("windowFromScrapes") or {}).get("nativeWindowWithLagSeconds"),
            "nativeSumOfP99sSeconds": (meta.get("windowFromScrapes") or {}).get("nativeWindowSumOfP99sSeconds"),
            "classicSeconds": (meta.get("windowFromScrapes") or {}).get("classicWindowSeconds"),
            # the model before minSyncPeriod + 2 x p99(sync), from the same native p99s:
            # max over nodes of max(p99(network programming) - 1 s, minSyncPeriod + p99(sync))
            "nativeBeforeSeconds": max_or_none(n.get("nativeWindowBeforeSeconds") for n in
                                               ((meta.get("windowFromScrapes") or {}).get("nodes") or {}).values()),
            # per node: each kind's sync and network-programming p99 and window
            "nodes": (meta.get("windowFromScrapes") or {}).get("nodes"),
        },
        "pods": pods,
        "podWindowMinSeconds": r3(min(pod_max)) if pod_max else None,
        "podWindowP99Seconds": r6(p99),
        "podWindowMaxSeconds": r3(max(pod_max)) if pod_max else None,
        # the control plane's part of the windows (the test's watches) and what follows it
        "controlPlaneLag": lag_summary(pods),
        # W (before the safety factor and the 3 s floor) >= the p99 of the per-pod windows
        "wCoversP99": None if window is None or p99 is None else bool(window >= p99),
        "failedMeasurements": failed_measurements,
        "podsUncovered": uncovered,
        "failedReads": meta.get("failedReads"),
        "ruleReads": meta.get("ruleReads"),
        "readErrors": meta.get("readErrors"),
        "order": meta.get("order"),
        "replicas": meta.get("replicas"),
        "ratePerNodePerSecond": meta.get("ratePerNodePerSecond"),
        "timeoutMs": meta.get("timeoutMs"),
        "terminationGracePeriodSeconds": meta.get("terminationGracePeriodSeconds"),
        "startedAtUnix": meta.get("startedAtUnix"),
        "finishedAtUnix": meta.get("finishedAtUnix"),
        "operatorWindowDetail": meta.get("operatorWindowDetail"),
        "nodeModes": meta.get("nodeModes"),
        # nodes without a ground truth in this run, and why (the per-pod windows leave them out)
        "unmeasuredNodes": meta.get("unmeasuredNodes") or {},
        # the operator's sync p99 per node at the end of the run (its own metric)
        "operatorSyncP99Seconds": meta.get("operatorSyncP99Seconds"),
        # protected runs: the operator's W, terms and recommended sleep every 2 s
        "operatorTimeline": meta.get("operatorTimeline"),
        # protected runs: the coverage the operator predicted and the one observed
        "coverage": coverage_comparison(pods, meta.get("operatorTimeline")) if protected else None,
        "warnings": list(warnings),
    }
    for msg in warnings:
        warn(f"run {name}: {msg}")
    raw = {
        "requests": requests,
        "deletions": deletions,
        "pods": pods,
        "groundtruth": groundtruth,
        "gtNodes": sorted(gt_nodes),
    }
    return result, raw


def max_or_none(values):
    """The largest of the finite numbers among `values` (`is_number`), None when there are none."""
    nums = [v for v in values if is_number(v)]
    return max(nums) if nums else None


CONNTRACK_EVENT = re.compile(r"^\[(\d+(?:\.\d+)?)\]\s+\[(NEW|DESTROY)\]\s+tcp\s")
CONNTRACK_TUPLE = re.compile(r"src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)")


def read_conntrack(path):
    """`conntrack -E -e NEW,DESTROY -o timestamp` output of one node: per source port, its
    events in time order as (unix seconds, "NEW" or "DESTROY", the address the entry sends to:
    the reply tuple's source, the pod after kube-proxy's DNAT). Other lines (the summary, a
    warning) are skipped."""
    by_port = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = CONNTRACK_EVENT.match(line.strip())
            tuples = CONNTRACK_TUPLE.findall(line)
            if not m or len(tuples) < 2:
                continue
            by_port.setdefault(int(tuples[0][2]), []).append((float(m.group(1)), m.group(2), tuples[1][0]))
    for events in by_port.values():
        events.sort()
    return by_port


def race_spans(deletions, pod_info, groundtruth, nodes):
    """Per node with a ground truth, the spans (stopped, removed) in which a pod could take a new
    connection without serving it: from its deletion plus its preStop sleep to the first
    successful read of that node's rules without its IP (`inf` when never seen removed). A node
    without a ground truth in the run (meta.json `unmeasuredNodes`) has no entry."""
    removed = {(g["pod"], g["node"]): g["_removed"] for g in groundtruth}
    spans = {n: [] for n in nodes}
    for pod, (ip, _, t) in deletions.items():
        stopped = t + ((pod_info.get(pod) or {}).get("sleep") or 0)
        for n in nodes:
            by = removed.get((pod, n))
            by = math.inf if by is None else by
            if by > stopped:
                spans[n].append((stopped, by))
    return spans


# How long after the API server the test's watch may see a deletion, seconds: a pod counts as
# stopped this much before its recorded deletion plus its sleep (a pod that exits at once on
# SIGTERM refused connections up to 10 ms before the recorded deletion). It errs towards `race`,
# which fails a protected run, never towards passing one.
DELETION_SLACK_SECONDS = 0.25


def classify_failures(failed, conntrack, deletions, pod_info, slack=0.05, spans=None,
                      deletion_slack=DELETION_SLACK_SECONDS):
    """The cause of each failed request, from its source port and its node's conntrack events.

    - `race`: a new connection (its own NEW entry) whose SYN went out (the NEW event's time, not
      the request's scheduled start: a lagging load generator sends late) after the pod it went
      to stopped serving (its deletion, less `deletion_slack`, plus its preStop sleep): the NEW
      entry names the pod the node's rules chose, so the rules still held it: what the sleep
      removes;
    - `pinned`: no NEW entry of its own: an earlier attempt's entry with the same tuple, not yet
      destroyed, carried it to where that attempt went (an unanswered SYN leaves an entry in
      SYN_SENT for nf_conntrack_tcp_timeout_syn_sent, 120 s by default);
    - `liveSynDropped`: a timeout on its own entry to a pod still serving: its SYN dropped (a full
      accept queue, a busy node);
    - `keepAlive`: sent on a connection that had served an earlier request (`reused`): the
      pod it was opened to broke it (an app that exits on SIGTERM without draining); the rules
      only steer new connections, so only the app's own shutdown fixes it;
    - `other`: its own entry to a pod still serving, and refused, reset or otherwise failed;
    - `notSent`: the load generator never sent it (all its workers busy past the timeout: the
      client overloaded, as on a starved machine); no rule was consulted;
    - `notRace`: no conntrack record of it, but by its node's ground truth (`spans`, from
      race_spans) no pod was stopped and still in that node's rules while it was tried: not the
      race, whatever else failed it (a starved node or client);
    - `unattributed`: not sent, no port recorded, or no conntrack record of it and no ground
      truth that rules the race out.
    Returns {"counts": {cause: n}, "byOutcome": {cause: {outcome: n}}, "unattributedByNode": {node:
    n}, "otherEvidence": [...]}: each `other` failure with its evidence (node, port, scheduled
    start, SYN time, the pod it went to, when that pod was recorded stopped or None: never
    deleted), so none is left there unexplained."""
    deleted_by_ip = {}
    for pod, (ip, _, t) in deletions.items():
        sleep = (pod_info.get(pod) or {}).get("sleep") or 0
        if ip:
            deleted_by_ip.setdefault(ip, []).append(t + sleep)
    counts = {c: 0 for c in CAUSES}
    by_outcome = {c: {} for c in CAUSES}
    unattributed_by_node = {}
    other_evidence = []
    for r in failed:
        events = (conntrack.get(r["node"]) or {}).get(r["port"]) if r["port"] else None
        cause = "unattributed"
        if r.get("notSent"):
            cause = "notSent"
        elif r.get("reused"):
            cause = "keepAlive"
        elif events:
            start, end = r["t"] - slack, r["t"] + r["latencySeconds"] + slack
            own = [e for e in events if e[1] == "NEW" and start <= e[0] <= end]
            if own:
                syn_at, ip = own[0][0], own[0][2]
                stops = deleted_by_ip.get(ip, [])
                if any(t - deletion_slack <= syn_at for t in stops):
                    cause = "race"
                elif r["outcome"] == "timeout":
                    cause = "liveSynDropped"
                else:
                    cause = "other"
                    other_evidence.append({"node": r["node"], "port": r["port"], "scheduledAt": r["t"], "synAt": syn_at,
                                           "podIp": ip, "podStoppedAt": min(stops) if stops else None,
                                           "outcome": r["outcome"]})
            else:
                before = [e for e in events if e[0] < start]
                if before and before[-1][1] == "NEW":
                    cause = "pinned"
        if cause == "unattributed" and spans is not None and r["node"] in spans:
            start, end = r["t"] - slack, r["t"] + r["latencySeconds"] + slack
            if not any(stopped <= end and by >= start for stopped, by in spans[r["node"]]):
                cause = "notRace"
        counts[cause] += 1
        if cause == "unattributed":
            unattributed_by_node[r["node"]] = unattributed_by_node.get(r["node"], 0) + 1
        by_outcome[cause][r["outcome"]] = by_outcome[cause].get(r["outcome"], 0) + 1
    return {"counts": counts, "byOutcome": {c: dict(sorted(o.items())) for c, o in by_outcome.items() if o},
            "unattributedByNode": dict(sorted(unattributed_by_node.items())), "otherEvidence": other_evidence}


def coverage_comparison(pods, timeline):
    """The coverage the operator predicted beside the one observed, for a protected run.

    Predicted: `status.recommendation.coverage` over the run (the timeline's `coverageRatio`, the
    share of (pod, node) windows the sleep covers from the histograms W came from, and
    `coverageLowestNodeRatio`). Observed: the share of (pod, node) windows, and of pods (their
    slowest node), within the pod's own sleep, from the ground truth. None without a pod that
    has a sleep and a window."""
    pairs = [(p["sleepSeconds"], w) for p in pods if p["sleepSeconds"] is not None
             for w in (p.get("windowSeconds") or {}).values() if w is not None]
    per_pod = [(p["sleepSeconds"], p["maxWindowSeconds"]) for p in pods
               if p["sleepSeconds"] is not None and p["maxWindowSeconds"] is not None]
    if not pairs:
        return None
    points = [pt for pt in (timeline or []) if isinstance(pt, dict)]
    predicted = [pt["coverageRatio"] for pt in points if is_number(pt.get("coverageRatio"))]
    lowest = [pt["coverageLowestNodeRatio"] for pt in points if is_number(pt.get("coverageLowestNodeRatio"))]
    return {
        "predictedRatioMin": min(predicted) if predicted else None,
        "predictedRatioMean": r6(sum(predicted) / len(predicted)) if predicted else None,
        "predictedLowestNodeRatioMin": min(lowest) if lowest else None,
        "observedPairRatio": r6(sum(1 for s, w in pairs if w <= s) / len(pairs)),
        "observedPodRatio": r6(sum(1 for s, w in per_pod if w <= s) / len(per_pod)) if per_pod else None,
        "pairs": len(pairs),
        "pods": len(per_pod),
    }


def percent(v):
    return "–" if v is None else f"{100 * v:.1f}%"


def pod_windows(deletions, pod_info, groundtruth, nodes):
    """Per deleted pod, in deletion order: its sleep and grace, and per proxy node its window
    (seconds from its deletion to the first successful read without its IP) with the bound
    [last read with it, first read without it]; `maxWindowSeconds` the slowest node, None when
    some node never saw the IP go (or there is no ground truth): a failed measurement."""
    rows = {}
    for g in groundtruth:
        rows.setdefault(g["pod"], {})[g["node"]] = g
    pods = []
    for pod, (ip, node, t) in sorted(deletions.items(), key=lambda kv: (kv[1][2], kv[0])):
        mine = rows.get(pod, {})
        windows = {n: r6(mine[n]["_window"]) if n in mine else None for n in nodes}
        missing = [n for n in nodes if windows[n] is None]
        info = pod_info.get(pod, {})
        pods.append({
            "name": pod,
            "ip": ip,
            "node": node,
            "deletedAt": t,
            "sleepSeconds": info.get("sleep"),
            "graceSeconds": info.get("grace"),
            "windowSeconds": windows,
            "windowBoundSeconds": {n: mine[n]["boundSeconds"] for n in nodes
                                   if n in mine and mine[n]["boundSeconds"] is not None},
            "maxWindowSeconds": max(windows.values()) if nodes and not missing else None,
            "missingNodes": missing,
            # the control plane's part: from the deletion to the endpoint seen terminating, both
            # by the test's own watches (None when the slice watch never saw it)
            "controlPlaneLagSeconds": r6(info.get("lag")) if info.get("lag") is not None else None,
        })
    return pods


def lag_summary(pods):
    """The control plane's part of the per-pod windows: its p50 / p99 / max over the pods, the
    same of the rest of each window (the window less the lag: the data plane's part), and the
    Pearson correlation of the two parts over the pods that have both (None under 3 pods or
    when either part does not vary): near 0, the two compose by convolution."""
    lags = [p["controlPlaneLagSeconds"] for p in pods if p.get("controlPlaneLagSeconds") is not None]
    pairs = [(p["controlPlaneLagSeconds"], p["maxWindowSeconds"] - p["controlPlaneLagSeconds"]) for p in pods
             if p.get("controlPlaneLagSeconds") is not None and p["maxWindowSeconds"] is not None]
    rest = [b for _, b in pairs]
    corr = None
    if len(pairs) >= 3:
        ma, mb = sum(a for a, _ in pairs) / len(pairs), sum(rest) / len(pairs)
        va = sum((a - ma) ** 2 for a, _ in pairs)
        vb = sum((b - mb) ** 2 for b in rest)
        if va > 0 and vb > 0:
            corr = r3(sum((a - ma) * (b - mb) for a, b in pairs) / math.sqrt(va * vb))
    return {
        "samples": len(lags),
        "p50Seconds": r3(percentile(lags, 0.5)) if lags else None,
        "p99Seconds": r3(percentile(lags, 0.99)) if lags else None,
        "maxSeconds": r3(max(lags)) if lags else None,
        "restP99Seconds": r3(percentile(rest, 0.99)) if rest else None,
        "correlation": corr,
    }


def sort_key(meta_order, name):
    return (meta_order is None, meta_order if meta_order is not None else 0, name)


# ---------------------------------------------------------------- table


def fmt_num(v, digits=3):
    if v is None:
        return "–"
    if isinstance(v, int):
        return str(v)
    return f"{v:.{digits}f}".rstrip("0").rstrip(".") if digits else str(v)


def yes_no(v):
    return {True: "yes", False: "**no**", None: "–"}[v]


def per_node(counts):
    return ", ".join(f"{n} {c}" for n, c in sorted(counts.items())) if isinstance(counts, dict) else "–"


def table(runs):
    head = ["run", "protected", "proxy modes", "extra Services", "requests", "failures", "failure rate",
            "failures by outcome", "failures by cause", "measured W (s)", "injected sleep (s)", "max ground truth (s)",
            "pod windows min / p99 / max (s)", "W covers p99", "histogram", "W native / classic / native before, same scrapes (s)",
            "failed reads"]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] * 3 + ["---:"] * 4 + ["---"] * 2 + ["---:"] * 4 + ["---"] * 4) + "|"]
    for r in runs:
        rate = "–" if r["failureRate"] is None else f"{100 * r['failureRate']:.3f}%"
        outcomes = ", ".join(f"{o} {n}" for o, n in r["failuresByOutcome"].items()) or "–"
        causes = ", ".join(f"{c} {n}" for c, n in r["failuresByCause"].items() if n) or "–"
        windows = " / ".join(fmt_num(r[k]) for k in ("podWindowMinSeconds", "podWindowP99Seconds",
                                                         "podWindowMaxSeconds"))
        protected = ("yes (wait)" if r.get("handler") == "Wait" else "yes") if r["protected"] else "no"
        cells = [r["name"], protected, ", ".join(r["proxyModes"]) or "–",
                 str(r["extraServices"]), str(r["requests"]), str(r["failures"]), rate, outcomes, causes,
                 fmt_num(r["measuredWindowSeconds"]), fmt_num(r["injectedSleepSeconds"]),
                 fmt_num(r["maxGroundTruthSeconds"]), windows, yes_no(r["wCoversP99"]),
                 r["histogramKind"] or "–",
                 " / ".join(fmt_num(r["windowFromScrapes"].get(k)) for k in ("nativeSeconds", "classicSeconds", "nativeBeforeSeconds")),
                 per_node(r["failedReads"])]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines.append("")
    lines.append("Failure offsets (request start minus the nearest pod deletion):")
    lines.append("")
    for r in runs:
        s = r["failureOffsetSummary"]
        if r["failures"] == 0:
            text = "no failures"
        elif s["min"] is None:
            text = f"{r['failures']} failures, no deletions to relate them to"
        else:
            text = (f"{r['failures']} failures, min {s['min']:+.3f} s, p50 {s['p50']:+.3f} s, "
                    f"max {s['max']:+.3f} s after the nearest deletion")
        bound = r["sleepBound"]
        if bound is not None:
            # informational: how much longer than needed the sleep was; the test's check on the
            # sleep (tests/e2e_deploy.rs) allows the safety factor on top, and says so in the verdict
            verdict = {True: "within", False: "above", None: "unknown vs"}[bound["ok"]]
            text += (f"; injected sleep {fmt_num(r['injectedSleepSeconds'])} s, for information (not a check): "
                     f"{verdict} 2 x this run's largest window, {fmt_num(bound['limitSeconds'])} s")
            at_scale = r.get("sleepBoundAtScale")
            if at_scale is not None:
                verdict = {True: "within", False: "above", None: "unknown vs"}[at_scale["ok"]]
                whole = {True: "within", False: "above", None: "unknown vs"}[at_scale["okInWholeSeconds"]]
                text += (f", {verdict} max(3 s, 2 x the largest window at "
                         f"{r['extraServices']} extra Services) = {fmt_num(at_scale['limitSeconds'])} s "
                         f"({whole} it in whole seconds: {at_scale['wholeSecondLimitSeconds']} s)")
        lines.append(f"- {r['name']}: {text}")
    coverage = []
    for r in runs:
        c = r.get("coverage")
        if c:
            coverage.append(f"- {r['name']}: predicted {percent(c['predictedRatioMin'])} at least (mean "
                            f"{percent(c['predictedRatioMean'])}, lowest node {percent(c['predictedLowestNodeRatioMin'])}); "
                            f"observed {percent(c['observedPairRatio'])} of {c['pairs']} (pod, node) windows, "
                            f"{percent(c['observedPodRatio'])} of {c['pods']} pods")
        o = r.get("observedRemovals")
        if isinstance(o, dict):
            cov = percent(o["coverageRatio"]) if o.get("coverageRatio") is not None else "none"
            coverage.append(f"  - the operator's own observation (node agents, its rolling window): {o.get('removals')} removals, "
                            f"p99 {fmt_num(o.get('p99Seconds'))} s{' at least' if o.get('p99IsLowerBound') else ''}"
                            f"{' (set W)' if o.get('setsWindow') else ''}, {o.get('coarse', 0)} coarse, "
                            f"{o.get('censored', 0)} censored; each pod's own sleep covered {cov}")
    section(lines, "Coverage, predicted by the operator (status.recommendation.coverage over the run: the share of "
                   "(pod, node) windows its sleep covers) and observed (windows within each pod's own sleep):", coverage)
    sync = []
    for r in runs:
        if not r.get("operatorSyncP99Seconds"):
            continue
        modes = r.get("nodeModes") or {}
        p99 = ", ".join(f"{n} ({modes.get(n, '?')}) {fmt_num(v)} s" for n, v in sorted(r["operatorSyncP99Seconds"].items()))
        sync.append(f"- {r['name']} ({r['extraServices']} extra Services): {p99}")
        sync.extend(f"  - ProxySyncSlow: {a.get('message')}" for a in ((r.get("operatorWindowDetail") or {}).get("advice") or [])
                    if isinstance(a, dict) and a.get("reason") == "ProxySyncSlow")
    section(lines, "The operator's kube-proxy sync p99 per node at the end of each run "
                   "(`safe_termination_kube_proxy_sync_p99_seconds`), and in protected runs its ProxySyncSlow advice:", sync)
    unmeasured = [f"- {r['name']}: no ground truth on {n} ({why}); its per-pod windows are the other nodes'"
                  for r in runs for n, why in sorted((r.get("unmeasuredNodes") or {}).items())]
    section(lines, "Nodes without a ground truth:", unmeasured)
    lines.append("")
    lines.append("Per-pod windows: seconds from the pod's deletion to its IP gone from each node's rules, by the "
                 "first successful read without it, in brackets the bound from the last successful read with "
                 "it; the slowest node; the pod's own preStop sleep.")
    for r in runs:
        lines.append("")
        lines.extend(pod_table(r))
    return "\n".join(lines) + "\n"


def section(lines, title, items):
    """Appends a titled list to `lines` (a blank line, the title, a blank line, the items);
    nothing when there are no items."""
    if items:
        lines.extend(["", title, ""] + items)


def pod_table(r):
    nodes = sorted({n for p in r["pods"] for n in p["windowSeconds"]})
    facts = [f"W {fmt_num(r['measuredWindowSeconds'])} s" if r["measuredWindowSeconds"] is not None else "no W",
             f"p99 of the windows {fmt_num(r['podWindowP99Seconds'])} s",
             f"W covers it: {yes_no(r['wCoversP99'])}",
             f"histograms {r['histogramKind'] or 'not reported'}",
             f"failed reads {per_node(r['failedReads'])}"]
    out = [f"{r['name']} ({'; '.join(facts)}):", ""]
    if r["failedMeasurements"]:
        out += [f"FAILED MEASUREMENTS (no successful read without the IP): {', '.join(r['failedMeasurements'])}", ""]
    if not r["pods"]:
        return out + ["no deleted pods"]
    start = r["startedAtUnix"] if r["startedAtUnix"] is not None else min(p["deletedAt"] for p in r["pods"])
    head = ["pod", "deleted (s after start)", "sleep (s)", "grace (s)"] + [f"{n} (s)" for n in nodes] + \
        ["slowest (s)", "sleep covers it"]
    out += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 2) + "---|"]
    for p in r["pods"]:
        cells = [p["name"], f"{p['deletedAt'] - start:.3f}", fmt_num(p["sleepSeconds"]), fmt_num(p["graceSeconds"])]
        for n in nodes:
            v, b = p["windowSeconds"].get(n), p["windowBoundSeconds"].get(n)
            cell = "never seen removed" if v is None else fmt_num(v)
            if b is not None:
                cell += f" [{fmt_num(b[0])}, {fmt_num(b[1])}]"
            cells.append(cell)
        slowest, sleep = p["maxWindowSeconds"], p["sleepSeconds"]
        covers = "–" if not r["protected"] or slowest is None else yes_no(sleep is not None and sleep >= slowest)
        cells += [fmt_num(slowest), covers]
        out.append("| " + " | ".join(cells) + " |")
    return out


# ---------------------------------------------------------------- SVG

FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
C_OK = "#9dbf9e"
C_OK_EDGE = "#6f9f72"
C_FAIL = "#d62728"
C_DEL = "#2b2b2b"
C_SLEEP = "#1f77b4"
C_GT = "#7b3fa0"
C_ROLL = "#e07b00"
C_AXIS = "#555"
C_GRID = "#e6e6e6"
C_W = "#444"
C_NODES = ("#7b3fa0", "#e07b00", "#2a7a2e", "#8c564b")

WIDTH = 1200
MAIN_X0, MAIN_X1 = 74, 800
INSET_X0, INSET_X1 = 912, 1178
PLOT_H = 120


def nice_step(span, target):
    if span <= 0:
        return 1.0
    raw = span / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def ticks(lo, hi, target):
    step = nice_step(hi - lo, target)
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    v = first
    while v <= hi + 1e-9 * max(1, abs(hi)):
        out.append(round(v, 10))
        v += step
    return out, step


def tick_label(v, step):
    if step >= 1 and abs(v - round(v)) < 1e-9:
        return str(int(round(v)))
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-9:
        decimals += 1
    return f"{v:.{decimals}f}"


def count_axis(n, minimum):
    """Integer ticks 0..top for a count axis, top >= max(n, minimum)."""
    n = max(n, minimum)
    raw = n / 4
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw - 1e-9)
    step = max(1, int(round(step)))
    top = int(math.ceil(n / step)) * step
    return list(range(0, top + 1, step)), step


def text(x, y, s, size=12, anchor="start", color="#222", weight=None, extra=""):
    w = f' font-weight="{weight}"' if weight else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{color}"{w}{extra}>'
            f"{escape(str(s))}</text>")


def attr(s):
    """Text for a double-quoted XML attribute."""
    return escape(str(s), {'"': "&quot;"})


def text_width(s, size):
    """Rough width of DejaVu Sans/Helvetica text."""
    return len(s) * size * 0.56


def thousands(n):
    return f"{n:,}"


def svg_panel(out, run, raw, top, inset_x, windows_x):
    """Append one panel's elements to `out`; return its height."""
    name = run["name"]
    requests = raw["requests"]
    deletions = raw["deletions"]
    groundtruth = raw["groundtruth"]
    gt_nodes = raw["gtNodes"]
    sleep = run["injectedSleepSeconds"] if run["protected"] else None
    rollouts = run["rollouts"]

    # Time origin and range.
    times = [t for t, _, _ in requests] + [d[2] for d in deletions.values()]
    times += [g["_removed"] for g in groundtruth if g["_removed"] is not None]
    for r in rollouts:
        times += [r[k] for k in ("startedAtUnix", "finishedAtUnix") if r.get(k) is not None]
    start = run["startedAtUnix"]
    if start is None or (times and min(times) < start):
        start = min(times) if times else 0.0  # no recorded start, or data from before it
    end = run["finishedAtUnix"]
    end_data = max(times) if times else start + 1
    if sleep:
        end_data = max(end_data, max((d[2] + sleep for d in deletions.values()), default=end_data))
    end = max(end if end is not None else end_data, end_data, start + 1)
    xticks, xstep = ticks(0, end - start, 10)
    span = max(end - start, xticks[-1] if xticks else 1)
    if xticks and xticks[-1] < end - start - 1e-9:
        span = end - start

    def X(t):
        return MAIN_X0 + (t - start) / span * (MAIN_X1 - MAIN_X0)

    nbins = max(1, int(math.ceil(span / BIN_SECONDS)))
    ok_bins = [0] * nbins
    fail_bins = [0] * nbins
    for t, o, _ in requests:
        b = int(math.floor((t - start) / BIN_SECONDS + 1e-6))  # ms timestamps on a bin edge stay in it
        if 0 <= b < nbins:
            (ok_bins if o == "ok" else fail_bins)[b] += 1

    y = top
    # Title.
    status = ("protected, preStop Wait" if run.get("handler") == "Wait" else "protected") if run["protected"] else "unprotected"
    rate = "" if run["failureRate"] is None else f" ({100 * run['failureRate']:.3f}%)"
    details = [status]
    if run["proxyModes"]:
        details.append(", ".join(run["proxyModes"]))
    details.append(f"{thousands(run['extraServices'])} extra Services")
    if run["protected"] and sleep is not None:
        details.append(f"longest wait {fmt_num(sleep)} s" if run.get("handler") == "Wait" else f"preStop sleep {fmt_num(sleep)} s")
    if run["measuredWindowSeconds"] is not None:
        details.append(f"measured W {fmt_num(run['measuredWindowSeconds'])} s")
    details.append(f"{thousands(run['requests'])} requests")
    fail_color = C_FAIL if run["failures"] else "#2a7a2e"
    sep = "\u00a0\u00a0·\u00a0\u00a0"
    tail = f"{thousands(run['failures'])} failures{rate}"
    detail = "·\u00a0\u00a0" + sep.join(details) + "\u00a0\u00a0·"
    # Shrink the title until it fits the panel's width.
    size = 15
    while size > 10 and (text_width(name, size) * 1.08 + text_width(detail + tail, size) + size
                         > WIDTH - 16 - (MAIN_X0 - 60)):
        size -= 0.5
    out.append(f'<g class="panel" data-run="{attr(name)}">')
    out.append(f'<text x="{MAIN_X0 - 60}" y="{y + 15}" font-size="{size:g}" fill="#111">'
               f'<tspan font-weight="bold">{escape(name)}</tspan>'
               f'<tspan fill="#444" dx="{size * 0.5:g}">{escape(detail)}</tspan>'
               f'<tspan fill="{fail_color}" font-weight="bold" dx="{size * 0.5:g}">{escape(tail)}</tspan></text>')
    y += 26

    # Rollout strip.
    roll_y = y + 6
    last_label_x = -1e9
    for r in rollouts:
        s = r.get("startedAtUnix")
        if s is None:
            continue
        f = r.get("finishedAtUnix")
        x0 = X(s)
        if f is not None:
            out.append(f'<rect x="{x0:.1f}" y="{roll_y - 2.5:.1f}" width="{max(1.0, X(f) - x0):.1f}" height="5" '
                       f'fill="{C_ROLL}" fill-opacity="0.35"/>')
        out.append(f'<path class="rollout-start" d="M{x0:.1f},{roll_y + 5:.1f} l-5,-9 h10 z" fill="{C_ROLL}"/>')
        label = f"rollout {r.get('index', '')}".strip()
        if x0 + 7 > last_label_x:
            out.append(text(x0 + 7, roll_y + 4, label, 10, color="#8a4a00"))
            last_label_x = x0 + 7 + text_width(label, 10) + 6
    out.append(text(MAIN_X0 - 6, roll_y + 4, "rollouts", 10, "end", C_AXIS))
    y += 16

    # Ground-truth strip: one row per proxy node.
    row_h = 7
    gt_h = max(12, row_h * len(gt_nodes) + 4)
    gt_top = y
    out.append(f'<rect x="{MAIN_X0}" y="{gt_top}" width="{MAIN_X1 - MAIN_X0}" height="{gt_h}" fill="#faf7fc"/>')
    out.append(text(MAIN_X0 - 6, gt_top + gt_h / 2 + 3.5, "IP removed", 10, "end", C_AXIS))
    row_of = {n: i for i, n in enumerate(gt_nodes)}
    for g in groundtruth:
        if g["_removed"] is None:
            continue
        ry = gt_top + 2 + row_h * row_of[g["node"]] + row_h / 2
        xd = X(deletions[g["pod"]][2])
        xr = X(g["_removed"])
        out.append(f'<line x1="{xd:.1f}" y1="{ry:.1f}" x2="{xr:.1f}" y2="{ry:.1f}" stroke="{C_GT}" '
                   f'stroke-width="1" stroke-opacity="0.6"/>')
        out.append(f'<path class="groundtruth" d="M{xr:.1f},{ry - 3:.1f} l3,3 l-3,3 l-3,-3 z" fill="{C_GT}"/>')
    y += gt_h + 4

    # Main plot.
    p_top, p_bot = y, y + PLOT_H
    ok_ticks, ok_step = count_axis(math.ceil(max(ok_bins) * 1.1) if requests else 0, 1)  # headroom
    ok_top = ok_ticks[-1]
    f_ticks, f_step = count_axis(max(fail_bins) if requests else 0, 4)
    f_top = f_ticks[-1]

    def Yok(v):
        return p_bot - v / ok_top * PLOT_H

    def Yf(v):
        return p_bot - v / f_top * PLOT_H

    out.append(f'<rect x="{MAIN_X0}" y="{p_top}" width="{MAIN_X1 - MAIN_X0}" height="{PLOT_H}" fill="#fff" '
               f'stroke="{C_AXIS}" stroke-width="0.8"/>')
    left_axis(out, MAIN_X0, MAIN_X1, Yok, ok_ticks, ok_top, ok_step, C_AXIS)
    for v in xticks:
        xx = X(start + v)
        if 0 < v < span:
            out.append(f'<line x1="{xx:.1f}" y1="{p_top}" x2="{xx:.1f}" y2="{p_bot}" stroke="{C_GRID}"/>')
        out.append(f'<line x1="{xx:.1f}" y1="{p_bot}" x2="{xx:.1f}" y2="{p_bot + 4}" stroke="{C_AXIS}"/>')
        out.append(text(xx, p_bot + 16, tick_label(v, xstep), 11, "middle", C_AXIS))
    out.append(text(MAIN_X0 + (MAIN_X1 - MAIN_X0) / 2, p_bot + 31, "seconds since the run's start", 11,
                    "middle", C_AXIS))
    mid = p_top + PLOT_H / 2
    out.append(text(16, mid, "ok / 100 ms", 11, "middle", C_OK_EDGE,
                    extra=f' transform="rotate(-90 16 {mid:.1f})"'))

    # ok requests: a step area per 100 ms bin.
    if requests:
        bw = (MAIN_X1 - MAIN_X0) * BIN_SECONDS / span
        pts = [f"M{MAIN_X0:.1f},{p_bot:.1f}"]
        for i, v in enumerate(ok_bins):
            x0 = MAIN_X0 + i * bw
            pts.append(f"L{x0:.2f},{Yok(v):.1f}L{min(MAIN_X1, x0 + bw):.2f},{Yok(v):.1f}")
        pts.append(f"L{MAIN_X1:.1f},{p_bot:.1f}Z")
        out.append(f'<path class="ok-bars" d="{"".join(pts)}" fill="{C_OK}" stroke="{C_OK_EDGE}" '
                   f'stroke-width="0.4"/>')
    else:
        out.append(text((MAIN_X0 + MAIN_X1) / 2, mid + 4, "no load data", 13, "middle", "#999"))

    # Sleep bands, translucent over the ok area.
    if sleep:
        for pod, (_, _, t) in sorted(deletions.items(), key=lambda kv: kv[1][2]):
            x0, x1 = X(t), X(t + sleep)
            out.append(f'<rect class="sleep-band" x="{x0:.1f}" y="{p_top}" width="{max(1.0, x1 - x0):.1f}" '
                       f'height="{PLOT_H}" fill="{C_SLEEP}" fill-opacity="0.2"/>')

    # Deletions.
    for pod, (_, _, t) in sorted(deletions.items(), key=lambda kv: kv[1][2]):
        xx = X(t)
        out.append(f'<line class="deletion" x1="{xx:.1f}" y1="{gt_top:.1f}" x2="{xx:.1f}" y2="{p_bot}" '
                   f'stroke="{C_DEL}" stroke-width="0.8" stroke-opacity="0.55"><title>{escape(pod)} deleted'
                   f'</title></line>')

    # Rollout starts through the plot.
    for r in rollouts:
        if r.get("startedAtUnix") is not None:
            xx = X(r["startedAtUnix"])
            out.append(f'<line x1="{xx:.1f}" y1="{roll_y + 5:.1f}" x2="{xx:.1f}" y2="{p_bot}" stroke="{C_ROLL}" '
                       f'stroke-width="1.2" stroke-dasharray="4,3"/>')

    # Failures on their own (red, right-hand) axis, drawn on top; at least 2.5 px wide.
    bw = (MAIN_X1 - MAIN_X0) * BIN_SECONDS / span
    for i, v in enumerate(fail_bins):
        if v:
            wdt = max(2.5, bw)
            x0 = MAIN_X0 + i * bw + bw / 2 - wdt / 2
            out.append(f'<rect class="fail-bar" x="{x0:.2f}" y="{Yf(v):.1f}" width="{wdt:.2f}" '
                       f'height="{p_bot - Yf(v):.1f}" fill="{C_FAIL}"/>')
    for v in f_ticks:
        yy = Yf(v)
        out.append(f'<line x1="{MAIN_X1}" y1="{yy:.1f}" x2="{MAIN_X1 + 4}" y2="{yy:.1f}" stroke="{C_FAIL}"/>')
        out.append(text(MAIN_X1 + 7, yy + 4, tick_label(v, f_step), 11, "start", C_FAIL))
    rx = MAIN_X1 + 40
    out.append(text(rx, mid, "failed / 100 ms", 11, "middle", C_FAIL,
                    extra=f' transform="rotate(90 {rx} {mid:.1f})"'))

    # Inset: all deletions superimposed.
    svg_inset(out, run, raw, roll_y - 4, gt_top, p_top, p_bot, sleep, inset_x)

    # Below: each pod's windows against its sleep.
    h = svg_windows(out, run, p_bot + 46, windows_x)
    out.append("</g>")
    return (p_bot + 46 + h) - top


def windows_range(runs):
    """One x range (seconds after a pod's deletion) for every run's window plot: the longest
    window, sleep or W of any run, so they compare."""
    hi = 1.0
    for r in runs:
        for p in r["pods"]:
            hi = max([hi] + [v for v in p["windowSeconds"].values() if v is not None])
            if r["protected"] and p["sleepSeconds"] is not None:
                hi = max(hi, p["sleepSeconds"])
        if r["measuredWindowSeconds"] is not None:
            hi = max(hi, r["measuredWindowSeconds"])
    hi = min(hi * 1.08, 60.0)
    _, step = ticks(0, hi, 8)
    return 0.0, math.ceil(hi / step - 1e-9) * step


def svg_windows(out, run, top, xrange):
    """One row per deleted pod (deletion order): per proxy node a marker at its window (the first
    successful read without the IP) and a line back to the last read with it; the pod's own sleep
    as a blue tick, the run's largest sleep and W as lines across. Returns the height used."""
    pods = run["pods"]
    nodes = sorted({n for p in pods for n in p["windowSeconds"]})
    lo, hi = xrange
    xt, xstep = ticks(lo, hi, 10)

    def X(v):
        return MAIN_X0 + (min(max(v, lo), hi) - lo) / (hi - lo) * (MAIN_X1 - MAIN_X0)

    n = max(1, len(pods))
    rh = max(5.0, min(14.0, 150.0 / n))
    plot_top = top + 14
    plot_h = rh * n + 6
    plot_bot = plot_top + plot_h
    out.append(f'<g class="windows" data-run="{attr(run["name"])}">')
    out.append(text(MAIN_X0, top + 6, "each pod's window: deletion to its IP gone from a node's rules", 11, "start",
                    "#333", weight="bold"))
    lx = MAIN_X0 + text_width("each pod's window: deletion to its IP gone from a node's rules", 11) + 24
    for j, node in enumerate(nodes):
        c = C_NODES[j % len(C_NODES)]
        out.append(marker(j, lx + 4, top + 2, 3.2, c))
        out.append(text(lx + 12, top + 6, node, 11, "start", c))
        lx += 22 + text_width(node, 11)
    out.append(f'<rect x="{MAIN_X0}" y="{plot_top}" width="{MAIN_X1 - MAIN_X0}" height="{plot_h:.1f}" fill="#fff" '
               f'stroke="{C_AXIS}" stroke-width="0.8"/>')
    for v in xt:
        xx = X(v)
        if lo < v < hi:
            out.append(f'<line x1="{xx:.1f}" y1="{plot_top}" x2="{xx:.1f}" y2="{plot_bot:.1f}" stroke="{C_GRID}"/>')
        out.append(f'<line x1="{xx:.1f}" y1="{plot_bot:.1f}" x2="{xx:.1f}" y2="{plot_bot + 4:.1f}" stroke="{C_AXIS}"/>')
        out.append(text(xx, plot_bot + 16, tick_label(v, xstep), 11, "middle", C_AXIS))
    out.append(text(MAIN_X0 + (MAIN_X1 - MAIN_X0) / 2, plot_bot + 31, "seconds after the pod's deletion", 11,
                    "middle", C_AXIS))
    out.append(text(MAIN_X0 - 6, plot_top + plot_h / 2 + 4, f"{len(pods)} pods", 10, "end", C_AXIS))
    if not pods:
        out.append(text((MAIN_X0 + MAIN_X1) / 2, plot_top + plot_h / 2 + 4, "no deleted pods", 11, "middle", "#999"))
    size = min(3.2, rh / 2.6)
    for i, p in enumerate(pods):
        yy = plot_top + 3 + rh * i + rh / 2
        if run["protected"] and p["sleepSeconds"] is not None:
            xs = X(p["sleepSeconds"])
            out.append(f'<line class="pod-sleep" x1="{xs:.1f}" y1="{yy - rh / 2 + 0.5:.1f}" x2="{xs:.1f}" '
                       f'y2="{yy + rh / 2 - 0.5:.1f}" stroke="{C_SLEEP}" stroke-width="2"/>')
        for j, node in enumerate(nodes):
            c = C_NODES[j % len(C_NODES)]
            v, b = p["windowSeconds"].get(node), p["windowBoundSeconds"].get(node)
            dy = (j - (len(nodes) - 1) / 2) * min(2.0, rh / 5)
            if v is None:
                out.append(text(MAIN_X1 - 4, yy + 3.5, f"{p['name']}: never seen removed on {node}", 9, "end", C_FAIL,
                                extra=' class="missing-window"'))
                continue
            if b is not None:
                out.append(f'<line class="window-bound" x1="{X(b[0]):.1f}" y1="{yy + dy:.1f}" x2="{X(b[1]):.1f}" '
                           f'y2="{yy + dy:.1f}" stroke="{c}" stroke-width="1" stroke-opacity="0.6"/>')
            out.append(marker(j, X(v), yy + dy, size, c, "pod-window",
                              f"{p['name']} on {node}: {fmt_num(v)} s after its deletion"))
    sleeps = [p["sleepSeconds"] for p in pods if p["sleepSeconds"] is not None]
    if run["protected"] and sleeps:
        xs = X(max(sleeps))
        out.append(f'<line class="sleep-line" x1="{xs:.1f}" y1="{plot_top}" x2="{xs:.1f}" y2="{plot_bot:.1f}" '
                   f'stroke="{C_SLEEP}" stroke-width="1.2"/>')
        out.append(text(xs + 4, plot_top + 11, f"preStop sleep {fmt_num(max(sleeps))} s", 10, "start", C_SLEEP))
    if run["measuredWindowSeconds"] is not None:
        xw = X(run["measuredWindowSeconds"])
        out.append(f'<line class="w-line" x1="{xw:.1f}" y1="{plot_top}" x2="{xw:.1f}" y2="{plot_bot:.1f}" '
                   f'stroke="{C_W}" stroke-width="1.2" stroke-dasharray="5,3"/>')
        out.append(text(xw + 4, plot_bot - 4, f"W {fmt_num(run['measuredWindowSeconds'])} s", 10, "start", C_W))
    out.append("</g>")
    return (plot_bot + 36) - top


def marker(j, x, y, size, color, cls=None, title=None):
    """A node's marker: a circle for the first node, a square for the second, a diamond after."""
    c = f' class="{cls}"' if cls else ""
    t = f"<title>{escape(title)}</title>" if title else ""
    if j % 3 == 0:
        return f'<circle{c} cx="{x:.1f}" cy="{y:.1f}" r="{size:.1f}" fill="{color}">{t}</circle>'
    if j % 3 == 1:
        return (f'<rect{c} x="{x - size:.1f}" y="{y - size:.1f}" width="{2 * size:.1f}" height="{2 * size:.1f}" '
                f'fill="{color}">{t}</rect>')
    return (f'<path{c} d="M{x:.1f},{y - size * 1.3:.1f} l{size * 1.3:.1f},{size * 1.3:.1f} '
            f'l-{size * 1.3:.1f},{size * 1.3:.1f} l-{size * 1.3:.1f},-{size * 1.3:.1f} z" fill="{color}">{t}</path>')


def inset_range(runs, raws):
    """One x range (seconds after a deletion) for every run's inset, so they compare."""
    hi, lo = 2.0, -0.5
    for run, raw in zip(runs, raws):
        offsets = run["failureOffsetsSeconds"]
        gts = [g["seconds"] for g in raw["groundtruth"] if g["seconds"] is not None]
        sleep = run["injectedSleepSeconds"] if run["protected"] else None
        hi = max([hi, (sleep or 0) + 1.0, (max(gts) + 0.5) if gts else 0] + ([max(offsets) + 0.3] if offsets else []))
        lo = min([lo] + ([min(offsets) - 0.3] if offsets else []))
    lo, hi = max(lo, -3.0), min(hi, 12.0)
    _, step = ticks(lo, hi, 6)
    return math.floor(lo / step) * step, math.ceil(hi / step) * step


def svg_inset(out, run, raw, title_y, strip_top, p_top, p_bot, sleep, xrange):
    offsets = run["failureOffsetsSeconds"]
    gts = [g["seconds"] for g in raw["groundtruth"] if g["seconds"] is not None]
    lo, hi = xrange
    xt, xstep = ticks(lo, hi, 6)

    def X(v):
        return INSET_X0 + (v - lo) / (hi - lo) * (INSET_X1 - INSET_X0)

    out.append(text(INSET_X0, title_y + 8, "failures around deletions, superimposed", 11, "start", "#333",
                    weight="bold"))
    # Ground-truth rug.
    sh = p_top - 4 - strip_top
    out.append(f'<rect x="{INSET_X0}" y="{strip_top}" width="{INSET_X1 - INSET_X0}" height="{sh:.1f}" '
               f'fill="#faf7fc"/>')
    shown = [v for v in gts if lo <= v <= hi]
    for v in shown:
        xx = X(v)
        out.append(f'<line x1="{xx:.1f}" y1="{strip_top + 1.5:.1f}" x2="{xx:.1f}" y2="{strip_top + sh - 1.5:.1f}" '
                   f'stroke="{C_GT}" stroke-width="1.2" stroke-opacity="0.55"/>')
    out.append(f'<rect x="{INSET_X0}" y="{p_top}" width="{INSET_X1 - INSET_X0}" height="{PLOT_H}" fill="#fff" '
               f'stroke="{C_AXIS}" stroke-width="0.8"/>')
    if sleep:
        out.append(f'<rect x="{X(0):.1f}" y="{p_top}" width="{X(min(sleep, hi)) - X(0):.1f}" height="{PLOT_H}" '
                   f'fill="{C_SLEEP}" fill-opacity="0.13"/>')
        out.append(text((X(0) + X(min(sleep, hi))) / 2, p_bot - 8, f"preStop sleep {fmt_num(sleep)} s", 10,
                        "middle", C_SLEEP))
    nb = int(round((hi - lo) / BIN_SECONDS))
    bins = [0] * max(nb, 1)
    outside = 0
    for v in offsets:
        b = int(math.floor((v - lo) / BIN_SECONDS + 1e-6))
        if 0 <= b < len(bins):
            bins[b] += 1
        else:
            outside += 1
    yt, ystep = count_axis(max(bins) if offsets else 0, 4)
    ytop = yt[-1]

    def Y(v):
        return p_bot - v / ytop * PLOT_H

    left_axis(out, INSET_X0, INSET_X1, Y, yt, ytop, ystep, C_FAIL)
    for v in xt:
        xx = X(v)
        out.append(f'<line x1="{xx:.1f}" y1="{p_bot}" x2="{xx:.1f}" y2="{p_bot + 4}" stroke="{C_AXIS}"/>')
        out.append(text(xx, p_bot + 16, tick_label(v, xstep), 11, "middle", C_AXIS))
    out.append(text((INSET_X0 + INSET_X1) / 2, p_bot + 31, "seconds after the nearest deletion", 11, "middle",
                    C_AXIS))
    bw = (INSET_X1 - INSET_X0) * BIN_SECONDS / (hi - lo)
    for i, v in enumerate(bins):
        if v:
            out.append(f'<rect x="{INSET_X0 + i * bw + 0.3:.2f}" y="{Y(v):.1f}" width="{max(1.5, bw - 0.6):.2f}" '
                       f'height="{p_bot - Y(v):.1f}" fill="{C_FAIL}"/>')
    out.append(f'<line x1="{X(0):.1f}" y1="{strip_top}" x2="{X(0):.1f}" y2="{p_bot}" stroke="{C_DEL}" '
               f'stroke-width="1.2"/>')
    notes = []
    if not offsets:
        notes.append("no failures")
    if outside:
        notes.append(f"{outside} failure(s) outside this range")
    if len(shown) < len(gts):
        notes.append(f"{len(gts) - len(shown)} removal(s) outside")
    for i, n in enumerate(notes):
        out.append(text(INSET_X1 - 6, p_top + 15 + 14 * i, n, 11, "end", "#777"))


def legend(out, y):
    items = [
        ("rect", C_OK, "ok requests per 100 ms (left axis)"),
        ("rect", C_FAIL, "failed requests per 100 ms (red right axis)"),
        ("line", C_DEL, "pod deletion"),
        ("band", C_SLEEP, "injected preStop sleep"),
        ("diamond", C_GT, "IP removed from a node's kube-proxy rules"),
        ("tri", C_ROLL, "rollout start / duration"),
        ("dot", C_NODES[0], "a pod's window on a node (line: back to the last read with its IP)"),
        ("dash", C_W, "measured W"),
    ]
    x = MAIN_X0 - 60
    row = 0
    for kind, color, label in items:
        wdt = 22 + text_width(label, 12) + 20
        if x + wdt > WIDTH - 10:
            x = MAIN_X0 - 60
            row += 1
        yy = y + row * 20
        if kind == "rect":
            out.append(f'<rect x="{x}" y="{yy - 9}" width="14" height="11" fill="{color}"/>')
        elif kind == "band":
            out.append(f'<rect x="{x}" y="{yy - 10}" width="14" height="13" fill="{color}" fill-opacity="0.2"/>')
        elif kind == "line":
            out.append(f'<line x1="{x + 7}" y1="{yy - 11}" x2="{x + 7}" y2="{yy + 4}" stroke="{color}" '
                       f'stroke-width="1.2"/>')
        elif kind == "diamond":
            out.append(f'<line x1="{x - 2}" y1="{yy - 3.5}" x2="{x + 9}" y2="{yy - 3.5}" stroke="{color}" '
                       f'stroke-opacity="0.6"/>')
            out.append(f'<path d="M{x + 9},{yy - 8} l4.5,4.5 l-4.5,4.5 l-4.5,-4.5 z" fill="{color}"/>')
        elif kind == "tri":
            out.append(f'<path d="M{x + 7},{yy + 2} l-5,-9 h10 z" fill="{color}"/>')
        elif kind == "dot":
            out.append(f'<line x1="{x - 2}" y1="{yy - 3.5}" x2="{x + 9}" y2="{yy - 3.5}" stroke="{color}" '
                       f'stroke-opacity="0.6"/>')
            out.append(f'<circle cx="{x + 9}" cy="{yy - 3.5}" r="3.2" fill="{color}"/>')
        elif kind == "dash":
            out.append(f'<line x1="{x + 7}" y1="{yy - 11}" x2="{x + 7}" y2="{yy + 4}" stroke="{color}" '
                       f'stroke-width="1.2" stroke-dasharray="5,3"/>')
        out.append(text(x + 22, yy, label, 12, "start", "#333"))
        x += wdt
    return (row + 1) * 20


def left_axis(out, x0, x1, y_of, ticks, top, step, color):
    """A left y axis from x0: a tick and label per value in `ticks` (label colour `color`) and a
    grid line across to x1 for the values strictly between 0 and `top`."""
    for v in ticks:
        yy = y_of(v)
        if 0 < v < top:
            out.append(f'<line x1="{x0}" y1="{yy:.1f}" x2="{x1}" y2="{yy:.1f}" stroke="{C_GRID}"/>')
        out.append(f'<line x1="{x0 - 4}" y1="{yy:.1f}" x2="{x0}" y2="{yy:.1f}" stroke="{color}"/>')
        out.append(text(x0 - 7, yy + 4, tick_label(v, step), 11, "end", color))


def render_svg(runs, raws, generated):
    body = []
    y = 12
    body.append(text(MAIN_X0 - 60, y + 16, "Connection errors during rolling restarts", 18, weight="bold"))
    body.append(text(WIDTH - 16, y + 16, "generated " + time.strftime("%Y-%m-%d %H:%M:%S UTC",
                                                                       time.gmtime(generated)),
                     11, "end", "#777"))
    y += 42
    y += legend(body, y) + 12
    inset_x = inset_range(runs, raws)
    windows_x = windows_range(runs)
    for run, raw in zip(runs, raws):
        h = svg_panel(body, run, raw, y, inset_x, windows_x)
        y += h + 14
        body.append(f'<line x1="{MAIN_X0 - 60}" y1="{y - 12}" x2="{WIDTH - 16}" y2="{y - 12}" stroke="#ddd"/>')
    height = int(y + 4)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}" font-family="{FONT}">\n'
            f'<rect width="100%" height="100%" fill="#fff"/>\n')
    return head + "\n".join(body) + "\n</svg>\n"


# ---------------------------------------------------------------- main


def by_mode(by_node, node_modes):
    """Failures per proxy mode from failures per node and meta.json's `nodeModes` (node -> mode);
    None when the run does not say which node ran which mode."""
    if not isinstance(node_modes, dict):
        return None
    out = {}
    for node, n in by_node.items():
        mode = node_modes.get(node)
        if isinstance(mode, str):
            out[mode] = out.get(mode, 0) + n
    return dict(sorted(out.items()))


def add_scale_bounds(runs):
    """Adds `maxGroundTruthAtScaleSeconds` to every run and `sleepBoundAtScale` to protected runs.

    The ground truth (deletion -> IP gone from a node's rules) is a property of the cluster at a
    given number of Services, whether or not the pods were protected; the largest window observed
    at the same `extraServices` over all runs is the one the injected sleep is held to:
    sleep <= max(3 s, 2 x that window). The per-run `sleepBound` stays alongside.
    """
    by_scale = {}
    for r in runs:
        if r["maxGroundTruthSeconds"] is not None:
            k = r["extraServices"]
            by_scale[k] = max(by_scale.get(k, 0.0), r["maxGroundTruthSeconds"])
    for r in runs:
        at_scale = by_scale.get(r["extraServices"])
        r["maxGroundTruthAtScaleSeconds"] = at_scale
        if r["protected"]:
            limit = r3(max(3.0, 2 * at_scale)) if at_scale is not None else 3.0
            # the API takes a native preStop sleep in whole seconds: the least sleep that can
            # honour "2 x the window" is that, rounded up
            whole = max(3, math.ceil(round(2 * at_scale, 6))) if at_scale is not None else 3
            sleep = r["injectedSleepSeconds"]
            r["sleepBoundAtScale"] = {
                "limitSeconds": limit,
                "ok": None if sleep is None else bool(sleep <= limit),
                "wholeSecondLimitSeconds": whole,
                "okInWholeSeconds": None if sleep is None else bool(sleep <= whole),
            }
        else:
            r["sleepBoundAtScale"] = None


def run_report(outdir):
    runs_dir = os.path.join(outdir, "runs")
    if not os.path.isdir(runs_dir):
        raise Malformed(runs_dir, None, "no such directory (expected OUTDIR/runs/<run>/)")
    dirs = sorted(d for d in os.listdir(runs_dir) if os.path.isdir(os.path.join(runs_dir, d)))
    if not dirs:
        raise Malformed(runs_dir, None, "no run directories")
    loaded = [load_run(os.path.join(runs_dir, d)) for d in dirs]
    loaded.sort(key=lambda rr: sort_key(rr[0]["order"], rr[0]["name"]))
    names = [r["name"] for r, _ in loaded]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        warn(f"run name(s) used more than once: {', '.join(dup)}")
    runs = [r for r, _ in loaded]
    raws = [raw for _, raw in loaded]
    add_scale_bounds(runs)
    generated = time.time()

    json_path = os.path.abspath(os.path.join(outdir, "results.json"))
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump({"generatedAtUnix": round(generated, 3), "runs": runs}, f, indent=2)
        f.write("\n")
    tbl = table(runs)
    with open(os.path.join(outdir, "results.md"), "w", encoding="utf-8") as f:
        f.write("# Connection errors during rolling restarts\n\n" + tbl)
    with open(os.path.join(outdir, "results.svg"), "w", encoding="utf-8") as f:
        f.write(render_svg(runs, raws, generated))
    sys.stdout.write(tbl)
    print(json_path)


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(f"usage: {PROG} OUTDIR   (reads OUTDIR/runs/<run>/, writes OUTDIR/results.{{json,md,svg}})",
              file=sys.stderr)
        return 0 if len(argv) == 2 else 2
    try:
        run_report(argv[1])
    except Malformed as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"{PROG}: error: {e.filename or ''}: {e.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
