// The page's charts, drawn with uPlot (vendored, MIT): the live request's tokens over time, the machine's roofline
// (the P sweep's, with the live prompt on it), TTFT against the arrival rate, and compute against load over the stored prefix. uPlot is
// loaded on first use so the page's first paint does not wait for it. Every value drawn comes from the API.

import { annotate } from "./labels.js";

let uPlotModule = null;
async function uPlot() {
  uPlotModule ??= (await import("../vendor/uplot/uPlot.esm.js")).default;
  return uPlotModule;
}

// A colour the style sheet defines (`--amber`), so that a colour and its contrast are set in one place.
export const cssColor = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

const SI = [[1e15, "P"], [1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];
function si(v) {
  if (v == null) return "";
  for (const [p, s] of SI) if (Math.abs(v) >= p) return `${+(v / p).toPrecision(3)} ${s}`;
  return `${+v.toPrecision(3)}`;
}

function widthOf(el) {
  return Math.max(240, el.clientWidth || el.parentElement.clientWidth || 600);
}

// Keep a chart as wide as its box (phones, window resizes).
function fit(el, chart, height) {
  el.resizeObserver?.disconnect();
  el.resizeObserver = new ResizeObserver(() => {
    const width = widthOf(el);
    if (width !== chart.width) chart.setSize({ width, height });
  });
  el.resizeObserver.observe(el);
  return chart;
}

const seconds = (v) => (v == null ? "" : v < 1 ? `${+(v * 1e3).toPrecision(2)} ms` : `${+v.toPrecision(3)} s`);

// times: seconds since the request was sent at which each token arrived; marks: TTFT lines.
export async function drawTimeline(el, times, marks) {
  const U = await uPlot();
  const xs = [0, ...times];
  const ys = [0, ...times.map((_, k) => k + 1)];
  el.replaceChildren();
  return fit(el, new U({
    width: widthOf(el), height: 220,
    scales: { x: { time: false } },
    axes: [{ label: "seconds since the prompt was sent", values: (u, v) => v.map((x) => x.toFixed(2)) },
      { label: "tokens out" }],
    series: [{}, { label: "tokens received", stroke: "#10b981", width: 2, paths: U.paths.stepped({ align: 1 }),
      points: { show: true, size: 6, fill: "#10b981" } }],
    legend: { show: false },
    hooks: { draw: [annotate(marks)] },
  }, [xs, ys], el), 220);
}

// The machine's one roofline (c: the /api/sweep/curve body), log-log, intensity against FLOP/s: the roof, the time
// model's curve, measured points ({intensity, measured_flops_per_s, label or P}: the sweep's, or the live prompt)
// and, for the live view, one decode step's predicted point ({intensity, flops_per_s, label}).
export async function drawRoofline(el, c, measured, decode = null) {
  const U = await uPlot();
  const roof = new Map(c.roof.intensity.map((x, k) => [x, c.roof.flops_per_s[k]]));
  const predicted = new Map(c.points.map((p) => [p.intensity, p.attainable_flops_per_s]));
  const got = new Map(measured.map((m) => [m.intensity, m.measured_flops_per_s]));
  const dec = new Map(decode ? [[decode.intensity, decode.flops_per_s]] : []);
  const xs = [...new Set([...roof.keys(), ...predicted.keys(), ...got.keys(), ...dec.keys()])].sort((a, b) => a - b);
  const column = (m) => xs.map((x) => m.get(x) ?? null);
  const labels = new Map(measured.map((m) => [m.intensity, m.label ?? `P=${m.P}`]));
  el.replaceChildren();
  return fit(el, new U({
    width: widthOf(el), height: 280,
    scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
    axes: [{ label: "arithmetic intensity (FLOP per byte)", values: (u, v) => v.map(si) },
      { label: "FLOP/s", values: (u, v) => v.map(si), size: 56 }],
    series: [{},
      { label: "roof", stroke: "#64748b", width: 2, spanGaps: true, points: { show: false } },
      { label: "predicted", stroke: "#2563eb", width: 2, spanGaps: true, points: { show: false } },
      { label: "measured", stroke: "#ea580c", paths: () => null, dots: true, points: { show: true, size: 10, fill: "#ea580c" } },
      { label: "one decode step", stroke: "#dc2626", paths: () => null, dots: true, points: { show: true, size: 10, fill: "#dc2626" } }],
    legend: { show: false },
    hooks: { draw: [annotate(
      [{ x: c.ridge, color: cssColor("--amber"), dash: true, label: `ridge ${c.ridge.toFixed(1)} FLOP/B`, short: "ridge" }],
      { s: 3, labels, color: "#9a3412" },
    ), dotsAt] },
  }, [xs, column(roof), column(predicted), column(got), column(dec)], el), 280);
}

// Each measured and decode dot's centre in CSS pixels of the plot, on el.dataset.dots ({measured: [[x, y]…],
// decode: […]}), so a test can read where the dots are drawn (uPlot draws them on a canvas).
function dotsAt(u) {
  const at = (s) => u.data[0].flatMap((x, k) => (u.data[s][k] == null ? []
    : [[u.valToPos(x, "x") + u.bbox.left / devicePixelRatio, u.valToPos(u.data[s][k], "y") + u.bbox.top / devicePixelRatio]]));
  u.root.parentElement.dataset.dots = JSON.stringify({ measured: at(3), decode: at(4) });
}

// r: an /api/load body. TTFT (log) against the arrival rate: the curve's p50 and p99, this rate's two points.
export async function drawLoad(el, r) {
  const U = await uPlot();
  const p50 = new Map(r.curve.map((p) => [p.rate, p.ttft_p50_s]));
  const p99 = new Map(r.curve.map((p) => [p.rate, p.ttft_p99_s]));
  const xs = [...new Set([...p50.keys(), r.rate])].sort((a, b) => a - b);
  const column = (m) => xs.map((x) => m.get(x) ?? null);
  const here = (v) => xs.map((x) => (x === r.rate ? v : null));
  el.replaceChildren();
  return fit(el, new U({
    width: widthOf(el), height: 240,
    scales: { x: { time: false, range: (u, lo, hi) => [0, hi * 1.04] }, y: { distr: 3 } },
    axes: [{ label: "arrival rate (requests/s)", values: (u, v) => v.map((x) => +x.toPrecision(2)) },
      { label: "TTFT", values: (u, v) => v.map(seconds), size: 60 }],
    series: [{},
      { label: "p50", stroke: "#10b981", width: 2, spanGaps: true, points: { show: true, size: 5, fill: "#10b981" } },
      { label: "p99", stroke: "#dc2626", width: 2, spanGaps: true, points: { show: true, size: 5, fill: "#dc2626" } },
      { label: "p50 here", stroke: "#2563eb", paths: () => null, dots: true, points: { show: true, size: 11, fill: "#10b981" } },
      { label: "p99 here", stroke: "#2563eb", paths: () => null, dots: true, points: { show: true, size: 11, fill: "#dc2626" } }],
    legend: { show: false },
    hooks: { draw: [annotate([
      { x: r.rate, color: "#2563eb", label: `this rate: ${r.human.rate}`, short: "this rate" },
      { x: r.capacity_req_per_s, color: "#64748b", dash: true, label: `capacity ${r.human.capacity}`, short: "capacity" },
    ])] },
  }, [xs, column(p50), column(p99), here(r.ttft_p50_s), here(r.ttft_p99_s)], el), 240);
}

// r: an /api/load body. Each simulated request's TTFT against its arrival time, at the slider's rate: below capacity
// the waits stay level (the queue drains between bursts); past it each arrival waits longer than the one before.
export async function drawQueue(el, r) {
  const U = await uPlot();
  const xs = r.requests.map((q) => q.arrival_s);
  el.replaceChildren();
  return fit(el, new U({
    width: widthOf(el), height: 200,
    scales: { x: { time: false }, y: { range: (u, lo, hi) => [0, hi * 1.05] } },
    axes: [{ label: "arrival (seconds into the simulated run)", values: (u, v) => v.map((x) => +x.toPrecision(3)) },
      { label: "TTFT", values: (u, v) => v.map(seconds), size: 60 }],
    series: [{}, { label: "TTFT", stroke: "#dc2626", paths: () => null, dots: true,
      points: { show: true, size: 6, fill: "#dc2626" } }],
    legend: { show: false },
  }, [xs, r.requests.map((q) => q.ttft_s)], el), 200);
}

// r: an /api/compute-or-load body. Seconds (log) against the stored prefix's length (log): the predicted prefill,
// and the reads from the page cache and from the disk; a marker where the faster side changes.
export async function drawTiers(el, r) {
  const U = await uPlot();
  const xs = r.points.map((p) => p.P);
  // Each tier's flips in a dark shade of its line's colour (text on white: 4.5:1), so that "P = 300" alone still says
  // whose it is where the plot is too narrow for more.
  const tiers = [{ name: "page cache", tier: r.ram, color: "#15803d" }, { name: "disk", tier: r.disk, color: "#b45309" }];
  const flips = tiers.flatMap(({ name, tier, color }) => (tier?.flips ?? []).map((P) => ({ x: P, color, dash: true,
    label: `${name}: the faster side changes at P = ${P}`, short: [`${name}: P = ${P}`, `P = ${P}`] })));
  el.replaceChildren();
  return fit(el, new U({
    width: widthOf(el), height: 260,
    scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
    axes: [{ label: "stored prefix (tokens)", values: (u, v) => v.map(si) },
      { label: "seconds", values: (u, v) => v.map(seconds), size: 60 }],
    series: [{},
      { label: "compute", stroke: "#2563eb", width: 2, points: { show: false } },
      { label: "page cache", stroke: "#10b981", width: 2, points: { show: false } },
      { label: "disk", stroke: "#b45309", width: 2, spanGaps: true, points: { show: false } }],
    legend: { show: false },
    hooks: { draw: [annotate(flips)] },
  }, [xs, r.points.map((p) => p.compute_s), r.points.map((p) => p.ram_s), r.points.map((p) => p.disk_s)], el), 260);
}
