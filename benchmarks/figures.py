"""The benchmark figures (PNG, matplotlib's Agg backend), drawn from the results the benchmark scripts save.

    python benchmarks/figures.py comlrl results.json docs/figures/comlrl-multiturn.png
    python benchmarks/figures.py curves curves.json docs/figures/learning-curves.png
    python benchmarks/figures.py vs_trl docs/benchmarks.md docs/figures/vs-trl.png

- `comlrl`: the JSON that `compare_comlrl.py --json-out` writes; the joint reward against the samples seen per agent,
  one line per library (the mean over seeds) with a band from the lowest to the highest seed, one panel per advantage
  mode and, with `--num-turns 2`, per turn. `compare_comlrl.py --figure PATH` calls the same function after its report.
- `curves`: the JSON that `learning_curves.py --json-out` writes; the held-out reward against the samples seen per
  agent, one panel per family, ours against CoMLRL (mean over seeds, band from the lowest to the highest seed).
- `vs_trl`: the table between the `<!-- bench:vs_trl start -->` markers of docs/benchmarks.md; the team's step time
  beside the sum of the TRL steps, one pair of bars per setup. `vs_trl.py --update-docs` calls the same function with
  its fresh rows, so the table and the figure always come from the same run.

The figures are drawn on a `matplotlib.figure.Figure` (no pyplot, so no GUI backend and no global state) at 100 dpi.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

COLORS = {"multiagent_trl": "tab:blue", "comlrl": "tab:orange", "trl": "tab:gray", "team": "tab:blue"}
DPI = 100
# The tutorial's 10 prompts (compare_comlrl.TRAIN_PROMPTS); results saved before `num_prompts` was written lack it.
DEFAULT_NUM_PROMPTS = 10
VS_TRL_MARKERS = ("<!-- bench:vs_trl start -->", "<!-- bench:vs_trl end -->")


def _figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def comlrl_panels(results: dict) -> list[tuple[str, float, dict[str, list[list[float]]]]]:
    """(title, samples per bin, {library: per-seed curves}) for each panel of a `compare_comlrl.py --json-out` file.

    Single-turn results bin the rewards by `bin_samples` samples; multi-turn results bin each turn per epoch, so a bin
    is an epoch of all turns: `num_prompts * sum(G**t)` samples per agent (both libraries expand the whole tree).

    >>> panels = comlrl_panels({"settings": {"bin_samples": 40}, "modes": {"mean": {"curves": {"comlrl": [[1.0]]}}}})
    >>> panels
    [('advantage_mode=mean', 40, {'comlrl': [[1.0]]})]
    """
    settings = results["settings"]
    panels = []
    for mode, report in results["modes"].items():
        # `--family ac` keys the comparisons by trainer (iac, maac), the MAGRPO family by advantage mode.
        label = mode.upper() if settings.get("family") == "ac" else f"advantage_mode={mode}"
        if "turn_curves" in report:
            turns = sorted({int(t) for curves in report["turn_curves"].values() for t in curves})
            g = settings["num_generations"]
            epoch = results.get("num_prompts", DEFAULT_NUM_PROMPTS) * sum(g**t for t in turns)
            for t in turns:
                curves = {lib: by_turn[str(t)] for lib, by_turn in report["turn_curves"].items()}
                panels.append((f"turn {t} ({label})", epoch, curves))
        else:
            panels.append((label, settings["bin_samples"], report["curves"]))
    return panels


def comlrl_figure(results: dict, path: str | Path) -> Path:
    """Draw the joint reward against the samples seen, per library, from `compare_comlrl.py --json-out`'s results.

    Args:
        results: the parsed JSON (`{"settings": ..., "modes": {mode: report}}`).
        path: the PNG to write (its folder is created).

    Returns:
        The path written.
    """
    panels = comlrl_panels(results)
    figure = _figure(4.2 * len(panels) + 0.4, 3.4)
    axes = figure.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    for ax, (title, size, curves) in zip(axes, panels):
        for library, runs in curves.items():
            bins = min(len(run) for run in runs)
            _mean_and_band(
                ax, [(k + 1) * size for k in range(bins)], [[run[k] for run in runs] for k in range(bins)], library
            )
        _label_panel(ax, title, "samples seen per agent")
    return _finish_seed_figure(figure, axes, results, "joint reward (x100)", "Joint reward", path)


def _mean_and_band(ax, xs: list, columns: list[list[float]], library: str) -> None:
    """One library's line: the mean over seeds at each x, with a band from the lowest to the highest seed."""
    ax.plot(xs, [statistics.fmean(c) for c in columns], marker="o", ms=3, label=library, color=COLORS[library])
    ax.fill_between(xs, [min(c) for c in columns], [max(c) for c in columns], alpha=0.2, color=COLORS[library])


def _label_panel(ax, title: str, xlabel: str) -> None:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)


def _finish_seed_figure(figure, axes, results: dict, ylabel: str, title: str, path: str | Path) -> Path:
    """The y label and legend on the first panel, a title saying which seeds the lines average, then the PNG."""
    axes[0].set_ylabel(ylabel)
    axes[0].legend(loc="lower right", fontsize=8)
    seeds = results["settings"].get("seeds", [])
    runs = f"mean of {len(seeds)} seeds (band: min to max)" if len(seeds) > 1 else f"seed {seeds[0]}" if seeds else ""
    figure.suptitle(f"{title}, {runs}", fontsize=10)
    return _save(figure, path)


def curves_figure(results: dict, path: str | Path) -> Path:
    """Draw the held-out reward against the samples seen per agent, one panel per family, ours against CoMLRL, from
    `learning_curves.py --json-out`'s results: each library's mean over seeds at each scoring point, with a band from
    the lowest to the highest seed.

    Args:
        results: the parsed JSON (`{"settings": ..., "runs": {family: {library: {seed: {"points": [[x, y], ...]}}}}}`).
        path: the PNG to write (its folder is created).

    Returns:
        The path written.
    """
    families = list(results["runs"])
    figure = _figure(3.2 * len(families) + 0.4, 3.2)
    axes = figure.subplots(1, len(families), sharey=True, squeeze=False)[0]
    for ax, family in zip(axes, families):
        for library, seeds in results["runs"][family].items():
            runs = [dict(map(tuple, run["points"])) for run in seeds.values()]
            xs = sorted(set.intersection(*(set(run) for run in runs)))
            _mean_and_band(ax, xs, [[run[x] for run in runs] for x in xs], library)
        _label_panel(ax, family.upper() if "-" not in family else family, "samples per agent")
    return _finish_seed_figure(figure, axes, results, "held-out reward (x100)", "Held-out joint reward", path)


def parse_vs_trl_table(page: str) -> list[dict]:
    """The rows of the table between docs/benchmarks.md's vs_trl markers, with the keys `vs_trl.py` uses.

    >>> page = "\\n".join([VS_TRL_MARKERS[0], "| model | agents | team's generation | TRL s/step | team s/step |",
    ...     "|---|---|---|---|---|", "| tiny | LoRA adapters | plain | 0.113 | 0.080 |", VS_TRL_MARKERS[1]])
    >>> parse_vs_trl_table(page)
    [{'size': 'tiny', 'kind': 'lora', 'path': 'plain', 'trl_step_s': 0.113, 'team_step_s': 0.08}]
    """
    block = re.search(re.escape(VS_TRL_MARKERS[0]) + r"(.*?)" + re.escape(VS_TRL_MARKERS[1]), page, re.DOTALL)
    if block is None:
        raise ValueError(f"no {VS_TRL_MARKERS[0]} ... {VS_TRL_MARKERS[1]} block in the page")
    rows = []
    for line in block.group(1).splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] == "model" or set(cells[0]) <= {"-"}:
            continue
        kind = "lora" if cells[1].lower().startswith("lora") else "separate"
        row = {"size": cells[0], "kind": kind, "path": cells[2], "trl_step_s": float(cells[3])}
        row["team_step_s"] = float(cells[4])
        ratio = re.match(r"\*\*([0-9.]+)x\*\*", cells[5]) if len(cells) > 5 else None
        if ratio:  # the ratio of the unrounded medians, as the table prints it (not of the rounded times)
            row["ratio"] = float(ratio.group(1))
        rows.append(row)
    if not rows:
        raise ValueError("the vs_trl block has no table rows")
    return rows


def vs_trl_figure(rows: list[dict], path: str | Path, num_agents: int = 2) -> Path:
    """Draw the team's step time beside the sum of the TRL steps, one pair of bars per setup.

    Args:
        rows: `vs_trl.py`'s results (or `parse_vs_trl_table`'s): `size`, `kind`, `path`, `trl_step_s`, `team_step_s`.
        path: the PNG to write (its folder is created).
        num_agents: the agents per team (one TRL trainer each).

    Returns:
        The path written.
    """
    figure = _figure(8, 0.32 * len(rows) + 1.6)
    ax = figure.subplots()
    labels = [f"{r['size']} · {'LoRA' if r['kind'] == 'lora' else 'separate'} · {r['path']}" for r in rows]
    y = list(range(len(rows)))
    height = 0.4
    trl = [r["trl_step_s"] for r in rows]
    team = [r["team_step_s"] for r in rows]
    ax.barh(
        [k - height / 2 for k in y],
        trl,
        height,
        label=f"TRL: sum of {num_agents} trainers' steps",
        color=COLORS["trl"],
    )
    ax.barh([k + height / 2 for k in y], team, height, label=f"team of {num_agents}", color=COLORS["team"])
    for k, r in enumerate(rows):
        ratio = r.get("ratio", r["team_step_s"] / r["trl_step_s"])
        ax.text(max(r["trl_step_s"], r["team_step_s"]), k, f" {ratio:.2f}x", va="center", fontsize=7)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()  # the table's order, top to bottom
    ax.set_xlabel("seconds per step (median)")
    ax.set_xlim(0, max(trl + team) * 1.12)
    ax.grid(axis="x", alpha=0.3)
    figure.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    figure.suptitle("Step time, team vs one TRL GRPOTrainer per agent (label: team / TRL)", fontsize=10)
    return _save(figure, path)


def _save(figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("figure", choices=["comlrl", "curves", "vs_trl"], help="Which figure to draw.")
    parser.add_argument(
        "source", help="comlrl, curves: compare_comlrl.py's or learning_curves.py's --json-out file; vs_trl: the page."
    )
    parser.add_argument("output", help="The PNG to write.")
    args = parser.parse_args(argv)
    text = Path(args.source).read_text()
    if args.figure == "comlrl":
        written = comlrl_figure(json.loads(text), args.output)
    elif args.figure == "curves":
        written = curves_figure(json.loads(text), args.output)
    else:
        written = vs_trl_figure(parse_vs_trl_table(text), args.output)
    print(f"wrote {written}")


if __name__ == "__main__":
    main()
