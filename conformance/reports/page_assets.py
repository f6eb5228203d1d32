"""The style of the kit's pages and the script of report.html, inlined into each page (the CSP
allows nothing else). Plain DOM calls, no framework: every text of the report goes in through
``textContent`` or ``setAttribute``, never parsed as HTML, so a message cannot inject markup."""

from __future__ import annotations

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1em 2em;color:#222}
h1{font-size:1.4em;margin:.2em 0}h2{font-size:1.15em;margin:1.2em 0 .4em}h3{font-size:1em;margin:1em 0 .3em}
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4}code,pre,.id{font-family:ui-monospace,monospace;font-size:12px}
pre{background:#f7f7f7;padding:6px;overflow-x:auto;white-space:pre-wrap}
.o{text-align:center;min-width:2.2em;font-weight:bold}
.passed,.xpassed{background:#cdeccd}.failed{background:#f5b5b5}.error{background:#d9c2f0}
.xfailed{background:#fbe3a6}.unsupported{background:#dcdcdc}.skipped{background:#eee}.none{background:#fff}
.warn{color:#a00;font-weight:bold}#filters select{margin:0 .6em .3em 0}#filters label{white-space:nowrap}
#runs td.o{white-space:nowrap}.num{text-align:right}.regression{color:#a00}.fix{color:#060}svg{background:#fff}
"""

REPORT_SCRIPT = r"""
"use strict";
const D = JSON.parse(document.getElementById("data").textContent);
const SHORT = {passed: "✓", failed: "✗", error: "E", xfailed: "x", unsupported: "U", skipped: "s", xpassed: "X"};
const HEADS = ["error", "stacks", "log tail"];

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "text") e.textContent = String(v); else e.setAttribute(k, String(v));
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}
function num(v) {
  if (typeof v !== "number") return String(v);
  return Number.isInteger(v) ? v.toLocaleString("en-US") : v.toPrecision(4);
}

// rows of the grid: one per cell (its items by area), one per item that is no cell's
const ROWS = new Map();
for (const item of D.items) {
  const key = item.cell || item.id;
  if (!ROWS.has(key)) ROWS.set(key, {key: key, axes: item.axes || null, items: {}});
  ROWS.get(key).items[item.cell ? item.area : "item"] = item;
}
const COLUMNS = D.items.some((i) => !i.cell) ? [...D.areas, "item"] : D.areas;

function parseHash() {
  const out = {};
  for (const part of location.hash.replace(/^#/, "").split("&")) {
    if (!part) continue;
    const at = part.indexOf("=");
    const key = decodeURIComponent(at < 0 ? part : part.slice(0, at));
    out[key] = at < 0 ? [] : decodeURIComponent(part.slice(at + 1)).split(",").filter((v) => v);
  }
  return out;
}
function hashOf(filters) {
  return Object.entries(filters).filter(([, v]) => v.length)
    .map(([k, v]) => encodeURIComponent(k) + "=" + v.map(encodeURIComponent).join(",")).join("&");
}

function matches(row, filters) {
  for (const axis of D.axes) {
    const want = filters[axis];
    if (!want || !want.length) continue;
    if (!row.axes || !want.includes(row.axes[axis])) return false;
  }
  const outcomes = filters.outcome;
  return !outcomes || !outcomes.length || Object.values(row.items).some((i) => outcomes.includes(i.outcome));
}

function header() {
  document.getElementById("title").textContent =
    "Thunder " + (D.thunder || "?") + " conformance (" + (D.profile || "?") + " profile)";
  // which failures are new and which an entry for other Thunder versions explains (a fork's triage)
  const note = (k) => (k === "failed" ? D.failures_note : "");
  const counts = Object.entries(D.counts).map(([k, n]) => n + " " + k + note(k)).join(", ");
  document.getElementById("run").textContent = "torch " + (D.torch || "?") + ", " + (D.backend || "?") + ", " +
    (D.world_size || "?") + " ranks, started " + (D.started || "?") + ": " + counts +
    " (exit status " + D.exit_status + ")";
  for (const w of D.warnings) document.querySelector("header").append(el("p", {class: "warn", text: "⚠ " + w}));
}

function filterBar(filters) {
  const bar = el("div", {id: "filters"});
  const values = {};
  for (const row of ROWS.values()) {
    if (!row.axes) continue;
    for (const a of D.axes) {
      values[a] = values[a] || new Map();
      values[a].set(row.axes[a], (values[a].get(row.axes[a]) || 0) + 1);
    }
  }
  const seen = new Set(D.items.map((i) => i.outcome));
  const axes = [...D.axes.filter((a) => values[a]), "outcome"];
  for (const axis of axes) {
    const options = axis === "outcome" ? D.outcomes.filter((o) => seen.has(o)).map((o) => [o, null])
      : [...values[axis].entries()].sort((x, y) => x[0] < y[0] ? -1 : 1);
    const select = el("select", {id: "f-" + axis, "data-axis": axis}, el("option", {value: "", text: "all"}));
    for (const [v, n] of options) select.append(el("option", {value: v, text: n === null ? v : v + " (" + n + ")"}));
    const want = filters[axis] || [];
    if (want.length > 1) select.append(el("option", {value: want.join(","), text: want.join(", ")}));
    select.value = want.join(",");
    select.addEventListener("change", () => {
      const next = parseHash();
      delete next.cell;
      next[axis] = select.value ? select.value.split(",") : [];
      location.hash = hashOf(next);
    });
    bar.append(el("label", {text: axis + " "}, select));
  }
  return bar;
}

function grid(filters) {
  const table = el("table", {id: "grid"});
  table.append(el("tr", {}, el("th", {text: "cell"}), ...COLUMNS.map((c) => el("th", {text: c}))));
  let rows = 0, items = 0;
  for (const row of ROWS.values()) {
    if (!matches(row, filters)) continue;
    rows += 1;
    const link = el("a", {href: "#cell=" + encodeURIComponent(row.key), class: "id", text: row.key,
      title: row.axes ? D.axes.map((a) => a + "=" + row.axes[a]).join(" ") : null});
    const tr = el("tr", {"data-row": row.key}, el("td", {}, link));
    for (const column of COLUMNS) {
      const item = row.items[column];
      if (!item) { tr.append(el("td", {class: "o none", text: "–"})); continue; }
      items += 1;
      const tip = item.outcome + (item.excuse ? ": " + item.excuse : "");
      tr.append(el("td", {class: "o " + item.outcome, "data-item": item.id, "data-outcome": item.outcome, title: tip},
        el("a", {href: "#cell=" + encodeURIComponent(row.key), text: SHORT[item.outcome] || item.outcome})));
    }
    table.append(tr);
  }
  const shown = el("p", {id: "shown", "data-rows": rows, "data-items": items,
    text: rows + " of " + ROWS.size + " rows, " + items + " of " + D.items.length + " items shown"});
  return [shown, table];
}

// a message's evidence sections (controller.Outcome.describe): "--- rank R: ... ---" then "[log tail]" etc.
function sections(message, title) {
  const out = [];
  let rank = null, head = null, lines = [];
  const flush = () => { if (head === title && lines.length) out.push([rank, lines.join("\n")]); lines = []; };
  for (const line of (message || "").split("\n")) {
    const r = /^--- rank (.*) ---$/.exec(line);
    const h = /^\[(.+)\]$/.exec(line);
    if (r) { flush(); rank = r[1]; head = null; } else if (h && HEADS.includes(h[1])) { flush(); head = h[1]; }
    else if (line.startsWith("repro: ")) { flush(); head = null; } else lines.push(line);
  }
  flush();
  return out;
}

function valueText(v) {
  if (v === null || typeof v !== "object") return num(v);
  if (Array.isArray(v) && v.every((x) => x === null || typeof x !== "object")) return v.map(num).join(", ");
  if (!Array.isArray(v) && Object.values(v).every((x) => x === null || typeof x !== "object"))
    return Object.entries(v).map(([k, x]) => k + " " + num(x)).join(", ");
  if (Array.isArray(v)) return v.map((x, i) => i + ": " + valueText(x)).join("; ");
  return JSON.stringify(v);
}

function memoryTable(m) {
  const phases = Object.keys(m.measured || {});
  if (!phases.length) return null;
  const heads = ["phase", "measured (B)", "bound (B)", "bound / measured", "eager (B)"];
  const t = el("table", {class: "memory"}, el("tr", {}, ...heads.map((h) => el("th", {text: h}))));
  for (const p of phases) {
    const peak = m[p + " peak"] || {};
    const values = [m.measured[p], peak.bound, peak["bound / measured"], (m.eager || {})[p]];
    t.append(el("tr", {"data-phase": p}, el("td", {text: p}),
      ...values.map((v) => el("td", {class: "num", text: v === undefined ? "–" : num(v)}))));
  }
  return t;
}

function metricsOf(item) {
  const m = item.metrics || {};
  const box = el("div", {class: "metrics"});
  if (item.area === "memory") box.append(el("h4", {text: "memory per phase (rank 0)"}), memoryTable(m));
  const seq = m["collective sequence"];
  if (Array.isArray(seq)) {
    box.append(el("details", {}, el("summary", {text: "collective sequence (" + seq.length + ")"}),
      el("ol", {class: "sequence"}, ...seq.map((s) => el("li", {class: "id", text: s})))));
  }
  const apart = ["collective sequence", "timings", "cell_run_s", "world_start_s"];  // shown above
  const rest = Object.entries(m).filter(([k]) => !apart.includes(k));
  if (rest.length) {
    const t = el("table", {}, el("tr", {}, el("th", {text: "metric"}), el("th", {text: "value"})));
    for (const [k, v] of rest) t.append(el("tr", {}, el("td", {text: k}), el("td", {class: "id", text: valueText(v)})));
    box.append(el("details", {}, el("summary", {text: "metrics (" + rest.length + ")"}), t));
  }
  return box;
}

function cellView(key) {
  const row = ROWS.get(key);
  const main = [el("p", {}, el("a", {href: "#" + lastFilters, text: "← every cell"}))];
  if (!row) return [...main, el("p", {class: "warn", text: "no cell " + key + " in this report"})];
  main.push(el("h2", {id: "cell", class: "id", text: key}));
  if (row.axes) main.push(el("p", {text: D.axes.map((a) => a + "=" + row.axes[a]).join(", ")}));
  const any = Object.values(row.items)[0];
  const m = any.metrics || {};
  const times = Object.assign({cell_run_s: m.cell_run_s, world_start_s: m.world_start_s}, m.timings || {});
  main.push(el("p", {id: "timings", text: "timings (s): " + Object.entries(times).filter(([, v]) => v !== undefined)
    .map(([k, v]) => k + " " + num(v)).join(", ")}));
  for (const [area, item] of Object.entries(row.items)) {
    const sec = el("section", {"data-item": item.id, "data-outcome": item.outcome});
    sec.append(el("h3", {}, el("span", {class: "o " + item.outcome, text: " " + item.outcome + " "}), " " + area));
    if (item.excuse) sec.append(el("p", {class: "excuse", text: item.outcome + ": " + item.excuse}));
    if (item.xfail_reason && item.xfail_reason !== item.excuse) {
      sec.append(el("p", {class: "excuse", text: item.xfail_reason}));
    }
    for (const k of item.known_elsewhere || []) sec.append(el("p", {class: "warn", text: k.note}));
    const ranks = (item.ranks || []).filter((r) => r.status !== "passed" || (r.failures || []).length);
    if (ranks.length) {
      const heads = ["rank", "status", "findings"].map((h) => el("th", {text: h}));
      const t = el("table", {class: "findings"}, el("tr", {}, ...heads));
      for (const r of ranks) t.append(el("tr", {}, el("td", {text: r.rank}), el("td", {text: r.status}),
        el("td", {}, el("ul", {}, ...(r.failures || []).map((f) => el("li", {class: "finding id", text: f}))))));
      sec.append(t);
    }
    if (item.repro) sec.append(el("pre", {class: "repro", text: item.repro}));
    for (const [rank, tail] of sections(item.message, "log tail")) {
      sec.append(el("details", {open: ""}, el("summary", {text: "rank " + rank + ": log tail"}),
        el("pre", {class: "log", text: tail})));
    }
    if (item.message && item.outcome !== "unsupported")
      sec.append(el("details", {}, el("summary", {text: "message"}), el("pre", {text: item.message})));
    sec.append(metricsOf(item));
    main.push(sec);
  }
  return main;
}

let lastFilters = "";  // the grid's filters, for the way back from a cell

function render() {
  const filters = parseHash();
  const main = document.getElementById("main");
  main.replaceChildren();
  if (filters.cell) { main.append(...cellView(filters.cell.join(","))); window.scrollTo(0, 0); return; }
  lastFilters = location.hash.replace(/^#/, "");
  main.append(filterBar(filters), ...grid(filters));
}

header();
render();
window.addEventListener("hashchange", render);
"""
