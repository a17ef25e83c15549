#include "actors/status.hpp"

namespace stitch {

const std::string& dashboard_html() {
  static const std::string page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Stitch</title>
<style>
  body { font-family: "DejaVu Sans", sans-serif; margin: 24px; color: #1d2330; background: #fafbfc; }
  h1 { font-size: 20px; margin: 0 0 4px 0; }
  .sub { color: #5b6472; font-size: 13px; margin-bottom: 16px; }
  table { border-collapse: collapse; width: 100%; font-size: 13px; background: #fff; }
  th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #e3e6ea; }
  th { background: #f0f2f5; font-weight: 600; }
  .ok { color: #1a7f37; font-weight: 600; }
  .bad { color: #b42318; font-weight: 600; }
  .card { background: #fff; border: 1px solid #e3e6ea; border-radius: 6px; padding: 12px;
          margin-bottom: 16px; }
  #chart { width: 100%; height: 260px; }
  .legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
  .swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
</style>
</head>
<body>
<h1>Stitch</h1>
<div class="sub" id="summary">loading…</div>
<div class="card">
  <table id="replicas">
    <thead><tr><th>replica</th><th>pool</th><th>ready</th><th>applied</th><th>sync</th>
    <th>last stage (s)</th><th>last pause (µs)</th><th>drain (ms)</th><th>folded</th>
    <th>active</th><th>reason</th></tr></thead>
    <tbody></tbody>
  </table>
</div>
<div class="card">
  <div>Applied version over time</div>
  <svg id="chart" viewBox="0 0 1000 260" preserveAspectRatio="none"></svg>
  <div class="legend" id="legend"></div>
</div>
<div class="card"><div>Recent updates</div>
  <table id="updates"><thead><tr><th>when</th><th>replica</th><th>version</th><th>stage (s)</th>
  <th>pause (µs)</th><th>folded</th></tr></thead><tbody></tbody></table>
</div>
<script>
"use strict";
const colors = ["#2563eb", "#d97706", "#059669", "#db2777", "#7c3aed", "#0891b2", "#65a30d"];
function text(tag, value, cls) {
  const el = document.createElement(tag);
  el.textContent = value === null || value === undefined ? "—" : String(value);
  if (cls) el.className = cls;
  return el;
}
function fixed(v, digits) { return typeof v === "number" ? v.toFixed(digits) : "—"; }
function render(s) {
  const pools = s.pools.map(p => p.pool + " → " + p.pointer).join(", ") || "no run claimed";
  const ready = s.replicas.filter(r => r.ready).length;
  document.getElementById("summary").textContent =
    "pointer: " + pools + " · replicas ready: " + ready + "/" + s.replicas.length +
    " · transfers in flight: " + s.transfers.length;
  const body = document.querySelector("#replicas tbody");
  body.replaceChildren();
  for (const r of s.replicas) {
    const tr = document.createElement("tr");
    tr.className = "replica";
    tr.dataset.id = r.replica_id;
    tr.append(text("td", r.replica_id), text("td", r.pool),
              text("td", r.ready ? "yes" : "no", r.ready ? "ok" : "bad"),
              text("td", r.applied), text("td", r.sync_state),
              text("td", fixed(r.last_update.stage_s, 3)),
              text("td", fixed(r.last_update.pause_us, 1)),
              text("td", fixed(r.last_update.drain_ms, 2)),
              text("td", r.last_update.folded_versions), text("td", r.active_requests),
              text("td", r.terminal_error || r.reason || ""));
    body.append(tr);
  }
  drawChart(s);
  const ub = document.querySelector("#updates tbody");
  ub.replaceChildren();
  for (const u of s.recent_updates.slice(0, 10)) {
    const tr = document.createElement("tr");
    tr.append(text("td", new Date(u.at_ms).toLocaleTimeString()), text("td", u.replica_id),
              text("td", u.version), text("td", fixed(u.stage_s, 3)),
              text("td", fixed(u.pause_us, 1)), text("td", u.folded_versions));
    ub.append(tr);
  }
}
function drawChart(s) {
  const svg = document.getElementById("chart");
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  const now = s.generated_at_ms;
  let t0 = now - 60000, vmax = 1;
  for (const r of s.replicas)
    for (const [t, v] of r.history) { t0 = Math.min(t0, t); vmax = Math.max(vmax, v); }
  const x = t => 40 + (t - t0) / Math.max(1, now - t0) * 950;
  const y = v => 240 - v / vmax * 220;
  const axis = document.createElementNS(ns, "path");
  axis.setAttribute("d", "M40 10 V240 H990");
  axis.setAttribute("stroke", "#9aa3af");
  axis.setAttribute("fill", "none");
  svg.append(axis);
  const top = document.createElementNS(ns, "text");
  top.setAttribute("x", 2); top.setAttribute("y", 24); top.setAttribute("font-size", 12);
  top.textContent = "v" + vmax;
  svg.append(top);
  const legend = document.getElementById("legend");
  legend.replaceChildren();
  s.replicas.forEach((r, i) => {
    const color = colors[i % colors.length];
    const pts = [];
    let last = null;
    for (const [t, v] of r.history) {
      if (last !== null) pts.push(x(t) + "," + y(last));
      pts.push(x(t) + "," + y(v));
      last = v;
    }
    if (last !== null) pts.push(x(now) + "," + y(last));
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts.join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", color);
    line.setAttribute("stroke-width", 2);
    line.dataset.replica = r.replica_id;
    svg.append(line);
    const item = document.createElement("span");
    const sw = document.createElement("span");
    sw.className = "swatch";
    sw.style.background = color;
    item.append(sw, document.createTextNode(r.replica_id));
    legend.append(item);
  });
}
async function refresh() {
  try {
    const res = await fetch("status", {cache: "no-store"});
    render(await res.json());
  } catch (e) {
    document.getElementById("summary").textContent = "status unavailable: " + e;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
)HTML";
  return page;
}

} // namespace stitch
