// The lesson page's entry point: fetch the catalog once, then wire each section.

import { $, getJSON, report } from "./api.js";
import { initCalculator } from "./calculator.js";
import { initLive } from "./live.js";
import { initLoad } from "./load.js";
import { initQuiz } from "./quiz.js";
import { initSweep } from "./sweep.js";
import { initTiers } from "./tiers.js";
import { initToc } from "./toc.js";

async function main() {
  initToc();
  initQuiz();
  const cat = await getJSON("/api/catalog");
  const own = cat.loaded;
  $("model-badge").textContent = own
    ? `this server runs ${own.model_id ?? own.name} (${own.path}, `
      + `L = ${own.L}, H_q = ${own.H_q}, H_kv = ${own.H_kv}, d_head = ${own.d_head})`
    : "this server has no model loaded: the live section is off";
  initCalculator(cat);
  initLive(cat);
  initSweep(cat);
  initLoad(cat);
  initTiers(cat);
}

main().catch(report);
