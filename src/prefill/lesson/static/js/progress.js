// A long prefill's real progress: while the server prefills a prompt longer than its chunk, the page asks
// /api/progress (the step loop's own notes, read between two steps) and says which chunk is running and when
// each one ended, "prefilling chunk 3 of 8: chunk 2 done at 960 ms (tokens 256-511)", and repaints the mask
// grid's rows as their chunks are computed.

import { $, getJSON } from "./api.js";

const POLL_MS = 100; // the pause between two small GETs while the prefill runs (each answered between two steps)

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

// What the status line says once the server has reported `p` (an /api/progress answer).
export function progressWords(p, chunk) {
  const next = p.chunks.length + 1;
  const first = p.chunks.length ? p.chunks.at(-1).last + 1 : p.cached ?? 0;
  const last = Math.min(p.P, first + chunk) - 1;
  if (!p.chunks.length) return `prefilling chunk 1 of ${p.of || "?"} (tokens ${first}-${last})`;
  const c = p.chunks.at(-1);
  const done = `chunk ${c.k} done at ${Math.round(c.t_ms).toLocaleString("en-US")} ms (tokens ${c.first}-${c.last})`;
  return p.state === "prefilled" ? `all ${p.of} chunks prefilled: ${done}; sampling the first token`
    : `prefilling chunk ${next} of ${p.of} (tokens ${first}-${last}): ${done}`;
}

// Poll until the returned stop() is called (the first token came); `fresh`: no token of the prompt is cached. `say(text)` sets the status line, `paint(done)`
// repaints the grid with `done` prompt tokens computed. The chunks reported are kept on the progress bar's
// data-seen ("k:first-last@ms ..."): what a test reads after the run.
export function followPrefill(tok, say, paint, fresh) {
  const chunk = tok.chunk_size;
  if (!chunk || tok.P <= chunk) return () => false;
  const bar = $("prefill-progress");
  Object.assign(bar, { hidden: false, max: Math.ceil(tok.P / chunk), value: 0 });
  bar.dataset.seen = "";
  let stopped = false;
  let shown = -1; // chunks reported so far
  // Without the prefix cache every token is computed, from token 0; with it, the server says where it starts.
  say(fresh ? progressWords({ P: tok.P, chunks: [], of: bar.max, cached: 0 }, chunk)
    : `prefilling in chunks of at most ${chunk} tokens: the prefix cache may hold the prompt's start`);
  (async () => {
    while (!stopped) {
      const p = await getJSON("/api/progress", { P: tok.P }).catch(() => null);
      if (stopped) break;
      if (p && p.state !== "not seen" && p.chunks.length !== shown) {
        shown = p.chunks.length;
        Object.assign(bar, { max: p.of, value: shown });
        bar.dataset.seen = p.chunks.map((c) => `${c.k}:${c.first}-${c.last}@${Math.round(c.t_ms)}`).join(" ");
        say(progressWords(p, chunk));
        paint(shown ? p.chunks.at(-1).last + 1 : p.cached);
      }
      await sleep(POLL_MS);
    }
  })();
  // stop(): true the first time, when a chunked prefill was being followed
  return () => {
    if (stopped) return false;
    stopped = true;
    bar.hidden = true;
    return true;
  };
}
