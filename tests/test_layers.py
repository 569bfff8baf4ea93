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


def test_importing_the_package_does_not_load_the_comlrl_layer():
    assert run_python("import sys, multiagent_trl; print('multiagent_trl.comlrl' in sys.modules)") == "False"
    assert run_python("import sys, multiagent_trl.cli; print('multiagent_trl.comlrl' in sys.modules)") == "False"


def test_comlrl_names_load_on_first_use():
    code = (
        "import sys, multiagent_trl\n"
        "from multiagent_trl import MAGRPOTrainer\n"
        "from multiagent_trl.comlrl.reinforce import MAGRPOTrainer as ported\n"
        "print(MAGRPOTrainer is ported, 'multiagent_trl.comlrl' in sys.modules)"
    )
    assert run_python(code) == "True True"


def test_the_comlrl_subpackage_is_an_attribute_as_before():
    # `import multiagent_trl` used to load `comlrl/`, so code could reach it as an attribute: it still can.
    assert run_python("import multiagent_trl; print(multiagent_trl.comlrl.MAGRPOTrainer.__name__)") == "MAGRPOTrainer"


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
