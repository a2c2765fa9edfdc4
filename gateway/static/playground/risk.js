// Risk rendering shared by the chat and score views: token colouring, the sparkline, the cut marker.

/** Background colour of a token from its score relative to the threshold in force.
 *  Green (0) -> amber (half the threshold) -> red (at or above it). null = not scored. */
export function riskColor(score, threshold) {
  if (score === null || score === undefined || !Number.isFinite(score)) return "";
  const r = ratio(score, threshold);
  const t = Math.min(r, 1);
  const hue = 120 * (1 - t);
  const alpha = r >= 1 ? 0.8 : 0.15 + 0.45 * t;
  return `hsla(${hue.toFixed(0)}, 85%, 50%, ${alpha.toFixed(2)})`;
}

function ratio(score, threshold) {
  if (threshold && threshold > 0) return Math.max(0, score) / threshold;
  return score > 0 ? 1 : 0;
}

export function fmt(x, digits = 3) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (!Number.isFinite(x)) return String(x);
  if (Number.isInteger(x)) return String(x);
  const a = Math.abs(x);
  if (a !== 0 && (a < 1e-3 || a >= 1e5)) return x.toExponential(2);
  return x.toFixed(digits);
}

export function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

// ------------------------------------------------------------------------------------- tooltip
const tip = () => document.getElementById("tooltip");

export function showTip(ev, text) {
  const t = tip();
  t.textContent = text;
  t.hidden = false;
  const x = Math.min(ev.clientX + 12, window.innerWidth - t.offsetWidth - 8);
  const y = ev.clientY + 16 + t.offsetHeight > window.innerHeight ? ev.clientY - t.offsetHeight - 8 : ev.clientY + 16;
  t.style.left = `${x}px`;
  t.style.top = `${y}px`;
}

export function hideTip() {
  tip().hidden = true;
}

// ----------------------------------------------------------------------------------- sparkline
/** Live line chart of per-token risk with the threshold line and the cut position. */
export class Sparkline {
  constructor(canvas, info) {
    this.canvas = canvas;
    this.info = info;
    this.highlighted = null;
    this.clear();
    canvas.addEventListener("mousemove", (ev) => this.hover(ev));
    canvas.addEventListener("mouseleave", () => { this.highlighted = null; hideTip(); this.draw(); });
    new ResizeObserver(() => this.draw()).observe(canvas);
  }

  clear() {
    this.scores = [];      // numbers or null (unscored)
    this.labels = [];      // token text per point, for the hover tooltip
    this.threshold = null;
    this.cut = null;       // {index, score, category}
    this.draw();
  }

  /** Replace everything at once (switching between conversation turns). */
  load(series) {
    this.scores = series.scores.slice();
    this.labels = series.labels.slice();
    this.threshold = series.threshold;
    this.cut = series.cut;
    this.draw();
  }

  push(score, label) {
    this.scores.push(score);
    this.labels.push(label);
    this.draw();
  }

  setThreshold(t) {
    if (t !== null && t !== undefined && t !== this.threshold) {
      this.threshold = t;
      this.draw();
    }
  }

  markCut(index, score, category) {
    this.cut = { index, score, category };
    this.draw();
  }

  highlight(i) {
    this.highlighted = i;
    this.draw();
  }

  geometry() {
    const w = this.canvas.clientWidth;
    const h = this.canvas.clientHeight;
    const n = Math.max(this.scores.length, this.cut ? this.cut.index + 1 : 0, 2);
    const finite = this.scores.filter((s) => s !== null && Number.isFinite(s));
    const peak = Math.max(0, ...finite, this.cut?.score ?? 0);
    // A threshold far above every score (a gate opened wide by hand) would flatten the curve to the
    // axis: then the scale follows the scores and the threshold is drawn as "off scale" at the top.
    const offScale = this.threshold !== null && peak > 0 && this.threshold > 4 * peak;
    let ymax = offScale ? peak : Math.max(peak, (this.threshold ?? 0) * 1.25);
    if (!(ymax > 0)) ymax = 1;
    ymax *= 1.08;
    const padL = 44, padR = 8, padT = 8, padB = 16;
    const x = (i) => padL + (n <= 1 ? 0 : (i * (w - padL - padR)) / (n - 1));
    const y = (v) => padT + (h - padT - padB) * (1 - Math.max(0, v) / ymax);
    return { w, h, n, ymax, x, y, padL, padR, padT, padB, offScale };
  }

  /** Update the DOM mirror now and repaint on the next animation frame (one paint per frame). */
  draw() {
    const c = this.canvas;
    // The scored point count is mirrored in the DOM so tests (and curious users) can read it.
    c.dataset.points = String(this.scores.filter((s) => s !== null).length);
    c.dataset.cut = this.cut ? String(this.cut.index) : "";
    if (this.info) {
      const fin = this.scores.filter((s) => s !== null && Number.isFinite(s));
      this.info.textContent = fin.length
        ? `max ${fmt(Math.max(...fin))}` + (this.threshold !== null ? ` · threshold ${fmt(this.threshold)}` : "")
        : "";
    }
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => { this.pending = false; this.paint(); });
  }

  paint() {
    const c = this.canvas;
    const dpr = window.devicePixelRatio || 1;
    const w = c.clientWidth, h = c.clientHeight;
    if (!w || !h) return;
    if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
      c.width = Math.round(w * dpr);
      c.height = Math.round(h * dpr);
    }
    const g = c.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    const G = this.geometry();
    const css = getComputedStyle(document.documentElement);
    const ink = css.getPropertyValue("--ink-2").trim() || "#666";

    // axes
    g.strokeStyle = "#ddd";
    g.lineWidth = 1;
    g.beginPath();
    g.moveTo(G.padL, G.padT);
    g.lineTo(G.padL, h - G.padB);
    g.lineTo(w - G.padR, h - G.padB);
    g.stroke();
    g.fillStyle = ink;
    g.font = "10px system-ui, sans-serif";
    g.textAlign = "right";
    g.fillText(fmt(G.ymax, 2), G.padL - 4, G.padT + 8);
    g.fillText("0", G.padL - 4, h - G.padB);
    g.textAlign = "left";
    g.fillText(`${this.scores.length} tokens`, G.padL + 4, h - 3);

    if (!this.scores.some((v) => v !== null) && this.threshold === null && !this.cut) {
      g.fillStyle = ink;
      g.textAlign = "center";
      g.fillText("no risk scores yet (they arrive with each token while the guard is on)", (G.padL + w) / 2, h / 2);
      return;
    }

    // threshold
    if (this.threshold !== null && G.offScale) {
      g.fillStyle = "#d33";
      g.textAlign = "right";
      g.fillText(`threshold ${fmt(this.threshold)} ↑ (off scale)`, w - G.padR - 2, G.padT + 8);
    } else if (this.threshold !== null) {
      const ty = G.y(this.threshold);
      g.save();
      g.setLineDash([5, 4]);
      g.strokeStyle = "#d33";
      g.beginPath();
      g.moveTo(G.padL, ty);
      g.lineTo(w - G.padR, ty);
      g.stroke();
      g.restore();
      g.fillStyle = "#d33";
      g.textAlign = "right";
      // Label above the line at the right end (below it when the line is at the top edge).
      g.fillText(`threshold ${fmt(this.threshold)}`, w - G.padR - 2, ty - 4 > G.padT + 8 ? ty - 4 : ty + 12);
    }

    // risk: filled area + line, gaps where unscored
    const pts = this.scores.map((s, i) => (s === null || !Number.isFinite(s) ? null : [G.x(i), G.y(s)]));
    g.strokeStyle = "#2a6fdb";
    g.fillStyle = "rgba(42,111,219,0.12)";
    g.lineWidth = 1.5;
    let run = [];
    const flush = () => {
      if (!run.length) return;
      g.beginPath();
      g.moveTo(run[0][0], h - G.padB);
      for (const p of run) g.lineTo(p[0], p[1]);
      g.lineTo(run[run.length - 1][0], h - G.padB);
      g.closePath();
      g.fill();
      g.beginPath();
      run.forEach((p, k) => (k ? g.lineTo(p[0], p[1]) : g.moveTo(p[0], p[1])));
      g.stroke();
      run = [];
    };
    for (const p of pts) {
      if (p) run.push(p);
      else flush();
    }
    flush();
    // points above the threshold in red
    pts.forEach((p, i) => {
      if (!p) return;
      const over = this.threshold !== null && this.scores[i] >= this.threshold;
      if (over || this.scores.length <= 64) {
        g.fillStyle = over ? "#d33" : "#2a6fdb";
        g.beginPath();
        g.arc(p[0], p[1], over ? 3 : 1.8, 0, 2 * Math.PI);
        g.fill();
      }
    });

    // the cut
    if (this.cut) {
      const cx = G.x(this.cut.index);
      g.strokeStyle = "#b00";
      g.lineWidth = 2;
      g.beginPath();
      g.moveTo(cx, G.padT);
      g.lineTo(cx, h - G.padB);
      g.stroke();
      if (Number.isFinite(this.cut.score)) {
        g.fillStyle = "#b00";
        g.beginPath();
        g.arc(cx, G.y(this.cut.score), 4.5, 0, 2 * Math.PI);
        g.fill();
      }
      g.fillStyle = "#b00";
      g.font = "bold 11px system-ui, sans-serif";
      const label = `✂ ${this.cut.category ?? "cut"}`;
      const tw = g.measureText(label).width;
      g.textAlign = cx + 6 + tw > w ? "right" : "left";
      g.fillText(label, cx + (g.textAlign === "right" ? -6 : 6), G.padT + 10);
    }

    if (this.highlighted !== null && pts[this.highlighted]) {
      const [hx, hy] = pts[this.highlighted];
      g.strokeStyle = "#000";
      g.lineWidth = 1;
      g.beginPath();
      g.arc(hx, hy, 5, 0, 2 * Math.PI);
      g.stroke();
    }
  }

  hover(ev) {
    if (!this.scores.length) return;
    const G = this.geometry();
    const rect = this.canvas.getBoundingClientRect();
    const px = ev.clientX - rect.left;
    const i = Math.round(((px - G.padL) / (G.w - G.padL - G.padR)) * (G.n - 1));
    if (i < 0 || i >= this.scores.length) { hideTip(); return; }
    this.highlighted = i;
    this.draw();
    showTip(ev, `#${i}  ${JSON.stringify(this.labels[i] ?? "")}  risk ${fmt(this.scores[i])}`);
  }
}

// ---------------------------------------------------------------------------------- token view
/** Appends coloured token spans to a container; each span knows its sparkline index. */
export class TokenView {
  constructor(container, sparkline) {
    this.box = container;
    this.spark = sparkline;
    this.threshold = null;
  }

  /** One span for a piece of text covering scores[k] (several when a delta carried several tokens). */
  add(text, scores, firstIndex) {
    const scored = scores.filter((s) => s !== null && s !== undefined && Number.isFinite(s));
    const peak = scored.length ? Math.max(...scored) : null;
    const span = el("span", { class: peak === null ? "tok unscored" : "tok" }, text);
    if (peak !== null) {
      span.style.background = riskColor(peak, this.threshold);
      span.dataset.risk = String(peak);
      span.dataset.index = String(firstIndex);
      if (this.threshold !== null && peak >= this.threshold) span.classList.add("over");
    }
    const label = scores.length > 1
      ? `tokens #${firstIndex}–${firstIndex + scores.length - 1}  risk ${scores.map((s) => fmt(s)).join(", ")}`
      : peak === null ? "not scored" : `token #${firstIndex}  risk ${fmt(peak)}` +
        (this.threshold ? ` (${fmt(100 * peak / this.threshold, 0)}% of threshold)` : "");
    span.addEventListener("mousemove", (ev) => { showTip(ev, label); if (peak !== null) this.spark?.highlight(firstIndex); });
    span.addEventListener("mouseleave", () => { hideTip(); this.spark?.highlight(null); });
    this.box.append(span);
    return span;
  }
}

/** The cut (or prompt refusal) explanation: category, score vs threshold, where, top features. */
export function cutCard(safety, featureInfo, { where, title } = {}) {
  const gate = safety.gate ?? "response";
  // Kept in the server's order: the guard ranks them by contribution (weight x activation), not activation.
  const feats = safety.features ?? [];
  const trigger = safety.trigger ?? "readout";
  const card = el("div", { class: "cut-card", dataset: { category: safety.category, gate, trigger } },
    el("div", { class: "cut-title" },
      el("span", { class: "scissors" }, "✂"),
      title ?? (gate === "prompt" ? "Prompt refused by the guard" : "Stream cut by the guard"),
      el("span", { class: "category" }, safety.category),
      safety.decision && safety.decision !== "intervened" ? el("span", { class: "pill warn" }, safety.decision) : null),
    el("div", { class: "cut-facts" },
      // four decimals: a cut score is often within a rounding step of its threshold
      `score ${fmt(safety.score, 4)} > threshold ${fmt(safety.threshold, 4)} · ${gate} gate · token ${safety.token_offset}` +
      (safety.char_offset !== null && safety.char_offset !== undefined ? ` · char ${safety.char_offset}` : "") +
      (where ? ` · ${where}` : "")),
  );
  if (feats.length) {
    const list = el("ol", { class: "features" });
    for (const f of feats) {
      const info = featureInfo?.get(`${gate}:${f.id}`) ?? featureInfo?.get(f.id);
      const li = el("li", {},
        el("code", {}, `#${f.id}`),
        el("span", { class: "act" }, `act ${fmt(f.activation, 2)}`),
        info?.category ? el("span", { class: "pill" }, info.category) : null,
        info?.label ? el("span", { class: "flabel" }, info.label) : null);
      if (info?.top_snippets?.length) {
        li.append(el("details", {}, el("summary", {}, "top activating snippets"),
          el("ul", { class: "snippets" }, info.top_snippets.slice(0, 5).map((s) =>
            el("li", {}, typeof s === "string" ? s : (s.text ?? JSON.stringify(s)))))));
      }
      list.append(li);
    }
    card.append(el("div", { class: "muted small" }, "top SAE features at the cut:"), list);
    if (trigger === "combined") {
      // the prompt gate's score is the read-out's plus its residual probe's: the latents explain only part of it
      card.append(el("div", { class: "muted small probe-note" },
        "the score adds the residual probe to these features' read-out: they explain part of it"));
    }
  } else if (trigger === "residual_probe") {
    // the response gate's second trigger reads the residual itself, which no SAE latent explains
    card.append(el("div", { class: "muted small probe-note" },
      "cut by the residual probe: it reads what the SAE does not reconstruct, so no latent names it"));
  }
  return card;
}
