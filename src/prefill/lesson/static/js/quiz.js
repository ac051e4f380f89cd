// The three typed answers (checked by the server, which holds the answers) and the multiple-choice questions:
// "Predict first" before the mask demo, and three on KV bytes, arithmetic intensity and the load curve.

import { $, getJSON, postJSON, report } from "./api.js";
import { lastLoad } from "./load.js";

// Each question's right choice, a hint for a wrong one (never the answer: the student tries again), and why the
// right one is right, shown only once it is chosen. The load question's why quotes the page's own simulation
// (the "Under load" section's answer) where it has run: how far this server's wait bends is its numbers' to say.
const QUESTIONS = {
  predict: { right: "B",
    hint: "Which tokens may the last prompt token read, and which may the first? The mask below says; then try again.",
    why: () => "Prefill computes all positions in the same pass, but each position's attention may only read itself "
      + "and earlier positions (token i uses tokens 0…i). The mask enforces that inside the parallel pass, which is "
      + "why the parallel result equals the one-at-a-time result; break it and decode would continue from the "
      + "wrong cache." },
  kv: { right: "B",
    hint: "Write out 2 · L · H_kv · d_head · P · b (K and V, for every layer, KV head, head dimension and prompt "
      + "position, b bytes each) and multiply it out; then try again.",
    why: () => "2 · L · H_kv · d_head · P · b = 2 · 32 · 8 · 128 · 2,048 · 2 = 268,435,456 B = 256 MiB: K and V "
      + "(the 2), for every layer, KV head, head dimension and prompt position, at 2 bytes each." },
  intensity: { right: "A",
    hint: "Of the two, the FLOPs and the bytes of the weights, which one grows with P? Then try again.",
    why: () => "The FLOPs are about 2 · N · P, while the weights' N · b bytes are read once per forward whatever P "
      + "is: 100 times the tokens reuse the same bytes 100 times as often, so the FLOPs per byte grow with P until "
      + "the activations' bytes (which do grow with P) catch up. That is the P sweep below." },
  load: { right: "C",
    hint: "Think of the queue when the arrivals nearly match what the server can finish; then try again.",
    why: () => "For a server that takes one request at a time, the wait in the queue grows like 1 / (1 − ρ): "
      + "slowly at first, then without bound as ρ nears 1, where the server can never catch up. "
      + simulated() },
};

// What the page's own simulation of this server says (the "Under load" section's curve), or where to find it.
function simulated() {
  const r = lastLoad();
  if (!r) return "The 'Under load' section below simulates this server: scroll there to see its numbers.";
  const at = (u) => r.curve.reduce((a, b) => (Math.abs(b.utilisation - u) < Math.abs(a.utilisation - u) ? b : a));
  const [low, high, over] = [at(0.1), at(0.9), r.curve.at(-1)];
  const pct = (p) => `${Math.round(p.utilisation * 100)} %`;
  const ms = (p) => `${Math.round(p.ttft_p50_s * 1e3).toLocaleString("en-US")} ms`;
  return `This server, simulated below: p50 TTFT ${ms(low)} at ${pct(low)} of capacity, ${ms(high)} at `
    + `${pct(high)}, ${ms(over)} at ${pct(over)}. Its TTFT counts the prefill itself, not only the wait, and it runs `
    + "several requests at once, so how sharply it bends is its own; past capacity its queue never drains.";
}

export function initQuiz() {
  getJSON("/api/exercise").then((e) => { $("skeleton").textContent = e.skeleton; }).catch((e) => report(e, "code"));
  for (const form of document.querySelectorAll("form.answer")) initAnswer(form);
  for (const box of document.querySelectorAll("[data-quiz]")) initChoice(box, QUESTIONS[box.dataset.quiz]);
}

function initChoice(box, q) {
  const root = box.closest(".question") ?? box.parentElement;
  const feedback = root.querySelector(".feedback");
  const buttons = [...root.querySelectorAll(".choice")];
  for (const btn of buttons) {
    btn.setAttribute("aria-pressed", "false");
    btn.addEventListener("click", () => {
      for (const b of buttons) {
        b.setAttribute("aria-pressed", String(b === btn));
        b.classList.remove("right", "wrong");
      }
      const right = btn.dataset.choice === q.right;
      btn.classList.add(right ? "right" : "wrong");
      feedback.textContent = right ? `Right: ${q.why()}` : `Not quite. ${q.hint}`;
      feedback.className = `feedback ${right ? "right" : "wrong"}`;
    });
  }
}

function initAnswer(form) {
  const input = form.querySelector("input");
  const feedback = form.querySelector(".feedback");
  const reveal = form.querySelector(".reveal");
  const ask = async (body) => {
    try {
      const v = await postJSON("/api/answer", { question: form.dataset.question, ...body });
      feedback.textContent = v.message;
      feedback.className = `feedback ${v.correct ? "right" : "wrong"}`;
      input.className = v.correct ? "right" : "wrong";
      reveal.hidden = v.correct || body.reveal === true;
    } catch (e) {
      feedback.textContent = e.message;
      feedback.className = "feedback wrong";
    }
  };
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    if (input.value.trim() === "") {
      feedback.textContent = "Type a number first.";
      feedback.className = "feedback wrong";
      return;
    }
    ask({ answer: input.value });
  });
  reveal.addEventListener("click", () => ask({ reveal: true }));
}
