// The three typed answers (checked by the server, which holds the answers) and the two A/B questions.

import { $, getJSON, postJSON, report } from "./api.js";

// Why, in our own words; the right choice is B (No) in both.
const EXPLAIN = {
  right: "Right: No. Prefill computes all positions in the same pass, but each position's attention may only read "
    + "itself and earlier positions. Break that rule and the keys, values and first token differ from what "
    + "reading the prompt one token at a time would give, and decode would continue from the wrong cache.",
  wrong: "Not quite. The positions are computed together, yet not independently: attention is causal, so token i "
    + "may only use tokens 1…i. The mask enforces that inside the parallel pass, which is why the parallel "
    + "result equals the one-at-a-time result.",
};

export function initQuiz() {
  getJSON("/api/exercise").then((e) => { $("skeleton").textContent = e.skeleton; }).catch(report);
  for (const form of document.querySelectorAll("form.answer")) initAnswer(form);
  for (const box of document.querySelectorAll(".choices")) {
    const feedback = box.parentElement.querySelector(".feedback");
    for (const btn of box.querySelectorAll(".choice")) {
      btn.setAttribute("aria-pressed", "false");
      btn.addEventListener("click", () => {
        for (const b of box.querySelectorAll(".choice")) {
          b.setAttribute("aria-pressed", String(b === btn));
          b.classList.remove("right", "wrong");
        }
        const right = btn.dataset.right === "yes";
        btn.classList.add(right ? "right" : "wrong");
        feedback.textContent = right ? EXPLAIN.right : EXPLAIN.wrong;
        feedback.className = `feedback ${right ? "right" : "wrong"}`;
      });
    }
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
      report(e);
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
