#!/usr/bin/env python3
"""Draws the propagation window of each data plane side by side (docs/benchmarks/data-planes.md "Three data
planes"): for each number of extra Services, one group of bars per data plane, its p50 and p99
(the late end of each removal's read bound) and a tick at its max.

Input: a JSON file holding a list of runs, each
  {"services": 0, "planes": {"cilium": {"removals": 24, "p50": 0.325, "p99": 0.569, "max": 0.570,
   "p99_early": 0.341}, ...}}
in seconds, as tests/e2e_window.rs `three_data_planes_side_by_side` prints them. Output: an SVG.

  python3 e2e/experiment/plane_windows.py docs/img/data-planes.json docs/img/data-planes.svg
"""
import json
import sys

PLANES = ["iptables-nft", "nftables", "cilium"]
COLOURS = {"iptables-nft": "#4c78a8", "nftables": "#59a14f", "cilium": "#e15759"}


def svg(runs):
    """The SVG text for `runs` (see the module docstring); raises ValueError on a run without
    a known data plane or with a negative figure."""
    if not runs:
        raise ValueError("no runs")
    top = 0.0
    for r in runs:
        planes = [p for p in PLANES if p in r["planes"]]
        if not planes:
            raise ValueError(f"run at {r.get('services')} Services has none of {PLANES}")
        for p in planes:
            f = r["planes"][p]
            if min(f["p50"], f["p99"], f["max"]) < 0:
                raise ValueError(f"{p} at {r['services']} Services: a negative window")
            top = max(top, f["max"])
    top = max(0.5, (int(top * 2) + 1) / 2)  # the axis in half seconds
    w, h, left, bottom, plot_h = 120 + 260 * len(runs), 330, 60, 60, 230
    y = lambda s: h - bottom - s / top * plot_h  # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="{left}" y="18" font-size="14">Propagation window per data plane, one pod deleted at a time (seconds)</text>']
    t = 0.0
    while t <= top + 1e-9:
        out.append(f'<line x1="{left}" x2="{w - 20}" y1="{y(t):.1f}" y2="{y(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 8}" y="{y(t) + 4:.1f}" text-anchor="end">{t:.1f}</text>')
        t += 0.5
    for i, r in enumerate(runs):
        x0 = left + 20 + i * 260
        for j, p in enumerate(q for q in PLANES if q in r["planes"]):
            f, x = r["planes"][p], x0 + j * 75
            c = COLOURS[p]
            out.append(f'<rect x="{x}" y="{y(f["p99"]):.1f}" width="30" height="{y(0) - y(f["p99"]):.1f}" fill="{c}" fill-opacity="0.35"/>')
            out.append(f'<rect x="{x + 30}" y="{y(f["p50"]):.1f}" width="30" height="{y(0) - y(f["p50"]):.1f}" fill="{c}"/>')
            out.append(f'<line x1="{x}" x2="{x + 60}" y1="{y(f["max"]):.1f}" y2="{y(f["max"]):.1f}" stroke="{c}" stroke-width="2"/>')
            out.append(f'<text x="{x + 30}" y="{y(0) + 14:.1f}" text-anchor="middle">{p}</text>')
            out.append(f'<text x="{x + 30}" y="{y(f["p99"]) - 4:.1f}" text-anchor="middle" font-size="10">{f["p99"]:.2f}</text>')
        out.append(f'<text x="{x0 + 105}" y="{y(0) + 32:.1f}" text-anchor="middle" font-weight="bold">{r["services"]:,} extra Services</text>')
    out.append(f'<text x="{left}" y="{h - 8}" font-size="11">light bar: p99, dark bar: p50, line: max (late end of each read bound; {runs[0]["planes"][PLANES[0]]["removals"] if PLANES[0] in runs[0]["planes"] else "?"} removals per plane and run)</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as f:
        runs = json.load(f)
    with open(argv[2], "w", encoding="utf-8") as f:
        f.write(svg(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
