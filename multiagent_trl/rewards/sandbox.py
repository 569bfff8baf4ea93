"""Run untrusted Python programs against their tests, isolated and in parallel.

Model-written code is hostile until proven otherwise: one completion may loop forever, fork without end, allocate
20 GB, kill its parent, write to `~/.ssh`, read a token from the environment or open a socket. `Sandbox` runs each
program in a fresh interpreter, in its own process tree, with limits, and turns whatever happens into an
`ExecutionResult` (never an exception in the trainer):

```python
from multiagent_trl.rewards.sandbox import Sandbox

sandbox = Sandbox(timeout=2.0, memory_mb=512)  # raises SandboxUnavailableError where bubblewrap cannot run
result = sandbox.run("def add(a, b):\\n    return a + b", "assert add(1, 2) == 3\\nassert add(2, 2) == 5")
result.status, result.tests_passed, result.tests_total  # ('failed', 1, 2)
results = sandbox.run_many([(program, tests), ...])  # a pool of `workers` jobs at a time
```

Tests come in two forms, both Python source:

- `assert` statements at the top level (each one is a test), with any setup around them;
- HumanEval's form: a `check(candidate)` function (each top-level statement of its body that contains an `assert`
  is a test; the other statements are its setup), called with the job's `entry_point` function, or with the
  function named in a trailing `check(name)` line.

A test passes when it runs without raising. The program is executed as a module named `solution` (so an
`if __name__ == "__main__":` block does not run), then the tests, in the same namespace.

Isolation modes (`isolation=`), and what each guarantees:

| guarantee                                                          | "bwrap" (default) | "namespaces" | "none"  |
|--------------------------------------------------------------------|-------------------|--------------|---------|
| timeout (wall clock, CPU) kills the job and every process it made  | yes               | yes          | (1)     |
| memory (address space), process-count, file-size, open-file limits | yes               | yes          | yes (2) |
| environment without the parent's variables                         | yes               | yes          | yes     |
| fresh working directory, removed afterwards                        | yes (tmpfs)       | yes          | yes     |
| output kept to a bound                                             | yes               | yes          | yes     |
| no network (the job's own loopback at most)                        | yes               | yes          | no      |
| cannot see or signal the host's processes                          | yes               | yes          | no      |
| sees no host files but read-only system paths and the interpreter  | yes               | no           | no      |
| not root on the host (a root parent drops the job to uid 65534)    | yes               | yes          | yes     |

(1) its process group only: a child that calls `setsid` escapes the kill. (2) the process count is per user, counted
when the job starts, so jobs running at once share it.

- `"bwrap"` runs every job in [bubblewrap](https://github.com/containers/bubblewrap) (`apt-get install bubblewrap`)
  with new user, PID, network, IPC, UTS and mount namespaces: the job sees `/usr` (and the `/bin`, `/lib*` links),
  the Python interpreter's install folder, read-only, a private `/proc`, a minimal `/dev` and a size-limited tmpfs
  as its working directory; nothing else of the host's files.
- `"namespaces"` uses util-linux `unshare` (user, PID, network, IPC, UTS, mount namespaces; no filesystem view of
  its own): the job reads what uid 65534 (or your uid, when not root) may read and writes where it may write.
- `"none"`: resource limits, a process group, a clean environment and a temporary directory only.

`Sandbox()` refuses to start (`SandboxUnavailableError`, with the fix) where the chosen mode does not work; the weaker
modes run only when named. In every mode the program's tests are scored inside the job's own interpreter, so the
sandbox protects the host, not the score: a program written to fool its tests (or the runner in its process) can.
"""

from __future__ import annotations

import ast
import functools
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

STATUSES = ("passed", "failed", "syntax_error", "error", "timeout", "memory", "killed")
ISOLATION_MODES = ("bwrap", "namespaces", "none")
NOBODY = 65534  # the unprivileged uid and gid a root parent drops to
_TRUNCATED = "\n[... truncated]"

# Runs inside the job's interpreter (`python -s -S -c LAUNCHER <result fd> <mode>`): reads the job on stdin, sets the
# limits (after the namespaces exist, so that the process count is the job's own), runs the program and the test
# steps, and writes one report to the result fd. Only built-in modules at start (the interpreter's start-up is most of
# a job's cost); the parent splits the tests, and fields travel NUL-separated (Python source cannot hold a NUL).
LAUNCHER = r"""
import os, resource, sys
fd, mode = int(sys.argv[1]), sys.argv[2]
sys.path[:] = [path for path in sys.path if path]  # not the working directory: the program cannot shadow modules
fields = sys.stdin.buffer.read().decode().split("\0")
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
entry, limits, program, steps = fields[0] or None, [int(x) for x in fields[1].split(",")], fields[2], fields[3:]
cpu, memory, processes, file_bytes, message_chars = limits
if mode == "none":  # no user namespace: RLIMIT_NPROC counts every task of this uid, so allow the ones that exist
    uid = os.getuid()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/status") as status:
                lines = dict(line.split(":", 1) for line in status if ":" in line)
            if int(lines["Uid"].split()[0]) == uid:
                processes += int(lines["Threads"])
        except (OSError, ValueError, KeyError):
            pass
for name, value in (("RLIMIT_CPU", (cpu, cpu + 1)), ("RLIMIT_AS", memory), ("RLIMIT_NPROC", processes),
                    ("RLIMIT_FSIZE", file_bytes), ("RLIMIT_NOFILE", 64), ("RLIMIT_CORE", 0)):
    resource.setrlimit(getattr(resource, name), value if isinstance(value, tuple) else (value, value))


def short(text):
    return text if len(text) <= message_chars else text[: message_chars - 3] + "..."


def finish(status, passed=0, total=0, error="", failed=()):
    sys.stdout.flush(); sys.stderr.flush()
    report = [status, str(passed), str(total), short(error).replace("\0", ""), *failed]
    os.write(fd, "\0".join(report).encode("utf-8", "replace"))
    os._exit(0)


def describe(err, frames=False):
    import linecache, traceback  # only on errors
    for name, source in (("solution.py", program),):  # source lines in the traceback
        linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    text = "".join(traceback.format_exception_only(type(err), err)).strip()
    trace = traceback.extract_tb(err.__traceback__)[1:] if frames else []  # the program's frames, not the runner's
    return text + ("\n" + "".join(traceback.format_list(trace[-3:])).rstrip() if trace else "")


tests = [(steps[i] == "t", steps[i + 1]) for i in range(0, len(steps), 2)]
total = sum(is_test for is_test, _ in tests)
try:
    code = compile(program, "solution.py", "exec")
except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
    finish("syntax_error", error=describe(err))
scope = {"__name__": "solution", "__builtins__": __builtins__}
try:
    exec(code, scope)
except MemoryError:
    finish("memory", total=total, error="MemoryError while running the program")
except BaseException as err:
    finish("error", total=total, error=describe(err, frames=not isinstance(err, SystemExit)))
if entry is not None:
    if not callable(scope.get(entry)):
        finish("error", total=total, error=f"NameError: the program does not define the function {entry!r}")
    scope["candidate"] = scope[entry]
passed, failed, error = 0, [], ""
for is_test, source in tests:
    try:
        exec(compile(source, "tests.py", "exec"), scope)
        passed += is_test
    except MemoryError:
        finish("memory", passed, total, "MemoryError while running the tests", failed)
    except BaseException as err:
        if not is_test:
            finish("error", passed, total, describe(err), failed)
        failed.append(short(source))
        error = error or ("" if isinstance(err, AssertionError) and not str(err) else describe(err))
finish("passed" if passed == total else "failed", passed, total, error, failed)
"""


def split_tests(tests: str, entry_point: str | None) -> tuple[list[tuple[bool, str]], str | None]:
    """The tests as steps `(is_test, source)` in running order, and the function a `check(candidate)` receives.

    A test is a top-level statement that contains an `assert`, or one of `check`'s body; the other statements are
    setup. A trailing `check(name)` call is dropped (the runner calls nothing) and names the entry point.

    >>> split_tests("import math\\nassert math.pi > 3", None)
    ([(False, 'import math'), (True, 'assert math.pi > 3')], None)
    >>> split_tests("def check(candidate):\\n    x = 1\\n    assert candidate(x)\\ncheck(f)", None)[1]
    'f'
    """
    tree = ast.parse(tests)
    body, check = [], None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            check = node
            continue
        call = node.value if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) else None
        if call is not None and isinstance(call.func, ast.Name) and call.func.id == "check":
            if entry_point is None and call.args and isinstance(call.args[0], ast.Name):
                entry_point = call.args[0].id
            continue
        body.append(node)
    if check is not None:
        if entry_point is None:
            raise ValueError(
                "the tests define check(candidate) but name no function to check; pass entry_point= (HumanEval's "
                "'entry_point' column) or end the tests with a line `check(<function name>)`."
            )
        body += check.body
    steps = [(any(isinstance(n, ast.Assert) for n in ast.walk(node)), ast.unparse(node)) for node in body]
    return steps, entry_point if check is not None else None


@dataclass(frozen=True)
class Job:
    """One program and its tests. `entry_point` names the function a `check(candidate)` test receives."""

    program: str
    tests: str = ""
    entry_point: str | None = None


@dataclass(frozen=True)
class _Prepared:
    """A checked job: the program, its test steps `(is_test, source)`, and the function `check` receives."""

    program: str
    steps: tuple[tuple[bool, str], ...]
    entry_point: str | None


@functools.lru_cache(maxsize=256)  # the jobs of a batch share few test texts
def _split_cached(tests: str, entry_point: str | None) -> tuple[tuple[tuple[bool, str], ...], str | None]:
    steps, entry = split_tests(tests, entry_point)
    return tuple(steps), entry


@dataclass(frozen=True)
class ExecutionResult:
    """What happened to one job.

    Attributes:
        status: one of `STATUSES`: `"passed"` (every test passed), `"failed"` (some test failed), `"syntax_error"`
            (the program does not compile), `"error"` (the program, or the tests' setup, raised, or the job ended
            before reporting), `"timeout"` (wall-clock or CPU time ran out), `"memory"` (the memory limit was hit),
            `"killed"` (the job died from a signal it did not get from the sandbox's timeout).
        tests_passed, tests_total: tests that passed, and tests found (0 when the program did not run).
        stdout, stderr: the job's output, each cut to `max_output_bytes`.
        seconds: wall-clock time of the job.
        error: the first error, one short line or a short traceback ("" when none).
        failed_tests: the source of each failed test, shortened.
    """

    status: str
    tests_passed: int
    tests_total: int
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    error: str = ""
    failed_tests: tuple[str, ...] = field(default=())

    @property
    def passed(self) -> bool:
        """Whether every test passed (and there was at least one)."""
        return self.status == "passed" and self.tests_total > 0

    @property
    def fraction(self) -> float:
        """`tests_passed / tests_total`, 0.0 when there were no tests."""
        return self.tests_passed / self.tests_total if self.tests_total else 0.0


class SandboxUnavailableError(RuntimeError):
    """The requested isolation cannot run on this machine; the message says how to fix it or what to choose."""


class Sandbox:
    """Runs untrusted Python programs with their tests, isolated, `workers` at a time.

    Args:
        timeout (`float`, defaults to 5.0): wall-clock seconds per job (interpreter start included); the CPU-time
            limit is the same, rounded up. The whole process tree of a job that runs over is killed.
        memory_mb (`int`, defaults to 512): address-space limit of each process of a job, in MiB.
        workers (`int`, *optional*): jobs run at once; defaults to the number of CPUs this process may use.
        max_processes (`int`, defaults to 16): processes (threads included) a job may have at once.
        max_output_bytes (`int`, defaults to 16384): bytes of stdout and of stderr kept per job; the rest is read and
            dropped.
        max_file_mb (`int`, defaults to 16): largest file a job may write, in MiB (and, with bubblewrap, the size of
            its working directory).
        isolation (`str`, defaults to `"bwrap"`): `"bwrap"`, `"namespaces"` or `"none"`; see the module docstring
            for what each guarantees. The weaker two run only when named.
        python (`str`, *optional*): the interpreter that runs the jobs (standard library only, started with `-s -S`).
            Defaults to this interpreter's real executable, or to a system `python3` when the job's user could not
            read it (a root parent's pyenv under `/root`, say).

    Example:

    >>> sandbox = Sandbox(timeout=2.0)  # doctest: +SKIP
    >>> sandbox.run("def f(x):\\n    return 2 * x", "assert f(2) == 4").status  # doctest: +SKIP
    'passed'
    """

    def __init__(
        self,
        timeout: float = 5.0,
        memory_mb: int = 512,
        workers: int | None = None,
        max_processes: int = 16,
        max_output_bytes: int = 16_384,
        max_file_mb: int = 16,
        isolation: str = "bwrap",
        python: str | None = None,
    ):
        for name, value in (("timeout", timeout), ("memory_mb", memory_mb), ("max_processes", max_processes)):
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"`{name}` must be a positive number; got {value!r}.")
        for name, value in (("max_output_bytes", max_output_bytes), ("max_file_mb", max_file_mb)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer; got {value!r}.")
        if workers is not None and (not isinstance(workers, int) or workers < 1):
            raise ValueError(f"`workers` must be a positive integer or None (one per CPU); got {workers!r}.")
        if isolation not in ISOLATION_MODES:
            raise ValueError(
                f"`isolation` must be one of {ISOLATION_MODES}; got {isolation!r}. 'bwrap' is the only mode that "
                "hides the host's files; the others run only when chosen by name."
            )
        self.timeout = float(timeout)
        self.memory_mb = int(memory_mb)
        self.workers = workers or len(os.sched_getaffinity(0))
        self.max_processes = int(max_processes)
        self.max_output_bytes = max_output_bytes
        self.max_file_mb = max_file_mb
        self.isolation = isolation
        self._drop_to = NOBODY if os.geteuid() == 0 else None
        self.python = python or self._default_python()
        self._probe()

    # ------------------------------------------------------------------ public API

    def run(self, program: str, tests: str = "", entry_point: str | None = None) -> ExecutionResult:
        """Run one program and its tests; see `run_many`."""
        return self.run_many([Job(program, tests, entry_point)])[0]

    def run_many(self, jobs: Iterable[Job | Sequence[str | None]]) -> list[ExecutionResult]:
        """Run jobs, `workers` at a time; return one `ExecutionResult` per job, in order.

        A job is a `Job` or a tuple `(program, tests)` or `(program, tests, entry_point)`. Tests that do not parse,
        or a `check(candidate)` with no function to pass it, raise `ValueError` before anything runs (the tests are
        the caller's, not the model's); whatever the programs do becomes a result.
        """
        jobs = [self._job(job, index) for index, job in enumerate(jobs)]
        if not jobs:
            return []
        if len(jobs) == 1 or self.workers == 1:
            return [self._execute(job) for job in jobs]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(jobs)), thread_name_prefix="sandbox") as pool:
            return list(pool.map(self._execute, jobs))

    def __repr__(self) -> str:
        return (
            f"Sandbox(isolation={self.isolation!r}, timeout={self.timeout}, memory_mb={self.memory_mb}, "
            f"workers={self.workers}, max_processes={self.max_processes})"
        )

    # ------------------------------------------------------------------ checks

    @staticmethod
    def _job(job, index: int) -> _Prepared:
        if isinstance(job, str) or not isinstance(job, (Job, tuple, list)):
            raise TypeError(
                f"Job {index} is a {type(job).__name__}; a job is a Job or a tuple (program, tests[, entry_point])."
            )
        if not isinstance(job, Job):
            if not 1 <= len(job) <= 3:
                raise ValueError(f"Job {index} has {len(job)} items; expected (program, tests[, entry_point]).")
            job = Job(*job)
        if not isinstance(job.program, str) or not isinstance(job.tests, str):
            raise TypeError(f"Job {index}: `program` and `tests` must be strings.")
        if "\0" in job.tests:
            raise ValueError(f"Job {index}: the tests contain a NUL character; Python source cannot.")
        try:
            steps, entry = _split_cached(job.tests, job.entry_point)
        except SyntaxError as err:
            raise ValueError(f"Job {index}: the tests do not parse ({err}); fix the tests, not the program.") from err
        except ValueError as err:
            raise ValueError(f"Job {index}: {err}") from err
        return _Prepared(job.program, steps, entry)

    def _default_python(self) -> str:
        executable = os.path.realpath(sys.executable)
        if self._drop_to is None or _world_readable(executable):
            return executable
        for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3") or ""):
            if candidate and os.path.isfile(candidate) and _world_readable(os.path.realpath(candidate)):
                return os.path.realpath(candidate)
        raise SandboxUnavailableError(
            f"The jobs would run as uid {NOBODY} (this process is root), which cannot read {executable}; install a "
            "system python3 (apt-get install python3) or pass python= an interpreter that every user can run."
        )

    def _probe(self) -> None:
        """Run one trivial job, so that a mode that cannot work fails here, with the fix, not in training."""
        fixes = {
            "bwrap": "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap) "
            "and allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 "
            "also kernel.apparmor_restrict_unprivileged_userns=0), or knowingly choose a weaker mode: "
            "isolation='namespaces' (host files visible) or isolation='none' (resource limits only).",
            "namespaces": "install util-linux's unshare and allow unprivileged user namespaces, or knowingly choose "
            "isolation='none' (resource limits only).",
            "none": f"check that {self.python} runs.",
        }
        tool = {"bwrap": "bwrap", "namespaces": "unshare", "none": None}[self.isolation]
        if self._drop_to is not None and shutil.which("setpriv") is None:
            raise SandboxUnavailableError(
                "This process is root; jobs run as uid 65534 through `setpriv`, not found on PATH: install util-linux."
            )
        if tool and shutil.which(tool) is None:
            raise SandboxUnavailableError(
                f"isolation={self.isolation!r} needs `{tool}`, not found on PATH: {fixes[self.isolation]}"
            )
        result = self._execute(self._job(("x = 1", "assert x == 1"), 0), timeout=max(self.timeout, 10.0))
        if result.status != "passed":
            raise SandboxUnavailableError(
                f"isolation={self.isolation!r} could not run a trivial job (status {result.status!r}: "
                f"{(result.error or result.stderr).strip()[-500:]}). To fix: {fixes[self.isolation]}"
            )

    # ------------------------------------------------------------------ one job

    def _command(self, workdir: str | None, fd: int) -> list[str]:
        # Not -I: it would ignore PYTHONHASHSEED. The environment is entirely ours anyway, and the launcher drops the
        # working directory from sys.path.
        launcher = [self.python, "-s", "-S", "-c", LAUNCHER, str(fd), self.isolation]
        command = self._drop_privileges()
        if self.isolation == "none":
            return command + launcher
        if self.isolation == "namespaces":
            return command + [
                "unshare", "--user", f"--map-user={NOBODY}", f"--map-group={NOBODY}", "--net", "--pid", "--fork",
                "--kill-child", "--mount-proc", "--ipc", "--uts", *launcher,
            ]  # fmt: skip
        command += ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        command += [
            "--unshare-cgroup-try",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
        ]
        command += ["--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox", "--clearenv"]
        for name, value in _environment("/tmp").items():
            command += ["--setenv", name, value]
        command += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                command += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                command += ["--ro-bind", top, top]
        prefix = _install_prefix(self.python)
        if not prefix.startswith("/usr/"):
            command += ["--ro-bind", prefix, prefix]
        command += ["--proc", "/proc", "--dev", "/dev"]
        command += ["--size", str(self.max_file_mb << 20), "--perms", "0700", "--tmpfs", "/tmp", "--chdir", "/tmp"]
        return command + launcher

    def _drop_privileges(self) -> list[str]:
        """A root parent runs jobs as uid/gid 65534 through util-linux `setpriv`: an exec rather than Popen's `user=`,
        which would make Python fork (copying a large trainer's page tables) instead of vfork."""
        if self._drop_to is None:
            return []
        return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]

    def _execute(self, job: _Prepared, timeout: float | None = None) -> ExecutionResult:
        timeout = self.timeout if timeout is None else timeout
        start = time.monotonic()
        if "\0" in job.program:  # cannot travel to the runner, and would not compile
            return ExecutionResult("syntax_error", 0, 0, error="SyntaxError: source code cannot contain null bytes")
        workdir = None if self.isolation == "bwrap" else tempfile.mkdtemp(prefix="sandbox-")
        read_fd, write_fd = os.pipe()
        try:
            if workdir is not None and self._drop_to is not None:
                os.chown(workdir, self._drop_to, self._drop_to)
            limits = (max(1, math.ceil(timeout)), self.memory_mb << 20, self.max_processes, self.max_file_mb << 20)
            fields = [
                job.entry_point or "",
                ",".join(map(str, (*limits, min(2000, self.max_output_bytes)))),
                job.program,
            ]
            for is_test, source in job.steps:
                fields += ["t" if is_test else "s", source]
            payload = "\0".join(fields).encode("utf-8", "surrogatepass")
            env = _environment(workdir) if workdir else {}  # bwrap sets the job's environment itself
            try:
                process = subprocess.Popen(
                    self._command(workdir, write_fd),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(write_fd,),
                    cwd=workdir or "/",
                    env=env,
                    start_new_session=True,  # its own process group, killed as a whole
                )
            except OSError as err:
                return ExecutionResult(
                    "error", 0, 0, seconds=time.monotonic() - start, error=f"could not start: {err}"
                )
            os.close(write_fd)
            write_fd = -1
            outputs, report, timed_out = self._communicate(process, payload, read_fd, start + timeout)
            returncode = process.returncode
        finally:
            for fd in (read_fd, write_fd):
                if fd >= 0:
                    os.close(fd)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
        stdout, stderr = (_text(buffer, self.max_output_bytes) for buffer in outputs)
        seconds = time.monotonic() - start
        verdict = report.decode("utf-8", errors="replace").split("\0") if report else None
        if verdict is not None and (len(verdict) < 4 or verdict[0] not in STATUSES or not verdict[1].isdigit()):
            verdict = None
        if timed_out:
            status, error = "timeout", f"ran over the {timeout:g} s time limit"
        elif verdict is not None:
            status, passed, total, error, *failed = verdict
            return ExecutionResult(status, int(passed), int(total), stdout, stderr, seconds, error, tuple(failed))
        elif _signal_of(returncode) == signal.SIGXCPU:
            status, error = "timeout", f"ran over the {math.ceil(timeout)} s CPU-time limit"
        elif _signal_of(returncode) is not None:
            status, error = "killed", f"killed by {signal.Signals(_signal_of(returncode)).name}"
        else:
            status, error = "error", f"the job exited (code {returncode}) before its tests finished"
        return ExecutionResult(status, 0, 0, stdout, stderr, seconds, error)

    def _communicate(self, process: subprocess.Popen, payload: bytes, report_fd: int, deadline: float):
        """Feed the job, read its output (keeping a bounded part) and report until it ends or the deadline passes."""
        keep = self.max_output_bytes + 1  # one byte more tells that it was cut
        outputs = [bytearray(), bytearray()]
        report = bytearray()
        timed_out = False
        writer = threading.Thread(target=_feed, args=(process.stdin, payload), daemon=True)
        writer.start()
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ, 0)
            selector.register(process.stderr, selectors.EVENT_READ, 1)
            selector.register(report_fd, selectors.EVENT_READ, 2)
            ended_at = None
            while selector.get_map():
                now = time.monotonic()
                if ended_at is None and process.poll() is not None:
                    ended_at = now
                    _kill_group(process)  # stragglers of a job that has ended keep the pipes open
                if now >= deadline:
                    timed_out = ended_at is None
                    break
                if ended_at is not None and now - ended_at > 0.5:
                    break
                for key, _ in selector.select(timeout=min(deadline - now, 0.1)):
                    fd = key.fileobj if isinstance(key.fileobj, int) else key.fileobj.fileno()
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                    elif key.data == 2:
                        report += chunk[: (1 << 20) - len(report)]
                    elif len(outputs[key.data]) < keep:
                        outputs[key.data] += chunk[: keep - len(outputs[key.data])]
        _kill_group(process)
        process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            try:
                stream.close()
            except OSError:
                pass
        writer.join(timeout=1.0)
        return outputs, bytes(report), timed_out


def _feed(stream, payload: bytes) -> None:
    try:
        stream.write(payload)
        stream.close()
    except (BrokenPipeError, OSError):  # the job ended (or was killed) before reading it all
        pass


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_of(returncode: int | None) -> int | None:
    """The signal that ended a job: negative return codes from Popen, 128 + n from bubblewrap's and unshare's exit."""
    if returncode is None:
        return None
    if returncode < 0:
        return -returncode
    if 128 < returncode < 128 + 65:
        return returncode - 128
    return None


def _text(buffer: bytearray, limit: int) -> str:
    if len(buffer) <= limit:
        return buffer.decode("utf-8", errors="replace")
    return buffer[: limit - len(_TRUNCATED)].decode("utf-8", errors="replace") + _TRUNCATED


def _environment(home: str) -> dict[str, str]:
    """The job's whole environment: nothing of the parent's; a fixed hash seed, so set order is deterministic."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _install_prefix(python: str) -> str:
    """The folder an interpreter lives in (`<prefix>/bin/python3.x`), to bind read-only into the sandbox."""
    path = Path(python).resolve()
    return str(path.parent.parent if path.parent.name == "bin" else path.parent)


def _world_readable(path: str) -> bool:
    """Whether every user may read `path` and search every folder above it."""
    current = Path(path)
    if not current.exists() or not os.stat(current).st_mode & 0o004:
        return False
    return all(os.stat(parent).st_mode & 0o001 for parent in current.parents)


__all__ = [
    "ISOLATION_MODES",
    "STATUSES",
    "ExecutionResult",
    "Job",
    "Sandbox",
    "SandboxUnavailableError",
    "split_tests",
]
