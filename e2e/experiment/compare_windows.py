#!/usr/bin/env python3
"""W against the per-pod truth, per run of an experiment's results.json: the per-pod windows
(p99 and max), and W over the run's own interval from the same scrapes without the control
plane's part ("before"), with it by convolution (what the operator computes), and with it as a
sum of the two p99s. Writes an SVG picture and prints the table (Markdown).

    python3 e2e/experiment/compare_windows.py target/experiment/results.json docs/img/control-plane-part.svg
"""
import json
import sys
from xml.sax.saxutils import escape

SERIES = (
    ("W before (kube-proxy only)", "nativeSeconds", "#9e9e9e"),
    ("W with the control plane's part, convolution", "nativeWithLagSeconds", "#1565c0"),
    ("W with it, sum of p99s", "nativeSumOfP99sSeconds", "#ef6c00"),
)


def rows(results):
    out = []
    for run in results.get("runs") or []:
        ws = run.get("windowFromScrapes") or {}
        lag = run.get("controlPlaneLag") or {}
        out.append({
            "name": run.get("name"),
            "services": run.get("extraServices"),
            "p99": run.get("podWindowP99Seconds"),
            "max": run.get("podWindowMaxSeconds"),
            "lagP99": lag.get("p99Seconds"),
            "corr": lag.get("correlation"),
            **{key: ws.get(key) for _, key, _ in SERIES},
        })
    return out


def fmt(v, digits=3):
    return "–" if v is None else f"{v:.{digits}f}"


def table(rs):
    lines = ["| run | extra Services | per-pod p99 / max (s) | control plane's part p99 (s) | correlation | "
             + " | ".join(f"{label} (s)" for label, _, _ in SERIES) + " |",
             "|---|---:|---:|---:|---:|" + "---:|" * len(SERIES)]
    for r in rs:
        cells = []
        for _, key, _ in SERIES:
            v = r[key]
            mark = "" if v is None or r["p99"] is None else (" ✓" if v >= r["p99"] else " ✗")
            cells.append(fmt(v) + mark)
        lines.append(f"| {r['name']} | {r['services']} | {fmt(r['p99'])} / {fmt(r['max'])} | {fmt(r['lagP99'])} | "
                     f"{fmt(r['corr'], 2)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def svg(rs):
    width, left, right, top, row_h, bar_h = 860, 150, 30, 50, 70, 14
    height = top + row_h * len(rs) + 45 + 18 * len(SERIES)
    top_value = max([v for r in rs for v in [r["p99"], r["max"]] + [r[k] for _, k, _ in SERIES] if v is not None] + [1.0])
    scale = (width - left - right) / (top_value * 1.05)
    x = lambda v: left + v * scale
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             '<rect width="100%" height="100%" fill="white"/>',
             '<text x="10" y="20" font-size="14">W over each run\'s own interval against the per-pod windows (black: p99, grey tick: max)</text>']
    step = 0.5 if top_value < 5 else 1.0
    t = 0.0
    while t <= top_value * 1.05:
        axis = top + row_h * len(rs)
        parts.append(f'<line x1="{x(t):.1f}" y1="{top - 10}" x2="{x(t):.1f}" y2="{axis}" stroke="#eee"/>')
        parts.append(f'<text x="{x(t):.1f}" y="{axis + 15}" text-anchor="middle">{t:g} s</text>')
        t += step
    for i, r in enumerate(rs):
        y0 = top + i * row_h
        parts.append(f'<text x="10" y="{y0 + 25}">{escape(str(r["name"]))}</text>')
        for j, (label, key, color) in enumerate(SERIES):
            v = r[key]
            if v is None:
                continue
            y = y0 + j * (bar_h + 2)
            parts.append(f'<rect x="{left}" y="{y}" width="{max(0.0, x(v) - left):.1f}" height="{bar_h}" fill="{color}"><title>{escape(label)}: {v:.3f} s</title></rect>')
        h = len(SERIES) * (bar_h + 2)
        if r["p99"] is not None:
            parts.append(f'<line x1="{x(r["p99"]):.1f}" y1="{y0 - 3}" x2="{x(r["p99"]):.1f}" y2="{y0 + h + 3}" stroke="black" stroke-width="2"/>')
        if r["max"] is not None:
            parts.append(f'<line x1="{x(r["max"]):.1f}" y1="{y0 - 3}" x2="{x(r["max"]):.1f}" y2="{y0 + h + 3}" stroke="#757575" stroke-dasharray="3,2"/>')
    for j, (label, _, color) in enumerate(SERIES):
        y = top + row_h * len(rs) + 30 + 18 * j
        parts.append(f'<rect x="{left}" y="{y}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{left + 16}" y="{y + 10}">{escape(label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        with open(argv[1]) as f:
            results = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{argv[1]}: {e}", file=sys.stderr)
        return 1
    rs = rows(results)
    with open(argv[2], "w") as f:
        f.write(svg(rs))
    print(table(rs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
