"""The package's layering: the contracts in pyproject.toml's `[tool.importlinter]` (helpers import no trainer,
native code nothing from the CoMLRL layer, no import cycles), and the CoMLRL layer loaded only when a name is used."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import multiagent_trl

ROOT = Path(__file__).resolve().parents[1]

# The CoMLRL names the package root exports, each loaded on first use.
COMLRL_NAMES = [
    "CentralizedMAGRPOConfig",
    "CentralizedMAGRPOTrainer",
    "IACConfig",
    "IACTrainer",
    "MAACConfig",
    "MAACTrainer",
    "MADPOConfig",
    "MADPOIterConfig",
    "MADPOIterTrainer",
    "MADPOTrainer",
    "MAGRPOConfig",
    "MAGRPOTrainer",
    "MAREINFORCEConfig",
    "MAREINFORCETrainer",
    "MAReMaxConfig",
    "MAReMaxTrainer",
    "MARLHFConfig",
    "MARLHFIterConfig",
    "MARLHFIterTrainer",
    "MARLHFTrainer",
    "MARLOOConfig",
    "MARLOOTrainer",
]


def run_python(code: str) -> str:
    """`code` run by a fresh interpreter from the repository root (this checkout's package); its last line of stdout
    (CoMLRL, once loaded, prints a line of its own)."""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter")
    lint_imports = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    done = subprocess.run(
        [sys.executable, "-c", lint_imports, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken\.", done.stdout), done.stdout


def test_the_comlrl_layer_loads_on_first_use_only():
    # One interpreter (each start imports torch and TRL): the package and its CLI import without the layer; the
    # subpackage, reached as an attribute as it could be when `import multiagent_trl` loaded it, loads it; the first
    # CoMLRL name imported from the package is the layer's.
    code = (
        "import sys, multiagent_trl, multiagent_trl.cli\n"
        "before = 'multiagent_trl.comlrl' in sys.modules\n"
        "name = multiagent_trl.comlrl.MAGRPOTrainer.__name__\n"
        "after = 'multiagent_trl.comlrl' in sys.modules\n"
        "from multiagent_trl import MAGRPOTrainer\n"
        "from multiagent_trl.comlrl.reinforce import MAGRPOTrainer as ported\n"
        "print(before, name, after, MAGRPOTrainer is ported)"
    )
    assert run_python(code) == "False MAGRPOTrainer True True"


@pytest.mark.parametrize("name", COMLRL_NAMES)
def test_each_comlrl_name_is_exported_and_listed(name):
    from multiagent_trl import comlrl

    assert getattr(multiagent_trl, name) is getattr(comlrl, name)
    assert name in multiagent_trl.__all__
    assert name in dir(multiagent_trl)


def test_an_unknown_name_raises_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="has no attribute 'MAGRPOTrainr'"):
        multiagent_trl.MAGRPOTrainr  # noqa: B018


def test_the_native_preference_package_has_no_comlrl_names():
    import multiagent_trl.preference as preference

    assert not hasattr(preference, "MADPOConfig")
    assert "MADPOConfig" not in preference.__all__


# Where the package reaches into another library's internals, each for a reason no public API serves. Every other
# underscore name read off an object that is not `self`/`cls` fails `test_no_module_uses_another_objects_privates`:
# the package's own objects talk through public seams (`team.protocol.TeamTrainer`).
THIRD_PARTY_INTERNALS = {
    ("team/sharding.py", "_get_fsdp_state"): "torch FSDP2 has no public accessor for a unit's parameter groups",
    ("team/sharding.py", "_fsdp_param_groups"): "the same FSDP2 state",
    ("team/sharding.py", "_fsdp_param_group"): "the same FSDP2 state (torch < 2.9 keeps one group)",
    ("team/sharding.py", "_shared_state"): "Accelerate's PartialState singleton, reset between in-process runs",
    (
        "rollout/logprob_kernel.py",
        "_backward_tile",
    ): "TRL's chunked log-prob kernel, with a faster CPU tile swapped in",
    ("rollout/logprob_kernel.py", "_forward_tile"): "the same TRL kernel",
    ("rollout/sampling.py", "_get_logits_processor"): "transformers builds top-k/top-p processors only there",
    ("rollout/sampling.py", "_uses_top_k_top_p"): "a marker on the patched transformers model",
    ("rollout/generation.py", "_compile_all_devices"): "transformers' CompileConfig has no public switch for CPU",
    ("testing.py", "_exit"): "os._exit, the standard library's documented exit without the interpreter's teardown",
}


def private_reads(package: Path) -> set[tuple[str, str]]:
    """(module path, attribute) of every `x._name` in `package` where `x` is not `self`, `cls` or `super()`."""
    import ast

    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                continue
            found.add((path.relative_to(package).as_posix(), node.attr))
    return found


def test_no_module_uses_another_objects_privates():
    found = private_reads(ROOT / "multiagent_trl")
    assert sorted(found - THIRD_PARTY_INTERNALS.keys()) == []
    assert sorted(THIRD_PARTY_INTERNALS.keys() - found) == []  # an entry no longer needed goes


def test_the_private_read_scan_finds_a_private_call(tmp_path):
    (tmp_path / "m.py").write_text("def f(trainer):\n    return trainer._play(1), self._ok, super()._fine()\n")
    assert private_reads(tmp_path) == {("m.py", "_play")}


def test_the_team_trainer_protocol_holds_for_the_team_trainer(tmp_path):
    from datasets import Dataset

    from multiagent_trl import MultiAgentGRPOConfig, MultiAgentGRPOTrainer
    from multiagent_trl.team import TeamTrainer
    from multiagent_trl.testing import tiny_model_path

    args = MultiAgentGRPOConfig(output_dir=str(tmp_path), num_agents=2, num_generations=2, report_to="none")
    trainer = MultiAgentGRPOTrainer(
        model=tiny_model_path(),
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["Tell a story:"] * 2}),
    )
    assert isinstance(trainer, TeamTrainer)
    assert trainer.first_train_row is None and "magrpo" in trainer.model_tags
