"""tableagent: TableAgent-Bench / TAEF (agentic multi-turn bilingual TableQA; code
201983290498/TableAgentBench, Apache-2.0 — reimplemented from the description, no code copied).

"TableWorld" generates bilingual (en/zh) multi-table dialogue environments with exact ground truth
(CSV plus an XLSX with a two-row header, distractor tables sharing column names, chain and
fork-join topologies). Agents work through tools (list_folder, preview_table, table_schema,
search_cells, run_pandas, answer) and a deterministic rule judge computes the TAEF metric families:
information coverage (micro/macro, strict/non-strict), task Pass@1 and turn Coverage@1, table
recall/precision/F1, tool success and parallelism. The judge is the method under test: scripted
agents with exactly known scores (including one that pads the right answer with a flood of other
numbers, which TAEF's |Δ| ≤ 0.1 rule alone would credit) and hand-made cases gate it. The
``null_method`` swaps in a judge that credits any non-empty answer, which must fail them. The
served model then runs as the agent through the chat API with real tool calls (``tools``); its scores
are reported, and the leaderboard's finding (table agents score low) is a claim.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from offline_suites.base import Check, RunContext, SuiteResult, check_close, check_equal, claim
from offline_suites.registry import register_suite

REGIONS = {"North": "北部", "South": "南部", "East": "东部", "West": "西部", "Central": "中部"}
COLS = {"en": {"region": "region", "year": "year", "revenue": "revenue", "cost": "cost", "employees": "employees",
               "product": "product", "price": "price"},
        "zh": {"region": "地区", "year": "年份", "revenue": "收入", "cost": "成本", "employees": "员工人数",
               "product": "产品", "price": "价格"}}
TREND_WORDS = {"up": {"en": ("rose", "rise", "increased", "increase", "grew", "higher"), "zh": ("上升", "增长", "增加")},
               "down": {"en": ("fell", "fall", "decreased", "decrease", "declined", "lower"), "zh": ("下降", "减少")}}
NUMERIC_TOL = 0.1     # TAEF: a number is covered when |Δ| ≤ 0.1
FRONTIER_IC = 0.534   # best information coverage on the TableAgent-Bench leaderboard


@dataclass(frozen=True)
class Config:
    dialogues: int = 4
    years: tuple[int, ...] = (2021, 2022, 2023)
    llm_dialogues: int = 1           # dialogues the served model plays (0 = skip)
    llm_turns: int = 1               # turns per served-model dialogue
    llm_max_steps: int = 2           # tool steps per turn before the answer is forced
    llm_max_tokens: int = 64
    sandbox_timeout_s: float = 20.0
    null_method: bool = False        # a judge that credits every non-empty answer: the gates must fail
    BOUNDS: ClassVar[dict[str, tuple[float, float]]] = {
        "dialogues": (1, 1000), "years": (1900, 2100), "llm_dialogues": (0, 1000), "llm_turns": (1, 4),
        "llm_max_steps": (0, 100), "llm_max_tokens": (1, 4096), "sandbox_timeout_s": (1.0, 600.0)}

    SMOKE: ClassVar[Config]
    FULL: ClassVar[Config]


Config.SMOKE = Config()
Config.FULL = Config(dialogues=50, llm_dialogues=10, llm_turns=4, llm_max_steps=10, llm_max_tokens=256)


# ------------------------------------------------------------------------------------- generator
@dataclass
class Turn:
    info_item: str
    related_tables: list[str]
    score_points: list[dict[str, Any]]
    answer_text: str


@dataclass
class Dialogue:
    folder: Path
    lang: str
    topology: str
    tables: list[str]
    turns: list[Turn]


def _fmt_points(points: list[dict[str, Any]], lang: str, offset: float = 0.0) -> str:
    parts = []
    for p in points:
        if p["kind"] == "number":
            v = p["value"] + offset
            parts.append(f"{v:.2f}%" if p.get("percent") else f"{v:.2f}")
        elif p["kind"] == "entity":
            parts.append(p["aliases"][0 if lang == "en" else 1])
        else:
            parts.append(TREND_WORDS[p["value"]][lang][0])
    return "; ".join(parts)


def generate_dialogue(folder: Path, rng: np.random.Generator, lang: str, topology: str,
                      years: tuple[int, ...]) -> Dialogue:
    import pandas as pd
    from openpyxl import Workbook

    folder.mkdir(parents=True, exist_ok=True)
    c = COLS[lang]
    regions = list(REGIONS)[: int(rng.integers(3, 6))]
    rname = (lambda r: r) if lang == "en" else (lambda r: REGIONS[r])
    rev = {(r, y): float(rng.integers(200, 1000)) for r in regions for y in years}
    cost = {(r, y): float(round(rev[(r, y)] * rng.uniform(0.4, 0.95))) for r in regions for y in years}
    emp = {r: int(rng.integers(10, 80)) for r in regions}
    pd.DataFrame([{c["region"]: rname(r), c["year"]: y, c["revenue"]: rev[(r, y)]} for r in regions for y in years]
                 ).to_csv(folder / "regional_sales.csv", index=False)
    wb = Workbook()
    ws = wb.active
    ws.append(["Regional costs (currency units)" if lang == "en" else "各地区成本（货币单位）"])   # title row
    ws.append([c["region"], c["year"], c["cost"]])
    for r in regions:
        for y in years:
            ws.append([rname(r), y, cost[(r, y)]])
    wb.save(folder / "regional_costs.xlsx")
    pd.DataFrame([{c["region"]: rname(r), c["employees"]: emp[r]} for r in regions]).to_csv(folder / "headcount.csv",
                                                                                             index=False)
    # distractors: same column names, other years / an unrelated table
    pd.DataFrame([{c["region"]: rname(r), c["year"]: y - 10, c["revenue"]: float(rng.integers(100, 900))}
                  for r in regions for y in years]).to_csv(folder / "regional_sales_archive.csv", index=False)
    pd.DataFrame([{c["product"]: f"P{i}", c["price"]: float(rng.integers(5, 50))} for i in range(5)]
                 ).to_csv(folder / "product_catalog.csv", index=False)
    tables = sorted(p.name for p in folder.iterdir())
    y1, y0 = years[-1], years[-2]
    S, C, H = "regional_sales.csv", "regional_costs.xlsx", "headcount.csv"

    def ent(r: str) -> dict[str, Any]:
        # the other candidates ride along: naming them too is a contradiction, not coverage
        return {"kind": "entity", "value": r, "aliases": [r, REGIONS[r]],
                "others": [a for o in regions if o != r for a in (o, REGIONS[o])]}

    def num(v: float, percent: bool = False) -> dict[str, Any]:
        return {"kind": "number", "value": round(v, 2), "percent": percent}

    en = lang == "en"
    turns: list[tuple[str, list[str], list[dict[str, Any]]]] = []
    if topology == "chain":
        best = max(regions, key=lambda r: rev[(r, y1)] - cost[(r, y1)])
        turns.append((f"Which region had the highest profit (revenue minus cost) in {y1}?" if en else
                      f"{y1}年哪个地区的利润（收入减成本）最高？", [S, C], [ent(best)]))
        turns.append((f"For that region, what was the revenue per employee in {y1}?" if en else
                      f"该地区{y1}年的人均收入是多少？", [S, H], [num(rev[(best, y1)] / emp[best])]))
        trend = "up" if cost[(best, y1)] > cost[(best, y0)] else "down"
        turns.append((f"Did its cost rise or fall from {y0} to {y1}, and what was the cost in {y1}?" if en else
                      f"该地区成本从{y0}年到{y1}年是上升还是下降？{y1}年成本是多少？", [C],
                      [{"kind": "trend", "value": trend}, num(cost[(best, y1)])]))
        g = (rev[(best, y1)] / rev[(best, y0)] - 1) * 100
        turns.append((f"By what percentage did its revenue grow from {y0} to {y1}?" if en else
                      f"该地区收入从{y0}年到{y1}年增长了百分之多少？", [S], [num(g, True)]))
    else:   # fork-join: independent turns, then an aggregating one
        tr, tc = sum(rev[(r, y1)] for r in regions), sum(cost[(r, y1)] for r in regions)
        thr = float(np.median([rev[(r, y1)] for r in regions]))
        turns.append((f"What was the total revenue of all regions in {y1}?" if en else f"{y1}年所有地区的总收入是多少？",
                      [S], [num(tr)]))
        turns.append((f"What was the total cost of all regions in {y1}?" if en else f"{y1}年所有地区的总成本是多少？",
                      [C], [num(tc)]))
        turns.append((f"How many regions had revenue above {thr:g} in {y1}?" if en else
                      f"{y1}年有多少个地区的收入高于{thr:g}？", [S], [num(sum(rev[(r, y1)] > thr for r in regions))]))
        turns.append((f"Combining both, what was the overall profit margin in {y1} (in percent)?" if en else
                      f"综合来看，{y1}年的整体利润率是百分之多少？", [S, C], [num((tr - tc) / tr * 100, True)]))
    out = [Turn(q, sorted(g), pts, _fmt_points(pts, lang)) for q, g, pts in turns]
    return Dialogue(folder, lang, topology, tables, out)


# ------------------------------------------------------------------------------------------ tools
class ToolError(Exception):
    pass


def read_table(path: Path) -> Any:
    import pandas as pd

    if path.suffix == ".xlsx":
        return pd.read_excel(path, header=1)     # row 1 is a title row (two-row header)
    return pd.read_csv(path)


_SANDBOX = r"""
import json, sys, pathlib, resource
import pandas as pd
tables = {}
for p in sorted(pathlib.Path('.').iterdir()):
    if p.suffix == '.csv': tables[p.name] = pd.read_csv(p)
    elif p.suffix == '.xlsx': tables[p.name] = pd.read_excel(p, header=1)
ns = {'pd': pd, 'tables': tables}
exec(sys.stdin.read(), ns)
print(repr(ns.get('result', None))[:2000])
"""


def run_sandboxed(code: str, folder: Path, timeout_s: float) -> str:
    """Run agent-written pandas code in a separate interpreter with CPU/memory limits.
    Best effort: there is no network namespace here, so the limits are resources, not isolation."""
    def limits() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (int(timeout_s), int(timeout_s)))
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    try:
        r = subprocess.run([sys.executable, "-I", "-c", _SANDBOX], input=code, capture_output=True, text=True,
                           cwd=folder, timeout=timeout_s, preexec_fn=limits, env={"PATH": "/usr/bin:/bin"})
    except subprocess.TimeoutExpired as e:
        raise ToolError(f"timed out after {timeout_s}s") from e
    if r.returncode != 0:
        raise ToolError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}")
    return r.stdout.strip()


class TableEnv:
    """One dialogue's tool surface; records every call for the trace."""

    def __init__(self, dlg: Dialogue, sandbox_timeout_s: float = 20.0) -> None:
        self.dlg = dlg
        self.timeout = sandbox_timeout_s
        self.calls: list[dict[str, Any]] = []

    def _table(self, name: str) -> Path:
        if name not in self.dlg.tables:
            raise ToolError(f"no table {name!r}; available: {', '.join(self.dlg.tables)}")
        return self.dlg.folder / name

    def call(self, turn: int, tool: str, args: dict[str, Any], message: int) -> tuple[bool, str]:
        touched: list[str] = []
        try:
            if tool == "list_folder":
                out = "\n".join(self.dlg.tables)
            elif tool in ("preview_table", "table_schema"):
                name = str(args.get("name", ""))
                df = read_table(self._table(name))
                touched = [name]
                out = (df.head(int(args.get("rows", 20))).to_csv(index=False) if tool == "preview_table"
                       else json.dumps({"columns": list(map(str, df.columns)), "rows": len(df)}, ensure_ascii=False))
            elif tool == "search_cells":
                kw = str(args.get("keyword", "")).lower()
                hits = []
                for name in self.dlg.tables:
                    df = read_table(self.dlg.folder / name)
                    for col in df.columns:
                        if kw in str(col).lower() or df[col].astype(str).str.lower().str.contains(kw, regex=False).any():
                            hits.append(f"{name}:{col}")
                out = "\n".join(hits) or "no match"
            elif tool == "run_pandas":
                code = str(args.get("code", ""))
                touched = [t for t in self.dlg.tables if t in code]
                out = run_sandboxed(code, self.dlg.folder, self.timeout)
            else:
                raise ToolError(f"unknown tool {tool!r}")
            ok = True
        except (ToolError, ValueError, KeyError, OSError) as e:
            ok, out = False, f"error: {e}"
        self.calls.append({"turn": turn, "message": message, "tool": tool, "args": args, "ok": ok,
                           "tables": touched, "output": out[:500]})
        return ok, out


# ------------------------------------------------------------------------------------------ judge
_NUM = re.compile(r"(-?\d+(?:,\d{3})*(?:\.\d+)?)\s*(%|万|亿|[kK]\b|[mM]\b)?")
_MULT = {"万": 1e4, "亿": 1e8, "k": 1e3, "K": 1e3, "m": 1e6, "M": 1e6}


def extract_numbers(text: str) -> list[float]:
    out = []
    for m in _NUM.finditer(text):
        v = float(m.group(1).replace(",", ""))
        out.append(v * _MULT.get(m.group(2) or "", 1.0))
    return out


def _mentions(text: str, alias: str) -> bool:
    """Whole-word match for Latin names ("West" is not in "lowest"); substring for CJK."""
    if alias.isascii():
        return re.search(rf"\b{re.escape(alias.lower())}\b", text) is not None
    return alias in text


def point_covered(point: dict[str, Any], answer: str) -> bool:
    if point["kind"] == "number":
        return any(abs(v - point["value"]) <= NUMERIC_TOL for v in extract_numbers(answer))
    low = answer.lower()
    if point["kind"] == "entity":
        return (any(_mentions(low, a) for a in point["aliases"])
                and not any(_mentions(low, a) for a in point.get("others", [])))
    good = [w for ws in TREND_WORDS[point["value"]].values() for w in ws]
    bad = [w for k, d in TREND_WORDS.items() if k != point["value"] for ws in d.values() for w in ws]
    return any(w in low for w in good) and not any(w in low for w in bad)


Judge = Callable[[list[dict[str, Any]], str], list[bool]]


def rule_judge(points: list[dict[str, Any]], answer: str) -> list[bool]:
    """Which score points an answer covers. An answer that lists far more numbers than the turn
    asks for gets no numeric credit: otherwise dumping a table would cover every number in it."""
    flooded = len(extract_numbers(answer)) > 2 * len(points) + 3
    return [point_covered(p, answer) and not (flooded and p["kind"] == "number") for p in points]


def lenient_judge(points: list[dict[str, Any]], answer: str) -> list[bool]:
    """The null judge: any non-empty answer covers everything."""
    return [bool(answer.strip())] * len(points)


@dataclass
class Trace:
    dialogue: Dialogue
    answers: list[str | None]             # per turn; None = never answered
    declared_tables: list[list[str]]
    calls: list[dict[str, Any]]
    assistant_messages: int = 0
    tokens: int = 0
    meta: dict[str, Any] = field(default_factory=dict)


def score_traces(traces: list[Trace], judge: Judge = rule_judge) -> dict[str, Any]:
    """TAEF metric families by a judge (the deterministic rule judge unless told otherwise)."""
    turn_cov_strict, turn_cov_nonstrict, macro_strict, macro_nonstrict = [], [], [], []
    recall, precision, passes = [], [], []
    num_pts = num_cov = 0
    for tr in traces:
        covs_s, covs_n = [], []
        for t, turn in enumerate(tr.dialogue.turns):
            ans = tr.answers[t]
            hit = judge(turn.score_points, ans) if ans else [False] * len(turn.score_points)
            cov = sum(hit) / len(hit)
            if ans:
                covs_n.append(cov)
            covs_s.append(cov)
            for p, h in zip(turn.score_points, hit, strict=True):
                if p["kind"] == "number":
                    num_pts += 1
                    num_cov += h
            used = {x for c in tr.calls if c["turn"] == t and c["ok"] for x in c["tables"]} | set(tr.declared_tables[t])
            gold = set(turn.related_tables)
            recall.append(len(used & gold) / len(gold))
            precision.append(len(used & gold) / len(used) if used else 0.0)
        turn_cov_strict += covs_s
        turn_cov_nonstrict += covs_n
        macro_strict.append(float(np.mean(covs_s)))
        if covs_n:
            macro_nonstrict.append(float(np.mean(covs_n)))
        passes.append(all(c == 1.0 for c in covs_s))
    calls = [c for tr in traces for c in tr.calls]
    msgs = sum(tr.assistant_messages for tr in traces)
    rec_, prec_ = float(np.mean(recall)), float(np.mean(precision))
    nan = float("nan")
    return {
        "ic_micro_strict": float(np.mean(turn_cov_strict)), "ic_macro_strict": float(np.mean(macro_strict)),
        "ic_micro_nonstrict": float(np.mean(turn_cov_nonstrict)) if turn_cov_nonstrict else nan,
        "ic_macro_nonstrict": float(np.mean(macro_nonstrict)) if macro_nonstrict else nan,
        "task_pass_at_1": float(np.mean(passes)),
        "turn_coverage_at_1": float(np.mean([c == 1.0 for c in turn_cov_strict])),
        "numeric_points_covered": num_cov / num_pts if num_pts else nan,
        "table_recall": rec_, "table_precision": prec_,
        "table_f1": 2 * rec_ * prec_ / (rec_ + prec_) if rec_ + prec_ > 0 else 0.0,
        "tool_success_rate": sum(c["ok"] for c in calls) / len(calls) if calls else nan,
        "tool_parallelism": len(calls) / msgs if msgs else nan,
        "tool_calls": len(calls), "turns": len(turn_cov_strict), "tokens": sum(tr.tokens for tr in traces),
    }


# -------------------------------------------------------------------------------- scripted agents
def scripted(dlg: Dialogue, kind: str, timeout: float) -> Trace:
    env = TableEnv(dlg, timeout)
    answers: list[str | None] = []
    declared: list[list[str]] = []
    msgs = 0
    for t, turn in enumerate(dlg.turns):
        if kind == "crashy":
            env.call(t, "preview_table", {"name": "missing_table.csv"}, msgs)
            msgs += 1
        targets = dlg.tables if kind == "read_everything" else turn.related_tables
        for name in targets:                  # one assistant message with parallel calls
            env.call(t, "preview_table", {"name": name, "rows": 3}, msgs)
        msgs += 1
        offset = {"rounding_0.05": 0.05, "rounding_0.2": 0.2}.get(kind, 0.0)
        if kind == "silent":
            answers.append(None)
            declared.append([])
        elif kind == "shotgun":
            # the right answer buried in a dump of other figures
            answers.append(turn.answer_text + "; other figures: " + ", ".join(f"{v:.2f}" for v in range(101, 900, 41)))
            declared.append([])
        else:
            answers.append(_fmt_points(turn.score_points, dlg.lang, offset) if offset else turn.answer_text)
            declared.append([])
    return Trace(dlg, answers, declared, env.calls, msgs)


def _expected(dialogues: list[Dialogue], kind: str) -> dict[str, float]:
    """Exact scores each scripted agent must get, derived from the generated data."""
    turns = [(d, t) for d in dialogues for t in d.turns]
    n_gold = sum(len(t.related_tables) for _, t in turns)
    if kind == "oracle":
        return {"ic_micro_strict": 1.0, "task_pass_at_1": 1.0, "table_recall": 1.0, "table_precision": 1.0,
                "tool_success_rate": 1.0, "tool_parallelism": n_gold / len(turns)}
    if kind == "read_everything":
        return {"ic_micro_strict": 1.0, "table_recall": 1.0,
                "table_precision": float(np.mean([len(t.related_tables) / len(d.tables) for d, t in turns]))}
    if kind == "rounding_0.05":
        return {"numeric_points_covered": 1.0, "ic_micro_strict": 1.0}
    if kind in ("rounding_0.2", "shotgun"):
        ic = float(np.mean([sum(p["kind"] != "number" for p in t.score_points) / len(t.score_points) for _, t in turns]))
        return {"numeric_points_covered": 0.0, "ic_micro_strict": ic}
    if kind == "crashy":
        return {"tool_success_rate": n_gold / (n_gold + len(turns)), "ic_micro_strict": 1.0}
    if kind == "silent":
        return {"ic_micro_strict": 0.0, "ic_macro_strict": 0.0, "task_pass_at_1": 0.0}
    raise KeyError(kind)


SCRIPTED = ("oracle", "read_everything", "rounding_0.05", "rounding_0.2", "crashy", "silent", "shotgun")


# ------------------------------------------------------------------------------- served-model agent
_SYSTEM = {
    "en": ("You answer questions about the tables in a folder. Call the tools to read them. "
           "When you know the answer write: Final Answer: <answer> [tables: file, file]"),
    "zh": ("你要回答关于文件夹中表格的问题。调用工具读取表格。知道答案时写：Final Answer: <答案> [tables: 文件, 文件]"),
}
_FINAL = re.compile(r"Final Answer:\s*(.*)", re.S)


def _tool(tool: str, description: str, props: dict[str, str] | None = None) -> dict[str, Any]:
    props = props or {}
    return {"type": "function", "function": {"name": tool, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
        "required": list(props)}}}


# TableEnv's surface as OpenAI function tools: the served agent calls them through the chat API's `tools`
AGENT_TOOLS = [
    _tool("list_folder", "List the table files in the folder."),
    _tool("preview_table", "The first rows of a table as CSV.", {"name": "table file name"}),
    _tool("table_schema", "A table's columns and row count.", {"name": "table file name"}),
    _tool("search_cells", "Tables and columns whose name or cells contain a keyword.", {"keyword": "text to find"}),
    _tool("run_pandas", "Run Python on the tables (dict `tables` of pandas DataFrames by file name); set `result`.",
          {"code": "python code"}),
]


# A tool result goes back whole into the conversation; the tools' own prompt already takes ~550 of SmolLM2's
# tokens, so results are kept short enough for a few steps to fit a 1024-token context.
_TOOL_OUTPUT_CHARS = 400


def _call_args(raw: str) -> dict[str, Any]:
    try:
        args = json.loads(raw or "{}")
    except ValueError:
        return {"_unparsed": raw}
    return args if isinstance(args, dict) else {"_unparsed": raw}


def llm_agent(dlg: Dialogue, chat: Callable[[list[dict[str, Any]]], Any], cfg: Config) -> Trace:
    """The served model as the agent: ``chat(messages)`` offers it :data:`AGENT_TOOLS`; every call it makes
    runs against the dialogue's :class:`TableEnv` and the result goes back as a ``tool`` message. A reply
    without calls (or the last step's reply) is the turn's answer."""
    env = TableEnv(dlg, cfg.sandbox_timeout_s)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _SYSTEM[dlg.lang]}]
    answers: list[str | None] = []
    declared: list[list[str]] = []
    msgs = tokens = 0
    for t, turn in enumerate(dlg.turns[: cfg.llm_turns]):
        messages.append({"role": "user", "content": turn.info_item})
        answer: str | None = None
        for step in range(cfg.llm_max_steps + 1):
            reply = chat(messages)
            tokens += reply.prompt_tokens + reply.completion_tokens
            text = reply.text.strip()
            msgs += 1
            if not reply.tool_calls or step == cfg.llm_max_steps:
                messages.append({"role": "assistant", "content": text})
                fin = _FINAL.search(text)
                answer = (fin.group(1) if fin else text) or None
                m = re.search(r"\[tables?:\s*([^\]]*)\]", answer or "")
                declared.append([x.strip() for x in m.group(1).split(",") if x.strip() in dlg.tables] if m else [])
                break
            messages.append({"role": "assistant", "content": text or None, "tool_calls": reply.tool_calls})
            # the calls of one message run together: TAEF's tool parallelism counts calls per message
            for call in reply.tool_calls:
                fn = call["function"]
                _, out = env.call(t, fn["name"], _call_args(fn["arguments"]), msgs - 1)
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": out[:_TOOL_OUTPUT_CHARS]})
        answers.append(answer)
    # turns beyond llm_turns are not part of this trace
    sub = Dialogue(dlg.folder, dlg.lang, dlg.topology, dlg.tables, dlg.turns[: cfg.llm_turns])
    return Trace(sub, answers, declared, env.calls, msgs, tokens, {"messages": messages})


# ------------------------------------------------------------------------------------------ suite
@register_suite("tableagent", version=2, config=Config,
                null_method="the rule judge is replaced by one that credits every non-empty answer")
def run(ctx: RunContext, config: Config, seed: int) -> SuiteResult:
    cfg = config
    rng = np.random.default_rng(seed)
    world = ctx.results_dir / "tableworld"
    dialogues = []
    for i in range(cfg.dialogues):
        ctx.progress(0.02 + 0.2 * i / cfg.dialogues, "generating TableWorld")
        dialogues.append(generate_dialogue(world / f"dialogue_{i:03d}", rng, ("en", "zh")[i % 2],
                                           ("chain", "fork_join")[(i // 2) % 2], cfg.years))
    manifest = [{"folder": d.folder.name, "lang": d.lang, "topology": d.topology, "tables": d.tables,
                 "turns": [{"info_item": t.info_item, "related_tables": t.related_tables, "score_points": t.score_points}
                           for t in d.turns]} for d in dialogues]
    ctx.record_data("tableworld_manifest", json.dumps(manifest, sort_keys=True, ensure_ascii=False))
    ctx.save_json("tableworld_manifest.json", manifest)

    judge = lenient_judge if cfg.null_method else rule_judge

    def covered(point: dict[str, Any], answer: str) -> bool:
        return judge([point], answer)[0]

    checks: list[Check] = []
    metrics: dict[str, Any] = {"scripted": {}}
    for j, kind in enumerate(SCRIPTED):
        ctx.progress(0.25 + 0.3 * j / len(SCRIPTED), f"scripted agent {kind}")
        scores = score_traces([scripted(d, kind, cfg.sandbox_timeout_s) for d in dialogues], judge)
        metrics["scripted"][kind] = scores
        for key, exp in _expected(dialogues, kind).items():
            checks.append(check_close(f"{kind}_{key}", "hard", exp, scores[key], 1e-12))
        if kind == "silent":
            checks.append(check_equal("silent_nonstrict_ic_undefined", "hard", True, math.isnan(scores["ic_micro_nonstrict"]),
                                      "non-strict IC excludes unanswered turns; with none answered it is undefined"))
    # the judge's own rules on hand-made cases
    checks.append(check_equal("judge_number_normalisation", "hard", [True, True, True, False],
                              [covered({"kind": "number", "value": 15000.0}, "1.5万"),
                               covered({"kind": "number", "value": 2500.0}, "2.5k units"),
                               covered({"kind": "number", "value": 12.34, "percent": True}, "about 12.4%"),
                               covered({"kind": "number", "value": 12.34}, "12.5")]))
    checks.append(check_equal("judge_trend_contradiction", "hard", [True, False],
                              [covered({"kind": "trend", "value": "up"}, "costs rose"),
                               covered({"kind": "trend", "value": "up"}, "it rose then fell")]))
    west = {"kind": "entity", "value": "West", "aliases": ["West", "西部"], "others": ["North", "北部"]}
    checks.append(check_equal("judge_entity_rules", "hard", [True, True, False, False],
                              [covered(west, "The West region."), covered(west, "西部地区"),
                               covered(west, "the lowest profit"), covered(west, "West or North")]))
    checks.append(check_equal("judge_number_flood", "hard", [True, False],
                              [covered({"kind": "number", "value": 512.0}, "In 2023 it was 512.00."),
                               covered({"kind": "number", "value": 512.0},
                                       " ".join(str(v) for v in range(500, 520)))],
                              "a dump of twenty numbers around the value is not an answer"))
    sandbox_out = run_sandboxed("result = int(tables['headcount.csv'].iloc[:, 1].sum())", dialogues[0].folder,
                                cfg.sandbox_timeout_s)
    expected_sum = int(read_table(dialogues[0].folder / "headcount.csv").iloc[:, 1].sum())
    checks.append(check_equal("sandbox_run_pandas", "hard", str(expected_sum), sandbox_out))

    claims = []
    uses_llm = cfg.llm_dialogues > 0
    if uses_llm:
        traces = []
        for i, dlg in enumerate(dialogues[: cfg.llm_dialogues]):
            ctx.progress(0.6 + 0.35 * i / cfg.llm_dialogues, f"served model as agent, dialogue {i}")

            def chat(m: list[dict[str, Any]], i: int = i) -> Any:
                ctx.check_cancelled()
                return ctx.llm.chat(m, max_tokens=cfg.llm_max_tokens, temperature=0.0, seed=seed + i, tools=AGENT_TOOLS)

            traces.append(llm_agent(dlg, chat, cfg))
        served = score_traces(traces, judge)
        metrics["served"] = served
        ctx.save_json("tableagent_served_traces.json",
                      [{"folder": tr.dialogue.folder.name, "answers": tr.answers, "calls": tr.calls,
                        "messages": tr.meta["messages"]} for tr in traces])
        claims.append(claim("served_agent_below_frontier", "multi-turn table agents stay far below full coverage: "
                            "the best leaderboard model covers 53.4 %", served["ic_micro_strict"], "<=", FRONTIER_IC,
                            "served model's strict micro IC"))
    reference = {"leaderboard_ic_percent": {"Gemini-3-Pro-Preview (thinking)": 53.4, "GPT-5 (thinking)": 50.2,
                                            "Qwen3-8B (non-thinking)": 2.8},
                 "expected_small_model_ic_percent": "≈3 (Qwen3-8B row); a 135M model is expected lower",
                 "verified_against_paper": False}
    ctx.progress(1.0, "done")
    return ctx.result(metrics, reference, checks, claims=claims, uses_llm=uses_llm)
