// Chat tab: streams /v1/chat/completions with guard.include_scores and renders the risk live.
import { ApiError } from "./api.js";
import { cutCard, el, fmt, Sparkline, TokenView } from "./risk.js";
import { sseJson } from "./sse.js";

let S;                 // shared state from app.js
let spark;
const history = [];    // OpenAI messages of the conversation so far
let turns = [];        // rendered assistant turns: {node, series}
let controller = null;

const $ = (id) => document.getElementById(id);

export function initChat(shared) {
  S = shared;
  spark = new Sparkline($("chat-spark"), $("chat-spark-info"));
  $("chat-form").addEventListener("submit", (ev) => { ev.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", () => controller?.abort());
  $("chat-clear").addEventListener("click", () => {
    controller?.abort();
    history.length = 0;
    turns = [];
    $("conversation").replaceChildren();
    spark.clear();
    $("chat-stats").textContent = "";
  });
  $("guard-enabled").addEventListener("change", () => {
    for (const id of ["response-threshold", "prompt-threshold", "hold-back"]) $(id).disabled = !$("guard-enabled").checked;
  });
}

function num(id) {
  const v = $(id).value.trim();
  if (v === "") return null;
  const x = Number(v);
  return Number.isFinite(x) ? x : null;
}

function guardOverrides() {
  const g = { include_scores: true };
  if (!$("guard-enabled").checked) {
    g.enabled = false;
    return g;
  }
  const rt = num("response-threshold"), pt = num("prompt-threshold"), hb = num("hold-back");
  if (rt !== null) g.response_threshold = rt;
  if (pt !== null) g.prompt_threshold = pt;
  if (hb !== null) g.hold_back = Math.round(hb);
  return g;
}

function selectTurn(turn) {
  for (const t of turns) t.node.classList.toggle("selected", t === turn);
  spark.load(turn.series);
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  if (!S.model) {
    $("chat-stats").textContent = "The model is still loading; try again in a moment.";
    return;
  }
  const sys = $("system-prompt").value.trim();
  const messages = [...(sys ? [{ role: "system", content: sys }] : []), ...history, { role: "user", content: text }];
  const body = {
    model: S.model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    max_tokens: num("max-tokens") ?? 128,
    temperature: num("temperature") ?? 0.7,
    guard: guardOverrides(),
  };
  $("prompt").value = "";

  const conv = $("conversation");
  conv.append(el("div", { class: "turn user" }, el("div", { class: "who" }, "you"), el("div", { class: "text" }, text)));
  const tokensBox = el("div", { class: "tokens" });
  const node = el("div", { class: "turn assistant", dataset: { state: "streaming" } },
    el("div", { class: "who" }, "assistant"), tokensBox);
  conv.append(node);
  const series = { scores: [], labels: [], threshold: null, cut: null };
  const turn = { node, series };
  turns.push(turn);
  node.addEventListener("click", () => selectTurn(turn));
  selectTurn(turn);
  const view = new TokenView(tokensBox, spark);
  node.scrollIntoView({ block: "end" });

  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const t0 = performance.now();
  let tFirst = null, finish = null, usage = null, answer = "";

  const pushScores = (scores, label) => {
    for (const s of scores) {
      series.scores.push(s);
      series.labels.push(label);
      spark.push(s, label);
    }
  };

  try {
    const r = await fetch("v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!r.ok) {
      let err = null;
      try { err = await r.json(); } catch { /* not JSON */ }
      throw new ApiError(r.status, err);
    }
    for await (const chunk of sseJson(r)) {
      if (chunk.error) throw new ApiError(500, chunk);
      if (chunk.usage) usage = chunk.usage;
      for (const ch of chunk.choices ?? []) {
        if (ch.index !== 0) continue;
        if (ch.threshold !== undefined && ch.threshold !== null) {
          series.threshold = ch.threshold;
          view.threshold = ch.threshold;
          spark.setThreshold(ch.threshold);
        }
        const content = ch.delta?.content ?? "";
        const risk = Array.isArray(ch.risk) ? ch.risk : [];
        if (content || risk.length) {
          tFirst ??= performance.now();
          const first = series.scores.length;
          if (content) view.add(content, risk, first);
          pushScores(risk, content);
          answer += content;
        }
        if (ch.finish_reason) finish = ch.finish_reason;
        if (ch.safety) {
          series.cut = { index: ch.safety.token_offset, score: ch.safety.score, category: ch.safety.category };
          series.threshold ??= ch.safety.threshold;
          spark.setThreshold(series.threshold);
          spark.markCut(series.cut.index, series.cut.score, series.cut.category);
          tokensBox.append(el("span", { class: "cut-marker", title: "the guard stopped the stream here" },
            "✂ ", el("span", { class: "category" }, ch.safety.category)));
          node.append(cutCard(ch.safety, S.features));
        }
      }
    }
    node.dataset.state = "done";
  } catch (e) {
    if (e.name === "AbortError") {
      node.dataset.state = "stopped";
      node.append(el("div", { class: "muted small" }, "stopped by you"));
    } else if (e instanceof ApiError && e.code === "content_filter" && e.safety) {
      // The prompt gate refused the request before any generation (HTTP 400).
      node.dataset.state = "refused";
      series.threshold = e.safety.threshold;
      series.cut = { index: 0, score: e.safety.score, category: e.safety.category };
      spark.load(series);
      tokensBox.append(el("span", { class: "cut-marker", title: "refused before generation" },
        "✂ ", el("span", { class: "category" }, e.safety.category)));
      node.append(cutCard({ gate: "prompt", ...e.safety }, S.features, { where: "before generation (HTTP 400)" }));
    } else {
      node.dataset.state = "error";
      node.append(el("div", { class: "error" }, `${e instanceof ApiError ? `HTTP ${e.status}${e.code ? ` ${e.code}` : ""}: ` : ""}${e.message}`));
    }
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }

  if (finish) node.dataset.finish = finish;
  // What the client actually received is what the conversation continues from (a cut answer stays cut).
  history.push({ role: "user", content: text });
  if (answer) history.push({ role: "assistant", content: answer });
  else if (node.dataset.state === "refused") history.pop();

  const t1 = performance.now();
  const n = usage?.completion_tokens ?? series.scores.length;
  const parts = [`finish: ${finish ?? node.dataset.state}`];
  if (tFirst !== null) parts.push(`first token ${fmt((tFirst - t0) / 1000, 2)} s`);
  if (n && tFirst !== null && t1 > tFirst) parts.push(`${n} tokens · ${fmt(n / ((t1 - t0) / 1000), 1)} tok/s`);
  if (usage) parts.push(`prompt ${usage.prompt_tokens} tokens`);
  if (series.threshold !== null) parts.push(`threshold ${fmt(series.threshold)}`);
  if (!series.scores.length && !series.cut && node.dataset.state === "done") parts.push("no risk scores in the stream (guard off or include_scores unsupported)");
  $("chat-stats").textContent = parts.join(" · ");
  node.append(el("div", { class: "turn-actions" },
    el("a", { href: "#score", onclick: () => {
      $("score-prompt").value = text;
      $("score-response").value = answer;
    } }, "score this turn ↗")));
}
