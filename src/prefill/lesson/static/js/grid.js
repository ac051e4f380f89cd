// A P x P grid of cells with row and column labels: the causal mask (allowed / masked) or a heat map.
// Cells are elements (hover, counting, tests); above MAX_CELLS_P a scaled canvas is drawn instead.

const MAX_CELLS_P = 64;

// spec: {P, labels, cell(i, j) -> {cls, color}, describe(i, j) -> text, hover: element}. A cell is described on
// hover, and on a tap or click (touch screens have no hover).
export function drawGrid(el, spec) {
  const { P, labels } = spec;
  el.replaceChildren();
  el.classList.toggle("short-labels", !!labels && labels.every((t) => visible(t).length <= 3));
  if (P > MAX_CELLS_P) {
    drawCanvas(el, spec);
    return;
  }
  const showLabels = labels && labels.length === P;
  // Cells as large as fit the card (26 px for a few tokens, 8 px at the least; the box scrolls beyond that).
  const room = (el.parentElement.clientWidth || 800) - (showLabels ? 110 : 30);
  el.style.setProperty("--cell", `${Math.max(8, Math.min(P <= 8 ? 26 : 22, Math.floor(room / P) - 2))}px`);
  el.style.gridTemplateColumns = `${showLabels ? "auto " : ""}repeat(${P}, max-content)`;
  const frag = document.createDocumentFragment();
  if (showLabels) {
    frag.append(document.createElement("span"));
    for (let j = 0; j < P; j++) frag.append(label(labels[j], "col-lbl"));
  }
  for (let i = 0; i < P; i++) {
    if (showLabels) frag.append(label(labels[i], "row-lbl"));
    for (let j = 0; j < P; j++) {
      const c = document.createElement("span");
      const look = spec.cell(i, j);
      c.className = `cell ${look.cls}`;
      if (look.color) c.style.background = look.color;
      c.dataset.i = i;
      c.dataset.j = j;
      frag.append(c);
    }
  }
  el.append(frag);
  const say = (e) => {
    const t = e.target;
    if (t.classList.contains("cell")) spec.hover.textContent = spec.describe(+t.dataset.i, +t.dataset.j);
  };
  el.onmouseover = say;
  el.onclick = say;
}

function label(text, cls) {
  const s = document.createElement("span");
  s.className = `lbl ${cls}`;
  s.textContent = visible(text);
  s.title = JSON.stringify(text);
  return s;
}

// Whitespace a reader can see: a newline as ⏎; leading spaces kept (the grid's labels use white-space: pre).
export function visible(text) {
  return text.replaceAll("\n", "⏎").replaceAll("\t", "⇥");
}

function drawCanvas(el, spec) {
  const { P } = spec;
  const size = Math.min(560, el.parentElement.clientWidth || 560);
  const canvas = document.createElement("canvas");
  canvas.width = canvas.height = P;
  canvas.style.width = canvas.style.height = `${size}px`;
  const ctx = canvas.getContext("2d");
  for (let i = 0; i < P; i++) {
    for (let j = 0; j < P; j++) {
      const look = spec.cell(i, j);
      ctx.fillStyle = look.color ?? (look.cls === "allowed" ? "#2563eb" : "#eceff4");
      ctx.fillRect(j, i, 1, 1);
    }
  }
  canvas.onmousemove = canvas.onpointerdown = (e) => {
    const r = canvas.getBoundingClientRect();
    const i = Math.floor(((e.clientY - r.top) / r.height) * P);
    const j = Math.floor(((e.clientX - r.left) / r.width) * P);
    if (i >= 0 && j >= 0 && i < P && j < P) spec.hover.textContent = spec.describe(i, j);
  };
  el.style.gridTemplateColumns = "max-content";
  el.append(canvas);
}
