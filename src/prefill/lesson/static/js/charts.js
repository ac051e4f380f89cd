// The two charts of the live section, drawn with uPlot (vendored, MIT): the request's tokens over time and
// the roofline. uPlot is loaded on first use so the page's first paint does not wait for it.

let uPlotModule = null;
async function uPlot() {
  uPlotModule ??= (await import("../vendor/uplot/uPlot.esm.js")).default;
  return uPlotModule;
}

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

// Vertical lines at x values: [{x, color, dash, label}].
function markers(lines) {
  return (u) => {
    const { ctx } = u;
    ctx.save();
    for (const [k, m] of lines.entries()) {
      if (m.x == null) continue;
      const x = u.valToPos(m.x, "x", true);
      ctx.strokeStyle = m.color;
      ctx.lineWidth = 2 * devicePixelRatio;
      ctx.setLineDash(m.dash ? [6 * devicePixelRatio, 4 * devicePixelRatio] : []);
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
      ctx.fillStyle = m.color;
      ctx.font = `${12 * devicePixelRatio}px system-ui, sans-serif`;
      ctx.fillText(m.label, x + 4 * devicePixelRatio, u.bbox.top + (14 + 16 * k) * devicePixelRatio);
    }
    ctx.restore();
  };
}

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
    hooks: { draw: [markers(marks)] },
  }, [xs, ys], el), 220);
}

// r: the /api/roofline body.
export async function drawRoofline(el, r) {
  const U = await uPlot();
  const pts = [[r.prefill_intensity, r.prefill_attainable, "prefill"], [r.decode_intensity, r.decode_attainable, "decode"]];
  const xs = [...new Set([...r.roof.intensity, ...pts.map((p) => p[0])])].sort((a, b) => a - b);
  const roofAt = new Map(r.roof.intensity.map((x, k) => [x, r.roof.flops_per_s[k]]));
  for (const [x, y] of pts) roofAt.set(x, y);
  const series = pts.map(([px, py]) => xs.map((x) => (x === px ? py : null)));
  el.replaceChildren();
  return fit(el, new U({
    width: widthOf(el), height: 260,
    scales: { x: { time: false, distr: 3 }, y: { distr: 3 } },
    axes: [{ label: "arithmetic intensity (FLOP per byte)", values: (u, v) => v.map(si) },
      { label: "attainable FLOP/s", values: (u, v) => v.map(si), size: 60 }],
    series: [{},
      { label: "roof", stroke: "#64748b", width: 2, spanGaps: true, points: { show: false } },
      { label: "this prefill", stroke: "#2563eb", paths: () => null, points: { show: true, size: 12, fill: "#2563eb" } },
      { label: "one decode step", stroke: "#dc2626", paths: () => null, points: { show: true, size: 12, fill: "#dc2626" } }],
    legend: { show: false },
    hooks: { draw: [markers([{ x: r.ridge, color: "#f59e0b", dash: true, label: `ridge ${r.ridge.toFixed(1)}` }])] },
  }, [xs, xs.map((x) => roofAt.get(x)), ...series], el), 260);
}
