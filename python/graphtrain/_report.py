"""The HTML report of `graphtrain-stats compare`: one self-contained file (no network, no files
beside it). A heatmap of the divergence score, tensors in dump order (forward, then backward,
then parameter gradients) against steps, on a log colour scale with the first divergence marked;
clicking a cell plots that tensor's statistics in both runs over the steps, with axes and values.
"""

from __future__ import annotations

import html
import json
import math
import os
from typing import Any

# The page's script: builds the heatmap and the detail plots from the JSON in #data. Plain DOM
# and SVG, nothing fetched.
_SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const NS = 'http://www.w3.org/2000/svg';
function el(tag, attrs, parent, text) {
  const e = tag.startsWith('svg:') ? document.createElementNS(NS, tag.slice(4))
                                   : document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}
// log10 of the score from 1e-3 (blue, far inside the tolerance) to 1e3 (dark red); 1 is the
// tolerance, drawn white-yellow.
function colour(s) {
  if (s === null) return '#eeeeee';
  if (s === 'inf') return '#4a0000';
  const t = Math.max(-3, Math.min(3, Math.log10(Math.max(s, 1e-30))));
  const rgb = (r, g, b) => `rgb(${Math.round(r)},${Math.round(g)},${Math.round(b)})`;
  if (t <= 0) { const a = (t + 3) / 3; return rgb(40 + 215 * a, 90 + 160 * a, 200 + 30 * a); }
  const a = t / 3;
  return rgb(250 - 120 * a, 220 - 220 * a, 120 - 120 * a);
}
function fmt(v) {
  if (v === null) return 'n/a';
  if (!isFinite(v)) return String(v);
  return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : v.toPrecision(5);
}
function heatmap() {
  const table = document.getElementById('heatmap');
  const head = el('tr', {}, table);
  el('th', {}, head, 'tensor \\ step');
  D.steps.forEach(s => el('th', {class: 'step'}, head, String(s)));
  D.rows.forEach((row, r) => {
    const tr = el('tr', {}, table);
    const th = el('th', {class: 'name', title: row.tensor}, tr);
    th.textContent = `${row.direction === 'forward' ? '\u2192' : '\u2190'} ${row.module} ${row.label}`;
    D.steps.forEach((s, c) => {
      const score = row.scores[c];
      const td = el('td', {class: 'cell', 'data-row': r, 'data-step': s,
                           title: `step ${s}, ${row.tensor}: score ${fmt(score)}`}, tr);
      td.style.background = colour(score);
      if (D.first && D.first.row === r && D.first.step === s) {
        td.classList.add('first'); td.id = 'first-divergence';
      }
      td.addEventListener('click', () => detail(r, c));
    });
  });
}
function plot(parent, title, steps, a, b, mark) {
  const W = 330, H = 170, L = 62, R = 8, T = 18, B = 28;
  const svg = el('svg:svg', {width: W, height: H, class: 'plot'}, parent);
  el('svg:text', {x: L, y: 12, 'font-size': 12, 'font-weight': 'bold'}, svg, title);
  const vals = a.concat(b).filter(v => v !== null && isFinite(v));
  if (!vals.length) { el('svg:text', {x: L, y: H / 2}, svg, 'no finite values'); return; }
  let lo = Math.min(...vals), hi = Math.max(...vals);
  if (hi === lo) { const d = Math.abs(hi) * 1e-6 || 1; lo -= d; hi += d; }
  const s0 = steps[0], s1 = steps[steps.length - 1];
  const x = s => L + (W - L - R) * (s1 > s0 ? (s - s0) / (s1 - s0) : 0.5);
  const y = v => T + (H - T - B) * (1 - (v - lo) / (hi - lo));
  el('svg:line', {x1: L, x2: L, y1: T, y2: H - B, stroke: '#444'}, svg);
  el('svg:line', {x1: L, x2: W - R, y1: H - B, y2: H - B, stroke: '#444'}, svg);
  [lo, (lo + hi) / 2, hi].forEach(v => {
    el('svg:line', {x1: L - 4, x2: W - R, y1: y(v), y2: y(v), stroke: '#ddd'}, svg);
    el('svg:text', {x: L - 6, y: y(v) + 4, 'text-anchor': 'end', 'font-size': 10}, svg, fmt(v));
  });
  steps.forEach(s => el('svg:text', {x: x(s), y: H - B + 14, 'text-anchor': 'middle',
                                     'font-size': 10}, svg, String(s)));
  el('svg:text', {x: (L + W - R) / 2, y: H - 2, 'text-anchor': 'middle', 'font-size': 10}, svg,
     'step');
  if (mark !== null) el('svg:line', {x1: x(mark), x2: x(mark), y1: T, y2: H - B,
                                     stroke: '#d62728', 'stroke-dasharray': '3 2'}, svg);
  [[a, '#1f77b4', ''], [b, '#ff7f0e', '5 3']].forEach(([vs, colour, dash]) => {
    const pts = steps.map((s, i) => [s, vs[i]]).filter(p => p[1] !== null && isFinite(p[1]));
    el('svg:polyline', {fill: 'none', stroke: colour, 'stroke-width': 2, 'stroke-dasharray': dash,
                        points: pts.map(p => `${x(p[0])},${y(p[1])}`).join(' ')}, svg);
    pts.forEach(p => el('svg:circle', {cx: x(p[0]), cy: y(p[1]), r: 2.5, fill: colour}, svg));
  });
}
function detail(r, c) {
  const row = D.rows[r], box = document.getElementById('detail');
  box.innerHTML = '';
  document.querySelectorAll('td.selected').forEach(td => td.classList.remove('selected'));
  const step = D.steps[c];
  document.querySelector(`td[data-row="${r}"][data-step="${step}"]`).classList.add('selected');
  el('h3', {}, box, `${row.tensor} (module ${row.module}, ${row.direction})`);
  const v = row.verdicts[c];
  el('p', {}, box, v ? `step ${step}: score ${fmt(v[0])}, from ${v[1]}: ` +
                       `baseline ${fmt(v[2])}, candidate ${fmt(v[3])}`
                     : `step ${step}: not in both runs`);
  const plots = el('div', {class: 'plots'}, box);
  ['mean', 'std', 'min', 'max'].forEach(k =>
    plot(plots, k, D.steps, row.stats[k][0], row.stats[k][1], D.steps[c]));
  const logs = row.scores.map(s => s === null ? null : s === 'inf' ? 3 : Math.log10(Math.max(s, 1e-30)));
  plot(plots, 'score (log10)', D.steps, logs, row.scores.map(() => null), step);
}
heatmap();
if (D.first) detail(D.first.row, D.steps.indexOf(D.first.step));
document.querySelectorAll('.swatch').forEach(s => s.style.background =
  colour(Math.pow(10, Number(s.dataset.exp))));
document.body.dataset.rendered = '1';
"""

_STYLE = """
body{font-family:sans-serif;margin:20px;color:#222}
table#heatmap{border-collapse:collapse;font-size:11px}
th.name{text-align:left;font-weight:normal;white-space:nowrap;padding-right:8px;max-width:480px;
overflow:hidden;text-overflow:ellipsis}
th.step{font-weight:normal;padding:0 2px}
td.cell{width:18px;height:14px;border:1px solid #fff;cursor:pointer}
td.first{outline:3px solid #000;outline-offset:-1px}
td.selected{outline:2px dashed #444;outline-offset:-2px}
.legend span{display:inline-block;width:38px;height:12px}
.plots svg{background:#fafafa;margin:4px;border:1px solid #eee}
#layout{display:flex;gap:16px;align-items:flex-start}
#detail{position:sticky;top:0;background:#fff;max-width:700px}
#detail h3{font-size:14px;margin:4px}
"""


def _json(v: float | None) -> float | str | None:
    """A number for the page's JSON, which has no infinity or NaN."""
    if v is None or math.isnan(v):
        return None
    return "inf" if math.isinf(v) else v


def write(
    path: str,
    rows: dict[str, dict[str, Any]],
    steps: list[int],
    first: dict[str, Any] | None,
    headline: str,
    baseline: str,
    candidate: str,
    tolerance: str,
) -> None:
    """Writes the report atomically. rows: compare's rows in dump order, each with "tensor",
    "module", "direction", "label" and per step "cells" (verdict, baseline record, candidate
    record); first: compare's first divergence (its "key" names the row)."""
    # Forward tensors, then backward, then parameter gradients, each in dump order.
    rank_of = {"forward": 0, "backward": 1, "parameter gradient": 2}
    ordered = sorted(rows.values(), key=lambda r: rank_of[r["direction"]])
    out = []
    for row in ordered:
        cells = [row["cells"].get(s) for s in steps]
        out.append(
            {
                **{k: row[k] for k in ("tensor", "module", "direction", "label")},
                "scores": [c and _json(c[0].score) for c in cells],
                "verdicts": [
                    c
                    and [
                        _json(c[0].score),
                        c[0].statistic,
                        _json(c[0].baseline),
                        _json(c[0].candidate),
                    ]
                    for c in cells
                ],
                "stats": {
                    k: [[c and _json(c[side][k]) for c in cells] for side in (1, 2)]
                    for k in ("mean", "std", "min", "max")
                },
            }
        )
    marked = None
    if first is not None:
        row = next(i for i, r in enumerate(ordered) if r["tensor"] == first["key"])
        marked = {"row": row, "step": first["step"]}
    data = {"steps": steps, "rows": out, "first": marked}
    payload = json.dumps(data).replace("</", "<\\/")
    legend = "".join(
        f"<span title='score 1e{e}' class='swatch' data-exp='{e}'></span>" for e in range(-3, 4)
    )
    doc = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>graphtrain-stats compare</title><style>{_STYLE}</style></head>
<body>
<h2>graphtrain-stats compare</h2>
<p>baseline <code>{html.escape(baseline)}</code> (blue, solid) against candidate
<code>{html.escape(candidate)}</code> (orange, dashed); {html.escape(tolerance)}.</p>
<p id="headline">{html.escape(headline)}</p>
<p class="legend">divergence score, log scale: 1e-3 {legend} 1e3 (above 1 diverges; black
outline: the first divergence; click a cell for its statistics over the steps)</p>
<div id="layout"><table id="heatmap"></table><div id="detail"></div></div>
<script type="application/json" id="data">{payload}</script>
<script>{_SCRIPT}</script>
</body></html>
"""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(doc)
    os.replace(tmp, path)
