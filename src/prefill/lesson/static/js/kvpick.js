// The KV-store section's own controls: the student picks a stored prefix (tokens) and a storage speed (GB/s, or a
// named kind of storage) and sees compute against load for that one case (GET /api/compute-or-load/at). The
// decision and every number are the API's (the store's own rule on the time model); the page only converts
// GB/s to bytes/s for the query. An input that cannot be computed is said beside the inputs, in the boxes' own
// units, and the tiles it no longer matches are greyed.

import { $, ApiError, brief, getJSON, latest, logScale, wholeNumber } from "./api.js";

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
  const ask = latest(show, 40, "tp");
  range.addEventListener("input", () => { num.value = Math.round(track.at(+range.value)); ask(); });
  num.addEventListener("input", () => {
    if (+num.value > 0) range.value = track.position(+num.value);
    ask(); // an empty box, 0 or 2.5 is said as refused, never skipped
  });
  select.addEventListener("change", () => {
    if (select.value !== CUSTOM) rate.value = +(select.value / GB).toPrecision(4);
    ask();
  });
  rate.addEventListener("input", () => { select.value = CUSTOM; ask(); });
  await show();
}

// The inputs' own faults, in the boxes' words, before anything is asked (null: both can be sent).
function refusal() {
  const P = $("tp-num").value.trim();
  const rate = $("tp-rate").value.trim();
  if (P === "") return "Type the stored prefix: a whole number of tokens.";
  const whole = wholeNumber(P, "the stored prefix", "tokens");
  if (whole) return whole;
  if (rate === "" || !Number.isFinite(+rate)) return "Type the read speed in GB/s (3 is a fast SSD's).";
  return null;
}

// A refused input greys the tiles and the sentence of the last prefix and speed that could be computed; null
// clears that.
function refuse(reason) {
  const line = $("tp-status");
  line.textContent = reason ? `${reason[0].toUpperCase()}${reason.slice(1)}. The greyed numbers are for the last `
    + "prefix and speed that could be computed." : "";
  line.className = `status${reason ? " error" : ""}`;
  for (const el of document.querySelectorAll("#tiers-pick .tiles, #tp-text")) el.classList.toggle("stale", !!reason);
  if (reason) $("tiers-pick").dataset.refused = "1";
  else delete $("tiers-pick").dataset.refused;
}

async function show(signal) {
  const fault = refusal();
  if (fault) {
    refuse(fault.replace(/\.$/, ""));
    return;
  }
  let r;
  try {
    r = await getJSON("/api/compute-or-load/at", { P: $("tp-num").value, rate: +$("tp-rate").value * GB }, signal);
  } catch (e) {
    if (!(e instanceof ApiError)) throw e;
    refuse(e.message);
    return;
  }
  refuse(null);
  if (!r.available) {
    $("tp-text").textContent = r.note;
    return;
  }
  fillStorage(r.storage);
  $("tp-bytes").textContent = r.human.bytes;
  $("tp-load").textContent = r.human.load;
  $("tp-compute").textContent = r.human.compute;
  $("tp-choice").textContent = r.choice === "load" ? "load" : "compute";
  brief($("tp-text"), r.words);
  $("tiers-pick").dataset.choice = r.choice;
  $("tiers-pick").dataset.asked = r.asked;
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
