// Talking to the server: JSON GET/POST with the server's error message surfaced, and `latest`, which
// debounces a burst of slider events and cancels the request it replaces, so only the newest answer lands.

export class ApiError extends Error {}

// The API key, where the server wants one (`prefill lab --api-key`): given once in the URL's fragment (#key=...),
// which the browser never sends to any server, then kept in this tab's sessionStorage and sent as a Bearer token.
const given = new URLSearchParams(location.hash.slice(1)).get("key");
if (given) {
  sessionStorage.setItem("prefill-api-key", given);
  history.replaceState(null, "", location.pathname + location.search); // out of the address bar and the history
}
export function authHeaders() {
  const key = sessionStorage.getItem("prefill-api-key");
  return key ? { Authorization: `Bearer ${key}` } : {};
}

async function parse(res) {
  const body = await res.json().catch((e) => {
    if (e.name === "AbortError") throw e; // cancelled while the body was arriving: a newer request replaced it
    return null;
  });
  if (!res.ok || body === null) {
    throw new ApiError(body?.error?.message ?? `${res.status} ${res.statusText}: not a JSON answer`);
  }
  return body;
}

export async function getJSON(path, params = {}, signal = undefined) {
  const query = new URLSearchParams(params).toString();
  return parse(await fetch(query ? `${path}?${query}` : path, { signal, headers: authHeaders() }));
}

export async function postJSON(path, body, signal = undefined) {
  const res = await fetch(path, {
    method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() }, body: JSON.stringify(body), signal,
  });
  return parse(res);
}

// An error said where it happened, in the page's flow (never over its content): the section's status line, or the
// header's line for the page as a whole. A bug (not bad input) is also logged: the tests watch the console.
export function report(error, section = null) {
  if (!(error instanceof ApiError)) console.error(error);
  const text = error instanceof ApiError ? error.message : `unexpected: ${error}`;
  if (section && $(`${section}-status`)) setStatus(section, text, true);
  else {
    $("page-status").textContent = text;
    $("page-status").hidden = false;
  }
}

// work(signal) runs `delay` ms after the last call; a newer run aborts the older one's fetches; a failure is said
// in `section`'s status line.
export function latest(work, delay = 50, section = null) {
  let timer = null;
  let ctrl = null;
  return () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      ctrl?.abort();
      ctrl = new AbortController();
      work(ctrl.signal).catch((e) => { if (e.name !== "AbortError") report(e, section); });
    }, delay);
  };
}

export const $ = (id) => document.getElementById(id);

// Resolves once the page's pending changes have been laid out and painted (two animation frames), or after
// 100 ms where frames do not come (a tab in the background gets none).
export const settled = () => new Promise((done) => {
  requestAnimationFrame(() => requestAnimationFrame(done));
  setTimeout(done, 100);
});

// A log-scaled range input of `steps` positions from lo to hi: the value at a position, and a value's position
// (clamped to the track). The page's sliders over orders of magnitude (N, P, the arrival rate) all use it.
export function logScale(lo, hi, steps = 1000) {
  const span = Math.log(hi / lo);
  return {
    at: (pos) => lo * Math.exp((span * pos) / steps),
    position: (v) => Math.round((steps * Math.log(Math.min(hi, Math.max(lo, v)) / lo)) / span),
  };
}

// The page's long server jobs (the sweep's timed forwards, the load curve's simulations), one at a time: on a
// machine of few cores a simulation running beside a timed forward would slow the forward's clock.
let heavy = Promise.resolve();
export function oneAtATime(work) {
  const run = heavy.then(work, work);
  heavy = run.catch(() => {});
  return run;
}

// fn() once, when `el` first comes into the viewport (a section's data loads when a student scrolls to it).
export function onFirstView(el, fn) {
  if (!("IntersectionObserver" in window)) { fn(); return; }
  const seen = new IntersectionObserver((entries) => {
    if (!entries.some((e) => e.isIntersecting)) return;
    seen.disconnect();
    fn();
  });
  seen.observe(el);
}

// A section's status line (id `${section}-status`): a plain note, or an error.
export function setStatus(section, text, error = false) {
  const line = $(`${section}-status`);
  line.textContent = text;
  line.className = `status${error ? " error" : ""}`;
}

// work() once the section first comes into view; its failure is said in the section's status line.
export function loadWhenSeen(section, work) {
  onFirstView($(section), () => work().catch((e) => report(e, section)));
}

// A box that takes a whole number (tokens, answer tokens): null where `text` is one, else the fault in the box's
// words, "the stored prefix is a whole number of tokens; you typed 2.5" (never the validator's "Input should be a
// valid integer"). The range itself is the API's to say.
export function wholeNumber(text, what, unit) {
  return /^\s*-?\d+\s*$/.test(text) ? null : `${what} is a whole number of ${unit}; you typed ${text.trim() || "nothing"}`;
}

// A "why" paragraph, short: its first sentence shown, the rest behind a "more" button placed after it (a text
// of one sentence, or of a few words, is shown whole). The element's textContent stays the whole text.
const BRIEF_WORDS = 40; // a text longer than this is folded after its first sentence
export function brief(el, text) {
  el.nextElementSibling?.classList.contains("more-btn") && el.nextElementSibling.remove();
  const cut = text.match(/^(.*?[.!?])(\s)(?=[A-Z"'(])/s);
  if (!cut || text.split(/\s+/).length <= BRIEF_WORDS) {
    el.textContent = text;
    return;
  }
  const rest = Object.assign(document.createElement("span"), { textContent: text.slice(cut[1].length), hidden: true });
  rest.className = "more-rest";
  el.replaceChildren(cut[1], rest);
  const btn = Object.assign(document.createElement("button"), { type: "button", textContent: "more" });
  btn.className = "more-btn";
  btn.setAttribute("aria-expanded", "false");
  btn.addEventListener("click", () => {
    rest.hidden = !rest.hidden;
    btn.textContent = rest.hidden ? "more" : "less";
    btn.setAttribute("aria-expanded", String(!rest.hidden));
  });
  el.after(btn);
}
