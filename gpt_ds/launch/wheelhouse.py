"""Which wheels a node without internet needs to install gpt_ds beside its own torch.

launchers/wheelhouse.sh asks pip to resolve gpt_ds for the target (`pip install --dry-run
--report`), then this module reads the report: every package gpt_ds reaches through its
requirements (the extras asked for included, markers evaluated for the target's Python)
without passing through torch, less what the target already has (its `pip freeze`). torch's
own dependencies (CUDA libraries, triton, sympy, ...) stay out unless something else needs
them: the target's torch build is the user's (CUDA, ROCm or CPU), as in setup_env.sh.

    python gpt_ds/launch/wheelhouse.py REPORT.json [--extras dev,bench] [--python 3.12]
        [--have FREEZE.txt] [--skip NAME ...]      # prints name==version, one a line
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import cast

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare interpreter: pip's own copy
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

ALWAYS_SKIPPED = ("torch",)  # the target's own build


def canonical(name: str) -> str:
    """PEP 503's normalised project name (`Jinja2` -> jinja2, `typing_extensions` ->
    typing-extensions)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def freeze_versions(text: str) -> dict[str, str]:
    """Project -> version of a `pip freeze` (`name==version`; "" for `name @ url` or a bare
    name: any version serves; comments and options skipped)."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name = canonical(re.split(r"[=<>!~ @\[;]", line, maxsplit=1)[0])
            pinned = re.match(r"[^=]+==\s*([^\s;]+)", line)
            found[name] = pinned[1] if pinned else ""
    return found


def _served(req: Requirement, have: dict[str, str]) -> bool:
    """Whether the target's own copy of `req`'s project meets it (an unknown version does)."""
    version = have.get(canonical(req.name))
    if version is None:
        return False
    return not version or req.specifier.contains(version, prereleases=True)


def _wanted(req: Requirement, extras: set[str], env: dict[str, str]) -> bool:
    """Whether `req` applies on the target, for a package installed with `extras`."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**env, "extra": e}) for e in extras | {""})


def needed(
    report: dict,
    extras: set[str],
    skip: set[str],
    env: dict[str, str],
    have: dict[str, str] | None = None,
) -> list[tuple[str, str]]:
    """(name, version) of every package the report's requested root reaches without passing
    through a skipped one or one the target `have`s in a version that meets the requirement
    (an older one goes in: pip on the node would refuse it); the root itself first."""
    have = have or {}
    items = {canonical(i["metadata"]["name"]): i for i in report["install"]}
    roots = [canonical(i["metadata"]["name"]) for i in report["install"] if i.get("requested")]
    asked: dict[str, set[str]] = {r: set(extras) for r in roots}
    order, todo = [], list(roots)
    while todo:
        name = todo.pop(0)
        if name in order:
            continue
        order.append(name)
        for text in items[name]["metadata"].get("requires_dist") or []:
            req = Requirement(text)
            dep = canonical(req.name)
            if dep in skip or dep not in items or not _wanted(req, asked[name], env):
                continue
            if _served(req, have):
                continue
            before = asked.setdefault(dep, set())
            if dep not in order or not set(req.extras) <= before:
                before |= set(req.extras)
                if dep in order:  # more extras: walk it again
                    order.remove(dep)
                todo.append(dep)
    return [(items[n]["metadata"]["name"], items[n]["metadata"]["version"]) for n in order]


def target_env(python: str | None) -> dict[str, str]:
    """Marker values of the target: this interpreter's, its Python version replaced."""
    try:
        from packaging.markers import default_environment
    except ImportError:
        from pip._vendor.packaging.markers import default_environment  # type: ignore[assignment]
    env = cast("dict[str, str]", dict(default_environment()))  # a TypedDict, every value a str
    if python:
        env.update(python_version=python, python_full_version=f"{python}.0")
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("report", type=Path, help="pip install --dry-run --report's JSON")
    p.add_argument("--extras", default="", help="gpt_ds's extras, comma-separated")
    p.add_argument("--python", help="the target's Python version, e.g. 3.12")
    p.add_argument("--have", type=Path, help="the target's `pip freeze`: left out")
    p.add_argument("--skip", nargs="*", default=[], help="more projects to leave out")
    a = p.parse_args(argv)
    skip = {canonical(n) for n in (*ALWAYS_SKIPPED, *a.skip)}
    have = freeze_versions(a.have.read_text()) if a.have else {}
    extras = {e.strip() for e in a.extras.split(",") if e.strip()}
    report = json.loads(a.report.read_text())
    for name, version in needed(report, extras, skip, target_env(a.python), have):
        if have.get(canonical(name)):
            print(f"wheelhouse: {name} {version} replaces the target's {have[canonical(name)]}, "
                  "which does not meet gpt_ds's requirement", file=sys.stderr)  # fmt: skip
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
