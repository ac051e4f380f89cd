// Part 4: this server under load, simulated (GET /api/load). The first answer (when the section comes into
// view) brings the capacity and the curve of TTFT against the rate; the slider then asks for one rate at a time.
// The slider is a log scale over the curve's own range of the capacity (the API's curve_range: its first and last
// rate), so every rate it can ask lies on the curve drawn; every number shown comes from the API.

import { $, brief, getJSON, latest, loadWhenSeen, logScale, oneAtATime, setStatus } from "./api.js";
import { drawLoad, drawQueue } from "./charts.js";

const STEPS = 1000; // the range input's max
let capacity = null;
let track = null; // slider position <-> fraction of the capacity: the input's mapping, no model in it
let last = null; // the last /api/load answer shown: its curve is what the load question's answer quotes
export const lastLoad = () => last;

const status = (text, error = false) => setStatus("load", text, error);

export function initLoad(catalog) {
  if (!catalog.loaded) {
    status("No model is loaded in this server: nothing to simulate.");
    return;
  }
  loadWhenSeen("load", start);
}

async function start() {
  for (const id of ["ld-p50", "ld-p99", "ld-itl", "ld-util"]) $(id).textContent = "simulating…";
  $("load-out").textContent = "simulating…";
  status("Simulating this server at each arrival rate of the curve (once per server: some seconds)…");
  const first = await oneAtATime(() => getJSON("/api/load")); // not beside the sweep's timed forwards
  capacity = first.capacity_req_per_s;
  track = logScale(...first.curve_range, STEPS);
  $("load-range-words").textContent = first.curve_range.map((f) => `${Math.round(f * 100)} %`).join(" to ");
  const slider = $("load-range");
  slider.value = track.position(first.utilisation);
  slider.disabled = false;
  status(`The curve took ${first.curve_simulated_in_s.toFixed(1)} s to simulate; each new rate takes about `
    + `${first.simulated_in_s.toFixed(1)} s.`);
  await show(first);
  slider.addEventListener("input", latest(async (signal) => {
    $("load-out").textContent = `${(track.at(+slider.value) * 100).toFixed(0)} % of capacity…`;
    await show(await getJSON("/api/load", { rate: track.at(+slider.value) * capacity }, signal));
  }, 60));
}

async function show(r) {
  last = r;
  $("load-out").textContent = `${r.human.rate} · ${r.human.utilisation} of capacity`;
  $("ld-p50").textContent = r.human.ttft_p50;
  $("ld-p99").textContent = r.human.ttft_p99;
  $("ld-itl").textContent = r.human.itl_p50;
  $("ld-util").textContent = r.human.utilisation;
  brief($("load-text"), r.explanation);
  $("load-workload").textContent = `The mix: ${r.workload}. Capacity: ${r.human.capacity}, its throughput when `
    + "every request arrives at once.";
  $("load").dataset.rate = String(r.rate);
  await Promise.all([drawLoad($("load-chart"), r), drawQueue($("queue-chart"), r)]);
}
