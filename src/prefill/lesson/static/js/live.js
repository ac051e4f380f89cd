// Part 2: a real prefill on the server's model. The prompt goes through the OpenAI streaming route (the same
// scheduler as any client); tokens, attention, predictions and the roofline come from the /api routes.

import { $, ApiError, getJSON, latest, postJSON, report, settled } from "./api.js";
import { maskCell } from "./calculator.js";
import { cssColor, drawRoofline, drawTimeline } from "./charts.js";
import { drawGrid, visible } from "./grid.js";

let cat = null;
let current = null; // the prompt last prefilled: {text, chat, P, labels, maxAttentionP}

const fmtB = (n) => `${Math.round(n).toLocaleString("en-US")} B`;
const ms = (s) => (s == null ? "–" : s < 1 ? `${(s * 1e3).toFixed(1)} ms` : `${s.toFixed(2)} s`);
const quote = (t) => `'${visible(t)}'`;
const REPAINT_MS = 100; // the streamed answer's repaints, at most one in this many ms
const median = (xs) => {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

function status(text, error = false) {
  $("live-status").textContent = text;
  $("live-status").className = `status${error ? " error" : ""}`;
}

export function initLive(catalog) {
  cat = catalog;
  const own = cat.loaded;
  if (!own) {
    $("prefill-btn").disabled = true;
    status("No model is loaded in this server.");
    return;
  }
  for (let l = 0; l < own.L; l++) $("layer-select").append(new Option(String(l), l));
  for (let h = 0; h < own.H_q; h++) $("head-select").append(new Option(String(h), h));
  $("layer-select").value = Math.floor(own.L / 2);
  const redraw = latest(showAttention, 30);
  $("layer-select").addEventListener("change", redraw);
  $("head-select").addEventListener("change", redraw);
  $("live-form").addEventListener("submit", (e) => { e.preventDefault(); run(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); }
  });
}

async function run() {
  const btn = $("prefill-btn");
  if (btn.disabled) return;
  delete $("live").dataset.done;
  const text = $("prompt").value;
  const chat = $("chat").checked;
  if (!text.trim()) {
    staleResults("Type a prompt first: an empty prompt has nothing to prefill.");
    return;
  }
  btn.disabled = true;
  try {
    status("tokenizing…");
    const tok = await getJSON("/api/tokens", { text, chat: chat ? 1 : 0 });
    staleResults(null);
    current = { text, chat, P: tok.P, labels: tok.labels, maxAttentionP: tok.max_attention_P };
    await showTokens(tok);
    status(`prefilling ${tok.P} tokens in one pass, then decoding…`);
    const result = await stream(tok, chat, +$("max-tokens").value);
    btn.disabled = false;
    status(`done: ${tok.P} prompt tokens, ${result.n} answer tokens.`);
    const cached = result.usage?.prompt_tokens_details?.cached_tokens ?? 0;
    await Promise.all([showTimeline(tok, result, cached), showRoofline(tok.P - cached, cached), showAttention()]);
    $("live").dataset.done = "1";
  } catch (e) {
    if (e instanceof ApiError) staleResults(e.message);
    else {
      status(String(e), true);
      report(e);
    }
  } finally {
    btn.disabled = false;
  }
}

// A prompt that could not run: say why in plain words, and grey out the last prompt's results (null: they belong
// to the prompt being run, so they are shown plainly again).
function staleResults(reason) {
  for (const box of document.querySelectorAll("#live .sub")) box.classList.toggle("stale", reason !== null);
  if (reason === null) return;
  const earlier = document.querySelector("#live .sub:not([hidden])") ? " The results below are the last prompt's." : "";
  status(`${reason}${earlier}`, true);
}

async function showTokens(tok) {
  $("tokens-box").hidden = false;
  $("tokens-caption").textContent = `${tok.P} tokens: ${tok.labels.slice(0, 12).map(quote).join(" ")}${tok.P > 12 ? " …" : ""}`;
  const hover = $("token-hover");
  const m = await getJSON("/api/mask", { P: tok.P });  // a long prompt's in cells of m.scale tokens
  hover.textContent = `${m.caption}. Hover a cell.`;
  if (m.scale > 1) {
    const span = (i) => `${i * m.scale}-${Math.min(tok.P, (i + 1) * m.scale) - 1}`;
    drawGrid($("token-grid"), {
      P: m.rows.length, labels: null, cell: maskCell(m.rows), hover,
      describe: (i, j) => (m.rows[i][j] === "1" ? `tokens ${span(i)} may use tokens ${span(j)}`
        : m.rows[i][j] === "d" ? `tokens ${span(i)}: each may use itself and the earlier ones of these`
          : `masked: tokens ${span(j)} are in the future of tokens ${span(i)}`),
    });
    return;
  }
  drawGrid($("token-grid"), {
    P: tok.P, labels: tok.labels, cell: maskCell(m.rows), hover,
    describe: (i, j) => (m.rows[i][j] === "1" ? `token ${i} ${quote(tok.labels[i])} may use token ${j} ${quote(tok.labels[j])}`
      : `masked: ${quote(tok.labels[j])} (${j}) is in ${quote(tok.labels[i])}'s (${i}) future`),
  });
}

// ---- streaming, and the KV cache growing as it goes ----

function showKV(P, held, timings, tokFormula) {
  $("kv-box").hidden = false;
  const own = cat.loaded;
  $("kv-shape").textContent = `${own.L} layers × K and V, each [B, H_kv, S, d_head] = [1, ${own.H_kv}, ${held}, `
    + `${own.d_head}] (${own.dtype}); S = the ${P} prompt positions + ${Math.max(0, held - P)} generated so far`;
  $("kv-fill").style.width = `${Math.min(100, (100 * held) / (P + +$("max-tokens").value))}%`;
  if (timings?.kv_bytes != null) {
    $("kv-measured").textContent = fmtB(timings.kv_bytes);
    $("kv-formula").textContent = fmtB(timings.kv_bytes_formula);
    $("kv-formula-text").textContent = timings.kv_bytes === timings.kv_bytes_formula
      ? "measured from the request's cache blocks: equal to the formula" : "measured and formula differ";
    return;
  }
  $("kv-measured").textContent = "not reported";
  tokFormula(held);
}

async function stream(tok, chat, maxTokens) {
  const own = cat.loaded;
  const body = { model: own.model_id, max_tokens: maxTokens, temperature: 0, stream: true,
    stream_options: { include_usage: true, continuous_usage_stats: true } };
  if (chat) body.messages = [{ role: "user", content: current.text }];
  else body.prompt = current.text;
  // Without the prefix cache: a salt no request had before (vLLM's cache_salt) shares no cached block.
  if (!$("use-cache").checked) body.cache_salt = `page-${Date.now()}-${Math.random().toString(36).slice(2)}`;
  $("answer-box").hidden = false;
  $("answer").textContent = "";
  const out = { times: [], serverTimes: [], text: "", timings: null, usage: null, n: 0 };
  // While tokens stream, the answer and the KV cache are repainted every REPAINT_MS at most, not once a token:
  // where the browser shares the server's cores, a repaint a token took 7-8 ms of every ITL (2 cores).
  let pending = null;
  let latestKV = null; // [tokens held, the token's timings or null]
  const show = () => {
    pending = null;
    $("answer").textContent = out.text;
    if (latestKV) showKV(tok.P, latestKV[0], latestKV[1], formulaFor);
  };
  const showFormula = async (held, signal) => {
    const kv = await getJSON("/api/kv", { P: held }, signal);
    $("kv-formula").textContent = fmtB(kv.bytes);
    $("kv-formula-text").textContent = `${kv.formula} (this server version does not report measured bytes per chunk)`;
  };
  const formula = latest((signal) => showFormula(formula.held, signal), 0);
  const formulaFor = (held) => { formula.held = held; formula(); };
  showKV(tok.P, tok.P, null, () => {});
  await showFormula(tok.P);
  // The page holds still while the server prefills: where it shares the machine with the server (`prefill lab`
  // on a laptop), its own layout and painting take cores from the forward it is about to measure.
  await settled();
  const t0 = performance.now();
  const res = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
  });
  if (!res.ok) throw new ApiError((await res.json().catch(() => null))?.error?.message ?? `HTTP ${res.status}`);
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice(6);
      if (data === "[DONE]") continue;
      const obj = JSON.parse(data);
      if (obj.error) throw new ApiError(obj.error.message);
      const now = (performance.now() - t0) / 1e3;
      const ch = obj.choices?.[0];
      const piece = chat ? ch?.delta?.content : ch?.text;
      // A token's chunk: text, or (with continuous usage stats) the server's timings of that token even
      // when its text is held back for a possible stop string. The last chunk's timings are the final ones.
      const perToken = obj.timings?.t_s != null;
      if (piece) out.text += piece;
      if (obj.usage) out.usage = obj.usage;
      if (obj.timings && !perToken) out.timings = obj.timings;
      if (piece || perToken) {
        out.times.push(now);
        if (perToken) out.serverTimes.push(obj.timings.t_s);
      }
      out.n = out.usage?.completion_tokens ?? out.times.length;
      if (piece || perToken) {
        latestKV = [obj.timings?.kv_tokens ?? tok.P + Math.max(0, out.n - 1), perToken ? obj.timings : null];
        pending ??= setTimeout(show, REPAINT_MS);
      }
    }
  }
  clearTimeout(pending);
  show();
  return out;
}

// ---- timeline: measured phases and ticks, beside the predictions ----

async function showTimeline(tok, r, cached) {
  $("timeline-box").hidden = false;
  const t = r.timings ?? {};
  const ticks = r.serverTimes.length === r.times.length ? r.serverTimes : r.times;
  const ttft = t.ttft_s ?? r.times[0];
  const total = t.total_s ?? r.times.at(-1);
  const itls = Array.isArray(t.itl_s) ? t.itl_s : ticks.slice(1).map((x, k) => x - ticks[k]);
  const itl = itls.length ? itls.reduce((a, b) => a + b, 0) / itls.length : null;
  $("tl-ttft").textContent = ms(ttft);
  $("tl-ttft-sub").textContent = t.prefill_s != null ? `of which prefill ${ms(t.prefill_s)}` : "";
  $("tl-total").textContent = ms(total);
  for (const id of ["tl-pred", "tl-model", "tl-mfu", "tl-why"]) $(id).textContent = "…";
  $("tl-mfu-sub").textContent = "measuring this machine's GEMM rate (once per server)…";
  const query = { P: tok.P, cached, n: r.n };
  if (t.prefill_s) query.prefill_s = t.prefill_s;
  if (t.tokenize_s != null) query.tokenize_s = t.tokenize_s;
  if (t.cold) query.cold = 1;
  const itlP50 = median(itls);
  if (itlP50) query.itl_s = itlP50;
  const [pred, model] = await Promise.all([
    getJSON("/api/predict", query),
    itl && r.n >= 1 ? getJSON("/api/request", { ttft, itl, n: r.n }) : Promise.resolve(null),
  ]);
  const phases = [["tokenize", t.tokenize_s], ["queue", t.queue_s], ["prefill", t.prefill_s]];
  const before = phases.reduce((a, [, s]) => a + (s ?? 0), 0);
  phases.push(["first", t.first_token_s ?? Math.max(0, ttft - before)], ["decode", Math.max(0, total - ttft)]);
  const names = { tokenize: "tokenize", queue: "queue", prefill: `prefill (${pred.prefill})`,
    first: "first token (from the prefill)",
    decode: r.n > 1 ? `decode (${r.n - 1} steps: tokens 2 to ${r.n})` : "decode (none: one token)" };
  $("phases").replaceChildren(...phases.filter(([, s]) => s != null).map(([k, s]) => {
    const d = document.createElement("div");
    d.className = `ph-${k}`;
    d.style.flex = `${Math.round(s * 1e6)} 1 0`;  // flex-grow in microseconds: the bar's widths are the times
    d.title = `${names[k]}: ${ms(s)}`;
    return d;
  }));
  $("phase-legend").replaceChildren(...phases.filter(([, s]) => s != null).map(([k, s]) => {
    const span = document.createElement("span");
    span.className = "item";
    span.innerHTML = `<span class="sw ph-${k}"></span> ${names[k]} ${ms(s)}`;
    return span;
  }));
  const predTTFT = pred.predicted_ttft_s;
  $("tl-pred").textContent = ms(predTTFT);
  $("tl-pred-sub").textContent = pred.error != null
    ? `prefill ${pred.human.predicted} predicted beside ${ms(t.prefill_s)} measured (${pred.human.error}); ${pred.method}`
    : `prefill ${pred.human.predicted} (${pred.method})`;
  $("tl-why").textContent = pred.note ? `Why: ${pred.note}` : "";
  $("tl-model").textContent = model ? ms(model.request_s) : "–";
  $("tl-model-sub").textContent = model ? `${ms(ttft)} + ${r.n - 1} × ${ms(itl)} (mean ITL)`
    + (pred.itl_error != null ? `; ITL p50 ${ms(itlP50)} measured beside ${pred.human.predicted_itl} predicted `
      + `(${pred.human.itl_error})` : "") : "one token: no ITL";
  $("tl-mfu").textContent = pred.mfu != null ? `${(pred.mfu * 100).toFixed(1)} %` : "–";
  $("tl-mfu-sub").textContent = `${pred.human.flops} in ${ms(t.prefill_s)} against ${pred.human.gemm_rate} measured (${pred.gemm_source})`
    + (pred.mfu > 1 ? ". Over 100 %: the reference GEMM was timed at a busier moment; rates on a shared CPU are noisy." : "");
  await drawTimeline($("timeline-chart"), ticks, [
    { x: ttft, color: "#2563eb", label: "TTFT" },
    { x: predTTFT, color: cssColor("--amber"), dash: true, label: "predicted" },
  ]);
}

async function showRoofline(P, cached) {
  $("roof-box").hidden = false;
  $("roof-text").textContent = "Measuring this machine's GEMM rate and memory bandwidth (once per server)…";
  const r = await getJSON("/api/roofline", { P });
  const what = cached ? `This prefill (the ${P} tokens computed; ${cached} came from the prefix cache)` : "This prefill";
  $("roof-text").textContent = `${what}: ${r.prefill_intensity.toFixed(1)} FLOP/B, ${r.prefill_bound}. `
    + `One decode step: ${r.decode_intensity.toFixed(1)} FLOP/B, ${r.decode_bound}. Ridge point `
    + `${r.ridge.toFixed(1)} FLOP/B = measured GEMM rate / measured bandwidth (${r.dtype}). `
    + (r.compute_bound_from_P ? `A prefill here is compute-bound from P ≈ ${r.compute_bound_from_P.toLocaleString("en-US")} tokens.` : "");
  await drawRoofline($("roof-chart"), r);
}

async function showAttention(signal) {
  if (!current) return;
  $("attn-box").hidden = false;
  if (current.P > current.maxAttentionP) {
    $("attn-grid").replaceChildren();
    $("attn-check").textContent = `Attention weights are shown for prompts up to ${current.maxAttentionP} tokens; this one has ${current.P}.`;
    return;
  }
  const a = await postJSON("/api/attention", { text: current.text, chat: current.chat,
    layer: +$("layer-select").value, head: +$("head-select").value }, signal);
  const worst = Math.max(...a.row_sums.map((s) => Math.abs(s - 1)));
  // The page's accent at opacity √weight (two hex digits), as the colour scale beside the map says.
  const accent = cssColor("--accent");
  const alpha = (w) => Math.round(255 * Math.sqrt(w)).toString(16).padStart(2, "0");
  drawGrid($("attn-grid"), {
    P: a.P, labels: a.labels, hover: $("attn-hover"),
    cell: (i, j) => (j > i ? { cls: "masked" } : { cls: "weight", color: `${accent}${alpha(a.weights[i][j])}` }),
    describe: (i, j) => (j > i ? `masked: weight exactly 0 (${quote(a.labels[j])} is in the future)`
      : `${quote(a.labels[i])} puts ${(a.weights[i][j] * 100).toFixed(1)} % of its attention on ${quote(a.labels[j])}`),
  });
  $("attn-check").textContent = `Layer ${a.layer}, query head ${a.head} (reads K/V head ${a.kv_head}). Upper triangle: `
    + `largest weight ${a.upper_max} (exactly zero). Every row sums to 1 (largest |sum − 1| = ${worst.toExponential(1)}).`;
}
