// Part 3: a P sweep on this machine. The time model's curve (GET /api/sweep/curve) loads when the section comes
// into view; "Measure the sweep" prefills P = 1, 4, 16, ... one at a time on the server's model (POST
// /api/sweep/measure), so each point lands on the roofline as soon as it is measured. Every number comes from
// the API; this file places them.

import { $, ApiError, getJSON, loadWhenSeen, oneAtATime, postJSON, report, setStatus } from "./api.js";
import { drawRoofline } from "./charts.js";

let curve = null; // the /api/sweep/curve body
let measured = []; // /api/sweep/measure bodies, in the order they landed

const REGIME = { compute: "compute-bound", memory: "memory-bound", overhead: "overhead-bound" };

const status = (text, error = false) => setStatus("sweep", text, error);

export function initSweep(catalog) {
  if (!catalog.loaded) {
    $("sweep-summary").textContent = "No model is loaded in this server: nothing to measure.";
    return;
  }
  $("sweep-btn").addEventListener("click", () => measureSweep().catch(report));
  loadWhenSeen("sweep", loadCurve);
}

async function loadCurve() {
  $("sweep-summary").textContent = "Loading the time model's curve (this machine's profile is probed once per server)…";
  curve = await getJSON("/api/sweep/curve");
  const c = curve;
  $("sweep-summary").textContent = `${c.summary} Roof: ${c.human.peak} peak GEMM rate, ${c.human.bandwidth} `
    + `bandwidth, ridge ${c.ridge.toFixed(1)} FLOP/B (${c.profile.name}, ${c.profile.kind} profile, ${c.dtype}). `
    + "The live prompt above is drawn on this same roof.";
  const pick = $("sweep-max");
  pick.replaceChildren(...c.measure.map((m) => new Option(`${m.P.toLocaleString("en-US")} (about ${m.sweep})`, m.P)));
  pick.value = c.measure.at(-1).P;
  $("sweep-btn").disabled = false;
  status("Each P: one untimed forward, then the median of up to 3 timed ones (fewer where 3 would take over "
    + "3 s: each P's note says how many). The server's other requests wait meanwhile.");
  await drawRoofline($("sweep-chart"), c, measured);
  $("sweep").dataset.curve = "1";
}

function row(m) {
  const tr = document.createElement("tr");
  const cells = [m.P.toLocaleString("en-US"), m.human.measured, m.human.predicted, m.human.error, REGIME[m.dominant]];
  tr.replaceChildren(...cells.map((text) => {
    const td = document.createElement("td");
    td.textContent = text;
    return td;
  }));
  tr.lastChild.className = `bound-${m.dominant}`;
  tr.title = m.explain;
  // A tap, a click or Enter says the row's reason under the table: a phone has no hover to show a title.
  tr.tabIndex = 0;
  const say = () => {
    for (const r of tr.parentElement.rows) r.setAttribute("aria-selected", String(r === tr));
    $("sweep-note").textContent = `P = ${m.P.toLocaleString("en-US")}: ${m.explain}`;
  };
  tr.addEventListener("click", say);
  tr.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); say(); } });
  return tr;
}

async function measureSweep() {
  const btn = $("sweep-btn");
  if (btn.disabled || !curve) return;
  btn.disabled = true;
  delete $("sweep").dataset.done;
  const Ps = curve.measure_P.filter((P) => P <= +$("sweep-max").value);
  const body = $("sweep-table").tBodies[0];
  measured = [];
  body.replaceChildren();
  $("sweep-note").textContent = "";
  try {
    status("waiting for the load simulation below to finish (it would slow the clock)…");
    await oneAtATime(async () => {
      for (const [k, P] of Ps.entries()) {
        status(`measuring P = ${P.toLocaleString("en-US")} (${k + 1} of ${Ps.length})…`);
        const m = await postJSON("/api/sweep/measure", { P });
        measured.push(m);
        body.append(row(m));
        $("sweep-note").textContent = m.note;
        await drawRoofline($("sweep-chart"), curve, measured);
      }
    });
    status(`done: ${Ps.length} prompt lengths measured warm on this server's model. Tap or click a row for the time model's reason.`);
    $("sweep").dataset.done = "1";
  } catch (e) {
    status(e instanceof ApiError ? e.message : String(e), true);
    if (!(e instanceof ApiError)) report(e);
  } finally {
    btn.disabled = false;
  }
}
