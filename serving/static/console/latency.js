// Latency over the shift: per-level TTFT/TPOT percentiles and SLO attainment per time
// bucket from the audit database (GET /audit/latency/series), as charts (uPlot, vendored)
// and as a table of the very same figures; the CSV link returns them too.
import {api, el, fromLocalInput, pct, say, scroll, table, toLocalInput, when} from "./common.js";

const RANGES = {hour: [3600, 300], shift: [8 * 3600, 1800], day: [24 * 3600, 3600]};
const COLORS = {1: "#a4161a", 2: "#c25e00", 3: "#8a7000", 4: "#1e6b33", 5: "#1f4e8c"};
const DASH = {1: [], 2: [8, 4], 3: [2, 3], 4: [10, 3, 2, 3], 5: [1, 6]};   // not colour alone
const charts = [];
window.__triageCharts = charts;   // the browser tests read what was drawn

export async function render(root) {
  const now = Math.floor(Date.now() / 1000);
  root.append(
    el("form", {id: "range-form", class: "bar", onsubmit: (ev) => { ev.preventDefault(); load(); }},
      el("label", {for: "range"}, "Range", el("select", {id: "range", onchange: rangeChanged},
        el("option", {value: "hour"}, "Last hour"), el("option", {value: "shift"}, "This shift (8 h)"),
        el("option", {value: "day"}, "Last 24 h"), el("option", {value: "custom"}, "Custom"))),
      el("label", {for: "since"}, "From (UTC)", el("input", {id: "since", type: "datetime-local", value: toLocalInput(now - 3600), disabled: true})),
      el("label", {for: "until"}, "Until (UTC)", el("input", {id: "until", type: "datetime-local", value: toLocalInput(now), disabled: true})),
      el("label", {for: "bucket"}, "Bucket (s)", el("input", {id: "bucket", type: "number", min: "1", step: "1", value: "300", size: "6"})),
      el("label", {for: "pctl"}, "Percentile", el("select", {id: "pctl"},
        el("option", {value: "p50"}, "p50"), el("option", {value: "p95", selected: true}, "p95"), el("option", {value: "p99"}, "p99"))),
      el("button", {type: "submit", id: "apply", class: "primary"}, "Show")),
    el("p", {class: "note", id: "range-note"}),
    el("div", {class: "charts", id: "charts"}),
    el("h2", {}, "Figures per bucket and level ", el("a", {id: "csv", href: "#"}, "(download CSV)")),
    scroll("Latency figures", el("div", {id: "series-table"})),
  );
  await load();
}

function rangeChanged() {
  const r = document.getElementById("range").value;
  const custom = r === "custom";
  document.getElementById("since").disabled = !custom;
  document.getElementById("until").disabled = !custom;
  if (!custom) document.getElementById("bucket").value = String(RANGES[r][1]);
}

function window_() {
  const r = document.getElementById("range").value;
  const bucket = Number(document.getElementById("bucket").value) || 300;
  if (r === "custom") {
    return [fromLocalInput(document.getElementById("since").value), fromLocalInput(document.getElementById("until").value), bucket];
  }
  const until = Math.ceil(Date.now() / 1000);
  return [until - RANGES[r][0], until, bucket];
}

async function load() {
  const [since, until, bucket] = window_();
  if (!since || !until || until <= since) { say("Give a range whose end is after its start.", "error"); return; }
  const q = new URLSearchParams({since, until, bucket_s: bucket});
  let s;
  try { s = await api("/audit/latency/series?" + q); } catch (e) { say(e.message, "error"); return; }
  document.getElementById("csv").href = "/audit/latency/series?" + q + "&format=csv";
  document.getElementById("range-note").textContent =
    `${s.requests} requests from ${when(s.since)} to ${when(s.until)} in buckets of ${s.bucket_s} s (by arrival; effective level).`;
  const pctl = document.getElementById("pctl").value;
  drawCharts(s, pctl);
  drawTable(s);
}

function drawCharts(s, pctl) {
  const box = document.getElementById("charts");
  for (const c of charts.splice(0)) c.plot.destroy();
  box.replaceChildren();
  const xs = s.series.map(b => b.start);
  const specs = [
    [`ttft_${pctl}`, `TTFT ${pctl} (s) by level`, v => v],
    [`tpot_${pctl}`, `TPOT ${pctl} (s) by level`, v => v],
    ["slo_attainment", "SLO attainment by level (share of requests)", v => v],
    ["shed_errored", "Shed + aborted + errored requests by level", null],
  ];
  // lay out every chart's cell first, then size each plot to its cell
  const cells = specs.map(([key, title]) => {
    const fig = el("figure", {"aria-label": title + " (the same figures are in the table below)"}, el("figcaption", {}, title));
    const div = el("div", {class: "plot", dataset: {metric: key}});
    fig.append(div);
    box.append(el("div", {class: "chart"}, fig));
    return [key, fig, div];
  });
  for (const [key, fig, div] of cells) {
    const data = [xs];
    const series = [{label: "time (UTC)"}];
    for (const lv of s.levels) {
      data.push(s.series.map(b => {
        const g = b.groups.find(x => x.level === lv);
        if (!g) return null;
        return key === "shed_errored" ? g.shed + g.aborted + (g.errored || 0) : g[key];
      }));
      series.push({label: `L${lv}`, stroke: COLORS[lv] || "#333", dash: DASH[lv] || [], width: 2, points: {show: true, size: 6},
                   spanGaps: false});
    }
    const width = Math.max(260, Math.floor(fig.getBoundingClientRect().width) - 4);   // the grid cell's width
    const plot = new uPlot({width, height: 200, series, axes: [{}, {size: 60}], scales: {x: {time: true}},
                            legend: {live: false}, tzDate: ts => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC")}, data, div);
    charts.push({metric: key, plot, data});
  }
}

function drawTable(s) {
  const cols = ["Bucket start (UTC)", "Level", ["Requests", "num"], ["Served", "num"], ["Shed", "num"], ["Aborted", "num"],
                ["Errored", "num"], ["SLO attainment", "num"], ["TTFT p50", "num"], ["TTFT p95", "num"], ["TTFT p99", "num"],
                ["TPOT p50", "num"], ["TPOT p95", "num"], ["TPOT p99", "num"]];
  const t = table("Latency figures per time bucket and level", cols, {id: "series-rows"});
  const tb = el("tbody");
  const f = x => (x === null || x === undefined ? "–" : x.toFixed(4));
  for (const b of s.series) for (const g of b.groups) {
    tb.append(el("tr", {dataset: {start: String(b.start), end: String(b.end), level: String(g.level)}},
      el("td", {text: when(b.start)}), el("td", {text: `L${g.level}`}),
      ...[g.count, g.served, g.shed, g.aborted, g.errored ?? 0].map(x => el("td", {class: "num", text: String(x)})),
      el("td", {class: "num", text: pct(g.slo_attainment), dataset: {v: String(g.slo_attainment)}}),
      ...["ttft_p50", "ttft_p95", "ttft_p99", "tpot_p50", "tpot_p95", "tpot_p99"].map(k =>
        el("td", {class: "num", text: f(g[k]), dataset: {k, v: g[k] === null ? "" : String(g[k])}}))));
  }
  if (!tb.children.length) tb.append(el("tr", {}, el("td", {colspan: cols.length, class: "muted", text: "No requests in this range."})));
  t.append(tb);
  document.getElementById("series-table").replaceChildren(t);
}
