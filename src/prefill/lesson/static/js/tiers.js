// Part 5: compute or load (GET /api/compute-or-load). Asked once, when the section comes into view: the store's
// read rates are measured then (once per server, a fraction of a second). Every number shown comes from the API.

import { $, brief, getJSON, loadWhenSeen, oneAtATime, setStatus } from "./api.js";
import { drawTiers } from "./charts.js";
import { initKVPick } from "./kvpick.js";

const status = (text, error = false) => setStatus("tiers", text, error);

export function initTiers(catalog) {
  if (!catalog.loaded) {
    status("No model is loaded in this server: nothing to store.");
    return;
  }
  loadWhenSeen("tiers", async () => {
    await show();
    await initKVPick(catalog.loaded.context_length);
  });
}

async function show() {
  status("Measuring how fast this machine reads stored K/V back…");
  for (const id of ["tr-token", "tr-ram", "tr-disk", "tr-even"]) $(id).textContent = "measuring…";
  const r = await oneAtATime(() => getJSON("/api/compute-or-load")); // its probe reads files: not beside a sweep
  if (!r.available) {
    status(r.note);
    return;
  }
  status("");
  $("tr-token").textContent = r.human.per_token;
  $("tr-ram").textContent = r.human.ram;
  $("tr-disk").textContent = r.human.disk;
  $("tr-even").textContent = r.human.break_even;
  brief($("tiers-text"), r.explanation);
  $("tiers-source").textContent = `Read rates ${r.rates_source}. Prefill predicted by the time model on the `
    + `${r.profile} profile, in this server's prefill chunks.`;
  $("tiers-flip-key").hidden = !(r.ram?.flips?.length || r.disk?.flips?.length); // a key only for lines drawn
  $("tiers").dataset.shown = "1";
  await drawTiers($("tiers-chart"), r);
}
