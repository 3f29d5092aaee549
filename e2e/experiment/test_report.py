"""Tests for report.py: python3 -m unittest e2e/experiment/test_report.py"""

import csv
import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "report.py")
SVG_NS = "{http://www.w3.org/2000/svg}"


def import_here(name):
    """The module `name` of this folder (compare_windows, plane_windows), imported by path."""
    sys.path.insert(0, HERE)
    try:
        return __import__(name)
    finally:
        sys.path.remove(HERE)
T0 = 1764600000.0


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def make_run(outdir, dirname, meta, nodes=("node-a", "node-b"), rate=100, seconds=30,
             deletions=(), failures=(), groundtruth=None, write=("meta", "load", "deletions", "groundtruth", "conntrack"),
             sleeps=None, grace=None, old_format=False):
    """A synthetic run.

    deletions: [(pod, deleted_at_offset_from_T0)]
    failures: [(node, deletion index, offset seconds, outcome)] - the request
        scheduled at deletion time + offset on that node fails.
    groundtruth: [(pod, node, seconds after deletion or None)], optionally a
        fourth item: seconds after deletion of the last read that still showed
        the IP (default: 50 ms before the removal, node-a's poll cadence).
    sleeps: {pod: preStop sleep seconds} (deletions.csv's sleep_seconds);
    grace: every pod's terminationGracePeriodSeconds.
    old_format: the CSV columns before per-pod sleeps and read bounds.
    Each failed request gets source port 20000 + its index, and conntrack-<node>.txt a NEW
    entry for it towards the pod of its deletion index (a new connection to a deleted pod)."""
    d = os.path.join(outdir, "runs", dirname)
    os.makedirs(d)
    if "meta" in write:
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(meta, f)
    del_at = [(pod, T0 + t) for pod, t in deletions]
    if "load" in write:
        fail_at = {}
        for node, di, off, outcome in failures:
            fail_at[(node, round((del_at[di][1] + off - T0 - 1) * rate))] = (outcome, di)
        for node in nodes:
            rows, events = [], []
            for i in range(rate * seconds):
                t = T0 + 1 + i / rate
                outcome, di = fail_at.get((node, i), ("ok", None))
                if outcome == "ok":
                    rows.append([f"{t:.3f}", "1.25", "ok", f"web-{i % 3}", "", str(40000 + i % 20000), "0"])
                else:
                    rows.append([f"{t:.3f}", "0.4", outcome, "", "connect: connection refused, errno 111", str(20000 + i), "0"])
                    events.append(f"[{t + 0.0001:.6f}]\t    [NEW] tcp      6 120 SYN_SENT src=10.213.0.2 dst=10.96.0.9 "
                                  f"sport={20000 + i} dport=80 [UNREPLIED] src=10.0.0.{di + 10} dst=10.213.0.2 "
                                  f"sport=8080 dport={20000 + i}")
            write_csv(os.path.join(d, f"load-{node}.csv"),
                      ["t_unix_seconds", "latency_ms", "outcome", "pod", "detail", "local_port", "reused"], rows)
            if "conntrack" in write:
                with open(os.path.join(d, f"conntrack-{node}.txt"), "w") as f:
                    f.write("\n".join(events + ["conntrack v1.4.7 (conntrack-tools): 0 flow events have been shown."]) + "\n")
    sleeps = sleeps or {}
    if "deletions" in write:
        if old_format:
            write_csv(os.path.join(d, "deletions.csv"), ["pod", "ip", "node", "deleted_at_unix"],
                      [[pod, f"10.0.0.{i + 10}", "node-a", f"{t:.3f}"] for i, (pod, t) in enumerate(del_at)])
        else:
            write_csv(os.path.join(d, "deletions.csv"),
                      ["pod", "ip", "node", "deleted_at_unix", "sleep_seconds", "grace_seconds"],
                      [[pod, f"10.0.0.{i + 10}", "node-a", f"{t:.3f}", sleeps.get(pod, ""),
                        "" if grace is None else grace] for i, (pod, t) in enumerate(del_at)])
    if "groundtruth" in write and groundtruth is not None:
        at = dict(del_at)
        ips = {pod: f"10.0.0.{i + 10}" for i, (pod, _) in enumerate(del_at)}
        rows = []
        for g in groundtruth:
            pod, node, sec = g[:3]
            removed = "" if sec is None else f"{at.get(pod, T0) + sec:.3f}"
            if old_format:
                rows.append([pod, ips.get(pod, "10.9.9.9"), node, removed])
                continue
            lower = g[3] if len(g) > 3 else (None if sec is None else sec - 0.05)
            present = "" if lower is None else f"{at.get(pod, T0) + lower:.3f}"
            rows.append([pod, ips.get(pod, "10.9.9.9"), node, removed, present,
                         "poll" if node == "node-a" else "monitor"])
        header = ["pod", "ip", "proxy_node", "removed_at_unix"]
        if not old_format:
            header += ["last_present_at_unix", "reader"]
        write_csv(os.path.join(d, "groundtruth.csv"), header, rows)
    return d


def meta(name, order, protected, sleep=None, window=None, extra=0, kind=None, failed_reads=None):
    return {
        "histogramKind": kind, "failedReads": failed_reads,
        "name": name, "order": order, "protected": protected, "proxyModes": ["iptables-nft", "nftables"],
        "extraServices": extra, "replicas": 3, "ratePerNodePerSecond": 100, "timeoutMs": 1000,
        "startedAtUnix": T0, "finishedAtUnix": T0 + 32,
        "rollouts": [{"index": 1, "maxSurge": "25%", "maxUnavailable": "0", "startedAtUnix": T0 + 4.5,
                      "finishedAtUnix": T0 + 22}],
        "injectedSleepSeconds": sleep, "terminationGracePeriodSeconds": 30 if protected else None,
        "measuredWindowSeconds": window, "operatorWindowDetail": {"p99": window} if window else None,
        # the protected run carries W from the same scrapes both ways; the baseline none
        **({"windowFromScrapes": {"nativeWindowSeconds": 1.162, "classicWindowSeconds": 1.254,
                                  "nodes": {"node-a": {"nativeWindowBeforeSeconds": 1.7}, "node-b": {"nativeWindowBeforeSeconds": 1.3},
                                            "node-c": {"nativeWindowBeforeSeconds": None}}}} if protected else {}),
    }


DELETIONS = [("web-old-1", 5.0), ("web-old-2", 12.0), ("web-old-3", 20.0)]
BASELINE_FAILURES = [("node-a", 0, 0.2, "refused"), ("node-a", 0, 0.5, "refused"), ("node-b", 1, 0.35, "refused"),
                     ("node-a", 2, 0.65, "refused"), ("node-b", 2, 0.8, "refused")]
BASELINE_GT = [("web-old-1", "node-a", 0.9), ("web-old-1", "node-b", 1.0), ("web-old-2", "node-a", 1.2),
               ("web-old-2", "node-b", 1.1), ("web-old-3", "node-a", 0.95), ("web-old-3", "node-b", 1.3)]
PROTECTED_GT = [(pod, node, s) for (pod, _), s0 in zip(DELETIONS, (0.8, 1.0, 0.9))
                for node, s in (("node-a", s0), ("node-b", 1.1 if pod == "web-old-2" else s0 + 0.05))]


def import_report():
    """report.py as a module, for its functions."""
    sys.path.insert(0, HERE)
    try:
        import report
    finally:
        sys.path.remove(HERE)
    return report


def run_report(outdir):
    return subprocess.run([sys.executable, REPORT, outdir], capture_output=True, text=True, timeout=120)


class TwoRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        out = cls.out = cls.tmp.name
        # Directory names sort the other way round from `order`.
        make_run(out, "z-baseline", meta("a-baseline", 1, False, window=1.4), deletions=DELETIONS,
                 failures=BASELINE_FAILURES, groundtruth=BASELINE_GT)
        make_run(out, "a-protected", meta("b-protected", 2, True, sleep=3, window=1.4, kind="native",
                                          failed_reads={"node-a": 0, "node-b": 2}),
                 deletions=DELETIONS, groundtruth=PROTECTED_GT, sleeps={pod: 3 for pod, _ in DELETIONS}, grace=33)
        cls.proc = run_report(out)
        with open(os.path.join(out, "results.json")) as f:
            cls.results = json.load(f)
        cls.runs = {r["name"]: r for r in cls.results["runs"]}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_exit_zero_and_no_warnings(self):
        self.assertEqual(self.proc.returncode, 0, self.proc.stderr)
        self.assertEqual(self.proc.stderr, "")

    def test_order_field_sorts_runs(self):
        self.assertEqual([r["name"] for r in self.results["runs"]], ["a-baseline", "b-protected"])

    def test_required_keys(self):
        for r in self.results["runs"]:
            for k in ("name", "protected", "proxyModes", "extraServices", "requests", "failures",
                      "injectedSleepSeconds", "measuredWindowSeconds", "maxGroundTruthSeconds", "failureRate",
                      "failuresByOutcome", "failuresByNode", "rollouts", "deletedPods", "groundTruth",
                      "groundTruthP50Seconds", "failureOffsetsSeconds", "failureOffsetSummary", "sleepBound",
                      "requestsPerSecond"):
                self.assertIn(k, r)
        self.assertIsInstance(self.results["generatedAtUnix"], float)

    def test_baseline_numbers(self):
        r = self.runs["a-baseline"]
        self.assertIs(r["protected"], False)
        self.assertEqual(r["proxyModes"], ["iptables-nft", "nftables"])
        self.assertEqual(r["extraServices"], 0)
        self.assertEqual(r["requests"], 6000)
        self.assertEqual(r["failures"], 5)
        self.assertEqual(r["failuresByOutcome"], {"refused": 5})
        self.assertEqual(r["failuresByNode"], {"node-a": 3, "node-b": 2})
        self.assertAlmostEqual(r["failureRate"], 5 / 6000, places=12)
        self.assertEqual(r["maxGroundTruthSeconds"], 1.3)
        self.assertEqual(r["groundTruthP50Seconds"], 1.05)
        self.assertEqual(r["failureOffsetsSeconds"], [0.2, 0.5, 0.35, 0.65, 0.8])
        self.assertEqual(r["failureOffsetSummary"], {"min": 0.2, "p50": 0.5, "max": 0.8})
        self.assertIsNone(r["sleepBound"])
        self.assertIsNone(r["injectedSleepSeconds"])
        self.assertEqual(r["measuredWindowSeconds"], 1.4)
        self.assertEqual(r["deletedPods"], 3)
        self.assertEqual(r["requestsPerSecond"], 200.0)
        self.assertEqual(r["rollouts"], meta("x", 1, False)["rollouts"])
        self.assertEqual(r["groundTruth"][0], {"pod": "web-old-1", "ip": "10.0.0.10", "node": "node-a",
                                               "seconds": 0.9, "boundSeconds": [0.85, 0.9], "reader": "poll"})
        self.assertIsNone(r["histogramKind"])
        self.assertIsNone(r["podsUncovered"])
        self.assertEqual(r["failedMeasurements"], [])
        # no sleep in a baseline; each pod's slowest node
        self.assertEqual([(p["name"], p["sleepSeconds"], p["maxWindowSeconds"]) for p in r["pods"]],
                         [("web-old-1", None, 1.0), ("web-old-2", None, 1.2), ("web-old-3", None, 1.3)])
        self.assertEqual([(g["pod"], g["node"]) for g in r["groundTruth"]],
                         sorted((p, n) for p, n, _ in BASELINE_GT))

        # every synthetic failure is a new connection (its own conntrack entry) to the pod deleted
        # before it: the race
        self.assertEqual(r["failuresByCause"], {"race": 5, "pinned": 0, "liveSynDropped": 0, "keepAlive": 0, "other": 0, "notSent": 0, "notRace": 0, "unattributed": 0})
        self.assertEqual(r["failuresByCauseAndOutcome"], {"race": {"refused": 5}})

    def test_protected_numbers(self):
        r = self.runs["b-protected"]
        self.assertIs(r["protected"], True)
        self.assertEqual(r["requests"], 6000)
        self.assertEqual(r["failures"], 0)
        self.assertEqual(r["failureRate"], 0.0)
        self.assertEqual(r["failuresByOutcome"], {})
        self.assertEqual(r["failuresByNode"], {"node-a": 0, "node-b": 0})
        self.assertEqual(r["injectedSleepSeconds"], 3)
        self.assertEqual(r["maxGroundTruthSeconds"], 1.1)
        self.assertEqual(r["failureOffsetsSeconds"], [])
        self.assertEqual(r["failureOffsetSummary"], {"min": None, "p50": None, "max": None})
        # native histograms: the 2 x bound is the one tests/e2e_deploy.rs asserts
        self.assertEqual(r["sleepBound"], {"limitSeconds": 3.0, "ok": True, "asserted": True})

    def test_protected_pods(self):
        r = self.runs["b-protected"]
        self.assertEqual(r["histogramKind"], "native")
        self.assertEqual(r["failedReads"], {"node-a": 0, "node-b": 2})
        self.assertEqual(len(r["pods"]), 3)
        first = r["pods"][0]
        self.assertEqual(first["name"], "web-old-1")
        self.assertEqual(first["ip"], "10.0.0.10")
        self.assertAlmostEqual(first["deletedAt"], T0 + 5.0, places=6)
        self.assertEqual((first["sleepSeconds"], first["graceSeconds"]), (3, 33))
        self.assertIsInstance(first["sleepSeconds"], int)
        self.assertEqual(first["windowSeconds"], {"node-a": 0.8, "node-b": 0.85})
        self.assertEqual(first["windowBoundSeconds"], {"node-a": [0.75, 0.8], "node-b": [0.8, 0.85]})
        self.assertEqual(first["maxWindowSeconds"], 0.85)
        self.assertEqual(first["missingNodes"], [])
        self.assertEqual([p["maxWindowSeconds"] for p in r["pods"]], [0.85, 1.1, 0.95])
        # p99 of [0.85, 0.95, 1.1]: 0.95 + 0.98 x 0.15
        self.assertEqual((r["podWindowMinSeconds"], r["podWindowP99Seconds"], r["podWindowMaxSeconds"]),
                         (0.85, 1.097, 1.1))
        self.assertIs(r["wCoversP99"], True)
        self.assertEqual(r["failedMeasurements"], [])
        self.assertEqual(r["podsUncovered"], [])

    def test_stdout_table_and_last_line(self):
        lines = self.proc.stdout.rstrip("\n").split("\n")
        self.assertEqual(lines[-1], os.path.abspath(os.path.join(self.out, "results.json")))
        self.assertTrue(os.path.isabs(lines[-1]))
        rows = [line for line in lines if line.startswith("| a-baseline") or line.startswith("| b-protected")]
        self.assertEqual(len(rows), 2)
        self.assertIn("| 6000 | 5 | 0.083% | refused 5 | race 5 | 1.4 | – | 1.3 | 1 / 1.298 / 1.3 | yes | – | – / – / – | – |", rows[0])
        self.assertIn("| yes |", rows[1])
        self.assertIn("| 0.000% |", rows[1])
        self.assertIn("| 1.4 | 3 | 1.1 | 0.85 / 1.097 / 1.1 | yes | native | 1.162 / 1.254 / 1.7 | node-a 0, node-b 2 |", rows[1])
        # the per-pod table: deletion 5 s after the start, sleep, grace, each node's window and
        # bound, the slowest node, the verdict
        self.assertIn("| pod | deleted (s after start) | sleep (s) | grace (s) | node-a (s) | node-b (s) | "
                      "slowest (s) | sleep covers it |", self.proc.stdout)
        self.assertIn("| web-old-2 | 12.000 | 3 | 33 | 1 [0.95, 1] | 1.1 [1.05, 1.1] | 1.1 | yes |", self.proc.stdout)
        self.assertIn("| web-old-1 | 5.000 | – | – | 0.9 [0.85, 0.9] | 1 [0.95, 1] | 1 | – |", self.proc.stdout)
        self.assertIn("b-protected (W 1.4 s; p99 of the windows 1.097 s; W covers it: yes; histograms native; "
                      "failed reads node-a 0, node-b 2):", self.proc.stdout)
        self.assertIn("min +0.200 s, p50 +0.500 s, max +0.800 s", self.proc.stdout)
        with open(os.path.join(self.out, "results.md")) as f:
            md = f.read()
        self.assertIn(rows[0], md)
        self.assertIn(rows[1], md)

    def test_svg(self):
        tree = ET.parse(os.path.join(self.out, "results.svg"))
        root = tree.getroot()
        self.assertEqual(root.tag, SVG_NS + "svg")
        self.assertEqual(root.get("width"), "1200")
        panels = [g for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]
        self.assertEqual([p.get("data-run") for p in panels], ["a-baseline", "b-protected"])
        for p in panels:
            dels = [e for e in p.iter(SVG_NS + "line") if e.get("class") == "deletion"]
            self.assertEqual(len(dels), 3)
            gts = [e for e in p.iter(SVG_NS + "path") if e.get("class") == "groundtruth"]
            self.assertEqual(len(gts), 6)
            starts = [e for e in p.iter(SVG_NS + "path") if e.get("class") == "rollout-start"]
            self.assertEqual(len(starts), 1)
        bands = [[e for e in p.iter(SVG_NS + "rect") if e.get("class") == "sleep-band"] for p in panels]
        self.assertEqual([len(b) for b in bands], [0, 3])
        fails = [[e for e in p.iter(SVG_NS + "rect") if e.get("class") == "fail-bar"] for p in panels]
        self.assertEqual([len(f) for f in fails], [5, 0])
        # A single failure per bin is clearly visible: tall and wide enough.
        for e in fails[0]:
            self.assertGreaterEqual(float(e.get("height")), 20)
            self.assertGreaterEqual(float(e.get("width")), 2)
        # Each pod's windows: a marker per pod and node, its bound, the sleep per pod and the
        # run's largest, W.
        windows = [[g for g in p.iter(SVG_NS + "g") if g.get("class") == "windows"] for p in panels]
        self.assertEqual([[g.get("data-run") for g in w] for w in windows], [["a-baseline"], ["b-protected"]])
        for (w,) in windows:
            marks = [e for e in w.iter() if e.get("class") == "pod-window"]
            self.assertEqual(len(marks), 6)
            self.assertEqual(sorted({e.tag for e in marks}), [SVG_NS + "circle", SVG_NS + "rect"])
            self.assertEqual(len([e for e in w.iter(SVG_NS + "line") if e.get("class") == "window-bound"]), 6)
            self.assertEqual(len([e for e in w.iter(SVG_NS + "line") if e.get("class") == "w-line"]), 1)
        counts = [(len([e for e in w.iter(SVG_NS + "line") if e.get("class") == "pod-sleep"]),
                   len([e for e in w.iter(SVG_NS + "line") if e.get("class") == "sleep-line"])) for (w,) in windows]
        self.assertEqual(counts, [(0, 0), (3, 1)])
        # one x range for all runs, 0 .. 3.5 s (the 3 s sleep x 1.08, in 0.5 s steps): web-old-2's
        # node-b window 1.1 s at 1.1 / 3.5 of the axis, the sleep at 3 / 3.5
        (w,) = windows[1]
        rects = [e for e in w.iter(SVG_NS + "rect") if e.get("class") == "pod-window"]
        self.assertAlmostEqual(float(rects[1].get("x")) + float(rects[1].get("width")) / 2, 74 + 1.1 / 3.5 * 726,
                               delta=0.2)
        self.assertIn("web-old-2 on node-b: 1.1 s", rects[1].find(SVG_NS + "title").text)
        (line,) = [e for e in w.iter(SVG_NS + "line") if e.get("class") == "sleep-line"]
        self.assertAlmostEqual(float(line.get("x1")), 74 + 3 / 3.5 * 726, delta=0.2)
        # The deletion at T0+5 of a 32 s run sits 5/32 of the way along the x axis.
        xs = sorted(float(e.get("x1")) for e in panels[0].iter(SVG_NS + "line") if e.get("class") == "deletion")
        x0, x1 = 74, 800
        self.assertAlmostEqual(xs[0], x0 + 5 / 32 * (x1 - x0), delta=0.2)


class EdgeCases(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.out = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def results(self):
        with open(os.path.join(self.out, "results.json")) as f:
            return json.load(f)["runs"]

    def assert_malformed(self, proc, path, line):
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertIn(path, proc.stderr)
        if line is not None:
            self.assertIn(f"line {line}", proc.stderr)

    def append_line(self, path, line):
        with open(path, "a") as f:
            f.write(line + "\n")

    def test_malformed_number_in_load_csv(self):
        d = make_run(self.out, "a", meta("a", 1, False), seconds=1, deletions=DELETIONS[:1])
        path = os.path.join(d, "load-node-b.csv")
        with open(path) as f:
            lines = f.read().splitlines()
        lines[3] = "17646x00001.02,1.0,ok,web-0,,40001,0"
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        proc = run_report(self.out)
        self.assert_malformed(proc, path, 4)
        self.assertIn("t_unix_seconds", proc.stderr)
        self.assertEqual(proc.stdout, "")

    def test_wrong_field_count_and_unknown_outcome(self):
        d = make_run(self.out, "a", meta("a", 1, False), seconds=1, deletions=DELETIONS[:1])
        path = os.path.join(d, "deletions.csv")
        self.append_line(path, "web-x,10.0.0.99")
        self.assert_malformed(run_report(self.out), path, 3)
        with open(path, "w") as f:
            f.write("pod,ip,node,deleted_at_unix\nweb-x,10.0.0.9,node-a,1764600005\n")
        path = os.path.join(d, "load-node-a.csv")
        self.append_line(path, "1764600002.5,3,maybe,,,40002,0")
        proc = run_report(self.out)
        self.assert_malformed(proc, path, 102)
        self.assertIn("maybe", proc.stderr)

    def test_quoted_csv_fields_and_bad_quote(self):
        d = make_run(self.out, "a", meta("a", 1, False), seconds=1, deletions=DELETIONS[:1])
        path = os.path.join(d, "load-node-a.csv")
        self.append_line(path, '1764600002.5,,reset,,"read: connection reset by peer, ""x""",40003,0')
        proc = run_report(self.out)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.results()[0]["failuresByOutcome"], {"reset": 1})
        self.append_line(path, '1764600002.6,1,ok,web-0,"unterminated,40004,0')
        self.assert_malformed(run_report(self.out), path, 103)

    def test_bad_header(self):
        d = make_run(self.out, "a", meta("a", 1, False), seconds=1, deletions=DELETIONS[:1], groundtruth=[])
        path = os.path.join(d, "groundtruth.csv")
        with open(path, "w") as f:
            f.write("pod,ip,node,removed\n")
        proc = run_report(self.out)
        self.assert_malformed(proc, path, 1)
        self.assertIn("proxy_node", proc.stderr)

    def test_malformed_meta_json(self):
        d = make_run(self.out, "a", meta("a", 1, False), seconds=1)
        path = os.path.join(d, "meta.json")
        with open(path, "w") as f:
            f.write('{\n  "name": "a",\n  "protected": nope\n}\n')
        self.assert_malformed(run_report(self.out), path, 3)
        with open(path, "w") as f:
            json.dump({"name": "a", "extraServices": "many"}, f)
        proc = run_report(self.out)
        self.assert_malformed(proc, path, None)
        self.assertIn("extraServices", proc.stderr)

    def test_missing_files_warn(self):
        make_run(self.out, "a", meta("a", 1, True, sleep=3), seconds=2, write=("meta", "load"))
        make_run(self.out, "b", {}, seconds=1, write=("deletions",), deletions=DELETIONS[:1])
        proc = run_report(self.out)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("warning: run a: no deletions.csv", proc.stderr)
        self.assertIn("warning: run a: no groundtruth.csv", proc.stderr)
        self.assertIn("warning: run b: no meta.json", proc.stderr)
        self.assertIn("warning: run b: no load-<node>.csv", proc.stderr)
        a, b = self.results()
        self.assertEqual((a["name"], a["requests"], a["failures"], a["deletedPods"]), ("a", 400, 0, 0))
        self.assertIsNone(a["maxGroundTruthSeconds"])
        self.assertEqual(a["sleepBound"], {"limitSeconds": 3.0, "ok": True, "asserted": False})
        self.assertEqual((b["name"], b["requests"], b["deletedPods"], b["protected"]), ("b", 0, 1, False))
        self.assertIsNone(b["failureRate"])
        self.assertIsNone(b["requestsPerSecond"])
        root = ET.parse(os.path.join(self.out, "results.svg")).getroot()
        self.assertEqual(len([g for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]), 2)

    def test_offsets_nearest_deletion_signed_and_never_removed(self):
        fails = [("node-a", 1, -0.3, "timeout"), ("node-a", 0, 2.0, "reset"), ("node-b", 0, 4.0, "reset"),
                 ("node-b", 1, 1.0, "unreachable")]
        gt = [("web-old-1", "node-a", 1.5), ("web-old-1", "node-b", None), ("web-old-2", "node-a", 0.7),
              ("web-old-9", "node-a", 0.1)]
        make_run(self.out, "a", meta("slow", 1, True, sleep=5), deletions=DELETIONS, failures=fails,
                 groundtruth=gt)
        proc = run_report(self.out)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("never left", proc.stderr)
        self.assertIn("web-old-9", proc.stderr)
        (r,) = self.results()
        # deletions at +5, +12, +20: 7.0 -> +2.0 after 5; 9.0 -> -3.0 before 12; 11.7 -> -0.3; 13.0 -> +1.0
        self.assertEqual(r["failureOffsetsSeconds"], [2.0, -3.0, -0.3, 1.0])
        self.assertEqual(r["failureOffsetSummary"], {"min": -3.0, "p50": 0.35, "max": 2.0})
        self.assertEqual(r["failuresByOutcome"], {"reset": 2, "timeout": 1, "unreachable": 1})
        self.assertEqual(r["maxGroundTruthSeconds"], 1.5)
        self.assertEqual(r["groundTruthP50Seconds"], 1.1)
        self.assertEqual([g["seconds"] for g in r["groundTruth"]], [1.5, None, 0.7])
        # 5 s > max(3, 2 * 1.5)
        self.assertEqual(r["sleepBound"], {"limitSeconds": 3.0, "ok": False, "asserted": False})
        self.assertIn("for information (not a check): above 2 x this run's largest window, 3 s", proc.stdout)

    def test_sleep_bound_uses_twice_ground_truth(self):
        make_run(self.out, "a", meta("a", 1, True, sleep=4), seconds=10, deletions=DELETIONS[:1],
                 groundtruth=[("web-old-1", "node-a", 2.25)])
        self.assertEqual(run_report(self.out).returncode, 0)
        self.assertEqual(self.results()[0]["sleepBound"], {"limitSeconds": 4.5, "ok": True, "asserted": False})

    def test_failed_measurements_and_uncovered_pods(self):
        # web-old-1 never seen removed on node-b, web-old-2 has no node-b row, web-old-3 stayed
        # 1.5 s on node-a against a 1 s sleep
        gt = [("web-old-1", "node-a", 0.5), ("web-old-1", "node-b", None), ("web-old-2", "node-a", 0.7),
              ("web-old-3", "node-a", 1.5, 1.2), ("web-old-3", "node-b", 0.9)]
        make_run(self.out, "a", meta("p", 1, True, sleep=3, window=1.0, kind="classic",
                                     failed_reads={"node-a": 0, "node-b": 7}),
                 deletions=DELETIONS, groundtruth=gt, sleeps={"web-old-1": 3, "web-old-2": 3, "web-old-3": 1})
        proc = run_report(self.out)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("2 pod(s) never seen removed by a successful read on some node", proc.stderr)
        (r,) = self.results()
        self.assertEqual(r["failedMeasurements"], ["web-old-1", "web-old-2"])
        pods = {p["name"]: p for p in r["pods"]}
        self.assertEqual(pods["web-old-1"]["windowSeconds"], {"node-a": 0.5, "node-b": None})
        self.assertEqual(pods["web-old-1"]["missingNodes"], ["node-b"])
        self.assertIsNone(pods["web-old-1"]["maxWindowSeconds"])
        self.assertEqual(pods["web-old-2"]["missingNodes"], ["node-b"])
        self.assertEqual(pods["web-old-3"]["windowBoundSeconds"], {"node-a": [1.2, 1.5], "node-b": [0.85, 0.9]})
        self.assertEqual(r["podsUncovered"], ["web-old-3"])
        # only web-old-3 has a window on every node: p99 1.5 > W 1.0
        self.assertEqual(r["podWindowP99Seconds"], 1.5)
        self.assertIs(r["wCoversP99"], False)
        self.assertEqual(r["sleepBound"]["asserted"], False)
        self.assertIn("FAILED MEASUREMENTS (no successful read without the IP): web-old-1, web-old-2", proc.stdout)
        self.assertIn("| web-old-3 | 20.000 | 1 | – | 1.5 [1.2, 1.5] | 0.9 [0.85, 0.9] | 1.5 | **no** |", proc.stdout)
        self.assertIn("| web-old-1 | 5.000 | 3 | – | 0.5 [0.45, 0.5] | never seen removed | – | – |", proc.stdout)
        root = ET.parse(os.path.join(self.out, "results.svg")).getroot()
        missing = [e for e in root.iter(SVG_NS + "text") if e.get("class") == "missing-window"]
        self.assertEqual([e.text for e in missing], ["web-old-1: never seen removed on node-b",
                                                     "web-old-2: never seen removed on node-b"])

    def test_columns_of_older_runs_are_optional(self):
        make_run(self.out, "a", meta("a", 1, True, sleep=3), deletions=DELETIONS[:1], seconds=2,
                 groundtruth=[("web-old-1", "node-a", 0.9)], old_format=True)
        proc = run_report(self.out)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        (r,) = self.results()
        (p,) = r["pods"]
        self.assertEqual((p["sleepSeconds"], p["graceSeconds"], p["windowSeconds"], p["windowBoundSeconds"]),
                         (None, None, {"node-a": 0.9}, {}))
        self.assertEqual(r["podsUncovered"], ["web-old-1"])
        self.assertIsNone(r["histogramKind"])
        self.assertEqual(r["groundTruth"][0]["boundSeconds"], None)

    def test_malformed_bound_and_histogram_kind(self):
        d = make_run(self.out, "a", meta("a", 1, False), seconds=1, deletions=DELETIONS[:1],
                     groundtruth=[("web-old-1", "node-a", 0.9, 1.2)])
        path = os.path.join(d, "groundtruth.csv")
        proc = run_report(self.out)
        self.assert_malformed(proc, path, 2)
        self.assertIn("last_present_at_unix", proc.stderr)
        write_csv(path, ["pod", "ip", "proxy_node", "removed_at_unix", "last_present_at_unix", "reader"], [])
        with open(os.path.join(d, "meta.json"), "w") as f:
            json.dump(dict(meta("a", 1, False), histogramKind="exponential"), f)
        proc = run_report(self.out)
        self.assert_malformed(proc, os.path.join(d, "meta.json"), None)
        self.assertIn("histogramKind", proc.stderr)

    def test_runs_without_order_sort_by_name_after_ordered(self):
        for dirname, name, order in (("1", "zeta", 1), ("2", "beta", None), ("3", "alpha", None)):
            m = meta(name, order, False)
            if order is None:
                del m["order"]
            make_run(self.out, dirname, m, seconds=1)
        self.assertEqual(run_report(self.out).returncode, 0)
        self.assertEqual([r["name"] for r in self.results()], ["zeta", "alpha", "beta"])

    def test_no_runs_dir(self):
        proc = run_report(self.out)
        self.assertEqual(proc.returncode, 2)
        self.assertIn("runs", proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)


class Percentile(unittest.TestCase):
    def test_linear_interpolation(self):
        report = import_report()
        self.assertIsNone(report.percentile([], 0.5))
        self.assertEqual(report.percentile([3], 0.5), 3)
        self.assertEqual(report.percentile([4, 1, 3, 2], 0.5), 2.5)
        self.assertEqual(report.percentile([1, 2, 3, 4, 5], 1.0), 5)




class FailuresByCause(unittest.TestCase):
    """classify_failures: each failed request's cause from its port and the node's conntrack events."""

    def test_each_cause(self):
        report = import_report()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "conntrack-node-a.txt")
            line = "[{t}]\t    [{kind}] tcp      6 120 SYN_SENT src=10.213.0.2 dst=10.96.0.9 sport={p} dport=80 [UNREPLIED] src={ip} dst=10.213.0.2 sport=8080 dport={p}\n"
            with open(path, "w") as f:
                for t, kind, p, ip in [(100.0, "NEW", 1, "10.0.0.10"),   # own entry, pod deleted at 99
                                       (100.0, "NEW", 2, "10.0.0.11"),   # own entry, pod in its sleep
                                       (101.0, "NEW", 3, "10.0.0.12"),   # own entry, live pod
                                       (50.0, "NEW", 4, "10.0.0.12"),    # an earlier attempt's entry...
                                       (110.0, "DESTROY", 4, "10.0.0.12"),  # ...destroyed after the request
                                       (50.0, "NEW", 5, "10.0.0.12"),    # destroyed before the request
                                       (60.0, "DESTROY", 5, "10.0.0.12"),
                                       (101.0, "NEW", 6, "10.0.0.12")]:
                    f.write(line.format(t=t, kind=kind, p=p, ip=ip))
                f.write("conntrack v1.4.7 (conntrack-tools): 8 flow events have been shown.\n")
            ct = {"node-a": report.read_conntrack(path)}
        self.assertEqual(ct["node-a"][4], [(50.0, "NEW", "10.0.0.12"), (110.0, "DESTROY", "10.0.0.12")])
        deletions = {"old-1": ("10.0.0.10", "node-a", 99.0), "old-2": ("10.0.0.11", "node-a", 99.0)}
        pod_info = {"old-1": {"sleep": None}, "old-2": {"sleep": 3}}
        req = lambda t, outcome, port, node="node-a": {"t": t, "outcome": outcome, "node": node, "latencySeconds": 1.0, "port": port}
        failed = [req(100.0, "refused", 1), req(100.0, "timeout", 2), req(101.0, "timeout", 3), req(100.5, "timeout", 4),
                  req(100.5, "timeout", 5), req(101.0, "reset", 6), req(100.0, "timeout", None), req(100.0, "timeout", 1, "node-b"),
                  dict(req(102.0, "empty", 7), reused=True)]
        got = report.classify_failures(failed, ct, deletions, pod_info)
        # 1: race; 2: the pod sleeps until 102 (live), timed out; 3: live, timed out; 4: pinned by
        # the entry of 50 s; 5: its earlier entry was gone, and no own entry: unattributed; 6:
        # live, reset: other; no port, and no conntrack for node-b: unattributed
        # and a request on a reused keep-alive connection: keepAlive
        self.assertEqual(got["counts"], {"race": 1, "pinned": 1, "liveSynDropped": 2, "keepAlive": 1, "other": 1, "notSent": 0, "notRace": 0, "unattributed": 3})
        self.assertEqual(got["byOutcome"], {"race": {"refused": 1}, "pinned": {"timeout": 1}, "liveSynDropped": {"timeout": 2},
                                            "keepAlive": {"empty": 1}, "other": {"reset": 1}, "unattributed": {"timeout": 3}})

    def test_the_ground_truth_rules_the_race_out_of_an_unrecorded_failure(self):
        report = import_report()
        # old-1 stopped at 99 (no sleep) and left node-a's rules at 100.2, node-b's never seen;
        # old-2 sleeps until 102 and left both at 100.5: only old-1 on node-a [99, 100.2] and on
        # node-b [99, inf) can take a connection it does not serve
        deletions = {"old-1": ("10.0.0.10", "node-a", 99.0), "old-2": ("10.0.0.11", "node-a", 99.0)}
        pod_info = {"old-1": {"sleep": None}, "old-2": {"sleep": 3}}
        gt = [{"pod": "old-1", "node": "node-a", "_removed": 100.2}, {"pod": "old-2", "node": "node-a", "_removed": 100.5},
              {"pod": "old-1", "node": "node-b", "_removed": None}, {"pod": "old-2", "node": "node-b", "_removed": 100.5}]
        spans = report.race_spans(deletions, pod_info, gt, ["node-a", "node-b"])
        self.assertEqual(spans, {"node-a": [(99.0, 100.2)], "node-b": [(99.0, float("inf"))]})
        req = lambda t, node, port=9: {"t": t, "outcome": "timeout", "node": node, "latencySeconds": 1.0, "port": port}
        # node-a at 101.5 (span ended at 100.2), with or without a port: notRace; node-a at
        # 99.5: may be the race; node-b (never seen removed) and node-c (no ground truth):
        # unattributed; never sent (the load generator overloaded), on any node: notSent
        failed = [req(101.5, "node-a"), req(99.5, "node-a"), req(101.5, "node-b"), req(101.5, "node-c"), req(101.5, "node-a", None),
                  dict(req(99.5, "node-b", 0), notSent=True)]
        got = report.classify_failures(failed, {}, deletions, pod_info, spans=spans)
        self.assertEqual((got["counts"]["notRace"], got["counts"]["notSent"], got["counts"]["unattributed"]), (2, 1, 3))
        self.assertEqual(got["unattributedByNode"], {"node-a": 1, "node-b": 1, "node-c": 1})
        # without a ground truth, as before
        self.assertEqual(report.classify_failures(failed, {}, deletions, pod_info)["counts"]["unattributed"], 5)


class RaceRules(unittest.TestCase):
    """The two ways a race failure hid in `other`: a load generator that sends behind its
    schedule, and a deletion the test's watch records after the app already exited."""

    def conntrack(self, report, tmp, entries):
        path = os.path.join(tmp, "conntrack-node-a.txt")
        line = "[{t}]\t    [NEW] tcp      6 120 SYN_SENT src=10.213.0.2 dst=10.96.0.9 sport={p} dport=80 [UNREPLIED] src={ip} dst=10.213.0.2 sport=8080 dport={p}\n"
        with open(path, "w") as f:
            for t, p, ip in entries:
                f.write(line.format(t=t, p=p, ip=ip))
        return {"node-a": report.read_conntrack(path)}

    def test_a_syn_sent_after_the_stop_is_the_race_whatever_the_schedule(self):
        report = import_report()
        with tempfile.TemporaryDirectory() as tmp:
            # scheduled at 10.00, the lagging generator sent the SYN at 10.13; the pod (no
            # sleep) was deleted at 10.05 and its app exited at once: refused
            ct = self.conntrack(report, tmp, [(10.13, 1, "10.0.0.10"), (10.13, 2, "10.0.0.11")])
        deletions = {"old": ("10.0.0.10", "node-a", 10.05)}
        failed = [{"t": 10.0, "outcome": "refused", "node": "node-a", "latencySeconds": 0.2, "port": 1},
                  {"t": 10.0, "outcome": "refused", "node": "node-a", "latencySeconds": 0.2, "port": 2}]
        got = report.classify_failures(failed, ct, deletions, {"old": {"sleep": None}})
        self.assertEqual(got["counts"]["race"], 1)
        # the other went to a pod never deleted: `other`, with its evidence
        self.assertEqual(got["counts"]["other"], 1)
        self.assertEqual(got["otherEvidence"], [{"node": "node-a", "port": 2, "scheduledAt": 10.0, "synAt": 10.13,
                                                 "podIp": "10.0.0.11", "podStoppedAt": None, "outcome": "refused"}])

    def test_a_refusal_just_before_the_recorded_deletion_is_the_race(self):
        report = import_report()
        with tempfile.TemporaryDirectory() as tmp:
            # the watch recorded the deletion at 20.11; the app had exited and refused a SYN at
            # 20.10 (10 ms before), and one at 19.5 (0.61 s before: a live pod's refusal)
            ct = self.conntrack(report, tmp, [(20.10, 1, "10.0.0.10"), (19.5, 2, "10.0.0.10")])
        deletions = {"old": ("10.0.0.10", "node-a", 20.11)}
        failed = [{"t": 20.10, "outcome": "refused", "node": "node-a", "latencySeconds": 0.01, "port": 1},
                  {"t": 19.5, "outcome": "refused", "node": "node-a", "latencySeconds": 0.01, "port": 2}]
        got = report.classify_failures(failed, ct, deletions, {"old": {"sleep": None}})
        self.assertEqual((got["counts"]["race"], got["counts"]["other"]), (1, 1))
        self.assertEqual(got["otherEvidence"][0]["podStoppedAt"], 20.11)
        # a protected pod (sleep 3 s) still serving at 20.10 is not the race
        got = report.classify_failures(failed, ct, deletions, {"old": {"sleep": 3}})
        self.assertEqual((got["counts"]["race"], got["counts"]["other"]), (0, 2))


class Coverage(unittest.TestCase):
    """coverage: the operator's predicted share beside the share of windows within each pod's sleep."""

    def test_predicted_and_observed(self):
        report = import_report()
        pods = [
            {"sleepSeconds": 3, "windowSeconds": {"a": 1.0, "b": 3.5}, "maxWindowSeconds": 3.5},
            {"sleepSeconds": 3, "windowSeconds": {"a": 2.9, "b": 3.0}, "maxWindowSeconds": 3.0},
            {"sleepSeconds": 4, "windowSeconds": {"a": 3.2, "b": None}, "maxWindowSeconds": None},
            {"sleepSeconds": None, "windowSeconds": {"a": 9.0, "b": 9.0}, "maxWindowSeconds": 9.0},
        ]
        timeline = [{"coverageRatio": 0.9995, "coverageLowestNodeRatio": 0.999},
                    {"coverageRatio": 0.98, "coverageLowestNodeRatio": 0.97}, {"coverageRatio": None}, "junk"]
        c = report.coverage_comparison(pods, timeline)
        # 4 of 5 (pod, node) windows within the pod's sleep (3.5 > 3 is not); 1 of 2 pods whose
        # slowest node is known; the pod without a sleep is not counted
        self.assertEqual(c, {"predictedRatioMin": 0.98, "predictedRatioMean": 0.98975, "predictedLowestNodeRatioMin": 0.97,
                             "observedPairRatio": 0.8, "observedPodRatio": 0.5, "pairs": 5, "pods": 2})
        self.assertEqual(report.coverage_comparison(pods, None)["predictedRatioMin"], None)
        self.assertIsNone(report.coverage_comparison([{"sleepSeconds": None, "windowSeconds": {}, "maxWindowSeconds": None}], timeline))


class ByProxyMode(unittest.TestCase):
    """failuresByProxyMode: each node's failures under the mode meta.json's nodeModes gives it."""

    def test_failures_are_summed_per_mode(self):
        report = import_report()
        self.assertEqual(report.by_mode({"a": 3, "b": 5, "c": 1}, {"a": "iptables-nft", "b": "nftables", "c": "nftables"}),
                         {"iptables-nft": 3, "nftables": 6})
        self.assertEqual(report.by_mode({"a": 0}, {"a": "nftables"}), {"nftables": 0})
        self.assertIsNone(report.by_mode({"a": 3}, None))


if __name__ == "__main__":
    unittest.main()


class ScaleBounds(unittest.TestCase):
    """sleepBoundAtScale: the longest window at the same extraServices over all runs, and the
    same bound in the whole seconds a native sleep takes."""

    def test_whole_second_bound(self):
        report = import_report()
        runs = [
            {"extraServices": 4000, "maxGroundTruthSeconds": 1.849, "protected": False, "injectedSleepSeconds": None},
            {"extraServices": 4000, "maxGroundTruthSeconds": 1.2, "protected": True, "injectedSleepSeconds": 4},
            {"extraServices": 0, "maxGroundTruthSeconds": 1.1, "protected": True, "injectedSleepSeconds": 3},
        ]
        report.add_scale_bounds(runs)
        b = runs[1]["sleepBoundAtScale"]
        self.assertEqual(runs[1]["maxGroundTruthAtScaleSeconds"], 1.849)
        self.assertEqual((b["limitSeconds"], b["ok"]), (3.698, False))
        self.assertEqual((b["wholeSecondLimitSeconds"], b["okInWholeSeconds"]), (4, True))
        b = runs[2]["sleepBoundAtScale"]
        self.assertEqual((b["limitSeconds"], b["ok"], b["wholeSecondLimitSeconds"], b["okInWholeSeconds"]), (3.0, True, 3, True))
        self.assertIsNone(runs[0]["sleepBoundAtScale"])


class CompareWindows(unittest.TestCase):
    """compare_windows.py: W before and after the control plane's part against the per-pod p99."""

    def test_table_marks_which_w_covers_the_p99_and_the_picture_is_svg(self):
        compare_windows = import_here("compare_windows")
        results = {"runs": [{"name": "b-protected", "extraServices": 0, "podWindowP99Seconds": 1.085, "podWindowMaxSeconds": 1.123,
                             "controlPlaneLag": {"p99Seconds": 0.102, "correlation": -0.128},
                             "windowFromScrapes": {"nativeSeconds": 1.054, "nativeWithLagSeconds": 1.089, "nativeSumOfP99sSeconds": None}}]}
        rs = compare_windows.rows(results)
        row = compare_windows.table(rs).splitlines()[2]
        self.assertEqual(row, "| b-protected | 0 | 1.085 / 1.123 | 0.102 | -0.13 | 1.054 ✗ | 1.089 ✓ | – |")
        import xml.dom.minidom
        doc = xml.dom.minidom.parseString(compare_windows.svg(rs))
        self.assertEqual(len(doc.getElementsByTagName("rect")), 1 + 2 + 3)  # background, two bars, legend
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(compare_windows.main(["x", os.path.join(tmp, "missing.json"), os.path.join(tmp, "o.svg")]), 1)


class PlaneWindows(unittest.TestCase):
    """e2e/experiment/plane_windows.py: the bars stand at the given figures, and bad input is
    refused."""

    RUN = {"services": 0, "planes": {"iptables-nft": {"removals": 24, "p50": 0.066, "p99": 1.032, "max": 1.044, "p99_early": 0.982},
                                     "cilium": {"removals": 24, "p50": 0.325, "p99": 0.569, "max": 0.570, "p99_early": 0.341}}}

    def test_bars_at_the_figures(self):
        plane_windows = import_here("plane_windows")
        text = plane_windows.svg([self.RUN])
        self.assertTrue(text.startswith("<svg") and text.rstrip().endswith("</svg>"))
        # axis 0-1.5 s over 230 px, bottom at 330 - 60: a p99 of 1.032 s is a bar 158.2 px high
        self.assertIn('height="158.2" fill="#4c78a8" fill-opacity="0.35"', text)
        self.assertIn(">0.57</text>", text)
        self.assertNotIn("nftables</text>", text, "a plane not in the run is not drawn")

    def test_bad_input_is_refused(self):
        plane_windows = import_here("plane_windows")
        with self.assertRaises(ValueError):
            plane_windows.svg([])
        with self.assertRaises(ValueError):
            plane_windows.svg([{"services": 0, "planes": {"ipvs": {"removals": 1, "p50": 1, "p99": 1, "max": 1}}}])
        bad = json.loads(json.dumps(self.RUN))
        bad["planes"]["cilium"]["p50"] = -1
        with self.assertRaises(ValueError):
            plane_windows.svg([bad])
