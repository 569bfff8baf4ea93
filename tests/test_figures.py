"""benchmarks/figures.py draws the benchmark figures from hand-made results: PNG files of the expected size, readable
back, from both its functions and its command line."""

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="matplotlib draws the benchmark figures: pip install -e '.[bench]'")
import matplotlib.image  # noqa: E402

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "figures.py"
spec = importlib.util.spec_from_file_location("benchmark_figures", SCRIPT)
figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(figures)

SETTINGS = {"seeds": [0, 1], "num_generations": 2, "bin_samples": 4}
ONE_TURN = {"settings": SETTINGS, "modes": {"mean": {"curves": {"multiagent_trl": [[10, 20, 30], [12, 18, 40]]}}}}
ONE_TURN["modes"]["mean"]["curves"]["comlrl"] = [[11, 15, 20], [9, 16, 22]]
TWO_TURNS = {
    "settings": SETTINGS,
    "num_prompts": 3,
    "modes": {
        "mean": {
            "turn_curves": {
                "multiagent_trl": {"1": [[10, 20], [12, 22]], "2": [[11, 21], [13, 23]]},
                "comlrl": {"1": [[10, 12], [11, 13]], "2": [[10, 11], [12, 12]]},
            }
        }
    },
}
TABLE = """
<!-- bench:vs_trl start -->
Some words about the run.

| model | agents | team's generation | TRL s/step (2 trainers) | team s/step | time ratio (target) |
|---|---|---|---|---|---|
| tiny | separate models | plain | 0.096 | 0.081 | **0.84x** (<= 1.10x: met) |
| tiny | LoRA adapters | plain | 0.113 | 0.080 | **0.71x** (<= 0.75x: met) |
| bench-4m | LoRA adapters | compiled | 0.367 | 0.275 | **0.75x** (<= 0.75x: met) |
<!-- bench:vs_trl end -->
"""


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) in pixels, read back from the PNG."""
    height, width = matplotlib.image.imread(path).shape[:2]
    return width, height


@pytest.mark.parametrize(
    "results, panels",
    [
        (ONE_TURN, ["advantage_mode=mean"]),
        (TWO_TURNS, ["turn 1 (advantage_mode=mean)", "turn 2 (advantage_mode=mean)"]),
    ],
    ids=["one-turn", "two-turns"],
)
def test_comlrl_figure_has_a_panel_per_turn_and_the_expected_size(tmp_path, results, panels):
    assert [title for title, _, _ in figures.comlrl_panels(results)] == panels
    path = figures.comlrl_figure(results, tmp_path / "figures" / "comlrl.png")
    assert path.exists() and path.stat().st_size < 200_000
    # 4.2 inches per panel and 0.4 more, 3.4 high, at 100 dpi
    assert image_size(path) == (round(100 * (4.2 * len(panels) + 0.4)), 340)


def test_two_turn_samples_per_bin_are_an_epoch_of_the_whole_tree():
    # 3 prompts, G = 2: 3 * (2 + 4) = 18 samples per agent and epoch
    assert {size for _, size, _ in figures.comlrl_panels(TWO_TURNS)} == {18}


def test_vs_trl_figure_from_the_docs_table(tmp_path):
    rows = figures.parse_vs_trl_table(TABLE)
    assert [(r["size"], r["kind"], r["path"], r["ratio"]) for r in rows] == [
        ("tiny", "separate", "plain", 0.84),
        ("tiny", "lora", "plain", 0.71),
        ("bench-4m", "lora", "compiled", 0.75),
    ]
    path = figures.vs_trl_figure(rows, tmp_path / "vs-trl.png")
    assert image_size(path) == (800, round(100 * (0.32 * 3 + 1.6)))


def test_vs_trl_table_without_markers_is_an_error():
    with pytest.raises(ValueError, match="bench:vs_trl start"):
        figures.parse_vs_trl_table("| model | agents |")


def test_command_line_redraws_from_saved_files(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(TWO_TURNS))
    (tmp_path / "benchmarks.md").write_text(TABLE)
    figures.main(["comlrl", str(tmp_path / "results.json"), str(tmp_path / "a.png")])
    figures.main(["vs_trl", str(tmp_path / "benchmarks.md"), str(tmp_path / "b.png")])
    assert image_size(tmp_path / "a.png")[0] == 880 and image_size(tmp_path / "b.png")[0] == 800
