// The KV-store section's own controls: the student picks a stored prefix (tokens) and a storage speed (GB/s, or a
// named kind of storage) and sees compute against load for that one case (GET /api/compute-or-load/at). The
// decision and every number are the API's (the store's own rule on the time model); the page only converts
// GB/s to bytes/s for the query.

import { $, getJSON, latest, logScale } from "./api.js";

const STEPS = 1000; // the range input's max
const GB = 1e9;
const CUSTOM = "custom"; // the storage select's entry for a typed speed

export async function initKVPick(context) {
  const track = logScale(16, context, STEPS);
  const range = $("tp-range");
  const num = $("tp-num");
  const select = $("tp-storage");
  const rate = $("tp-rate");
  num.max = context;
  range.value = track.position(+num.value);
  const ask = latest(show, 40, "tiers");
  range.addEventListener("input", () => { num.value = Math.round(track.at(+range.value)); ask(); });
  num.addEventListener("input", () => { range.value = track.position(+num.value); ask(); });
  select.addEventListener("change", () => {
    if (select.value !== CUSTOM) rate.value = +(select.value / GB).toPrecision(4);
    ask();
  });
  rate.addEventListener("input", () => { select.value = CUSTOM; ask(); });
  await show();
}

async function show(signal) {
  const r = await getJSON("/api/compute-or-load/at", { P: $("tp-num").value, rate: +$("tp-rate").value * GB }, signal);
  if (!r.available) {
    $("tp-text").textContent = r.note;
    return;
  }
  fillStorage(r.storage);
  $("tp-bytes").textContent = r.human.bytes;
  $("tp-load").textContent = r.human.load;
  $("tp-compute").textContent = r.human.compute;
  $("tp-choice").textContent = r.choice === "load" ? "load" : "compute";
  $("tp-text").textContent = r.words;
  $("tiers-pick").dataset.choice = r.choice;
}

// The storage kinds, once: the API's named ones and this machine's measured, and "custom" for a typed speed.
function fillStorage(storage) {
  const select = $("tp-storage");
  if (select.options.length) return;
  for (const s of storage) {
    select.append(new Option(s.name, s.bytes_per_s)); // its speed shows in the GB/s box when chosen
  }
  select.append(new Option("custom (type the speed)", CUSTOM));
  const typed = +$("tp-rate").value * GB;
  select.value = storage.find((s) => s.bytes_per_s === typed)?.bytes_per_s ?? CUSTOM;
}
