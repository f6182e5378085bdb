"""A fresh venv that already holds some of this environment's distributions (pip, torch and
what they require), hard-linked instead of installed: a "node that has torch" in about a
second, where `pip install torch` takes ~35 s here and compiles every module again. pip in the
venv sees them as installed (their dist-info comes along) and removes them as its own."""

from __future__ import annotations

import errno
import importlib.metadata as metadata
import os
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
