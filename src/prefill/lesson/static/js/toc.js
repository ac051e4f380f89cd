// The table of contents lands on its section and stays there. The sections below the calculator draw their
// content when they first come into view (a curve, a simulation, a measurement: seconds later), so a section
// above the one jumped to can grow after the jump and push it down. After a jump the page keeps the section at
// the top of the window while the page's height changes, until the student scrolls, taps or types, or PIN_MS pass.

import { $ } from "./api.js";

const PIN_MS = 20_000; // the longest a section's content takes to arrive (the load curve's simulation: seconds)
const LET_GO = ["wheel", "touchstart", "keydown", "mousedown"]; // the student moving the page themselves

export function initToc() {
  for (const a of document.querySelectorAll(".toc a[href^='#']")) {
    a.addEventListener("click", (e) => {
      const target = $(a.hash.slice(1));
      if (!target) return;
      e.preventDefault();
      history.pushState(null, "", a.hash);
      pin(target);
    });
  }
  if (location.hash && $(location.hash.slice(1))) pin($(location.hash.slice(1))); // a link from elsewhere
}

let release = null; // ends the current pin

function pin(target) {
  release?.();
  // Instant, not smooth: a smooth scroll passes every section between, and each would start drawing its content.
  const land = () => target.scrollIntoView({ behavior: "instant", block: "start" });
  land();
  const grown = new ResizeObserver(land);
  grown.observe(document.body);
  const timer = setTimeout(() => release?.(), PIN_MS);
  const letGo = () => release?.();
  for (const ev of LET_GO) addEventListener(ev, letGo, { passive: true, once: true });
  release = () => {
    grown.disconnect();
    clearTimeout(timer);
    for (const ev of LET_GO) removeEventListener(ev, letGo);
    release = null;
  };
}
