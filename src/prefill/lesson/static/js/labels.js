// A chart's annotations, as a uPlot draw hook: vertical marker lines with their labels, and labels beside the points
// of one series. Of a few places tried in order, a label goes in the first that covers least (another marker line or
// a stretch of a series' line: 1, a point: 3) among those inside the plot and clear of the labels already placed, so
// that no label is ever drawn over another, and none over the data where some place is clear of it. A marker's
// label may have shorter forms (`short`, one or a list), tried in turn where the longer would cover something.

const BACKING = "rgba(255, 255, 255, 0.85)";

// lines: [{x, color, dash, label, short}] (short: a text or a list, longest first); points: {s, labels: Map x -> text, color} or null.
export function annotate(lines = [], points = null) {
  return (u) => {
    const { ctx } = u;
    const px = devicePixelRatio;
    const shown = lines.filter((m) => m.x != null).map((m) => ({ ...m, at: u.valToPos(m.x, "x", true) }));
    ctx.save();
    ctx.lineWidth = 2 * px;
    for (const m of shown) {
      ctx.strokeStyle = m.color;
      ctx.setLineDash(m.dash ? [6 * px, 4 * px] : []);
      ctx.beginPath();
      ctx.moveTo(m.at, u.bbox.top);
      ctx.lineTo(m.at, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.textAlign = "left"; // uPlot leaves its axes' alignment on the context
    ctx.textBaseline = "alphabetic";
    const layout = placer(u, shown.map((m) => m.at));
    ctx.font = `${12 * px}px system-ui, sans-serif`;
    const rows = Math.max(1, Math.floor(u.bbox.height / (16 * px)));
    const beside = (m, text) => { // right of the line, then left of it, row by row from the top
      const w = ctx.measureText(text).width;
      const spots = [];
      for (let k = 0; k < rows; k++) {
        const y0 = u.bbox.top + (3 + 16 * k) * px;
        spots.push([m.at + 4 * px, y0], [m.at - 4 * px - w, y0]);
      }
      return { text, ...layout.best(spots, w, 14 * px, m.at) };
    };
    for (const m of shown) {
      let label = null;
      for (const text of [m.label, m.short ?? []].flat()) { // the longest form that covers nothing, else the least
        const form = beside(m, text);
        if (!label || form.cost <= label.cost) label = form;
        if (label.cost === 0) break;
      }
      write(ctx, layout.take(label.box), label.text, m.color);
    }
    if (points) {
      ctx.font = `${11 * px}px system-ui, sans-serif`;
      u.data[0].forEach((x, i) => {
        const y = u.data[points.s][i];
        const text = points.labels.get(x);
        if (y == null || text == null) return;
        const cx = u.valToPos(x, "x", true);
        const cy = u.valToPos(y, "y", true);
        const w = ctx.measureText(text).width;
        const h = 13 * px;
        const gap = 8 * px; // past the point's dot
        const below = cy + gap;
        const above = cy - gap - h;
        const spots = [[cx - w / 2, below], [cx + gap, cy - h / 2], [cx - w / 2, above], [cx - gap - w, cy - h / 2],
          [cx - w, below], [cx, below], [cx - w, above], [cx, above]]; // centred, beside, then the four corners
        write(ctx, layout.take(layout.best(spots, w, h, null).box), text, points.color);
      });
    }
    ctx.restore();
  };
}

function write(ctx, box, text, color) {
  const px = devicePixelRatio;
  ctx.fillStyle = BACKING;
  ctx.fillRect(box.x0, box.y0, box.x1 - box.x0, box.y1 - box.y0);
  ctx.fillStyle = color;
  ctx.fillText(text, box.x0 + 2 * px, box.y1 - 3 * px);
}

// best(spots, w, h, own): {box, cost}, the place for a text w wide and h high among the spots [[x, y]] (the text's
// top left); `own` is the x of the label's own marker line, which it may touch. take(box): the box, now taken.
function placer(u, lineXs) {
  const px = devicePixelRatio;
  const placed = [];
  const drawn = dataSegments(u);
  const plot = { x0: u.bbox.left, x1: u.bbox.left + u.bbox.width, y0: u.bbox.top, y1: u.bbox.top + u.bbox.height };
  const meets = (a, b) => a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
  const inside = (b) => b.x0 >= plot.x0 && b.x1 <= plot.x1 && b.y0 >= plot.y0 && b.y1 <= plot.y1;
  const free = (b) => !placed.some((p) => meets(p, b));
  const best = (spots, w, h, own) => {
    const boxes = spots.map(([x, y]) => ({ x0: x - 2 * px, x1: x + w + 2 * px, y0: y, y1: y + h }));
    const cost = (b) => lineXs.filter((x) => x !== own && x > b.x0 && x < b.x1).length
      + drawn.reduce((n, seg) => n + (crosses(seg, b) ? seg.weight : 0), 0);
    let found = null;
    for (const box of boxes.filter((b) => inside(b) && free(b))) {
      const c = cost(box);
      if (!found || c < found.cost) found = { box, cost: c };
      if (c === 0) break;
    }
    if (found) return found;
    // Wider than the plot, or every place taken: below the labels so far, inside the plot if it is wide enough.
    const y0 = Math.max(plot.y0, ...placed.map((p) => p.y1 + px));
    const x0 = Math.max(w + 4 * px <= plot.x1 - plot.x0 ? plot.x0 : 0, Math.min(boxes[0].x0, plot.x1 - (w + 4 * px)));
    return { box: { x0, x1: x0 + w + 4 * px, y0, y1: y0 + h }, cost: Infinity };
  };
  const take = (box) => {
    placed.push(box);
    return box;
  };
  return { best, take };
}

// The series as drawn, in canvas pixels: {a, b, pad, weight} segments (a point: a = b, pad its dot's radius).
function dataSegments(u) {
  const px = devicePixelRatio;
  const out = [];
  for (let s = 1; s < u.series.length; s++) {
    const series = u.series[s];
    if (series.show === false) continue;
    const show = series.points?.show; // uPlot keeps it as a function
    const dot = (typeof show === "function" ? show(u, s) : show) ? ((series.points.size ?? 5) / 2) * px : 0;
    let last = null;
    u.data[0].forEach((x, i) => {
      const y = u.data[s][i];
      if (y == null) {
        if (!series.spanGaps) last = null;
        return;
      }
      const p = [u.valToPos(x, "x", true), u.valToPos(y, "y", true)];
      if (dot) out.push({ a: p, b: p, pad: dot, weight: 3 });
      if (last && !series.dots) out.push({ a: last, b: p, pad: 2 * px, weight: 1 });
      last = p;
    });
  }
  return out;
}

// Whether segment `seg` passes through box `b` (widened by the segment's pad), by samples 2 px apart.
function crosses(seg, b) {
  const [ax, ay] = seg.a;
  const [bx, by] = seg.b;
  const n = Math.min(400, Math.ceil(Math.hypot(bx - ax, by - ay) / (2 * devicePixelRatio)) + 1);
  for (let k = 0; k <= n; k++) {
    const x = ax + ((bx - ax) * k) / n;
    const y = ay + ((by - ay) * k) / n;
    if (x > b.x0 - seg.pad && x < b.x1 + seg.pad && y > b.y0 - seg.pad && y < b.y1 + seg.pad) return true;
  }
  return false;
}
