"""A wheelhouse: every wheel that multiagent_trl and its GPU benchmarks need, for a machine without network.

    python benchmarks/wheelhouse.py                        # on a connected machine: wheelhouse/, for CPython 3.12 on
                                                           # x86_64 Linux (glibc >= 2.28), torch left out
    python benchmarks/wheelhouse.py --have have.txt        # also leave out what the target already has
    python benchmarks/wheelhouse.py --list                 # only print the requirements it would resolve

Then copy the folder to the target, which brings its own torch and CUDA, and there (no network needed):

    python -m pip install --no-index --find-links wheelhouse -r wheelhouse/requirements.txt

What goes in: this project's dependencies (its own wheel, built here, names them) and the extra requirements the
benchmarks import (`--extra`, by default CoMLRL at the `bench` extra's pin), resolved for the target's Python and
platform by pip itself (`pip install --dry-run --report`). What stays out: torch, stood in for during the
resolution by an empty wheel of the target's version (`--torch`), so that neither torch nor the CUDA libraries it
pulls are resolved or downloaded; and, with `--have`, every package the target already has (its
`python -m pip list --format=freeze`) at a version that meets every requirement on it and whose own requirements
the carried versions meet (read from its wheel's metadata), together with whatever only those packages need. Then
`pip download --no-deps` fetches the rest, and the folder gets a `requirements.txt` (the top-level requirements,
pinned) and `SIZES.txt` (each wheel's size, largest first, and what was left out).

Only pip and the standard library are needed here (pip 22.2 or newer, for `--report`); the project need not be
installed. Pip's own configuration (an index, find-links) applies, except a configured constraint file, which is
replaced by the one pin on torch.
"""

from __future__ import annotations

import argparse
import email.parser
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
except ImportError:  # a bare Python: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.utils import canonicalize_name
    from pip._vendor.packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
ALWAYS_LEFT_OUT = ("torch",)  # the target's own, with its CUDA libraries


def project_pin(extra: str, name: str) -> str:
    """The requirement on `name` in pyproject.toml's `extra` (e.g. "comlrl==1.4.3"), read as text (Python 3.10 has
    no tomllib)."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(rf"^{re.escape(extra)} = \[(.*?)\]$", text, re.M | re.S)
    if block is None:
        raise SystemExit(f"pyproject.toml has no extra {extra!r}")
    for item in re.findall(r'"([^"]+)"', block.group(1)):
        if canonicalize_name(Requirement(item).name) == canonicalize_name(name):
            return item
    raise SystemExit(f"pyproject.toml's extra {extra!r} does not name {name!r}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dest", default=str(ROOT / "wheelhouse"), help="the folder (emptied of wheels first)")
    parser.add_argument("--python-version", default="3.12", help="the target's Python, as MAJOR.MINOR")
    parser.add_argument("--arch", default="x86_64", help="the target's machine (uname -m)")
    parser.add_argument(
        "--glibc", default="2.28", help="the target's glibc (ldd --version); manylinux wheels up to it"
    )
    parser.add_argument(
        "--torch", default=None, help="the target's torch version (default: the oldest that pyproject.toml allows)"
    )
    parser.add_argument(
        "--extra",
        nargs="*",
        default=None,
        help="requirements beside the project's (default: the bench extra's CoMLRL pin, which the GPU benchmarks "
        "import; give none to leave it out)",
    )
    parser.add_argument("--have", help="the target's `python -m pip list --format=freeze`: what it already has")
    parser.add_argument("--list", action="store_true", help="print the top-level requirements and exit")
    args = parser.parse_args(argv)
    if args.extra is None:
        args.extra = [project_pin("bench", "comlrl")]
    if args.torch is None:
        args.torch = torch_floor()
    return args


def project_requirements() -> list[str]:
    """pyproject.toml's `dependencies`, as text."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)\]$", text, re.M | re.S)
    return re.findall(r'"([^"]+)"', block.group(1))


def torch_floor() -> str:
    for item in project_requirements():
        requirement = Requirement(item)
        if requirement.name == "torch":
            floors = [spec.version for spec in requirement.specifier if spec.operator in (">=", "==", "~=")]
            if floors:
                return floors[0]
    raise SystemExit("pyproject.toml's torch requirement has no lower bound: pass --torch")


def platforms(arch: str, glibc: str) -> list[str]:
    """pip matches each --platform tag exactly: every manylinux tag a glibc of that version runs."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    return tags + [f"{name}_{arch}" for low, name in legacy.items() if minor >= low]


def target_environment(python_version: str, arch: str) -> dict[str, str]:
    """PEP 508 marker values of the target (CPython on Linux)."""
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "implementation_version": f"{python_version}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": arch,
        "platform_release": "",
        "platform_version": "",
        "extra": "",
    }


def stub_wheel(folder: Path, name: str, version: str) -> None:
    """An empty wheel named `name` with no requirements: it stands in for the target's own package while pip
    resolves, so that nothing it would pull (torch's CUDA libraries) is resolved."""
    dist_info = f"{name}-{version}.dist-info"
    files = {
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: wheelhouse.py\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist_info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def read_have(path: str | None) -> dict[str, Version | None]:
    """The target's packages: `name==version` lines (pip freeze's format) as {canonical name: version}, and a bare
    `name` as {name: None}, a package the target has at a version not read (taken as good enough: the install on the
    target says when it is not). Comments (#) and other lines are skipped."""
    if path is None:
        return {}
    have = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#")[0].strip()
        name, sep, version = line.partition("==")
        if sep:
            have[canonicalize_name(name)] = Version(version)
        elif re.fullmatch(r"[A-Za-z0-9._-]+", line):
            have[canonicalize_name(line)] = None
    return have


def applies(requirement: Requirement, environment: dict[str, str], extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**environment, "extra": extra}) for extra in extras | {""})


def kept_packages(report: dict, top: list[str], have: dict[str, Version | None], environment: dict[str, str]):
    """Walk the resolved graph from the top-level requirements; a package the target has at a version that meets
    every requirement on it is left out, and the walk does not go through it (its needs are the target's own).
    Returns ({name: version} to download, {name: reason} left out)."""
    resolved = {canonicalize_name(item["metadata"]["name"]): item["metadata"] for item in report["install"]}
    # every requirement on each package from the resolved set (conservatively: extras' requirements too)
    wanted: dict[str, list[Requirement]] = {}
    for metadata in resolved.values():
        for text in metadata.get("requires_dist", []):
            requirement = Requirement(text)
            marker = requirement.marker
            if marker is None or "extra" in str(marker) or marker.evaluate(environment):
                wanted.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    for text in top:
        requirement = Requirement(text)
        wanted.setdefault(canonicalize_name(requirement.name), []).append(requirement)

    kept, left_out = {}, {}
    queue = [(canonicalize_name(Requirement(text).name), set(Requirement(text).extras)) for text in top]
    seen = set()
    while queue:
        name, extras = queue.pop()
        if (name, frozenset(extras)) in seen or name not in resolved:
            continue
        seen.add((name, frozenset(extras)))
        if name in ALWAYS_LEFT_OUT:
            left_out[name] = "the target's own, with its CUDA libraries"
            continue
        if name in have and have[name] is None:
            left_out[name] = "the target has it, version not given"
            continue
        if name in have and all(r.specifier.contains(have[name], prereleases=True) for r in wanted.get(name, [])):
            left_out[name] = f"the target has {have[name]}"
            continue
        kept[name] = resolved[name]["version"]
        for text in resolved[name].get("requires_dist", []):
            requirement = Requirement(text)
            if applies(requirement, environment, extras):
                queue.append((canonicalize_name(requirement.name), set(requirement.extras)))
    return kept, left_out


def unmet(requires: list[str], versions: dict[str, Version], environment: dict[str, str]) -> list[str]:
    """The requirements in `requires` (markers evaluated for the target, no extras) that `versions` break. A package
    that `versions` does not name is not checked: the target already has what its own packages need.

    >>> unmet(["hub<2,>=0.16", "numpy"], {"hub": Version("2.4.0")}, target_environment("3.12", "x86_64"))
    ['hub<2,>=0.16']
    """
    broken = []
    for text in requires:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        version = versions.get(canonicalize_name(requirement.name))
        if version is not None and not requirement.specifier.contains(version, prereleases=True):
            broken.append(text)
    return broken


def wheel_requirements(wheel: Path) -> list[str]:
    """A wheel's Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


def keep_consistent(report, top, have, environment, requirements_of) -> tuple[dict, dict]:
    """`kept_packages`, then a check of each package left out at a known version against its own requirements
    (`requirements_of(name, version)`: its Requires-Dist, or None when not found): one that needs another version of
    something the wheelhouse carries (the target's tokenizers wanting an older huggingface_hub than the new
    transformers does, say) is carried too, and the walk is done again, until nothing changes."""
    carried: set[str] = set()
    while True:
        kept, left_out = kept_packages(report, top, {n: v for n, v in have.items() if n not in carried}, environment)
        versions = {name: Version(version) for name, version in kept.items()}
        versions.update({name: have[name] for name in left_out if have.get(name) is not None})
        conflicts = set()
        for name in left_out:
            if name in ALWAYS_LEFT_OUT or have.get(name) is None:
                continue
            requires = requirements_of(name, have[name])
            if requires is None:
                left_out[name] += "; its own requirements not found, not checked"
            elif unmet(requires, versions, environment):
                conflicts.add(name)
        if not conflicts:
            return kept, left_out
        for name in sorted(conflicts):
            print(f"{name} {have[name]} (the target's) needs another version of what the wheelhouse carries: carried")
        carried |= conflicts


def pip(*args: str, env: dict | None = None) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+ " + " ".join(command), flush=True)
    subprocess.run(command, check=True, env=env)


def main(argv=None) -> None:
    args = parse_args(argv)
    top = ["multiagent_trl", *args.extra]
    if args.list:
        print("\n".join(["torch (left out: the target's own)", *project_requirements(), *args.extra]))
        return
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    target = ["--only-binary=:all:", "--python-version", args.python_version, "--implementation", "cp"]
    for tag in platforms(args.arch, args.glibc):
        target += ["--platform", tag]
    environment = target_environment(args.python_version, args.arch)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        # the project's own wheel (pure Python): its metadata names its dependencies
        pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), str(ROOT))
        (project,) = dest.glob("multiagent_trl-*.whl")
        top[0] = f"multiagent_trl=={project.name.split('-')[1]}"
        stubs = scratch / "stubs"
        stubs.mkdir()
        stub_version = f"{args.torch}+stub"
        stub_wheel(stubs, "torch", stub_version)
        constraints = scratch / "constraints.txt"
        constraints.write_text(f"torch=={stub_version}\n")
        env = {**os.environ, "PIP_CONSTRAINT": str(constraints)}
        report_path = scratch / "report.json"
        pip(
            "install", "--quiet", "--dry-run", "--ignore-installed", "--target", str(scratch / "target"),
            *target, "--find-links", str(dest), "--find-links", str(stubs), "--report", str(report_path), *top,
            env=env,
        )  # fmt: skip
        report = json.loads(report_path.read_text())
        resolved = {canonicalize_name(i["metadata"]["name"]): i["metadata"] for i in report["install"]}

        def requirements_of(name: str, version: Version) -> list[str] | None:
            """Requires-Dist of the target's version: the resolved one's, or its wheel's (downloaded here)."""
            if name in resolved and Version(resolved[name]["version"]) == version:
                return resolved[name].get("requires_dist", [])
            folder = scratch / f"metadata-{name}"
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *target, "--dest", str(folder)]
            if subprocess.run([*command, f"{name}=={version}"], capture_output=True).returncode != 0:
                return None
            return wheel_requirements(next(folder.glob("*.whl")))

        kept, left_out = keep_consistent(report, top, read_have(args.have), environment, requirements_of)
    downloads = [f"{name}=={version}" for name, version in sorted(kept.items()) if name != "multiagent-trl"]
    pip("download", "--quiet", "--no-deps", *target, "--dest", str(dest), *downloads)
    (dest / "requirements.txt").write_text("\n".join(top) + "\n")
    wheels = sorted(dest.glob("*.whl"), key=lambda path: path.stat().st_size, reverse=True)
    total = sum(path.stat().st_size for path in wheels)
    lines = [f"{path.stat().st_size / 2**20:7.1f} MiB  {path.name}" for path in wheels]
    lines.append(f"{total / 2**20:7.1f} MiB  in all, {len(wheels)} wheels")
    lines += [f"left out: {name} ({reason})" for name, reason in sorted(left_out.items())]
    (dest / "SIZES.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nOn the target: python -m pip install --no-index --find-links {dest} -r {dest / 'requirements.txt'}")


if __name__ == "__main__":
    main()
