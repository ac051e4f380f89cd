// Prefill against decode, one step at a time (in the spirit of Transformer Explainer and Bycroft's LLM
// visualisation). Step 0, the prefill, computes every prompt row of A = softmax(mask(Q·Kᵀ / √d_head)) in ONE
// forward and writes P positions of K/V; each decode step after it computes ONE new row, for the token it feeds,
// against every cached key, and writes one more position. The weights are the real model's: POST /api/attention
// (the probe) over the prompt followed by the answer's first n − 1 tokens, the inputs of the decode steps.

import { $, getJSON, postJSON } from "./api.js";
import { cssColor } from "./charts.js";
import { drawGrid, visible } from "./grid.js";

const PLAY_MS = 1200; // one step this often while playing
const EARLIER = "#64748b"; // rows computed by an earlier step: slate, at opacity √weight
const quote = (t) => `'${visible(t)}'`;
const pct = (w) => `${(100 * w).toFixed(1)} %`;

let view = null; // {a: the /api/attention answer, P: prompt rows, step, kv: {S: bytes text}}
let timer = null;

export function initSteps() {
  $("steps-prev").addEventListener("click", () => { pause(); go(view.step - 1); });
  $("steps-next").addEventListener("click", () => { pause(); go(view.step + 1); });
  $("steps-play").addEventListener("click", () => (timer ? pause() : play()));
}

// The last run's steps (run: {text, chat, P, n, answer, maxAttentionP}), for the layer and head chosen above.
export async function showSteps(run, layer, head, signal) {
  pause();
  $("steps-box").hidden = false;
  const room = run.maxAttentionP - run.P;
  if (room < 0) {
    view = null; // nothing of the last prompt's steps stays: its grid, label, rows and KV strip are emptied
    for (const id of ["steps-grid", "steps-kv", "steps-label", "steps-row", "steps-kv-text", "steps-hover"]) {
      $(id).replaceChildren();
    }
    $("steps-body").hidden = true;
    $("steps-what").textContent = `The step-through is shown for prompts up to ${run.maxAttentionP} tokens; this one has ${run.P}.`;
    return;
  }
  const answerTokens = Math.max(0, Math.min(run.n - 1, room));
  const a = await postJSON("/api/attention", { text: run.text, chat: run.chat, layer, head,
    answer: answerTokens ? run.answer : "", answer_tokens: answerTokens }, signal);
  view = { a, P: a.prefill_rows, step: 0, kv: {} };
  $("steps-body").hidden = false;
  await go(0);
}

const lastStep = () => view.a.P - view.P; // the decode steps shown

function play() {
  if (view.step >= lastStep()) go(0);
  $("steps-play").textContent = "❚❚ pause";
  timer = setInterval(() => {
    go(view.step + 1);
    if (view.step >= lastStep()) pause(); // stopped on the last step, ready to play again from the prefill
  }, PLAY_MS);
}

function pause() {
  clearInterval(timer);
  timer = null;
  $("steps-play").textContent = "▶ play";
}

async function go(step) {
  if (!view) return;
  const { a, P } = view;
  const k = Math.max(0, Math.min(lastStep(), step));
  view.step = k;
  const [lo, hi] = k === 0 ? [0, P] : [P + k - 1, P + k]; // the rows this step computes
  const accent = cssColor("--accent");
  const alpha = (w) => Math.round(255 * Math.sqrt(w)).toString(16).padStart(2, "0");
  drawGrid($("steps-grid"), {
    P: a.P, labels: a.labels, hover: $("steps-hover"),
    cell: (i, j) => (j > i ? { cls: "masked" } : i >= hi ? { cls: "later" }
      : { cls: i >= lo ? "weight now" : "weight", color: `${i >= lo ? accent : EARLIER}${alpha(a.weights[i][j])}` }),
    describe: (i, j) => (j > i ? `masked: ${quote(a.labels[j])} is in the future of ${quote(a.labels[i])}`
      : i >= hi ? `row ${i} is computed by a later step` : `row ${i} ${quote(a.labels[i])}: ${pct(a.weights[i][j])} `
        + `on ${quote(a.labels[j])} (computed by ${i < P ? "the prefill" : `decode step ${i - P + 1}`})`),
  });
  $("steps-grid").dataset.step = k;
  $("steps-label").textContent = k === 0 ? `step 0 of ${lastStep()}: prefill` : `step ${k} of ${lastStep()}: decode ${k}`;
  $("steps-prev").disabled = k === 0;
  $("steps-next").disabled = k === lastStep();
  $("steps-what").textContent = k === 0
    ? `Prefill: ONE forward computes all ${P} rows at once, every prompt token's query against the keys up to it `
      + `(${P * (P + 1) / 2} weights under the mask), and writes ${P} positions of K/V. Its last row gives the first token.`
    : `Decode ${k}: ONE forward feeds ${quote(a.labels[lo])} (position ${lo}), computes ONE new row against the `
      + `${lo + 1} cached keys (its own written this step), and adds one position to the KV cache.`;
  $("steps-row").textContent = `row ${hi - 1} ${quote(a.labels[hi - 1])}, largest weights: ${top(a, hi - 1)}`;
  await showCache(hi);
}

// The row's three largest weights, "61.2 % on 'AI', …", and the row's sum.
function top(a, i) {
  const row = a.weights[i].slice(0, i + 1).map((w, j) => [w, j]).sort((x, y) => y[0] - x[0]).slice(0, 3);
  return `${row.map(([w, j]) => `${pct(w)} on ${quote(a.labels[j])} (${j})`).join(", ")}; the row sums to `
    + `${a.row_sums[i].toFixed(4)}`;
}

// The KV cache after the step: S positions, filled left to right, and its bytes from /api/kv.
async function showCache(S) {
  const { a, P } = view;
  const strip = $("steps-kv");
  strip.replaceChildren(...a.labels.map((t, j) => {
    const c = document.createElement("span");
    c.className = `kv-pos${j < S ? " held" : ""}${j === S - 1 && S > P ? " new" : ""}${j < P && S === P ? " new" : ""}`;
    c.title = `position ${j} ${quote(t)}`;
    return c;
  }));
  strip.dataset.held = S;
  view.kv[S] ??= (await getJSON("/api/kv", { P: S, symbol: "S" })).formula;
  $("steps-kv-text").textContent = `KV cache after this step: S = ${S} positions. ${view.kv[S]}`;
}
