// Score tab: POST /v1/guard/score over pasted text; shows every token's risk and where the guard would cut.
import { ApiError, postJson } from "./api.js";
import { cutCard, el, fmt, Sparkline, TokenView } from "./risk.js";

let S;
let spark;
let replayTimer = null;
const $ = (id) => document.getElementById(id);

export function initScore(shared) {
  S = shared;
  spark = new Sparkline($("score-spark"), $("score-spark-info"));
  $("score-run").addEventListener("click", () => run(false));
  $("score-replay").addEventListener("click", () => run(true));
}

async function run(replay) {
  clearTimeout(replayTimer);
  const prompt = $("score-prompt").value;
  const response = $("score-response").value;
  const box = $("score-tokens");
  const summary = $("score-summary");
  box.replaceChildren();
  $("score-cut").replaceChildren();
  spark.clear();
  box.dataset.state = "scoring";
  summary.textContent = "scoring…";
  let res;
  try {
    res = await postJson("v1/guard/score", { prompt, response: response === "" ? null : response });
  } catch (e) {
    box.dataset.state = "error";
    summary.replaceChildren(el("span", { class: "error" },
      `${e instanceof ApiError ? `HTTP ${e.status}${e.code ? ` ${e.code}` : ""}: ` : ""}${e.message}`));
    return;
  }
  const { tokens, scores, threshold, cut } = res;
  const gate = response === "" ? "prompt" : "response";
  const view = new TokenView(box, spark);
  view.threshold = threshold;
  spark.setThreshold(threshold);
  const finite = scores.filter((s) => s !== null && Number.isFinite(s));
  summary.replaceChildren(
    el("span", {}, `${tokens.length} ${gate} tokens · max risk ${fmt(finite.length ? Math.max(...finite) : null)} · threshold ${fmt(threshold)} · `),
    cut ? el("strong", { class: "bad-text" }, `would cut at token ${cut.token_offset} (${cut.category})`)
      : el("strong", { class: "ok-text" }, "no cut"));

  const renderToken = (i, live) => {
    if (cut && i === cut.token_offset) {
      if (live) spark.markCut(cut.token_offset, cut.score, cut.category);
      box.append(el("span", { class: "cut-marker", title: "a stream would be cut here: this and later tokens withheld" },
        "✂ ", el("span", { class: "category" }, cut.category)));
    }
    const span = view.add(tokens[i], [scores[i]], i);
    if (cut && i >= cut.token_offset) span.classList.add("after-cut");
    if (live) spark.push(scores[i], tokens[i]);
  };
  const finish = () => {
    if (cut) {
      if (!spark.cut) spark.markCut(cut.token_offset, cut.score, cut.category);
      $("score-cut").append(cutCard({ gate, threshold, ...cut }, S.features,
        { title: `A stream would be cut here (${gate} gate)` }));
    }
    box.dataset.state = "done";
  };
  if (replay) {
    // Same order and pacing as a stream would show them, so the sparkline grows as it would live.
    const tick = (i) => {
      if (i >= tokens.length) return finish();
      renderToken(i, true);
      replayTimer = setTimeout(() => tick(i + 1), 40);
    };
    tick(0);
  } else {
    for (let i = 0; i < tokens.length; i++) renderToken(i, false);
    // One redraw for the whole series rather than one per token.
    spark.load({ scores, labels: tokens, threshold,
      cut: cut ? { index: cut.token_offset, score: cut.score, category: cut.category } : null });
    finish();
  }
}
