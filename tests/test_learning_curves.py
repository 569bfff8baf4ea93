"""benchmarks/learning_curves.py, the learning-curve harness, as a smoke test: `--quick` for MAGRPO in
multiagent_trl only (one pass of the 10 prompts, scored every 40 samples), then its table, docs block and figure
read back. No times are asserted."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benchmarks" / "learning_curves.py"


@pytest.fixture(scope="module")
def curves():
    sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("benchmark_learning_curves", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through the module
    spec.loader.exec_module(module)
    return module


def test_quick_magrpo_run_scores_held_out_prompts_at_fixed_intervals(curves, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib draws the figure: pip install -e '.[bench]'")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    page = tmp_path / "benchmarks.md"
    page.write_text(f"before\n{curves.DOCS_MARKERS[0]}\nold\n{curves.DOCS_MARKERS[1]}\nafter\n")
    out = tmp_path / "curves.json"
    results = curves.main(
        ["--quick", "--families", "magrpo", "--libraries", "multiagent_trl", "--json-out", str(out),
         "--figure", str(tmp_path / "curves.png"), "--update-docs", str(page), "--command", "learning_curves --quick"]
    )  # fmt: skip
    run = results["runs"]["magrpo"]["multiagent_trl"]["0"]
    # 10 prompts x G=8: 80 samples per agent; scored before training, at 40, and after train()
    assert run["samples"] == 80
    assert [x for x, _ in run["points"]] == [0, 40, 80]
    assert all(0.0 <= y <= 100.0 for _, y in run["points"])
    assert json.loads(out.read_text())["runs"]["magrpo"]["multiagent_trl"]["0"]["points"] == [
        list(p) for p in run["points"]
    ]
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith(f"{curves.DOCS_MARKERS[1]}\nafter\n") and "old" not in text
    assert "HF_HUB_OFFLINE=1 learning_curves --quick" in text
    assert f"| magrpo | 0 | {run['points'][-1][1]:.1f} | {max(y for _, y in run['points']):.1f} | - | - |" in text
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_unknown_family_is_refused_with_the_choices(curves):
    with pytest.raises(ValueError, match="--families \\['ppo'\\]: unknown; choose from magrpo"):
        curves.CurveSettings(families=["ppo"])


def test_unknown_library_is_refused_with_the_choices(curves):
    # An unknown name used to select no run at all: the harness printed an empty table and exited 0.
    with pytest.raises(ValueError, match="--libraries \\['ours'\\]: unknown; choose from multiagent_trl, comlrl"):
        curves.CurveSettings(libraries=["ours"])


def test_merging_runs_keeps_every_seed_of_a_family(curves):
    """Runs of one family made by separate commands (seeds 0 and 1, then seed 2) merge cell by cell."""

    def part(seeds, final):
        cells = {str(seed): {"points": [[0, 37.8], [800, final]]} for seed in seeds}
        runs = {"iac": {"comlrl": dict(cells), "multiagent_trl": dict(cells)}}
        return {"settings": {"budget": 800, "seeds": seeds}, "runs": runs}

    results = curves.merged([part([0, 1], 50.0), part([2], 60.0), part([1], 70.0)])
    assert results["settings"]["seeds"] == [0, 1, 2]  # the figure's title counts them
    runs = results["runs"]["iac"]
    assert sorted(runs["comlrl"]) == sorted(runs["multiagent_trl"]) == ["0", "1", "2"]
    assert [runs["comlrl"][seed]["points"][-1][1] for seed in ("0", "1", "2")] == [50.0, 70.0, 60.0]
