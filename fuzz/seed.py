#!/usr/bin/env python3
"""Writes the seed inputs of every fuzz target into DIR/<target>/ (default target/fuzz-seeds),
from the real inputs in tests/data and ../shared/cases (when present) and a few hand-written
ones for the formats no file carries (Go durations, /configz, agent answers). The committed
corpora (fuzz/corpus/) are these seeds plus what the fuzzers found, minimised by libFuzzer
(`-merge=1`); fuzz/README.md has the commands.

Scrapes are cut into one seed per metric family (text: a `# HELP` block; protobuf: a
length-delimited message), so that seeds stay small and the fuzzer's inputs short."""
import json, os, pathlib, struct, sys

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ROOT / "target/fuzz-seeds")
DATA = [ROOT / "tests/data", ROOT.parent / "shared/cases"]


def write(target, name, data):
    d = OUT / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def files(sub, suffix):
    seen = {}
    for base in DATA:
        for p in sorted((base / sub).glob("*" + suffix)) if (base / sub).is_dir() else []:
            seen.setdefault(p.name, p)
    return list(seen.values())


def varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return v, i


# text scrapes: each family block, plus the small files whole
for p in files("metrics", ".txt"):
    text = p.read_text()
    if len(text) < 16384:
        write("text_parser", p.name, text)
    blocks, cur = [], []
    for line in text.splitlines(keepends=True):
        if line.startswith("# HELP ") and cur:
            blocks.append("".join(cur))
            cur = []
        cur.append(line)
    blocks.append("".join(cur))
    for n, b in enumerate(blocks):
        if "kubeproxy" in b or "iptables" in b or "nftables" in b or "build_info" in b or n % 10 == 0:
            write("text_parser", f"{p.stem}-{n}", b)

# protobuf scrapes: each message on its own, and our families together
for p in files("metrics", ".pb"):
    body = p.read_bytes()
    i, n, ours = 0, 0, b""
    while i < len(body):
        length, j = varint(body, i)
        msg = body[i : j + length]
        if b"kubeproxy" in msg or b"iptables" in msg or b"build_info" in msg or n % 10 == 0:
            write("protobuf", f"{p.stem}-{n}", msg)
        if b"kubeproxy_sync_proxy_rules_duration_seconds" in msg or b"network_programming" in msg:
            ours += msg
        i, n = j + length, n + 1
    write("protobuf", f"{p.stem}-ours", ours)

# native histograms, in the byte layout of checks.rs `Bytes::histogram`
for n, h in enumerate([
    bytes([7, 1, 0, 5, 3, 0, 250, 0, 40, 1, 0, 2, 0, 20, 2, 0, 0, 2, 0, 10, 0]),
    bytes([8, 0, 0, 0, 1, 0, 3, 0, 0, 7, 6, 0, 30, 0, 0, 2, 100, 8, 1, 0, 2, 0, 0, 50, 0, 0]),
    bytes([5, 4, 0, 1, 4, 0, 1, 0, 0, 2, 0, 2, 0, 0, 3, 0, 9, 0, 0, 0, 0, 0, 6, 1, 2, 0, 0, 8, 0, 0]),
    bytes([7, 1, 0, 0, 10, 0, 30, 0, 200, 0, 1, 0, 31, 0, 3, 0, 2, 0, 0, 0, 5, 0, 1, 0, 0, 0]),
    bytes([12, 3, 0, 9, 2, 0, 245, 0, 200, 1, 0, 2, 255, 0, 5, 3, 2, 0, 0, 0, 0, 1, 3, 1, 0, 0]),
]):
    write("native", f"seed-{n}", h + h)


def pods():
    out = []
    for p in files("pods", ".yaml"):
        text = p.read_text()
        write("mutate_yaml", p.name, text)
        for doc in yaml.safe_load_all(text):
            if not isinstance(doc, dict):
                continue
            kind = doc.get("kind")
            if kind == "Pod":
                out.append((p.stem, doc))
            elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
                t = doc["spec"]["template"]
                out.append((p.stem, {"apiVersion": "v1", "kind": "Pod", "metadata": t.get("metadata", {}), "spec": t["spec"]}))
            elif kind == "CronJob":
                t = doc["spec"]["jobTemplate"]["spec"]["template"]
                out.append((p.stem, {"apiVersion": "v1", "kind": "Pod", "metadata": t.get("metadata", {}), "spec": t["spec"]}))
    return out


# AdmissionReviews: the real ones, and one per pod template of the real workloads
for p in files("admission", ".json"):
    write("review", p.name, p.read_bytes())
for n, (stem, pod) in enumerate(pods()):
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"uid-{n}",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "namespace": "default",
            "object": pod,
        },
    }
    write("review", f"{stem}-{n}.json", json.dumps(review, separators=(",", ":")))
    write("mutate_yaml", f"{stem}-{n}.json", json.dumps(pod))

# kube-proxy configuration
configz = [
    '{"kubeproxy.config.k8s.io":{"Mode":"nftables","NFTables":{"MasqueradeBit":14},"MetricsBindAddress":"0.0.0.0:10249","SyncPeriod":"30s","MinSyncPeriod":"2s","ConfigSyncPeriod":"15m0s"}}',
    '{"kubeproxy.config.k8s.io":{"Mode":"ipvs","IPTables":{"MasqueradeBit":14,"SyncPeriod":"30s","MinSyncPeriod":"1s"},"IPVS":{"SyncPeriod":"30s","MinSyncPeriod":"0s","Scheduler":"rr"},"MetricsBindAddress":"127.0.0.1:10249"}}',
    '{"kubeproxy.config.k8s.io":{"ClientConnection":{"Kubeconfig":"/var/lib/kube-proxy/kubeconfig.conf"},"HostnameOverride":"node-a","MetricsBindAddress":"127.0.0.1:10249","Mode":"iptables","IPTables":{"MasqueradeBit":14},"SyncPeriod":"30s","MinSyncPeriod":"2s"}}',
    '{"mode":"nftables","nftables":{"minSyncPeriod":"2s","masqueradeBit":14},"clusterCIDR":"10.0.0.0/8"}',
    '{"kubeproxy.config.k8s.io":{"Mode":"kernelspace","SyncPeriod":"1m0s","MinSyncPeriod":"500ms"}}',
]
for n, c in enumerate(configz):
    write("configz", f"seed-{n}.json", c)
configmaps = [
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nbindAddress: 0.0.0.0\niptables:\n  masqueradeAll: false\n  masqueradeBit: 14\n  minSyncPeriod: 0s\n  syncPeriod: 30s\nmetricsBindAddress: 0.0.0.0:10249\nmode: \"iptables\"\n",
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\nipvs:\n  minSyncPeriod: 0s\n  syncPeriod: 30s\n  scheduler: rr\n",
    "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: nftables\nnftables:\n  minSyncPeriod: 1s\n  syncPeriod: 1h2m3.5s\nmetricsBindAddress: 127.0.0.1:10249\n",
    "kind: KubeProxyConfiguration\nmode: \"\"\nminSyncPeriod: 250ms\n",
] + configz[:2]
for n, c in enumerate(configmaps):
    write("configmap", f"seed-{n}.yaml", c)
for n, d in enumerate(["1s", "500ms", "1m0s", "2h45m", "1.5s", "-1s", "0", "1µs", "300us", "1h0m0.000000001s", "15m", "+2.s"]):
    write("go_duration", f"seed-{n}", d)

# TerminationPolicy specs
for p in sorted((ROOT / "config").glob("terminationpolicy-*.yaml")):
    doc = yaml.safe_load(p.read_text())
    write("policy_spec", p.stem + ".json", json.dumps(doc.get("spec") or {}))
write("policy_spec", "empty.json", "{}")
write("policy_spec", "exec.json", json.dumps({"mode": "Audit", "scope": "AllLongRunning", "preStop": {"handler": "Exec", "execImages": ["busybox*"], "minSeconds": 1, "maxSeconds": 5, "defaultSeconds": 3}, "grace": {"maxSeconds": 1}}))

# agent answers: status (2 bytes LE, minus 100), flags, headers, blank line, body
def answer(status, headers, body, flags=0):
    head = "".join(f"{k}: {v}\n" for k, v in headers)
    return struct.pack("<H", status - 100) + bytes([flags]) + head.encode() + b"\n" + body


small = (ROOT / "tests/data/metrics/kube-proxy-windows-truncated.txt").read_bytes()
write("agent_answer", "text", answer(200, [("content-type", "text/plain; version=0.0.4"), ("x-safe-termination-proxy-mode", "nftables")], small))
write("agent_answer", "protobuf", answer(200, [("content-type", "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited")], b""))
write("agent_answer", "openmetrics", answer(200, [("content-type", "application/openmetrics-text; version=1.0.0")], b"# EOF\n"))
write("agent_answer", "bad-gateway", answer(502, [("x-safe-termination-reason", "timeout")], b"kube-proxy: no answer in 5 s\n"))
write("agent_answer", "forbidden", answer(403, [], b"forbidden"))
write("agent_answer", "too-large", answer(200, [("content-type", "text/plain")], b"", flags=1))

# Cilium's load-balancer maps (checks.rs `cilium_lb`): [capacity/2 - 1] [pause ticks] records;
# host byte order as Cilium writes the counts and ids (this machine's: little-endian)
def lb_slot(slot, backend_id=0, count=0, qcount=0, flags2=0, tick=None):
    value = struct.pack("<IH", backend_id, count) + struct.pack(">H", 7) + bytes([0, flags2]) + struct.pack("<H", qcount)
    return (bytes([0]) if tick is None else bytes([2, tick])) + struct.pack("<H", slot) + value


def lb_backend(backend_id, ip, state=0, tick=None):
    value = bytes(int(x) for x in ip.split(".")) + struct.pack(">H", 8080) + bytes([6, state]) + struct.pack("<H", 0) + bytes([0, 0])
    return (bytes([1]) if tick is None else bytes([3, tick])) + struct.pack("<I", backend_id) + value


three = lb_backend(1, "10.244.1.5") + lb_backend(2, "10.244.2.4") + lb_backend(3, "10.244.1.4")
frontend3 = lb_slot(0, count=3) + lb_slot(1, 3) + lb_slot(2, 1) + lb_slot(3, 2)
write("cilium_lb", "three-active", bytes([127, 200]) + three + frontend3)
write("cilium_lb", "one-terminating", bytes([127, 200]) + lb_backend(1, "10.244.1.5", 1) + three[17:] + lb_slot(0, count=2, qcount=1) + lb_slot(1, 3) + lb_slot(2, 2) + lb_slot(3, 1))
# B terminating while the reader reads: Cilium's edits at ticks 2, 4, 6, 8 (slots, then master)
write("cilium_lb", "terminating-mid-read", bytes([127, 200]) + three + frontend3 + lb_backend(1, "10.244.1.5", 1, tick=2) + lb_slot(2, 2, tick=4) + lb_slot(3, 1, tick=6) + lb_slot(0, count=2, qcount=1, tick=8))
# a backend added first in the order (shifts the others up) while the reader reads
write("cilium_lb", "added-mid-read", bytes([127, 0]) + three[:34] + lb_slot(0, count=2) + lb_slot(1, 1) + lb_slot(2, 2) + lb_backend(4, "10.244.1.3", tick=3) + lb_slot(1, 4, tick=4) + lb_slot(2, 1, tick=9) + lb_slot(3, 2, tick=14) + lb_slot(0, count=3, tick=19))
# deleted from the EndpointSlice: the backend first, then its slot
write("cilium_lb", "deleted-mid-read", bytes([127, 200]) + three + frontend3 + bytes([5, 1]) + struct.pack("<I", 1) + lb_slot(2, 2, tick=3) + lb_slot(0, count=2, tick=5) + bytes([4, 7]) + struct.pack("<H", 3))
write("cilium_lb", "dangling-backend", bytes([127, 0]) + three[:34] + lb_slot(0, count=3) + lb_slot(1, 1) + lb_slot(2, 2) + lb_slot(3, 9))
write("cilium_lb", "count-past-capacity", bytes([3, 0]) + three + lb_slot(0, count=60000, qcount=5))
write("cilium_lb", "l7-proxy", bytes([127, 0]) + three + lb_slot(0, count=3, flags2=4) + frontend3[15:])
write("cilium_lb", "master-deleted", bytes([127, 0]) + three + frontend3 + bytes([4, 1]) + struct.pack("<H", 0))
