"""Captures native-histogram-answers.json: the answers of a real Prometheus to /api/v1/query.

Run with a Prometheus (3.16, `make k8s-bins`) on 127.0.0.1:PORT that scrapes every second, with
`scrape_native_histograms: true` and `always_scrape_classic_histograms: true` in `global`,
  - job kube-proxy: a static file server on 127.0.0.1 answering every GET with
    tests/data/metrics/kube-proxy-v1.37.2-idle-node-a.pb and `Content-Type:
    application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited`,
    target labelled `node: node-a`;
  - job prometheus: itself (its `prometheus_http_request_duration_seconds` is a native
    histogram with bucket factor 1.1 too, with many more observations),
after a few hundred queries to it. Usage: python3 capture.py PORT > native-histogram-answers.json
Every query is evaluated at the same `time`.
"""
import json, sys, time, urllib.parse, urllib.request

port = int(sys.argv[1])
at = round(time.time() - 2, 3)
KP = "kubeproxy_sync_proxy_rules_duration_seconds"
SELF = 'prometheus_http_request_duration_seconds{handler="/api/v1/query"}'
INC = 'increase(prometheus_http_request_duration_seconds{handler="/metrics"}[30s])'
queries = [
    KP,
    f"sum by (node, instance) ({KP})",
    f"sum by (node, instance, le) ({KP}_bucket)",
    f"sum by (node, instance) (increase({KP}[60s]))",
    "sum by (node, instance) (increase(kubeproxy_network_programming_duration_seconds[60s]))",
    SELF,
    INC,
]
for q in [0.5, 0.9, 0.99]:
    queries += [f"histogram_quantile({q}, sum by (node, instance) ({KP}))", f"histogram_quantile({q}, {SELF})", f"histogram_quantile({q}, {INC})"]
answers = []
for q in queries:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": at})
    answers.append({"query": q, "answer": json.load(urllib.request.urlopen(url))})
build = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/status/buildinfo"))["data"]
json.dump({"prometheus": build["version"], "time": at, "answers": answers}, sys.stdout, indent=1)
print()
