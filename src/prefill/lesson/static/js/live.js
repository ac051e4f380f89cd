// Part 2: a real prefill on the server's model. The prompt goes through the OpenAI streaming route (the same
// scheduler as any client); tokens, attention, predictions and the roofline come from the /api routes.

import { $, ApiError, authHeaders, getJSON, latest, postJSON, settled } from "./api.js";
import { maskCell } from "./calculator.js";
import { cssColor } from "./charts.js";
import { drawGrid, visible } from "./grid.js";
import { followPrefill } from "./progress.js";
import { explainEmpty, initNextToken, showGemm, showNextToken } from "./nexttoken.js";
import { initSteps, showSteps } from "./steps.js";
import { showResults } from "./results.js";

let cat = null;
let current = null; // the prompt last prefilled: {text, chat, P, labels, maxAttentionP, n}
let paintMask = () => {}; // repaint the live grid with this many prompt tokens computed (a long prefill's chunks)
export const lastPrompt = () => current; // the calculator's "use my prompt's P"

const fmtB = (n) => `${Math.round(n).toLocaleString("en-US")} B`;
const quote = (t) => `'${visible(t)}'`;
const REPAINT_MS = 100; // the streamed answer's repaints, at most one in this many ms
const MAX_ANSWER = 256; // the answer-tokens box's max
const LATER = ["next-box", "timeline-box", "attn-box", "steps-box", "gemm-box", "roof-box"]; // boxes filled only once the prefill has run
const CHUNK_SHADE = "#1e3a8a"; // an odd chunk's allowed cells: a darker blue than the even chunks' accent
const NOT_YET = "#c7d2fe"; // allowed cells of rows whose chunk has not run yet: a pale blue
const CACHED = "#94a3b8"; // allowed cells of rows whose K/V came from the prefix cache: slate, not computed

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
  initSteps();
  initNextToken();
  const redraw = latest((signal) => Promise.all([showAttention(signal), stepsOfCurrent(signal)]), 30);
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
  const maxTokens = $("max-tokens").value;
  if (!text.trim()) {
    staleResults("Type a prompt first: an empty prompt has nothing to prefill.");
    return;
  }
  if (!/^\d+$/.test(maxTokens) || +maxTokens < 1 || +maxTokens > MAX_ANSWER) {
    staleResults(`Answer tokens: type how many tokens to write after the prompt, a whole number from 1 to ${MAX_ANSWER}.`);
    return;
  }
  btn.disabled = true;
  try {
    status("tokenizing…");
    const tok = await getJSON("/api/tokens", { text, chat: chat ? 1 : 0 });
    // Never two prompts on the page at once: the boxes this prompt fills only later are hidden until it does.
    staleResults(null);
    for (const id of LATER) $(id).hidden = true;
    current = { text, chat, P: tok.P, labels: tok.labels, maxAttentionP: tok.max_attention_P };
    await showTokens(tok);
    status(prefillStatus(tok));
    const result = await stream(tok, chat, +maxTokens);
    current.n = result.n;
    current.answer = result.text;
    showChunkTimes(tok, result.timings);
    status(`done: ${tok.P} prompt tokens, ${result.n} answer tokens.`);
    document.dispatchEvent(new CustomEvent("prompt-run", { detail: { P: tok.P, n: result.n } }));
    const [pred, next] = await Promise.all([showResults(cat, tok, result, guesses()), showNextToken(current),
      showAttention(), stepsOfCurrent(), showGemm(tok.P)]);
    if (pred.cached) showCached(pred);
    if (!result.text) explainEmpty(result, next);
    $("live").dataset.done = "1";
  } catch (e) {
    staleResults(e instanceof ApiError ? e.message : `unexpected: ${e}`);
    if (!(e instanceof ApiError)) console.error(e);
  } finally {
    btn.disabled = false;
  }
}

// What the server is about to do with the prompt, said before it does it: one pass, or its chunks.
function prefillStatus(tok) {
  return `prefilling ${tok.prefill}, then decoding…${chunkWords(tok)}`;
}

function chunkWords(tok) {
  return tok.chunk_size && tok.P > tok.chunk_size
    ? ` The server prefills a long prompt in chunks of ${tok.chunk_size} tokens, one forward each (chunked prefill): `
      + "each chunk attends to the K/V the chunks before it wrote, and other requests' decode steps run between "
      + "chunks, so one long prompt never stalls the others. The grid below shows the chunks."
    : "";
}

// The student's guesses before the run (empty boxes: no guess), sent beside the measurement.
function guesses() {
  const out = {};
  const ttft = $("guess-ttft").value.trim();
  const kv = $("guess-kv").value.trim();
  if (ttft !== "" && +ttft >= 0) out.guess_ttft_s = +ttft / 1e3;
  if (kv !== "" && +kv >= 0) out.guess_kv = +kv;
  return out;
}

// A prompt that could not run: say why in plain words, and grey out the last prompt's results (null: they belong
// to the prompt being run, so they are shown plainly again).
function staleResults(reason) {
  for (const box of document.querySelectorAll("#live .sub")) box.classList.toggle("stale", reason !== null);
  $("live").classList.toggle("has-stale", reason !== null);
  if (reason === null) return;
  const earlier = document.querySelector("#live .sub:not([hidden])") ? " The greyed results below are the last prompt's." : "";
  status(`${reason}${earlier}`, true);
}

async function showTokens(tok) {
  $("tokens-box").hidden = false;
  $("tokens-caption").textContent = `${tok.P} tokens (numbered from 0): ${tok.labels.slice(0, 12).map(quote).join(" ")}`
    + `${tok.P > 12 ? " …" : ""}${templateWords(tok.template)}`;
  const hover = $("token-hover");
  const m = await getJSON("/api/mask", { P: tok.P });  // a long prompt's in cells of m.scale tokens
  // The server's prefill chunks as bands of rows: chunk k computes the rows of its own tokens, attending to all
  // the columns before them (the K/V the earlier chunks wrote).
  const chunk = tok.chunk_size && tok.P > tok.chunk_size ? tok.chunk_size : null;
  const chunkOf = (token) => (chunk ? Math.floor(token / chunk) : 0); // 0-based; said as chunk k + 1 of N
  $("chunk-caption").textContent = chunk ? `Chunked prefill: ${tok.prefill}. The rows are banded by chunk (alternate `
    + `shades): chunk 1 holds tokens 0-${chunk - 1}, chunk 2 tokens ${chunk}-${Math.min(tok.P, 2 * chunk) - 1}`
    + `${tok.P > 2 * chunk ? ", …" : ""}; each chunk's rows read the whole K/V written before them. While it runs, `
    + "the rows not computed yet are pale." : "";
  const base = maskCell(m.rows);
  let done = Infinity; // prompt tokens computed so far (a long prefill's progress); rows past it are pale
  let cached = 0; // prompt tokens whose K/V the prefix cache held (known once the request has run)
  const banded = (i, j) => {
    const look = base(i, j);
    if (look.cls !== "allowed") return look;
    if (i * m.scale < cached) return { ...look, color: CACHED };
    if (i * m.scale >= done) return { ...look, color: NOT_YET };
    return !cached && chunkOf(i * m.scale) % 2 ? { ...look, color: CHUNK_SHADE } : look;
  };
  hover.textContent = `${m.caption}. Hover or tap a cell.`;
  let draw;
  paintMask = (tokens, fromCache = 0) => {
    done = tokens;
    cached = fromCache;
    $("token-grid").dataset.computed = Number.isFinite(tokens) ? tokens : tok.P;
    draw();
  };
  if (m.scale > 1) {
    const span = (i) => `${i * m.scale}-${Math.min(tok.P, (i + 1) * m.scale) - 1}`;
    const inChunk = (i) => (chunk ? ` (chunk ${chunkOf(i * m.scale) + 1})` : "");
    draw = () => drawGrid($("token-grid"), {
      P: m.rows.length, labels: null, cell: banded, hover,
      describe: (i, j) => (m.rows[i][j] === "1" ? `tokens ${span(i)}${inChunk(i)} may use tokens ${span(j)}`
        : m.rows[i][j] === "d" ? `tokens ${span(i)}: each may use itself and the earlier ones of these`
          : `masked: tokens ${span(j)} are in the future of tokens ${span(i)}`),
    });
  } else {
    draw = () => drawGrid($("token-grid"), {
      P: tok.P, labels: tok.labels, cell: banded, hover,
      describe: (i, j) => (m.rows[i][j] === "1" ? `token ${i} ${quote(tok.labels[i])} may use token ${j} ${quote(tok.labels[j])}`
        : `masked: ${quote(tok.labels[j])} (${j}) is in ${quote(tok.labels[i])}'s (${i}) future`),
    });
  }
  paintMask(Infinity);
}

// What the chat template added to the student's text, said where the tokens are: its tokens, and the system
// prompt it writes on its own where it does.
function templateWords(t) {
  if (!t) return "";
  const system = t.system ? ` Among them is a system prompt you did not write: the template adds it on its own, `
    + `before your text: ${quote(t.before.trim())}.` : ` Before your text: ${quote(t.before)}.`;
  return `. The chat template adds ${t.tokens} tokens of its own around your text.${system} After it: ${quote(t.after)}.`;
}

// After a rerun whose prompt start came from the prefix cache: its rows are drawn as read, not computed (slate),
// and the caption says what was computed, in the words of the timeline (one pass, or its chunks).
function showCached(pred) {
  paintMask(Infinity, pred.cached);
  $("token-grid").dataset.cached = pred.cached;
  $("chunk-caption").textContent = `This prompt ran before: the first ${pred.cached.toLocaleString("en-US")} tokens' `
    + `K/V came from the prefix cache (slate rows: read, not computed). The prefill: ${pred.prefill}. Only the blue `
    + "rows were computed by this request.";
}

// After a chunked prefill: when the server says each chunk's forward ended (ms after the request arrived).
function showChunkTimes(tok, timings) {
  const chunks = timings?.prefill_chunks;
  if (!chunks) return;
  const said = chunks.map((c, k) => `chunk ${k + 1} (tokens ${c.first}-${c.last}) at `
    + `${Math.round(1e3 * c.t_s).toLocaleString("en-US")} ms`);
  $("chunk-caption").textContent += ` Measured on the server, each chunk's forward ended: ${said.join(", ")}, counted `
    + "from the request's arrival.";
}

// ---- streaming, and the KV cache growing as it goes ----

// The KV cache after prefill (S = P, its formula written out by the API) and as decode grows it (S = P + the
// tokens generated so far; the newest token's K/V is written by the next step, the last one's never).
// While the prefill runs, S counts the prompt positions written so far: 0 until the first chunk ends (one pass:
// until the first token), then each chunk's end as the server reports it.
function showKV(tok, held, timings) {
  $("kv-box").hidden = false;
  const own = cat.loaded;
  const prefilling = held < tok.P;
  $("kv-prefill").textContent = tok.kv.text;
  $("kv-prefill-formula").textContent = tok.kv.formula;
  $("kv-shape").textContent = `${own.L} layers × K and V, each [B, H_kv, S, d_head] = [1, ${own.H_kv}, ${held}, `
    + `${own.d_head}] (${own.dtype}); ` + (prefilling ? `S = ${held} of the ${tok.P} prompt positions, written so `
      + "far: the prefill is running" : `S = the ${tok.P} prompt positions + ${held - tok.P} generated so far`);
  $("kv-decode-label").textContent = prefilling ? `during the prefill: S = ${held} written so far`
    : `after decode so far: S = ${tok.P} + ${held - tok.P} = ${held} (measured)`;
  $("kv-box").dataset.held = held;
  $("kv-fill").style.width = `${Math.min(100, (100 * held) / (tok.P + +$("max-tokens").value))}%`;
  $("kv-measured").textContent = timings?.kv_bytes != null ? fmtB(timings.kv_bytes)
    : prefilling ? "prefilling…" : "not reported";
  if (timings?.kv_bytes_formula != null) $("kv-formula").textContent = fmtB(timings.kv_bytes_formula);
}

// The KV tiles at S positions held during the prefill (a chunk's end), the formula's bytes from /api/kv.
async function prefillKV(tok, held) {
  showKV(tok, held, null);
  const kv = await getJSON("/api/kv", { P: held, symbol: "S" });
  if (+$("kv-box").dataset.held === held) $("kv-formula").textContent = fmtB(kv.bytes);
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
  $("answer-note").textContent = "";
  const out = { times: [], serverTimes: [], text: "", timings: null, usage: null, n: 0, finish: null };
  // While tokens stream, the answer and the KV cache are repainted every REPAINT_MS at most, not once a token:
  // where the browser shares the server's cores, a repaint a token took 7-8 ms of every ITL (2 cores).
  let pending = null;
  let latestKV = null; // [tokens held, the token's timings or null]
  const show = () => {
    pending = null;
    $("answer").textContent = out.text;
    if (latestKV) showKV(tok, latestKV[0], latestKV[1]);
  };
  prefillKV(tok, 0).catch(() => {}); // a failure here is said by the stream's own
  $("kv-formula-text").textContent = "";
  // The page holds still while the server prefills: where it shares the machine with the server (`prefill lab`
  // on a laptop), its own layout and painting take cores from the forward it is about to measure.
  await settled();
  const t0 = performance.now();
  const res = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
    method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() }, body: JSON.stringify(body),
  });
  if (!res.ok) throw new ApiError((await res.json().catch(() => null))?.error?.message ?? `HTTP ${res.status}`);
  // The request is queued (its headers came back before any token): follow a long prompt's chunks as the server
  // reports them; the grid's rows fill in as their chunks run.
  const stopProgress = followPrefill(tok, (words) => status(`${words}.${chunkWords(tok)}`), (n) => {
    paintMask(n);
    if (!out.times.length && Number.isFinite(n)) prefillKV(tok, n).catch(() => {}); // the K/V written so far
  }, body.cache_salt !== undefined);
  try {
    for await (const obj of sseEvents(res)) {
      const now = (performance.now() - t0) / 1e3;
      const ch = obj.choices?.[0];
      const piece = chat ? ch?.delta?.content : ch?.text;
      // A token's chunk: text, or (with continuous usage stats) the server's timings of that token even
      // when its text is held back for a possible stop string. The last chunk's timings are the final ones.
      const perToken = obj.timings?.t_s != null;
      if (piece) out.text += piece;
      if (obj.usage) out.usage = obj.usage;
      if (ch?.finish_reason) out.finish = ch.finish_reason;
      if (obj.timings && !perToken) out.timings = obj.timings;
      if (piece || perToken) {
        if (stopProgress()) paintMask(Infinity); // the first token: every row computed
        out.times.push(now);
        if (perToken) out.serverTimes.push(obj.timings.t_s);
      }
      out.n = out.usage?.completion_tokens ?? out.times.length;
      if (piece || perToken) {
        latestKV = [obj.timings?.kv_tokens ?? tok.P + Math.max(0, out.n - 1), perToken ? obj.timings : null];
        pending ??= setTimeout(show, REPAINT_MS);
      }
    }
  } finally {
    stopProgress();
  }
  clearTimeout(pending);
  show();
  if (latestKV) { // the formula at the final S, written out
    const kv = await getJSON("/api/kv", { P: latestKV[0], symbol: "S" });
    $("kv-formula").textContent = fmtB(kv.bytes);
    $("kv-formula-text").textContent = kv.formula + (latestKV[1]?.kv_bytes === kv.bytes
      ? ": equal to the bytes measured in the request's cache blocks" : "");
  }
  return out;
}

// The server-sent events of a streamed completion, parsed; an error event is thrown as an ApiError.
async function* sseEvents(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const obj = JSON.parse(event.slice(6));
      if (obj.error) throw new ApiError(obj.error.message);
      yield obj;
    }
  }
}

// The prefill / decode stepper for the last prompt, at the layer and head chosen for the heat map.
function stepsOfCurrent(signal) {
  return current?.n != null ? showSteps(current, +$("layer-select").value, +$("head-select").value, signal) : null;
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
