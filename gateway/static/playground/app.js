// Entry point: tabs (hash routing), server status, shared guard feature labels.
import { getJson, listOf } from "./api.js";
import { initChat } from "./chat.js";
import { initRuns, showRuns } from "./runs.js";
import { initScore } from "./score.js";

export const shared = {
  model: null,
  // feature id -> {id, category, weight, label?, top_snippets?}; filled from GET /v1/guard/features
  features: new Map(),
  featuresNote: "",
};

async function loadStatus() {
  const modelPill = document.getElementById("status-model");
  const guardPill = document.getElementById("status-guard");
  try {
    const ready = await fetch("ready").then((r) => r.json());
    const models = ready.checks?.engine ? await getJson("v1/models") : null;
    shared.model = models ? listOf(models)[0]?.id ?? null : null;
    modelPill.textContent = shared.model ? `model: ${shared.model}` : "model: loading…";
    modelPill.className = shared.model ? "pill ok" : "pill warn";
    guardPill.textContent = `guard: ${ready.checks?.guard ? "ready" : "not ready"}`;
    guardPill.className = ready.checks?.guard ? "pill ok" : "pill warn";
    if (!shared.model) setTimeout(loadStatus, 3000);
    else loadFeatures();
  } catch (e) {
    modelPill.textContent = `gateway unreachable: ${e.message}`;
    modelPill.className = "pill bad";
    setTimeout(loadStatus, 3000);
  }
  document.body.dataset.ready = shared.model ? "1" : "0";
}

/** GET /v1/guard/features as a flat list of {id, gate?, category?, weight?, label?, top_snippets?}.
 *  Accepts the flat list, or the guard's nested description
 *  {prompt|response: {overall: [{id, weight}], categories: {name: {features: [{id, weight}]}}}}. */
function featureEntries(body) {
  const f = body?.features ?? body;
  if (Array.isArray(f)) return f;
  const out = [];
  for (const gate of ["prompt", "response"]) {
    const g = f?.[gate];
    if (!g || typeof g !== "object") continue;
    // category entries first: they say which category a latent was selected for
    for (const [category, c] of Object.entries(g.categories ?? {})) {
      for (const x of c?.features ?? []) out.push({ ...x, gate, category });
    }
    for (const x of g.overall ?? []) out.push({ ...x, gate });
  }
  return out;
}

async function loadFeatures() {
  try {
    const body = await getJson("v1/guard/features");
    for (const f of featureEntries(body)) {
      // Keyed by "gate:id" (exact) and by id (any gate). A feature can be selected for several
      // categories or gates: keep the first entry, but never lose a label or snippets.
      for (const key of [f.gate ? `${f.gate}:${f.id}` : null, f.id]) {
        if (key === null) continue;
        const prev = shared.features.get(key);
        shared.features.set(key, prev ? { ...f, ...prev, label: prev.label ?? f.label,
          top_snippets: prev.top_snippets ?? f.top_snippets } : f);
      }
    }
    shared.featuresNote = `${new Set(featureEntries(body).map((f) => f.id)).size} selected features`;
    if (body?.guard) setGuardPill(`guard: ${body.guard}`, "pill ok");
  } catch (e) {
    shared.featuresNote = `feature labels unavailable: ${e.message}`;
    // /ready reports an absent guard as fine when the deployment runs without one; the guard's own
    // endpoint says so explicitly.
    if (e.code === "guard_disabled") setGuardPill("guard: off on this deployment", "pill warn");
  }
  document.getElementById("status-guard").title = shared.featuresNote;
}

function setGuardPill(text, cls) {
  const g = document.getElementById("status-guard");
  g.textContent = text;
  g.className = cls;
}

function route() {
  const hash = location.hash.replace(/^#/, "") || "chat";
  const [tab, ...rest] = hash.split("/");
  const name = ["chat", "score", "runs"].includes(tab) ? tab : "chat";
  for (const sec of document.querySelectorAll("section.tab")) sec.hidden = sec.id !== `tab-${name}`;
  for (const a of document.querySelectorAll("nav.tabs a")) a.classList.toggle("active", a.dataset.tab === name);
  if (name === "runs") showRuns(rest.join("/") || null);
  // Canvases measured while hidden have no size; redraw on show.
  window.dispatchEvent(new Event("resize"));
}

window.addEventListener("hashchange", route);
initChat(shared);
initScore(shared);
initRuns();
route();
loadStatus();
