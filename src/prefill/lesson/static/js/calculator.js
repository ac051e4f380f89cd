// Part 1's live numbers: the prefill calculator, the causal-mask demo and the worked example.
// Every number shown comes from the API (prefill.costmodel.costs); this file only moves values between inputs and text.

import { $, ApiError, getJSON, latest, logScale, setStatus, wholeNumber } from "./api.js";
import { drawGrid } from "./grid.js";

const TERA = 1e12;
let catalog = null;

// A range slider and its number box, kept in step; onChange fires on either.
function pairUp(rangeId, numId, onChange) {
  const range = $(rangeId);
  const num = $(numId);
  range.addEventListener("input", () => { num.value = range.value; onChange(); });
  num.addEventListener("input", () => {
    if (num.value !== "" && Number.isFinite(+num.value)) {
      range.value = num.value;
      onChange();
    }
  });
  return { get: () => +num.value, set: (v) => { num.value = v; range.value = v; } };
}

// A log-scaled slider (its positions 0..max from lo to hi) and its number box, kept in step: N and P span over three
// orders of magnitude, and on a linear track the seed's N = 7 sat at 1.4% of it. The slider's values keep two
// significant digits within [lo, hi] (one arrow press moves N from 7 to 7.1, and back to 7); a typed value is
// kept as typed.
function logPair(rangeId, numId, lo, hi, onChange, integer = false) {
  const range = $(rangeId);
  const num = $(numId);
  const track = logScale(lo, hi, +range.max);
  const valueAt = (pos) => {
    const v = Math.min(hi, Math.max(lo, +track.at(pos).toPrecision(2)));
    return integer ? Math.round(v) : v;
  };
  range.addEventListener("input", () => { num.value = valueAt(+range.value); onChange(); });
  num.addEventListener("input", () => {
    if (num.value !== "" && Number.isFinite(+num.value)) {
      if (+num.value > 0) range.value = track.position(+num.value);
      onChange(); // a value the API refuses is said as refused, not skipped
    }
  });
  range.value = track.position(+num.value);
  return { get: () => +num.value, set: (v) => { num.value = v; range.value = track.position(v); },
    lock: (on) => { range.disabled = on; num.disabled = on; } };
}

// A refused input (the API's one-line reason) greys out the results it no longer matches; null clears that.
function stale(reason) {
  setStatus("calc", reason ?? "", reason !== null);
  for (const el of document.querySelectorAll("#calc .worked, #calc .tiles")) el.classList.toggle("stale", reason !== null);
}

function peakOf(hw, dtype) {
  return hw.peak_flops[dtype] ?? hw.peak_flops.bfloat16;
}

export function initCalculator(cat) {
  catalog = cat;
  const update = latest(refresh, 30, "calc");
  const N = logPair("n-range", "n-num", 0.1, 500, update);
  const P = logPair("p-range", "p-num", 1, 32768, update, true);
  const U = pairUp("u-range", "u-num", update);
  const peak = pairUp("peak-range", "peak-num", update);
  const hwSel = $("hw-select");
  const modelSel = $("model-select");
  const dtypeSel = $("dtype-select");
  for (const h of cat.hardware) hwSel.append(new Option(h.name, h.key));
  for (const d of cat.dtypes) dtypeSel.append(new Option(d, d));
  if (cat.loaded) modelSel.append(new Option(`this server's model (${cat.loaded.name})`, cat.loaded.key));
  for (const m of cat.models) modelSel.append(new Option(m.name, m.key));
  dtypeSel.value = "bfloat16"; // the seed's GPU; the server's model brings the server's own dtype
  const nOut = $("n-out");

  const applyHardware = () => {
    const hw = cat.hardware.find((h) => h.key === hwSel.value);
    peak.set(hw ? +(peakOf(hw, dtypeSel.value) / TERA).toPrecision(6) : 100);
    $("bw-num").value = hw ? +(hw.bandwidth / TERA).toPrecision(6) : 2;
  };
  hwSel.addEventListener("change", () => { applyHardware(); update(); });
  dtypeSel.addEventListener("change", () => { if (hwSel.value) applyHardware(); update(); });
  // A chosen model brings its own N and shapes: N is locked to it (and said so) while the model is chosen, so
  // 2·N·P, the exact FLOPs and the KV bytes never describe two models at once.
  const chooseModel = () => {
    const own = cat.loaded?.key === modelSel.value ? cat.loaded : null;
    const m = cat.models.find((x) => x.key === modelSel.value) ?? own;
    N.lock(!!m);
    if (m) N.set(+(m.N / 1e9).toPrecision(4));
    // A model brings its dtype too: this server's, the one it computes and caches in; a preset's, the one it is
    // published in (the lesson's Llama-3-8B at P = 2,048 holds 256 MiB in bfloat16, not float32's 512).
    if (m) dtypeSel.value = m.dtype;
    if (m && hwSel.value) applyHardware();
    $("model-lock").textContent = m ? `N = ${(m.N / 1e9).toPrecision(4)} billion is ${m.name}'s own: locked while a `
      + "model is chosen (choose “only N” to type any N). "
      + `dtype: ${m.dtype}, ${own ? "as this server runs it" : "as the model is published"} (change it below).` : "";
    update();
  };
  modelSel.addEventListener("change", chooseModel);
  $("bw-num").addEventListener("input", update);
  nOut.addEventListener("input", update);
  // "use my prompt's P and n": the live run's prompt length and answer tokens, on this server's model, so the KV
  // tiles line up with the live view's.
  const useBtn = $("use-prompt");
  document.addEventListener("prompt-run", (e) => {
    useBtn.disabled = false;
    useBtn.dataset.P = e.detail.P;
    useBtn.dataset.n = e.detail.n;
    useBtn.title = `P = ${e.detail.P}, n = ${e.detail.n}: the live run's`;
  });
  useBtn.addEventListener("click", () => {
    if (cat.loaded) modelSel.value = cat.loaded.key;
    P.set(+useBtn.dataset.P);
    nOut.value = useBtn.dataset.n;
    chooseModel();
  });

  async function refresh(signal) {
    const nFault = nOut.value.trim() === "" ? null : wholeNumber(nOut.value, "Output tokens n", "tokens");
    if (nFault) {
      stale(`${nFault}. The numbers below are for the last input that could be computed.`);
      return;
    }
    let body;
    try {
      body = await getJSON("/api/estimate", {
        N: N.get() * 1e9, P: P.get(), mfu: U.get(), peak: peak.get() * TERA, bandwidth: +$("bw-num").value * TERA,
        model: modelSel.value, dtype: dtypeSel.value, n: nOut.value || 1, // an empty box: the KV after one token
      }, signal);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      stale(`${e.message}. The numbers below are for the last input that could be computed.`);
      return;
    }
    stale(null);
    show(body);
  }
  update();
  initMask();
  initExample();
}

function show(r) {
  $("line-flops").textContent = r.lines.flops;
  $("line-time").textContent = r.lines.time;
  $("out-flops").textContent = r.human.flops;
  $("out-seconds").textContent = r.human.seconds;
  if (r.exact) {
    const e = r.exact;
    $("out-exact").textContent = `${e.human.total} · ${e.human.seconds}`;
    $("out-exact-sub").textContent = `${e.model}: attention over the causal triangle ${e.human.attention}, `
      + `logits of the last position only ${e.human.unembed}`;
  } else {
    $("out-exact").textContent = "choose a model";
    $("out-exact-sub").textContent = "the exact count needs the model's shapes";
  }
  if (r.kv) {
    $("out-kv").textContent = r.kv.text;
    $("out-kv-sub").textContent = `${r.kv.formula}; ${r.kv.L} layers × K and V of [${r.kv.shape.join(", ")}], `
      + `${r.kv.per_token.toLocaleString("en-US")} B per token`;
  } else {
    $("out-kv").textContent = "choose a model";
    $("out-kv-sub").textContent = "KV bytes need L, H_kv and d_head";
  }
  const d = r.kv_decoded;
  $("out-kv-decoded").textContent = d ? `${d.bytes.toLocaleString("en-US")} B` : "choose a model";
  $("out-kv-decoded-sub").textContent = d ? `${d.formula} (the last answer token's K/V is never written: nothing reads it)`
    : "KV bytes need L, H_kv and d_head";
  const rf = r.roofline;
  const out = $("out-bound");
  out.textContent = `prefill: ${rf.prefill_bound} · one decode step: ${rf.decode_bound}`;
  out.className = `t-value ${rf.prefill_bound === "compute-bound" ? "bound-compute" : "bound-memory"}`;
  const from = rf.compute_bound_from_P ? `prefill turns compute-bound from P ≈ ${rf.compute_bound_from_P.toLocaleString("en-US")} tokens` : "";
  $("out-bound-sub").textContent = `intensity ${rf.prefill_intensity.toFixed(1)} FLOP/B (decode ${rf.decode_intensity.toFixed(1)}) `
    + `vs the ridge point ${rf.ridge.toFixed(1)} FLOP/B = peak / bandwidth${from ? "; " + from : ""}`
    + (r.exact ? "" : " (weights only: choose a model to count activations and KV)");
}

// ---- the causal mask demo ----

// A mask cell's look: '1' allowed, '0' masked, 'd' a scaled mask's diagonal cell (part of its pairs allowed),
// filled with a lighter accent (a fill, not text: no contrast target applies).
const PARTIAL_FILL = "#93b4f0";

export function maskCell(rows) {
  return (i, j) => (rows[i][j] === "d" ? { cls: "partial", color: PARTIAL_FILL }
    : { cls: rows[i][j] === "1" ? "allowed" : "masked" });
}

function initMask() {
  const range = $("demo-range");
  const draw = latest(async (signal) => {
    const m = await getJSON("/api/mask", { P: range.value }, signal);
    $("demo-out").textContent = m.P;
    $("mask-caption").textContent = m.caption;
    const labels = Array.from({ length: m.P }, (_, k) => String(k)); // from 0, as the live grid and the lesson
    drawGrid($("mask-grid"), {
      P: m.P, labels, cell: maskCell(m.rows), hover: $("mask-hover"),
      describe: (i, j) => (m.rows[i][j] === "1" ? `token ${i} may use token ${j}`
        : `masked: ${j} is in ${i}'s future`),
    });
  }, 20);
  range.addEventListener("input", draw);
  draw();
}

// ---- the worked example ----

function initExample() {
  const ids = ["ex-ttft", "ex-itl", "ex-n"];
  const box = document.querySelector("#example .worked");
  const refuse = (reason) => {
    setStatus("example", reason ? `${reason}. The greyed lines are for the last values that could be computed.` : "", !!reason);
    box.classList.toggle("stale", !!reason);
  };
  const update = latest(async (signal) => {
    const [ttft, itl, n] = ids.map((id) => $(id).value);
    if ([ttft, itl, n].some((v) => v === "")) {
      refuse("Type all three: TTFT and ITL in seconds, and the number of output tokens");
      return;
    }
    const whole = wholeNumber(n, "Output tokens n", "tokens");
    if (whole) {
      refuse(whole);
      return;
    }
    let r;
    try {
      r = await getJSON("/api/request", { ttft, itl, n }, signal);
    } catch (e) {
      if (!(e instanceof ApiError)) throw e;
      refuse(e.message);
      return;
    }
    refuse(null);
    $("ex-request").textContent = r.lines.request;
    $("ex-decode").textContent = r.lines.decode;
    $("ex-output").textContent = r.lines.output;
  });
  for (const id of ids) $(id).addEventListener("input", update);
  update();
}
