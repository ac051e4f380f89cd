// Two views of the live prompt that the best explainers have (Transformer Explainer, Bycroft's LLM
// visualisation): the first answer token's probabilities (POST /api/next-token: the real model's logits at the
// prompt's last position, softmaxed) with where a token the student names ranked, and the prefill's GEMM against
// a decode step's (GET /api/gemm: the time model's own operation on the real model's shapes). The numbers are
// the API's; this file places them.

import { $, ApiError, getJSON, postJSON } from "./api.js";
import { visible } from "./grid.js";

const quote = (t) => `'${visible(t)}'`;
const pct = (p) => (p >= 0.001 ? `${(100 * p).toFixed(1)} %` : `${p.toExponential(1)}`);
const MAT_PX = 120; // d_model drawn this wide
let run = null; // the prompt the next-token box shows: {text, chat}

export function initNextToken() {
  $("next-form").addEventListener("submit", (e) => {
    e.preventDefault();
    if (run) showNextToken(run).catch((err) => { $("next-lookup-line").textContent = err.message; });
  });
}

// The distribution of the first answer token, the token chosen, and the looked-up token's rank. Returns the
// API's answer (the live section reads the chosen token to explain an empty answer), or null where the server
// refused this prompt (a prompt longer than the route reads): said in the box, the rest of the section drawn.
export async function showNextToken(current) {
  run = current;
  $("next-box").hidden = false;
  let r;
  try {
    r = await postJSON("/api/next-token", { text: current.text, chat: current.chat, top: 10,
      lookup: $("next-lookup").value });
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    $("next-list").replaceChildren();
    $("next-chosen").textContent = `${e.message.charAt(0).toUpperCase()}${e.message.slice(1)}.`;
    $("next-lookup-line").textContent = "";
    $("next-box").dataset.rank = "";
    return null;
  }
  const best = r.top[0].p;
  $("next-list").replaceChildren(...r.top.map((t, k) => {
    const li = document.createElement("li");
    const bar = Object.assign(document.createElement("span"), { className: "next-bar" });
    bar.style.width = `${(100 * t.p) / best}%`;
    const label = Object.assign(document.createElement("span"), { className: "next-label mono",
      textContent: `${k + 1}. ${quote(t.token)}` });
    const p = Object.assign(document.createElement("span"), { className: "next-p", textContent: pct(t.p) });
    li.append(label, bar, p);
    if (k === 0) li.className = "chosen";
    return li;
  }));
  $("next-chosen").textContent = `Chosen: ${quote(r.chosen.token)}, probability ${pct(r.chosen.p)}: at `
    + "temperature 0 the server takes the most likely token, the first of this list: the answer's first token. "
    + `The list is the top 10 of ${r.vocab.toLocaleString("en-US")} tokens, from the logits of the prompt's last `
    + `position (token ${r.P - 1}).`;
  const l = r.lookup;
  $("next-lookup-line").textContent = l ? `${quote(l.text)}` + (l.tokens.length > 1 ? ` is ${l.tokens.length} tokens `
    + `here (${l.tokens.map(quote).join(" + ")}); its first, ${quote(l.tokens[0])},` : "")
    + ` ranked ${l.rank.toLocaleString("en-US")} of ${r.vocab.toLocaleString("en-US")}, probability ${pct(l.p)}`
    + (l.rank === 1 ? ": the token chosen." : ".") : "";
  $("next-box").dataset.rank = l ? l.rank : "";
  return r;
}

// An answer with no text (its one token ended it): said in the answer box, with the token and its probability.
export function explainEmpty(result, next) {
  const why = next ? `the model's first answer token was ${quote(next.chosen.token)} (probability `
    + `${pct(next.chosen.p)}), which ends an answer` : "the model's first answer token ends an answer";
  $("answer-note").textContent = `No text: ${why}, so the server stopped after ${result.n} token`
    + `${result.n === 1 ? "" : "s"} (finish: ${result.finish ?? "stop"}). Its end token is never shown as text.`;
}

// One matrix as a box drawn to scale (rows x cols, d_model = MAT_PX), with its shape under it; a row is drawn at
// least ROW_PX high, so that 5 rows are not drawn as thin as decode's one.
const ROW_PX = 3;
const OPS_PX = 80; // the "·" and "=" between the three matrices, and the gaps
function matrix([rows, cols], dModel, name, px, tokens = true) {
  const box = Object.assign(document.createElement("span"), { className: "mat" });
  const fill = Object.assign(document.createElement("span"), { className: `mat-fill ${name}` });
  const high = (px * rows) / dModel; // to scale; a matrix of token rows (x, out) at least ROW_PX a row
  fill.style.width = `${Math.max(ROW_PX, (px * cols) / dModel)}px`;
  fill.style.height = `${Math.min(160, tokens ? Math.max(ROW_PX * rows, high) : high)}px`;
  box.append(fill, Object.assign(document.createElement("span"), { className: "mat-shape mono",
    textContent: `${name} [${rows.toLocaleString("en-US")}, ${cols.toLocaleString("en-US")}]` }));
  return box;
}

function gemmRow(g, dModel, id) {
  const op = (t) => Object.assign(document.createElement("span"), { className: "mat-op", textContent: t });
  // d_model drawn MAT_PX wide, or less where the three matrices would not fit side by side (a phone)
  const px = Math.min(MAT_PX, ($(id).clientWidth - OPS_PX) / (1 + (2 * g.w[1]) / dModel));
  $(id).replaceChildren(matrix(g.x, dModel, "x", px), op("·"), matrix(g.w, dModel, "W_QKV", px, false), op("="),
    matrix([g.x[0], g.w[1]], dModel, "out", px));
  return `x [${g.x.join(", ")}] · W_QKV [${g.w.join(", ")}]: ${g.human.flops} moving ${g.human.bytes} (the weight's `
    + `${g.human.weights} and the rows), ${g.intensity.toFixed(1)} FLOP/B; the time model predicts `
    + `${g.human.seconds} here (${g.bound}-bound)`;
}

// The prefill's GEMM and a decode step's, for the live prompt's P, one layer of the real model.
export async function showGemm(P) {
  $("gemm-box").hidden = false;
  let g;
  try {
    g = await getJSON("/api/gemm", { P });
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    $("gemm-text").textContent = e.message;
    return;
  }
  const dModel = g.prefill.x[1];
  const rows = g.chunked ? `its first chunk's ${g.prefill.M.toLocaleString("en-US")} rows` : `all ${P} rows`;
  $("gemm-prefill").textContent = `Prefill, ${rows} at once: ${gemmRow(g.prefill, dModel, "gemm-prefill-mats")}.`;
  $("gemm-decode").textContent = `One decode step, one row: ${gemmRow(g.decode, dModel, "gemm-decode-mats")}.`;
  $("gemm-text").textContent = `${g.flops_ratio.toFixed(0)} times the FLOPs for ${g.seconds_ratio.toFixed(1)} times `
    + "the time: the weight is read once per forward whatever the rows, so prefill's one wide GEMM reuses each "
    + "byte for every prompt row, while decode reads the same bytes for one row. (One layer's fused Q, K, V "
    + `projection; the model has ${g.L} layers, each with several such weights.)`;
  $("gemm-box").dataset.shown = String(P);
}
