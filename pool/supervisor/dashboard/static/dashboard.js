// The shm-pool dashboard: one EventSource ("events") gives a snapshot, then
// the changes twice a second. Everything kept here is bounded as the server
// bounds it; everything a task wrote is shown as text, never as HTML.
"use strict";

const LIMITS = { bars: 5000, series: 300, events: 200, output: 500, failures: 20 };
const STREAM_WINDOW_MS = 30000;
const ROW_PX = 14;
const PALETTE = ["#0969da", "#8250df", "#1f883d", "#bf8700", "#d1242f", "#1b7c83",
  "#953800", "#6e7781", "#a475f9", "#4ac26b", "#e16f24", "#218bff"];
const state = { header: {}, workers: {}, lanes: {}, bars: [], series: [], events: [],
  output: [], failures: [], maps: {}, dispatchers: null };
let skewMs = 0;  // the server's clock minus ours, from its series points
let drawPending = false;
// How long drawing takes (read by benchmarks/dashboard.py).
const perf = { renders: 0, lastMs: 0, maxMs: 0, totalMs: 0 };
window.dashboardPerf = perf;

const $ = (id) => document.getElementById(id);

function keep(list, more, limit) {
  for (const item of more) list.push(item);
  if (list.length > limit) list.splice(0, list.length - limit);
}

function onSnapshot(snapshot) {
  Object.assign(state, snapshot);
  settleClock();
  schedule();
}

function onChanges(changes) {
  Object.assign(state.workers, changes.workers);
  for (const uid of changes.removed) delete state.workers[uid];
  Object.assign(state.lanes, changes.lanes);
  Object.assign(state.maps, changes.maps);
  for (const id of changes.maps_removed) delete state.maps[id];
  for (const key of ["bars", "series", "events", "output", "failures"]) {
    keep(state[key], changes[key], LIMITS[key]);
  }
  if (changes.dispatchers) state.dispatchers = changes.dispatchers;
  state.header = changes.header;
  settleClock();
  schedule();
}

function settleClock() {
  const last = state.series[state.series.length - 1];
  if (last) skewMs = last[0] - Date.now();
}

function schedule() {
  if (!drawPending) {
    drawPending = true;
    requestAnimationFrame(() => { drawPending = false; render(); });
  }
}

function render() {
  const started = performance.now();
  renderHeader();
  renderWorkers();
  renderDispatchers();
  renderMaps();
  drawStream();
  drawSeries();
  renderEvents();
  renderOutput();
  renderFailures();
  const ms = performance.now() - started;
  perf.renders += 1;
  perf.lastMs = ms;
  perf.totalMs += ms;
  perf.maxMs = Math.max(perf.maxMs, ms);
}

function fmt(n, digits = 0) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString(undefined,
    { maximumFractionDigits: digits });
}

function renderHeader() {
  const h = state.header;
  if (!h.namespace) return;
  $("namespace").textContent = h.namespace;
  document.title = `shm-pool ${h.namespace}`;
  const badge = $("state");
  badge.textContent = h.state;
  badge.className = `badge ${h.state}`;
  const byStatus = Object.entries(h.workers)
    .filter(([status]) => !["dropped", "exited"].includes(status));
  const live = byStatus.reduce((sum, [, n]) => sum + n, 0);
  $("t-workers").textContent = live;
  const others = byStatus.filter(([status]) => status !== "ready");
  $("t-workers-by").textContent = others.length
    ? `workers: ${byStatus.map(([s, n]) => `${n} ${s}`).join(", ")}` : "workers ready";
  $("t-rate").textContent = fmt(h.rate);
  $("t-queued").textContent = fmt(h.queued);
  const byPriority = Object.entries(h.queued_by_priority || {})
    .sort(([a], [b]) => Number(b) - Number(a));
  $("t-queued-by").textContent = byPriority.some(([p]) => p !== "0")
    ? `queued: ${byPriority.map(([p, n]) => `${fmt(n)} at priority ${p}`).join(", ")}`
    : "queued";
  $("t-running").textContent = fmt(h.running);
  $("t-ok").textContent = fmt(h.outcomes.ok);
  $("t-error").textContent = fmt(h.outcomes.error);
  $("t-lost").textContent = fmt(h.outcomes.lost);
  $("t-restarts").textContent = fmt(h.restarts);
}

function cell(row, text, cls = "") {
  const td = row.insertCell();
  td.textContent = text;
  if (cls) td.className = cls;
  return td;
}

function renderWorkers() {
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  const rows = Object.values(state.workers)
    .sort((a, b) => (a.gone_at ? 1 : 0) - (b.gone_at ? 1 : 0) || a.pid - b.pid);
  for (const w of rows) {
    const tr = body.insertRow();
    tr.dataset.pid = w.pid;
    tr.dataset.status = w.status;
    if (w.gone_at) tr.className = "gone";
    cell(tr, w.pid);
    cell(tr, w.uid, "opt");
    cell(tr, w.address, "addr opt").title = w.address;
    cell(tr, w.ended ? `${w.status} (${w.ended})` : w.status, `status ${w.status}`);
    cell(tr, w.gone_at ? "–" : fmt(w.running), "n");
    cell(tr, fmt(w.done), "n");
    cell(tr, w.rss_mb === null ? "–" : `${fmt(w.rss_mb)} MB`, "n");
    cell(tr, w.cpu === null ? "–" : `${fmt(w.cpu)} %`, "n opt");
    cell(tr, w.last_ms === null ? "–" : `${fmt(w.last_ms, 1)} ms`, "n opt");
  }
}

function renderDispatchers() {
  const rows = state.dispatchers;
  $("dispatchers-box").hidden = !rows;
  if (!rows) return;
  const body = $("dispatchers").tBodies[0];
  body.replaceChildren();
  for (const d of rows) {
    const tr = body.insertRow();
    if (d.clients === null) tr.className = "gone";
    const where = cell(tr, d.address);
    if (d.here) {
      const mark = document.createElement("span");
      mark.className = "here";
      mark.textContent = "this host";
      where.append(" ", mark);
    }
    cell(tr, d.clients === null ? "no answer" : fmt(d.clients), "n");
    cell(tr, fmt(d.queued), "n");
    cell(tr, fmt(d.sent), "n");
  }
}

function colourOf(label, labels) {
  if (label === "other") return "#afb8c1";
  if (!labels.has(label)) labels.set(label, PALETTE[labels.size % PALETTE.length]);
  return labels.get(label);
}

function fitCanvas(canvas, cssHeight) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth;
  canvas.style.height = `${cssHeight}px`;
  if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(cssHeight * ratio)) {
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(cssHeight * ratio);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.clearRect(0, 0, width, cssHeight);
  return [ctx, width];
}

const streamColours = new Map();

function drawStream() {
  const canvas = $("stream");
  const now = Date.now() + skewMs;
  const from = now - STREAM_WINDOW_MS;
  const visible = state.bars.filter((bar) => bar[2] >= from);
  const seen = new Set(visible.map((bar) => bar[0]));
  const lanes = Object.keys(state.lanes).filter((key) => seen.has(key)).sort((a, b) => {
    const x = state.lanes[a], y = state.lanes[b];
    return x.pid - y.pid || x.slot - y.slot;
  });
  const rowOf = new Map(lanes.map((key, i) => [key, i]));
  const labelWidth = 76;
  const [ctx, width] = fitCanvas(canvas, Math.max(3, lanes.length) * ROW_PX + 18);
  const plot = width - labelWidth;
  const x = (t) => labelWidth + ((t - from) / STREAM_WINDOW_MS) * plot;
  ctx.font = "11px ui-monospace, monospace";
  ctx.fillStyle = "#6b7480";
  lanes.forEach((key, i) => {
    const lane = state.lanes[key];
    ctx.fillText(`${lane.pid}/${lane.slot}`, 2, i * ROW_PX + 11);
  });
  let drawn = 0, failed = 0;
  for (const [key, start, end, label, , bad] of visible) {
    const row = rowOf.get(key);
    const left = Math.max(labelWidth, x(start));
    const barWidth = Math.max(1, x(end) - left);
    ctx.fillStyle = bad ? "#cf222e" : colourOf(label, streamColours);
    ctx.fillRect(left, row * ROW_PX + 2, barWidth, ROW_PX - 3);
    if (bad) {
      failed += 1;
      ctx.fillRect(left, row * ROW_PX, 2, ROW_PX);
    }
    drawn += 1;
  }
  const axisY = Math.max(3, lanes.length) * ROW_PX + 12;
  ctx.fillStyle = "#6b7480";
  for (let s = 30; s >= 0; s -= 5) {
    ctx.fillText(s ? `-${s}s` : "now", x(now - s * 1000) - (s ? 10 : 22), axisY);
  }
  if (!drawn) ctx.fillText("no tasks in the last 30 s", labelWidth + 8, 24);
  canvas.dataset.bars = drawn;
  canvas.dataset.failed = failed;
  const legend = $("legend");
  legend.replaceChildren();
  for (const [label, colour] of streamColours) {
    const item = document.createElement("span");
    const key = document.createElement("span");
    key.className = "key";
    key.style.background = colour;
    item.append(key, label);
    legend.append(item);
  }
  const bad = document.createElement("span");
  bad.innerHTML = '<span class="key failed"></span>failed';
  legend.append(bad);
}

function drawSeries() {
  const canvas = $("series");
  const [ctx, width] = fitCanvas(canvas, 140);
  const points = state.series;
  if (points.length < 2) return;
  const t0 = points[0][0], t1 = points[points.length - 1][0];
  const maxRate = Math.max(1, ...points.map((p) => p[1]));
  const maxQueue = Math.max(1, ...points.map((p) => p[2]));
  const x = (t) => ((t - t0) / Math.max(1, t1 - t0)) * (width - 4) + 2;
  const line = (index, max, colour) => {
    ctx.beginPath();
    ctx.strokeStyle = colour;
    ctx.lineWidth = 1.5;
    points.forEach((p, i) => {
      const y = 134 - (p[index] / max) * 126;
      if (i) ctx.lineTo(x(p[0]), y); else ctx.moveTo(x(p[0]), y);
    });
    ctx.stroke();
  };
  line(1, maxRate, "#0969da");
  line(2, maxQueue, "#bf8700");
  $("rate-max").textContent = `(max ${fmt(maxRate)})`;
  $("queue-max").textContent = `(max ${fmt(maxQueue)})`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

function renderMaps() {
  const box = $("maps");
  const maps = Object.values(state.maps);
  if (!maps.length) {
    box.innerHTML = '<p class="none">none running</p>';
    return;
  }
  box.replaceChildren();
  for (const map of maps) {
    const row = document.createElement("div");
    row.className = "map" + (map.done >= map.total ? " ended" : "");
    const share = map.total ? Math.min(100, (100 * map.done) / map.total) : 100;
    const label = document.createElement("span");
    label.className = "label";
    label.textContent = map.label;
    const bar = document.createElement("span");
    bar.className = "bar";
    const fill = document.createElement("span");
    fill.className = "fill";
    fill.style.width = `${share}%`;
    bar.append(fill);
    const count = document.createElement("span");
    count.className = "count";
    count.textContent = `${fmt(map.done)}/${fmt(map.total)} (${Math.floor(share)}%)` +
      (map.failed ? `, ${fmt(map.failed)} failed` : "");
    row.append(label, bar, count);
    box.append(row);
  }
}

function renderEvents() {
  const list = $("events");
  list.replaceChildren();
  for (const event of state.events.slice(-60).reverse()) {
    const item = document.createElement("li");
    item.className = `k-${event.kind}`;
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = clock(event.t);
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = event.kind;
    item.append(time, kind, event.text);
    list.append(item);
  }
}

function renderOutput() {
  const pre = $("output");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  pre.textContent = state.output.slice(-200).join("\n");
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

function renderFailures() {
  const box = $("failures");
  if (!state.failures.length) return;
  const open = new Set([...box.querySelectorAll("details[open]")].map((d) => d.dataset.t));
  box.replaceChildren();
  for (const failure of state.failures.slice().reverse()) {
    const details = document.createElement("details");
    details.dataset.t = failure.t;
    details.open = open.has(String(failure.t));
    const summary = document.createElement("summary");
    const type = document.createElement("span");
    type.className = "type";
    type.textContent = failure.type.split(".").pop();
    summary.append(`${clock(failure.t)} ${failure.function} `, type,
      `: ${failure.message}` + (failure.pid ? ` (pid ${failure.pid})` : ""));
    const trace = document.createElement("pre");
    trace.textContent = failure.traceback || `${failure.type}: ${failure.message}`;
    details.append(summary, trace);
    box.append(details);
  }
}

function connect() {
  const source = new EventSource("events");
  source.addEventListener("snapshot", (e) => onSnapshot(JSON.parse(e.data)));
  source.addEventListener("changes", (e) => onChanges(JSON.parse(e.data)));
  source.onerror = () => {
    const badge = $("state");
    badge.textContent = "disconnected: retrying";
    badge.className = "badge disconnected";
  };
}

window.addEventListener("resize", schedule);
connect();
