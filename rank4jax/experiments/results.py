"""Every reported figure from a record: one JSON record per run in ``results/runs/`` (family, width,
seed, rate, commit, machine, config digest, best and stopped steps, test LS(T), context gain, Story
Cloze accuracies and, where the run is kept, its per-story outcomes), the McNemar p of pairs whose
outcomes were not kept in ``results/pairs.json``, and the results tables of README.md,
docs/scaling.md and results/README.md rendered from them, between ``<!-- table: NAME -->`` and ``<!-- /table -->``.

    python -m rank4jax.experiments.results record released/d64/rank4 --name=d64-rank4-released --commit=2d3bf6c \
        --width=64
    python -m rank4jax.experiments.results render          # rewrite the tables from the records
    python -m rank4jax.experiments.results render --check  # exit 1 if a table differs from its records
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import platform
import re
import statistics
import sys

from rank4jax import files
from rank4jax.evaluation.significance import mcnemar_exact
from rank4jax.experiments.compare import CLOZE_RULES

RULES = ("mean_ce", "pmi", "ending_only")
ACCURACY_KEYS = {rule: key for key, (rule, _) in CLOZE_RULES.items()}  # rule → the report's accuracy key
PAGES = ("README.md", "docs/scaling.md", "results/README.md")
MARKER = re.compile(r"(<!-- table: (\w+) -->\n)(.*?)(<!-- /table -->)", re.S)


def record_of_release(folder: str, name: str, commit: str, width: int, machine: str | None = None) -> dict:
    """The record of a released run (``rank4jax.runs.release_run``) of the ladder's rung ``width`` (the
    rank-4 model's D) from its own files: its summary, config and evaluation reports (the test split's
    and one over every story of a Story Cloze file); ``machine``: the one it trained on (default: this one)."""
    summary = _json(os.path.join(folder, "train_summary.json"))
    config = _json(os.path.join(folder, "config.json"))
    step = summary["best_step"]
    test = _json(os.path.join(folder, "eval", f"test_step{step}.json"))
    (cloze_path,) = glob.glob(os.path.join(folder, "eval", f"*.all_step{step}.json"))
    cloze = _json(cloze_path)
    model = config["model"]
    with open(os.path.join(folder, "config.json"), "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    token = model.get("token_code", "outer")
    family = {"rank4": "flat" if token == "flat" else "rank4"}.get(config["model_family"], config["model_family"])
    fiber = (
        f"{model['dx']} × {model['dt']}" if config["model_family"] == "rank4" else f"width {model['dx'] * model['dt']}"
    )
    return {
        "name": name, "family": family, "width": width, "fiber": fiber, "params": summary["parameters"],
        "seed": config["seed"], "learning_rate": config["optim"]["learning_rate"],
        "patience": config["early_stop_patience"], "commit": commit, "machine": machine or _machine(),
        "config_digest": digest, "best_step": step, "stopped_step": summary["step"], "ls": test["last_slice_ce"],
        "context_gain": test["context_gain"],
        "cloze_accuracy": {rule: cloze[ACCURACY_KEYS[rule]] for rule in RULES},
        "cloze_outcomes": {rule: _outcomes(cloze["cloze_correct"][rule]) for rule in RULES},
        "teacher_forced": False, "source": os.path.relpath(folder),
    }  # fmt: skip


def _outcomes(values) -> str:
    """Per-story outcomes as a string: 1 right, 0 wrong, h a tie (half right)."""
    return "".join({1: "1", 0: "0", 0.5: "h"}[value] for value in values)


def _machine() -> str:
    name = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                platform.processor())  # fmt: skip
    return f"{name}, {os.cpu_count()} cores"


def _json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def load(root: str = ".") -> tuple[dict, list]:
    """(name → record, the pairs) of ``root``'s results/."""
    records = {}
    for path in sorted(glob.glob(os.path.join(root, "results", "runs", "*.json"))):
        record = _json(path)
        records[record["name"]] = record
    return records, _json(os.path.join(root, "results", "pairs.json"))


def mcnemar_p(a: dict, b: dict, pairs: list, rule: str) -> float | None:
    """McNemar's exact p of two runs' outcomes by ``rule``: from their kept outcomes, else the pair's
    recorded p, else None."""
    if a.get("cloze_outcomes") and b.get("cloze_outcomes"):
        decode = {"1": 1.0, "0": 0.0, "h": 0.5}
        first, second = ([decode[c] for c in r["cloze_outcomes"][rule]] for r in (a, b))
        return mcnemar_exact(first, second)["p_value"]
    for pair in pairs:
        if {pair["a"], pair["b"]} == {a["name"], b["name"]}:
            return pair["p"].get(rule)
    return None


# the cells -----------------------------------------------------------------------------------------


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def _p(value) -> str:
    return "—" if value is None else f"{value:.2g}"


def _steps(record) -> str:
    return f"{record['best_step']:,} / {record['stopped_step']:,}"


def _cloze(record) -> str:
    acc = record.get("cloze_accuracy") or {}
    return " / ".join(_pct(acc.get(rule)) for rule in RULES) + " %"


def _pair_cloze(a: dict, b: dict, pairs: list, rule: str) -> str:
    """``a / b %`` of one rule, with McNemar's p."""
    acc = [(r.get("cloze_accuracy") or {}).get(rule) for r in (a, b)]
    return f"{_pct(acc[0])} / {_pct(acc[1])} % ({_p(mcnemar_p(a, b, pairs, rule))})"


def _mean_sd(values) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


# the tables ----------------------------------------------------------------------------------------

LADDER = (("d64-rank4-released", "d64-baseline-released"), ("d128-rank4-327783e", "d128-baseline-327783e"),
          ("d256-rank4-327783e", "d256-baseline-327783e"))  # fmt: skip
SEEDS = (("d64-rank4-released", "d64-baseline-released"), ("d64-rank4-seed1-74bc0e1", "d64-baseline-seed1-74bc0e1"),
         ("d64-rank4-seed2-74bc0e1", "d64-baseline-seed2-74bc0e1"))  # fmt: skip
ABLATIONS = ("d64-rank4-released", "d64-fibre16x4-74bc0e1", "d64-fibre24x2-74bc0e1", "d64-fibre32x2-74bc0e1",
             "d64-flat8x4-seed0-ba09406", "d64-flat8x8-seed0-ba09406", "d64-baseline-released")  # fmt: skip
FLAT_SEEDS = (("d64-flat8x8-seed0-ba09406", "d64-flat8x4-seed0-ba09406"),
              ("d64-flat8x8-seed1-9be639e", "d64-flat8x4-seed1-9be639e"),
              ("d64-flat8x8-seed2-9be639e", "d64-flat8x4-seed2-9be639e"))  # fmt: skip
GRID = ((64, "d64-flat-released", "d64-flat_matched-9be639e"), (128, "d128-flat-9be639e", "d128-flat_matched-9be639e"),
        (256, "d256-flat-9be639e", "d256-flat_matched-9be639e"))  # fmt: skip
EXTRAS = ("d64-rank4_last-p4-327783e", "d256-rank4-lr1e-3-p4-327783e", "d256-baseline-lr1e-3-p4-327783e",
          "d64-baseline_lm-p4-327783e", "d128-baseline_lm-p4-327783e", "d256-baseline_lm-p4-327783e")  # fmt: skip


def ladder_table(records: dict, pairs: list) -> str:
    lines = ["| D | parameters rank-4 / baseline | LS(T) rank-4 | LS(T) baseline | Δ | context gain rank-4 / baseline "
             "| Story Cloze mean CE (p) | PMI (p) | ending only (p) |", "|---" * 9 + "|"]  # fmt: skip
    for rank4, baseline in LADDER:
        a, b = records[rank4], records[baseline]
        lines.append(
            f"| {int(rank4[1:].split('-')[0])} | {a['params']:,} / {b['params']:,} | {a['ls']:.4f} | {b['ls']:.4f} | "
            f"{b['ls'] - a['ls']:+.3f} | {a['context_gain']:.3f} / {b['context_gain']:.3f} | "
            + " | ".join(_pair_cloze(a, b, pairs, rule) for rule in RULES)
            + " |"
        )
    return "\n".join(lines)


def seeds_table(records: dict, pairs: list) -> str:
    lines = ["| seed | best step rank-4 / baseline | LS(T) rank-4 | LS(T) baseline | Δ | Story Cloze mean CE (p) "
             "| PMI (p) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for rank4, baseline in SEEDS:
        a, b = records[rank4], records[baseline]
        lines.append(
            f"| {a['seed']} | {a['best_step']:,} / {b['best_step']:,} | {a['ls']:.4f} | {b['ls']:.4f} | "
            f"{b['ls'] - a['ls']:+.3f} | " + " | ".join(_pair_cloze(a, b, pairs, r) for r in RULES[:2]) + " |"
        )
    ranks, bases = ([records[pair[i]]["ls"] for pair in SEEDS] for i in (0, 1))
    deltas = [b - a for a, b in zip(ranks, bases, strict=True)]
    lines.append(f"| mean ± sd | | {_mean_sd(ranks)} | {_mean_sd(bases)} | {statistics.mean(deltas):+.3f} ± "
                 f"{statistics.stdev(deltas):.3f} | | |")  # fmt: skip
    return "\n".join(lines)


def ablations_table(records: dict, pairs: list) -> str:
    lines = ["| run | token, fiber | parameters | best / stopped | LS(T) | context gain | Story Cloze mean CE / PMI / "
             "ending only |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    token = {"rank4": "Esem ⊗ Etmp", "flat": "free vector", "flat_matched": "free vector", "baseline": "1-D"}
    for name in ABLATIONS:
        r = records[name]
        lines.append(f"| {name} | {token[r['family']]}, {r['fiber']} | {r['params']:,} | {_steps(r)} | {r['ls']:.4f} | "
                     f"{r['context_gain']:.3f} | {_cloze(r)} |")  # fmt: skip
    flat, matched = ([records[pair[i]]["ls"] for pair in FLAT_SEEDS] for i in (0, 1))
    rank4 = [records[pair[0]]["ls"] for pair in SEEDS]
    base = [records[pair[1]]["ls"] for pair in SEEDS]

    def lead(others, grid):
        gaps = [o - g for o, g in zip(others, grid, strict=True)]
        return f"{statistics.mean(gaps):+.3f} ± {statistics.stdev(gaps):.3f}"

    lines += ["", "| three seeds (3e-3) | LS(T) | rank-4 − it | baseline − it |", "|---|---|---|---|",
              f"| flat grid 8 × 8 | {_mean_sd(flat)} | {lead(rank4, flat)} | {lead(base, flat)} |",
              f"| flat grid 8 × 4 (matched) | {_mean_sd(matched)} | {lead(rank4, matched)} | "
              f"{lead(base, matched)} |"]  # fmt: skip
    return "\n".join(lines)


def grid_table(records: dict, pairs: list) -> str:
    lines = ["| D | grid | fiber | parameters | rate | best / stopped | LS(T) | rank-4 − it | baseline − it | "
             "context gain | Story Cloze |", "|---" * 11 + "|"]  # fmt: skip
    for width, *grids in GRID:
        rank4, baseline = (records[n] for n in LADDER[(64, 128, 256).index(width)])
        for name in grids:
            r = records[name]
            lines.append(
                f"| {width} | {r['family']} | {r['fiber']} | {r['params']:,} | {r['learning_rate']:g} | {_steps(r)} | "
                f"{r['ls']:.4f} | {rank4['ls'] - r['ls']:+.3f} | {baseline['ls'] - r['ls']:+.3f} | "
                f"{r['context_gain']:.3f} | {_cloze(r)} |"
            )
    return "\n".join(lines)


def axial_table(records: dict, pairs: list) -> str:
    lines = ["| D = 64 | parameters | best / stopped | LS(T) | context gain | Story Cloze mean CE / PMI / "
             "ending only |", "|---|---|---|---|---|---|"]  # fmt: skip
    for name, label in (("d64-rank4-released", "joint (the rank-4 model)"), ("d64-axial-9be639e", "axial")):
        r = records[name]
        lines.append(f"| {label} | {r['params']:,} | {_steps(r)} | {r['ls']:.4f} | {r['context_gain']:.3f} | "
                     f"{_cloze(r)} |")  # fmt: skip
    return "\n".join(lines)


def extras_table(records: dict, pairs: list) -> str:
    lines = ["| run (patience 4) | rate | best / stopped | LS(T) | context gain | Story Cloze mean CE / PMI |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for name in EXTRAS:
        r = records[name]
        acc = r["cloze_accuracy"]
        forced = " (tf)" if r["teacher_forced"] else ""
        lines.append(f"| {name} | {r['learning_rate']:g} | {_steps(r)} | {r['ls']:.4f}{forced} | "
                     f"{r['context_gain']:.3f} | {_pct(acc['mean_ce'])} / {_pct(acc['pmi'])} % |")  # fmt: skip
    return "\n".join(lines)


def records_table(records: dict, pairs: list) -> str:
    """Where each record comes from: its commit, machine and source."""
    lines = ["| record | commit | machine | source |", "|---|---|---|---|"]
    for name, r in sorted(records.items()):
        lines.append(f"| {name} | {r['commit']} | {r['machine']} | {r['source']} |")
    return "\n".join(lines)


TABLES = {"ladder": ladder_table, "seeds": seeds_table, "ablations": ablations_table, "grid": grid_table,
          "axial": axial_table, "extras": extras_table, "records": records_table}  # fmt: skip


def render(root: str = ".", check: bool = False) -> list[str]:
    """Rewrite each page's tables from the records (``check``: only compare); the pages that differ."""
    records, pairs = load(root)
    differ = []
    for page in PAGES:
        path = os.path.join(root, page)
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = MARKER.sub(lambda m: m.group(1) + TABLES[m.group(2)](records, pairs) + "\n" + m.group(4), text)
        if new != text:
            differ.append(page)
            if not check:
                files.write_text(root, page, new)
    return differ


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="write the record of a released run")
    rec.add_argument("folder")
    rec.add_argument("--name", required=True)
    rec.add_argument("--commit", required=True)
    rec.add_argument("--width", type=int, required=True, help="the rung's D = dx·dt of the rank-4 model")
    rec.add_argument("--machine", help="the machine it trained on (default: this one)")
    ren = sub.add_parser("render", help="rewrite (or --check) the tables of every page in PAGES")
    ren.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if args.command == "record":
        record = record_of_release(args.folder, args.name, args.commit, args.width, args.machine)
        print(files.write_json(".", os.path.join("results", "runs", f"{args.name}.json"), record))
        return
    differ = render(".", check=args.check)
    print(("differ from their records: " if args.check else "rewrote: ") + (", ".join(differ) or "none"))
    sys.exit(1 if args.check and differ else 0)


if __name__ == "__main__":
    main()
