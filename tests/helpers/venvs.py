"""Venvs for the tests that install gpt_ds as a user would.

`linked_venv`: a fresh venv that already holds some of this environment's distributions (pip,
torch and what they require), hard-linked instead of installed: a "node that has torch" in
about a second, where `pip install torch` takes ~35 s here and compiles every module again. pip
in the venv sees them as installed (their dist-info comes along) and removes them as its own.

`floor_torch_venv`: a venv holding the torch of pyproject.toml's floor, which is not this
environment's (PyPI's Linux build, CUDA libraries and all, ~2.5 GB: it runs on the CPU), made
once a session; `venv_copy` gives each test its own hard-linked copy of it.
"""

from __future__ import annotations

import errno
import importlib.metadata as metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def linked_venv(venv: Path, *roots: str) -> Path:
    """`python -m venv --without-pip VENV` holding `roots` and their runtime requirements (no
    extras), as this environment has them; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    for dist in requirement_closure(roots):
        link_files(dist, site)
    return venv / "bin" / "python"


def requirement_closure(roots: tuple[str, ...]) -> list[metadata.Distribution]:
    """The distributions `roots` name and, transitively, those they require here."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        found[name] = dist = metadata.distribution(name)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(found.values())


def link_files(dist: metadata.Distribution, site: Path) -> None:
    """Each file of `dist` under site-packages (its RECORD; scripts in bin/ stay out: they
    name this environment's python) hard-linked to the same place under `site`."""
    for record in dist.files or []:
        if record.parts[0] == "..":
            continue
        source = Path(str(dist.locate_file(record)))
        if not source.is_file():  # RECORD may list what was never written (a skipped .pyc)
            continue
        target = site / str(record)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            shutil.copy2(source, target)  # another filesystem: a copy


def declared_floors(pyproject: Path) -> list[str]:
    """`name==floor` for each runtime dependency of pyproject.toml (`name>=floor,...`)."""
    text = pyproject.read_text()
    block = re.search(r"^dependencies = \[\n(.*?)^\]", text, re.S | re.M)
    assert block, f"{pyproject}: no dependencies = [...] block"
    deps = re.findall(r'^\s*"([^"]+)",', block[1], re.M)
    pins = []
    for dep in deps:
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)(,.*)?", dep)
        assert match, f"{pyproject}: {dep!r} declares no floor (name>=X)"
        pins.append(f"{match[1]}=={match[2]}")
    return pins


def floor_torch_venv(venv: Path, pyproject: Path, env: dict[str, str]) -> Path:
    """`venv` with pip (linked) and torch at pyproject's floor, installed by pip from the index
    with no cache (nothing written outside `venv`); its python."""
    python = linked_venv(venv, "pip")
    torch = next(pin for pin in declared_floors(pyproject) if pin.startswith("torch=="))
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-cache-dir", torch]
    subprocess.run(install, env=env, check=True, capture_output=True, timeout=1200)
    return python


def venv_copy(source: Path, venv: Path) -> Path:
    """A copy of `source` at `venv`, every file hard-linked (pip unlinks what it replaces, so
    neither changes the other); its python. Entry scripts in bin/ still name `source`."""
    subprocess.run(["cp", "-al", str(source), str(venv)], check=True)
    return venv / "bin" / "python"


def pip_installs(report: Path) -> dict[str, str]:
    """name -> version of what a pip `--report` file says pip installs (or would)."""
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"]: i["metadata"]["version"] for i in items}
