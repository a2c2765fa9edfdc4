"""Run every registered suite's FULL preset (its ``run_seeds`` seeds) one after another, resumably.

Each finished suite leaves a record in ``offline_suites/full-results/<suite>.json`` (the SuiteResult as
``nextguard suites run --json`` prints it, plus wall time, exit code and the machine it ran on), so a
session that ends mid-way loses at most the suite that was running: the next run skips every suite
whose record matches the registered version and FULL config. ``--table`` prints the README's
per-claim tables from the records.

    python scripts/suites_full.py                 # all suites, cheapest recorded first
    python scripts/suites_full.py repsim cgm      # just these
    python scripts/suites_full.py --table         # markdown from the records
    python scripts/suites_full.py --write-readme  # that markdown into offline_suites/README.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "offline_suites" / "full-results"
README = ROOT / "offline_suites" / "README.md"

# A suite without a record yet counts this many seconds per seed, for the queue's order and its ETA.
_UNKNOWN_SEED_S = 300.0


def _seed_seconds(name: str) -> float:
    """Seconds per seed from the suite's last record (any version), so cheap suites run first and an
    interrupted session still lands many."""
    path = RECORDS / f"{name}.json"
    if not path.exists():
        return _UNKNOWN_SEED_S
    rec = json.loads(path.read_text())
    return float(rec["wall_s"]) / max(_seeds(rec["result"]), 1)


def _registered() -> dict[str, dict[str, Any]]:
    from offline_suites.base import build_config
    from offline_suites.registry import list_suites

    out: dict[str, dict[str, Any]] = {}
    for suite in list_suites():
        config = build_config(suite.config_cls, "full", None)
        out[suite.name] = {"version": suite.version, "config": json.loads(json.dumps(config_dict(config)))}
    return out


def config_dict(config: Any) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def _record_path(name: str) -> Path:
    return RECORDS / f"{name}.json"


def _done(name: str, spec: dict[str, Any]) -> bool:
    path = _record_path(name)
    if not path.exists():
        return False
    rec = json.loads(path.read_text())
    return bool(rec.get("version") == spec["version"] and rec.get("config") == spec["config"])


def _machine() -> dict[str, Any]:
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "avx512_bf16": "avx512_bf16" in flags.split(), "load_avg_start": os.getloadavg()}


def run_one(name: str, spec: dict[str, Any], seed: int) -> dict[str, Any]:
    out_dir = Path(os.environ.get("NEXTGUARD_HOME", Path.home() / ".cache" / "nextguard")) / "suite-results" / "full"
    cmd = [sys.executable, "-m", "gateway.cli", "suites", "run", name, "--preset", "full", "--seed", str(seed),
           "--json", "--out", str(out_dir / name)]
    machine = _machine()
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"{name}: no result (exit {proc.returncode})\n{proc.stderr[-4000:]}")
    result = json.loads(lines[-1])
    return {"suite": name, "version": spec["version"], "config": spec["config"], "seed": seed,
            "exit_code": proc.returncode, "wall_s": round(wall, 1), "machine": machine,
            "finished": datetime.now(UTC).isoformat(timespec="seconds"), "result": result}


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in v) + "]"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _record(name: str) -> dict[str, Any] | None:
    path = _record_path(name)
    return json.loads(path.read_text()) if path.exists() else None


def summary(names: list[str]) -> str:
    rows = ["| suite | seeds | wall | gates passed | sanity passed | claims reproduced / not / inconclusive |",
            "|---|---|---|---|---|---|"]
    for name in names:
        rec = _record(name)
        if rec is None:
            rows.append(f"| {name} | pending | | | | |")
            continue
        res = rec["result"]
        gates = [c for c in res["checks"] if c["kind"] == "gate"]
        sanity = [c for c in res["checks"] if c["kind"] == "sanity"]
        verdicts = [c["verdict"] for c in res["claims"]]
        rows.append(
            f"| {name} | {_seeds(res)} | {rec['wall_s']:.0f} s | {sum(c['passed'] for c in gates)} / {len(gates)} | "
            f"{sum(c['passed'] for c in sanity)} / {len(sanity)} | {verdicts.count('reproduced')} / "
            f"{verdicts.count('not reproduced')} / {verdicts.count('inconclusive')} |")
    return "\n".join(rows)


def _seeds(res: dict[str, Any]) -> int:
    seeds = res.get("provenance", {}).get("seeds")
    if isinstance(seeds, list):
        return len(seeds)
    return max((len(c["per_seed"]) for c in res["claims"]), default=0)


def section(name: str) -> str:
    """The FULL block of one suite's README section."""
    rec = _record(name)
    if rec is None:
        return f"**FULL, three seeds:** pending (`python scripts/suites_full.py {name}`)."
    res = rec["result"]
    gates = [c for c in res["checks"] if c["kind"] == "gate"]
    sanity = [c for c in res["checks"] if c["kind"] == "sanity"]
    m = rec["machine"]
    out = [f"**FULL, {_seeds(res)} seeds** (seeds {rec['seed']}…, {rec['finished'][:10]}, wall {rec['wall_s']:.0f} s for all "
           f"seeds, {m['cpus']}-core box{' with AVX512-BF16' if m.get('avx512_bf16') else ''}; "
           f"`offline_suites/full-results/{name}.json`): gates {sum(c['passed'] for c in gates)} / {len(gates)} "
           f"passed on every seed, sanity checks {sum(c['passed'] for c in sanity)} / {len(sanity)}.", ""]
    failed = [c for c in gates if not c["passed"]]
    if failed:
        out.append("Gates that failed on at least one seed: " + "; ".join(
            f"`{c['name']}` (observed {_fmt(c['observed'])}, expected {_fmt(c['expected'])})" for c in failed) + ".")
        out.append("")
    if res["claims"]:
        out += ["| claim | paper | target | mean | 95% CI | per seed | verdict |", "|---|---|---|---|---|---|---|"]
        for c in res["claims"]:
            ci = "n/a" if c["ci95"] is None else f"[{_fmt(c['ci95'][0])}, {_fmt(c['ci95'][1])}]"
            per = ", ".join(_fmt(v) for v in c["per_seed"])
            why = f" ({c['reason']})" if c["verdict"] == "inconclusive" and c.get("reason") else ""
            out.append(f"| `{c['name']}` | {c['direction']} {_fmt(c['threshold'])} | {_fmt(c['target'])} | "
                       f"{_fmt(c['observed'])} | {ci} | {per} | {c['verdict']}{why} |")
    return "\n".join(out)


def table(names: list[str]) -> str:
    return summary(names) + "\n\n" + "\n\n".join(section(n) for n in names)


def write_readme(names: list[str]) -> list[str]:
    """Fill each ``<!-- full:NAME -->`` block (and ``full:summary``) in the suites README; returns the
    names whose block is missing."""
    text = README.read_text()
    missing = []
    blocks = {"summary": summary(names), **{n: section(n) for n in names}}
    for key, body in blocks.items():
        begin, end = f"<!-- full:{key} -->", f"<!-- /full:{key} -->"
        if begin not in text or end not in text:
            missing.append(key)
            continue
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + begin + "\n" + body + "\n" + end + tail
    README.write_text(text)
    return missing


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--write-readme", action="store_true")
    ap.add_argument("--force", action="store_true", help="rerun suites that already have a matching record")
    args = ap.parse_args()
    registered = _registered()
    unknown = [n for n in args.names if n not in registered]
    if unknown:
        ap.error(f"unknown suites {unknown}; registered: {sorted(registered)}")
    # read once: the queue's order and its ETA stay what they were at the start while records get written
    seed_s = {n: _seed_seconds(n) for n in registered}
    names = args.names or sorted(registered, key=lambda n: (seed_s[n], n))
    if args.table:
        print(table(names))
        return 0
    if args.write_readme:
        missing = write_readme(names)
        if missing:
            print(f"no README block for: {', '.join(missing)}", file=sys.stderr)
            return 1
        return 0
    RECORDS.mkdir(parents=True, exist_ok=True)
    todo = [n for n in names if args.force or not _done(n, registered[n])]
    skipped = [n for n in names if n not in todo]
    if skipped:
        print(f"records already match for {len(skipped)}: {', '.join(skipped)}", flush=True)
    seeds_of = {n: int(registered[n]["config"].get("run_seeds", 1)) for n in todo}
    left = sum(seed_s[n] * seeds_of[n] for n in todo)
    rc = 0
    for i, name in enumerate(todo, 1):
        est = seed_s[name] * seeds_of[name]
        if not args.force and _done(name, registered[name]):       # another runner got there first
            print(f"[{i}/{len(todo)}] {name}: a matching record appeared meanwhile, skipped", flush=True)
            left -= est
            continue
        print(f"[{i}/{len(todo)}] {name}: FULL x{seeds_of[name]} seeds, est. {est / 60:.0f} min; "
              f"queue left ~{left / 60:.0f} min", flush=True)
        try:
            rec = run_one(name, registered[name], args.seed)
        except RuntimeError as exc:
            print(f"  FAILED: {exc}", flush=True)
            rc = 1
            left -= est
            continue
        _record_path(name).write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        res = rec["result"]
        gates = [c for c in res["checks"] if c["kind"] == "gate"]
        verdicts = [c["verdict"] for c in res["claims"]]
        print(f"  done in {rec['wall_s'] / 60:.1f} min (est. {est / 60:.0f}); gates "
              f"{sum(c['passed'] for c in gates)}/{len(gates)}; claims reproduced {verdicts.count('reproduced')}, "
              f"not {verdicts.count('not reproduced')}, inconclusive {verdicts.count('inconclusive')}", flush=True)
        left -= est
        if rec["exit_code"] != 0:
            rc = 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
