"""The GPU machine's scripts, checked here on the CPU: the wheelhouse's requirements and what it leaves out
(benchmarks/wheelhouse.py, on hand-made resolutions, no network), and the device steps' time limits
(benchmarks/device_steps.sh, in real subprocesses: a package whose import hangs, a budget that runs out)."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SCRIPT = ROOT / "benchmarks" / "wheelhouse.py"
spec = importlib.util.spec_from_file_location("benchmark_wheelhouse", SCRIPT)
wheelhouse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelhouse)

needs_bash = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="bash")


def test_wheelhouse_resolves_pyprojects_requirements():
    """--list: pyproject.toml's dependencies and the bench extra's CoMLRL pin, read from the file itself."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (comlrl,) = [item for item in project["optional-dependencies"]["bench"] if item.startswith("comlrl")]
    listed = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert listed == ["torch (left out: the target's own)", *project["dependencies"], comlrl]
    torch = next(item for item in project["dependencies"] if item.startswith("torch"))
    assert wheelhouse.torch_floor() == re.search(r">=([0-9.]+)", torch).group(1)  # the stand-in's version


def test_platforms_cover_every_manylinux_tag_up_to_the_glibc():
    tags = wheelhouse.platforms("x86_64", "2.28")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert "manylinux_2_29_x86_64" not in tags
    assert tags[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]


def package(name, version, *requires):
    return {"metadata": {"name": name, "version": version, "requires_dist": list(requires)}}


# A resolution as `pip install --dry-run --report` writes it, by hand: the project needs lib (>=2) and torch; lib
# needs arrow and numpy; arrow needs numpy and, only on Windows, winlib; lib's "fast" extra needs speedup.
REPORT = {
    "install": [
        package("multiagent_trl", "0.1.0", "torch>=2.11", "lib>=2", "tool[cli]"),
        package("torch", "2.11.0+stub"),
        package("lib", "2.5", "arrow>=24", "numpy>=1.17", "speedup; extra == 'fast'"),
        package("arrow", "26.0", "numpy>=1.26", "winlib; sys_platform == 'win32'"),
        package("numpy", "2.4.6"),
        package("tool", "1.0", "click; extra == 'cli'"),
        package("click", "8.0"),
    ]
}
ENVIRONMENT = wheelhouse.target_environment("3.12", "x86_64")
TOP = ["multiagent_trl==0.1.0"]


@pytest.mark.parametrize(
    "have, kept, left_out",
    [
        # nothing known of the target: all but torch, extras followed (tool[cli] -> click)
        ({}, {"multiagent-trl", "lib", "arrow", "numpy", "tool", "click"}, {"torch"}),
        # a target whose numpy meets every requirement on it (>=1.17, >=1.26)
        ({"numpy": "2.5.2"}, {"multiagent-trl", "lib", "arrow", "tool", "click"}, {"torch", "numpy"}),
        # too old for arrow's >=1.26: carried
        ({"numpy": "1.20.0"}, {"multiagent-trl", "lib", "arrow", "numpy", "tool", "click"}, {"torch"}),
        # the target's arrow (any version: a bare name) is kept; numpy, only arrow's need then, still lib's
        ({"arrow": None}, {"multiagent-trl", "lib", "numpy", "tool", "click"}, {"torch", "arrow"}),
        # the target's lib meets >=2: neither it nor what only it needs is carried
        ({"lib": "2.1"}, {"multiagent-trl", "tool", "click"}, {"torch", "lib"}),
    ],
)
def test_kept_packages_leave_out_what_the_target_has(have, kept, left_out):
    from packaging.version import Version

    have = {name: None if version is None else Version(version) for name, version in have.items()}
    kept_now, left_out_now = wheelhouse.kept_packages(REPORT, TOP, have, ENVIRONMENT)
    assert set(kept_now) == kept
    assert set(left_out_now) == left_out
    assert "winlib" not in kept_now and "speedup" not in kept_now  # markers of another platform, an extra not asked


def test_read_have_takes_freeze_lines_and_bare_names(tmp_path):
    path = tmp_path / "have.txt"
    path.write_text("# the image\nNumPy==2.5.2\npyarrow  # version not read\n-e git+https://x/y#egg=z\n")
    have = wheelhouse.read_have(str(path))
    assert {name: None if v is None else str(v) for name, v in have.items()} == {"numpy": "2.5.2", "pyarrow": None}


def run_steps(tmp_path, script: str, **env):
    """`script` in bash after sourcing device_steps.sh, results in tmp_path/results."""
    results = tmp_path / "results"
    environment = {k: v for k, v in os.environ.items() if k != "OUT"}
    environment.update(RESULTS_DIR=str(results), PYTHON=sys.executable, **env)
    command = f". benchmarks/device_steps.sh; {script}"
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, env=environment, capture_output=True, text=True)
    return done, results


@needs_bash
def test_an_import_that_hangs_is_stopped_and_named(tmp_path):
    """The import probes: each package alone, a hang stopped at IMPORT_LIMIT with its stack, the rest not tried."""
    packages = tmp_path / "packages"
    (packages / "hangs").mkdir(parents=True)
    (packages / "hangs" / "__init__.py").write_text("import time\n\ntime.sleep(600)  # a hang on import\n")
    (packages / "fine").mkdir()
    (packages / "fine" / "__init__.py").write_text("__version__ = '1.0'\n")
    done, results = run_steps(
        tmp_path, "import_steps fine hangs json; echo rc=$?", IMPORT_LIMIT="4", PYTHONPATH=str(packages)
    )
    assert done.stdout.strip() == "rc=124"
    steps = (results / "steps.txt").read_text()
    assert re.search(r"import fine\s+ok", steps)
    assert re.search(r"import hangs\s+TIMED OUT after 4 s", steps)
    assert "import json" not in steps  # not tried after the hang
    imports = (results / "imports.txt").read_text()
    assert "fine 1.0" in imports
    assert 'hangs/__init__.py", line 3' in imports  # Python's stack at the hang (SIGABRT, faulthandler)
    assert "hangs hung on import" in imports


@needs_bash
def test_the_budget_caps_and_skips_steps(tmp_path):
    """A step gets at most what is left of the budget, and none once under MIN_STEP seconds are left."""
    deadline = int(time.time()) + 6  # room for bash to start on a loaded machine
    script = 'step long 600 long.txt sleep 600; echo "rc=$?"; sleep 2; step next 600 next.txt true; echo "rc=$?"'
    done, results = run_steps(tmp_path, script, DEADLINE=str(deadline), MIN_STEP="1")
    assert done.stdout.split() == ["rc=124", "rc=125"]
    steps = (results / "steps.txt").read_text()
    assert re.search(r"long\s+TIMED OUT after [1-6] s", steps)  # capped from 600 s to the budget's few seconds
    assert re.search(r"next\s+skipped: -?\d+ s of the budget left", steps)
    assert not (results / "next.txt").exists()


@needs_bash
def test_install_without_a_wheelhouse_tries_no_network(tmp_path):
    done, results = run_steps(tmp_path, "install_step; echo rc=$?", WHEELHOUSE=str(tmp_path / "none"))
    assert done.stdout.strip() == "rc=125"
    assert "No wheelhouse at" in (results / "install.txt").read_text()
    assert re.search(r"install\s+skipped: no wheelhouse", (results / "steps.txt").read_text())


@needs_bash
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_vllm_script_exits_cleanly_without_vllm(tmp_path):
    results = tmp_path / "results"
    environment = {k: v for k, v in os.environ.items() if k != "OUT"}
    environment.update(RESULTS_DIR=str(results), PYTHON=sys.executable, WHEELHOUSE=str(tmp_path / "none"))
    done = subprocess.run(
        ["bash", "benchmarks/device_vllm.sh"], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert done.returncode == 0
    assert "vLLM is not installed" in (results / "vllm.txt").read_text()
    assert re.search(r"vllm\s+skipped: vLLM is not installed", (results / "steps.txt").read_text())
    assert not (results / "install.txt").exists()  # nothing was installed, from anywhere


def test_a_target_package_whose_own_needs_clash_is_carried():
    """The target's tokenizers 0.23.2 meets transformers' requirement on it but wants huggingface_hub < 2, and the
    wheelhouse carries hub 2.4 for transformers: so tokenizers is carried too (at the resolved 0.23.3)."""
    from packaging.version import Version

    report = {
        "install": [
            package("multiagent_trl", "0.1.0", "transformers>=5.24"),
            package("transformers", "5.25.0", "huggingface-hub>=2.4,<3", "tokenizers>=0.23.1,<0.24"),
            package("huggingface-hub", "2.4.0"),
            package("tokenizers", "0.23.3", "huggingface-hub>=0.16.4,<3"),
        ]
    }
    own = {("tokenizers", "0.23.2"): ["huggingface-hub<2.0,>=0.16.4"], ("huggingface-hub", "1.33.0"): []}
    have = {"tokenizers": Version("0.23.2"), "huggingface-hub": Version("1.33.0")}
    kept, left_out = wheelhouse.keep_consistent(
        report, TOP, have, ENVIRONMENT, lambda name, version: own.get((name, str(version)))
    )
    assert kept == {
        "multiagent-trl": "0.1.0",
        "transformers": "5.25.0",
        "huggingface-hub": "2.4.0",
        "tokenizers": "0.23.3",
    }
    assert left_out == {}
    # without the clash (the target's tokenizers accepts hub < 3), it stays left out
    own[("tokenizers", "0.23.2")] = ["huggingface-hub<3,>=0.16.4"]
    kept, left_out = wheelhouse.keep_consistent(
        report, TOP, have, ENVIRONMENT, lambda name, version: own.get((name, str(version)))
    )
    assert "tokenizers" not in kept and left_out == {"tokenizers": "the target has 0.23.2"}
