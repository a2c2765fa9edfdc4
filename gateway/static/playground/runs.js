// Suite runs: the list (GET /v1/suites, GET /v1/runs) and a page per run (GET /v1/runs/{id}), polled
// while the run is not finished; plots and JSON from GET /v1/runs/{id}/artifacts/{file}.
import { ApiError, getJson, listOf, postJson } from "./api.js";
import { el, fmt } from "./risk.js";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
let timer = null;
let current = null;     // run id on screen, or "" for the list
const $ = (id) => document.getElementById(id);

export function initRuns() {
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && current !== null && location.hash.startsWith("#runs")) showRuns(current || null);
  });
}

export function showRuns(runId) {
  clearTimeout(timer);
  current = runId ?? "";
  if (runId) renderRun(decodeURIComponent(runId));
  else renderList();
}

function poll(fn, ms) {
  clearTimeout(timer);
  const me = current;
  timer = setTimeout(() => {
    if (current === me && location.hash.startsWith("#runs") && !document.hidden) fn();
  }, ms);
}

function unavailable(view, what, e) {
  const msg = e instanceof ApiError ? `HTTP ${e.status}${e.code ? ` ${e.code}` : ""}: ${e.message}` : e.message;
  view.replaceChildren(el("h2", {}, what), el("p", { class: "error" }, msg),
    el("p", { class: "hint" }, "Suite runs need the suite platform (Redis + a worker) on this deployment."));
}

const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");

function statusPill(status) {
  const cls = { succeeded: "ok", failed: "bad", cancelled: "warn", running: "run", queued: "" }[status] ?? "";
  return el("span", { class: `pill status ${cls}` }, status);
}

function progressBar(p, msg) {
  const pct = Math.max(0, Math.min(1, Number(p) || 0)) * 100;
  return el("div", { class: "progress", title: msg || "" },
    el("div", { class: "bar", style: `width:${pct.toFixed(1)}%` }), el("span", {}, `${pct.toFixed(0)}%${msg ? ` · ${msg}` : ""}`));
}

async function renderList() {
  const view = $("runs-view");
  let suites = [], runs = [];
  try {
    [suites, runs] = await Promise.all([getJson("v1/suites").then((b) => listOf(b, "suites")),
                                        getJson("v1/runs").then((b) => listOf(b, "runs"))]);
  } catch (e) {
    unavailable(view, "Suite runs", e);
    return;
  }
  const suiteList = el("ul", { class: "suites" }, suites.map(suiteItem));
  const table = el("table", { class: "runs" },
    el("thead", {}, el("tr", {}, ["run", "suite", "preset", "status", "progress", "created", "finished"].map((h) => el("th", {}, h)))),
    el("tbody", {}, runs.map((r) => el("tr", {},
      el("td", {}, el("a", { href: `#runs/${encodeURIComponent(r.id)}` }, el("code", {}, String(r.id).slice(0, 12)))),
      el("td", {}, r.suite ?? ""), el("td", {}, r.preset ?? ""), el("td", {}, statusPill(r.status)),
      el("td", {}, progressBar(r.progress, "")), el("td", {}, when(r.created_at)), el("td", {}, when(r.finished_at))))));
  view.replaceChildren(
    el("h2", {}, "Suites"), suites.length ? suiteList : el("p", { class: "muted" }, "no suites registered"),
    el("h2", {}, "Runs"), runs.length ? table : el("p", { class: "muted" }, "no runs yet: start one with a suite's Run button above"));
  if (runs.some((r) => !TERMINAL.has(r.status))) poll(renderList, 3000);
}

/** One suite with a small form: POST /v1/suites/{name}/runs {"preset", "seed"}, then open the run's page. */
function suiteItem(s) {
  const name = s.name ?? s.id ?? "?";
  const presets = s.presets ? (Array.isArray(s.presets) ? s.presets : Object.keys(s.presets)) : [];
  const preset = el("select", { "aria-label": `${name} preset` }, presets.map((p) => el("option", { value: p }, p)));
  const seed = el("input", { type: "number", value: "0", min: "0", step: "1", class: "seed", "aria-label": "seed" });
  const msg = el("span", { class: "small" });
  const go = el("button", { type: "button", class: "secondary small-btn", onclick: async () => {
    go.disabled = true;
    msg.textContent = "submitting…";
    try {
      const run = await postJson(`v1/suites/${encodeURIComponent(name)}/runs`,
        { ...(presets.length ? { preset: preset.value } : {}), seed: Number(seed.value) || 0 });
      location.hash = `#runs/${encodeURIComponent(run.id)}`;
    } catch (e) {
      msg.className = "small error";
      msg.textContent = e.message;
      go.disabled = false;
    }
  } }, "Run");
  return el("li", {},
    el("div", {}, el("strong", {}, name), s.version !== undefined ? el("span", { class: "muted" }, ` v${s.version}`) : null,
      s.description ? el("span", { class: "muted" }, ` — ${s.description}`) : null),
    el("div", { class: "suite-form" }, presets.length ? preset : null, el("label", { class: "small" }, "seed ", seed), go, msg));
}

/** Flatten nested metric objects into dotted keys for one table. */
function flatten(obj, prefix = "", out = []) {
  for (const [k, v] of Object.entries(obj ?? {})) {
    const key = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === "object" && !Array.isArray(v)) flatten(v, key, out);
    else out.push([key, v]);
  }
  return out;
}

function value(v) {
  if (Array.isArray(v)) {
    const s = v.length > 8 ? `[${v.slice(0, 8).map((x) => fmt(x)).join(", ")}, … ${v.length} items]`
      : `[${v.map((x) => fmt(x)).join(", ")}]`;
    return s;
  }
  return fmt(v, 4);
}

function artifactUrl(id, name) {
  return `v1/runs/${encodeURIComponent(id)}/artifacts/${name.split("/").map(encodeURIComponent).join("/")}`;
}

async function renderRun(id) {
  const view = $("runs-view");
  let run;
  try {
    run = await getJson(`v1/runs/${encodeURIComponent(id)}`);
  } catch (e) {
    unavailable(view, `Run ${id.slice(0, 12)}`, e);
    return;
  }
  const res = run.result ?? null;
  const parts = [
    el("p", {}, el("a", { href: "#runs" }, "← all runs")),
    el("h2", {}, `${run.suite ?? "suite"} `, statusPill(run.status), el("span", { class: "muted small" }, ` run ${run.id}`)),
    progressBar(run.progress, run.message),
    TERMINAL.has(run.status) ? null : el("p", {}, el("button", { type: "button", class: "secondary", id: "run-cancel",
      disabled: run.cancel_requested || null, onclick: async (ev) => {
        ev.target.disabled = true;
        try {
          await postJson(`v1/runs/${encodeURIComponent(run.id)}/cancel`, {});
        } catch (e) {
          ev.target.after(el("span", { class: "error small" }, ` ${e.message}`));
        }
        renderRun(id);
      } }, run.cancel_requested ? "cancel requested…" : "Cancel run")),
    el("table", { class: "kv" }, el("tbody", {}, [
      ["preset", run.preset], ["seed", run.seed], ["version", run.version], ["attempts", run.attempts],
      ["created", when(run.created_at)], ["started", when(run.started_at)], ["finished", when(run.finished_at)],
    ].map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v ?? "–"))))),
  ];
  if (run.error) parts.push(el("h3", {}, "Error"), el("pre", { class: "error" }, String(run.error)));
  if (run.config) {
    parts.push(el("details", {}, el("summary", {}, "config"), el("pre", {}, JSON.stringify(run.config, null, 1))));
  }
  if (res) {
    const sum = res.summary;
    if (sum) {
      parts.push(el("p", { class: sum.gates_passed ? "ok-text" : "bad-text" },
        el("strong", {}, sum.gates_passed ? "all gates passed" : `gates failed: ${(sum.gates_failed ?? []).join(", ")}`),
        sum.sanity_failed?.length ? el("span", { class: "muted" }, ` · sanity checks off: ${sum.sanity_failed.join(", ")}`) : null,
        sum.claims_total ? el("span", {}, ` · paper claims: ${sum.claims_reproduced} reproduced, ${sum.claims_not_reproduced} not, ` +
          `${sum.claims_inconclusive} inconclusive of ${sum.claims_total}`) : null));
    }
    const refs = new Map(flatten(res.reference_values));
    const rows = flatten(res.metrics);
    if (rows.length) {
      parts.push(el("h3", {}, "Metrics"), el("table", { class: "metrics" },
        el("thead", {}, el("tr", {}, el("th", {}, "metric"), el("th", {}, "measured"), el("th", {}, "reference"))),
        el("tbody", {}, rows.map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", { class: "num" }, value(v)),
          el("td", { class: "num muted" }, refs.has(k) ? value(refs.get(k)) : ""))))));
    }
    if (res.claims?.length) {
      // Claims are the paper's findings at this run's scale; a miss is a verdict, not a failed run.
      parts.push(el("h3", {}, "Paper claims"), el("table", { class: "checks claims" },
        el("thead", {}, el("tr", {}, ["", "claim", "statement", "observed (mean)", "95% CI", "paper", "verdict", "why", "note"].map((h) => el("th", {}, h)))),
        el("tbody", {}, res.claims.map((c) => el("tr", { class: c.verdict === "reproduced" ? "pass" : "fail" },
          el("td", {}, c.verdict === "reproduced" ? "✔" : c.verdict === "inconclusive" ? "?" : "✘"), el("td", {}, c.name),
          el("td", {}, c.statement), el("td", { class: "num" }, value(c.observed)),
          el("td", { class: "num" }, c.ci95 ? `${value(c.ci95[0])} … ${value(c.ci95[1])}` : "–"),
          el("td", { class: "num" }, `${c.direction} ${value(c.threshold)}`), el("td", {}, c.verdict),
          el("td", { class: "muted" }, c.reason ?? ""), el("td", { class: "muted" }, c.note ?? ""))))));
    }
    if (res.checks?.length) {
      parts.push(el("h3", {}, "Checks"), el("table", { class: "checks" },
        el("thead", {}, el("tr", {}, ["", "check", "kind (gate / sanity)", "expected", "observed", "tolerance", "note"].map((h) => el("th", {}, h)))),
        el("tbody", {}, res.checks.map((c) => el("tr", { class: c.passed ? "pass" : "fail" },
          el("td", {}, c.passed ? "✔" : "✘"), el("td", {}, c.name), el("td", {}, c.kind),
          el("td", { class: "num" }, value(c.expected)), el("td", { class: "num" }, value(c.observed)),
          el("td", { class: "num" }, value(c.tolerance)), el("td", { class: "muted" }, c.note ?? ""))))));
    }
  }
  const artifacts = run.artifacts?.length ? run.artifacts : res?.artifacts ?? [];
  if (artifacts.length) {
    const plots = el("div", { class: "plots" });
    const files = el("ul", { class: "files" });
    for (const name of artifacts) {
      const url = artifactUrl(run.id, name);
      if (/\.(png|jpe?g|svg|gif)$/i.test(name)) {
        plots.append(el("figure", {}, el("a", { href: url, target: "_blank" }, el("img", { src: url, alt: name, loading: "lazy" })),
          el("figcaption", {}, name)));
      } else {
        // The summary toggles an inline view; the link beside it opens the raw file.
        const det = el("details", {}, el("summary", {}, name, " ",
          el("a", { href: url, target: "_blank", class: "small" }, "open ↗")));
        det.addEventListener("toggle", async () => {
          if (!det.open || det.dataset.loaded) return;
          det.dataset.loaded = "1";
          try {
            const text = await fetch(url).then((r) => r.text());
            let shown = text;
            try { shown = JSON.stringify(JSON.parse(text), null, 1); } catch { /* not JSON: show as is */ }
            det.append(el("pre", {}, shown.length > 20000 ? `${shown.slice(0, 20000)}\n…` : shown));
          } catch (e) {
            det.append(el("p", { class: "error" }, e.message));
          }
        });
        files.append(el("li", {}, det));
      }
    }
    parts.push(el("h3", {}, "Artifacts"), plots, files);
  }
  view.replaceChildren(...parts.filter(Boolean));
  view.dataset.run = run.id;
  view.dataset.status = run.status;
  if (!TERMINAL.has(run.status)) poll(() => renderRun(id), 2000);
}
