// The three typed answers (checked by the server, which holds the answers) and the multiple-choice questions:
// "Predict first" before the mask demo, and three on KV bytes, arithmetic intensity and the load curve.

import { $, getJSON, postJSON, report } from "./api.js";

// Each question's right choice and why, in our own words; a wrong choice gets the why without the letter.
const QUESTIONS = {
  predict: { right: "B",
    why: "Prefill computes all positions in the same pass, but each position's attention may only read itself and "
      + "earlier positions (token i uses tokens 0…i). The mask enforces that inside the parallel pass, which is why "
      + "the parallel result equals the one-at-a-time result; break it and decode would continue from the wrong cache." },
  kv: { right: "B",
    why: "2 · L · H_kv · d_head · P · b = 2 · 32 · 8 · 128 · 2,048 · 2 = 268,435,456 B = 256 MiB: K and V (the 2), "
      + "for every layer, KV head, head dimension and prompt position, at 2 bytes each." },
  intensity: { right: "A",
    why: "The FLOPs are about 2 · N · P, while the weights' N · b bytes are read once per forward whatever P is: 100 "
      + "times the tokens reuse the same bytes 100 times as often, so the FLOPs per byte grow with P until the "
      + "activations' bytes (which do grow with P) catch up. That is the P sweep below." },
  load: { right: "C",
    why: "With arrivals at a fraction ρ of the capacity, the queue's wait grows like 1 / (1 − ρ): twice the base at "
      + "ρ = 0.5, ten times at 0.9, and without bound as ρ nears 1, where the server can never catch up. The "
      + "'Under load' section below shows it." },
};

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
      feedback.textContent = right ? `Right: ${q.why}` : `Not quite: try again. ${q.why}`;
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
