// A live prompt's results, once it has run: the timeline of its phases and tokens, the prediction beside the
// measurement (and the student's guesses beside both), and the roofline with this prefill as a measured point on the
// P sweep's roof. One /api/predict answer carries every number and verdict shown here (prefill.lesson.verdict);
// this file places them and computes none.

import { $, brief, getJSON } from "./api.js";
import { cssColor, drawRoofline, drawTimeline } from "./charts.js";

const ms = (s) => (s == null ? "–" : s < 1 ? `${(s * 1e3).toFixed(1)} ms` : `${s.toFixed(2)} s`);
let curve = null; // the sweep's /api/sweep/curve: the one roof of this machine

export async function showResults(cat, tok, r, guesses) {
  const t = r.timings ?? {};
  const cached = r.usage?.prompt_tokens_details?.cached_tokens ?? 0;
  const ticks = r.serverTimes.length === r.times.length ? r.serverTimes : r.times;
  const ttft = t.ttft_s ?? r.times[0];
  const gaps = Array.isArray(t.itl_s) ? t.itl_s : ticks.slice(1).map((x, k) => x - ticks[k]);
  const query = new URLSearchParams({ P: tok.P, cached, n: r.n, ttft_s: ttft, ...guesses });
  if (t.prefill_s) query.set("prefill_s", t.prefill_s);
  if (t.tokenize_s != null) query.set("tokenize_s", t.tokenize_s);
  if (t.cold) query.set("cold", 1);
  for (const g of gaps) query.append("itl", g);
  $("tl-mfu-sub").textContent = "measuring this machine's GEMM rate (once per server)…";
  const [pred, roof] = await Promise.all([getJSON(`/api/predict?${query}`), curve ?? getJSON("/api/sweep/curve")]);
  curve = roof;
  await Promise.all([showTimeline(tok, r, t, ttft, ticks, pred), showRoofline(pred, cached)]);
  return pred;
}

function phasesOf(t, ttft, total, pred, n) {
  const phases = [["tokenize", t.tokenize_s], ["queue", t.queue_s], ["prefill", t.prefill_s]];
  const before = phases.reduce((a, [, s]) => a + (s ?? 0), 0);
  phases.push(["first", t.first_token_s ?? Math.max(0, ttft - before)], ["decode", Math.max(0, total - ttft)]);
  // Tokens are numbered from 0, as in the grid: the first answer token (0) comes from the prefill.
  const names = { tokenize: "tokenize", queue: "queue", prefill: `prefill (${pred.prefill})`,
    first: "answer token 0 (from the prefill)",
    decode: n > 1 ? `decode (${n - 1} steps: answer tokens 1 to ${n - 1})` : "decode (none: one token)" };
  return phases.filter(([, s]) => s != null).map(([k, s]) => [k, s, names[k]]);
}

async function showTimeline(tok, r, t, ttft, ticks, pred) {
  $("timeline-box").hidden = false;
  const total = t.total_s ?? r.times.at(-1);
  $("tl-ttft").textContent = ms(ttft);
  $("tl-ttft-sub").textContent = t.prefill_s != null ? `of which prefill ${ms(t.prefill_s)}` : "";
  $("tl-total").textContent = ms(total);
  const phases = phasesOf(t, ttft, total, pred, r.n);
  $("phases").replaceChildren(...phases.map(([k, s, name]) => {
    const d = document.createElement("div");
    d.className = `ph-${k}`;
    d.style.flex = `${Math.round(s * 1e6)} 1 0`;  // flex-grow in microseconds: the bar's widths are the times
    d.title = `${name}: ${ms(s)}`;
    return d;
  }));
  $("phase-legend").replaceChildren(...phases.map(([k, s, name]) => {
    const span = document.createElement("span");
    span.className = "item";
    span.innerHTML = `<span class="sw ph-${k}"></span> ${name} ${ms(s)}`;
    return span;
  }));
  $("tl-pred").textContent = ms(pred.predicted_ttft_s);
  $("tl-pred-sub").textContent = pred.error != null
    ? `prefill ${pred.human.predicted} predicted beside ${ms(t.prefill_s)} measured (${pred.human.error}); ${pred.method}`
    : `prefill ${pred.human.predicted} (${pred.method})`;
  brief($("tl-why"), pred.note ? `Why: ${pred.note}` : "");
  const h = pred.human;
  $("tl-model").textContent = pred.request_model_s != null ? ms(pred.request_model_s) : "–";
  $("tl-model-sub").textContent = pred.itl_mean_s != null
    ? `${ms(ttft)} + ${r.n - 1} × ${h.itl_mean} (mean ITL)`
      + (pred.itl_error != null ? `; ITL p50 ${h.itl_p50} measured beside ${h.predicted_itl} predicted (${h.itl_error})` : "")
    : "one token: no ITL";
  $("tl-mfu").textContent = pred.mfu != null ? `${(pred.mfu * 100).toFixed(1)} %` : "–";
  $("tl-mfu-sub").textContent = `${h.flops} in ${ms(t.prefill_s)} against ${h.gemm_rate} measured (${pred.gemm_source})`
    + (pred.mfu > 1 ? ". Over 100 %: the reference GEMM was timed at a busier moment; rates on a shared CPU are noisy." : "");
  $("guess-out").replaceChildren(...pred.guesses.map((g) => {
    const p = document.createElement("p");
    p.className = "mono";
    p.textContent = `${g.what}: ${g.words}`;
    return p;
  }));
  $("guess-out").hidden = pred.guesses.length === 0;
  await drawTimeline($("timeline-chart"), ticks, [
    { x: ttft, color: "#2563eb", label: "TTFT" },
    { x: pred.predicted_ttft_s, color: cssColor("--amber"), dash: true, label: "predicted" },
  ]);
}

async function showRoofline(pred, cached) {
  $("roof-box").hidden = false;
  const v = pred.verdict;
  const d = pred.decode;
  const what = cached ? `This prefill (the ${pred.computed} tokens computed; ${cached} came from the prefix cache)` : "This prefill";
  const measured = v.measured_flops_per_s != null ? ` It ran at ${(v.measured_flops_per_s / 1e9).toFixed(1)} GFLOP/s measured.` : "";
  brief($("roof-text"), `${what}: ${v.words}.${measured} One decode step: ${d.words}. `
    + `Ridge = peak ${curve.human.peak} / bandwidth ${curve.human.bandwidth} (the sweep's roof, ${curve.profile.kind} `
    + `profile). Weights: ${v.weights}.` + (v.turn ? ` As the sweep below says, ${v.turn}.` : ""));
  const live = { intensity: v.intensity, measured_flops_per_s: v.measured_flops_per_s ?? v.predicted_flops_per_s,
    label: `your prompt (P=${pred.computed})` };
  const decode = { intensity: d.intensity, flops_per_s: d.predicted_flops_per_s, label: "one decode step" };
  await drawRoofline($("roof-chart"), curve, [live], decode);
}
