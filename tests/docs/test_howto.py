"""The how-to guides run as written: every guide in docs/how-to/, a new one included.

Each guide's blocks run in order (:mod:`docrun` says how a block is marked) in a fresh
directory, on free ports. The install guide runs first, for real: a fresh virtual
environment, pedelec-pyodide installed into it from this checkout (from the source tree,
editable, then as a built wheel); the ``.venv`` it leaves is the project's ``.venv`` in
every other guide, as the guides say ("pedelec-pyodide in your project's ``.venv``").
A block a test cannot run (a real model's key, other machines, a browser's console) says
why in the Markdown, and must still parse.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from docrun import DOCS, REPO, blocks, check_parses, dependencies_dir, run_doc, same_python_as_tests

from pedelec_pyodide.build.snapshot import PAGE

GUIDES = sorted((DOCS / "how-to").glob("*.md"))
INSTALL = DOCS / "how-to" / "install.md"
#: what a guide's commands need that a machine may lack
NEEDS: dict[str, tuple[str, ...]] = {
    "testing": ("npm", "/usr/bin/chromium"),
    "fast-start": ("curl",),
    "jupyterlite": ("curl", "npm"),
}

pytestmark = pytest.mark.skipif(not same_python_as_tests(),
                                reason="the guides' python3 is not this test's Python version")


def test_every_block_of_the_tutorial_and_the_guides_runs_or_says_why_not() -> None:
    """The quick check, without running anything: every block is marked (or runs by its
    language), and each one that is not run parses."""
    for doc in [DOCS / "tutorial.md", *GUIDES]:
        for block in blocks(doc):
            if block.kind == "not run:":
                check_parses(block)
    assert INSTALL in GUIDES and len(GUIDES) >= 10


@pytest.fixture(scope="module")
def deps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return dependencies_dir(tmp_path_factory.mktemp("deps"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory, deps: Path) -> Path:
    """The install guide, run as written; the ``.venv`` it made."""
    root = tmp_path_factory.mktemp("install")
    ran = run_doc(INSTALL, root, deps)
    assert [block.kind for block in ran].count("run") >= 3
    venv = root / "project" / ".venv"
    assert (venv / "bin" / "pedelec").is_file()
    return venv


def test_the_install_guide_runs_as_written(installed: Path) -> None:
    """A wheel was installed last: its pedelec-pyodide is a copy, not this checkout."""
    found = list(installed.glob("lib/python3*/site-packages/pedelec_pyodide/core/cli.py"))
    assert len(found) == 1 and not found[0].is_relative_to(REPO)


@pytest.mark.parametrize("guide", [guide for guide in GUIDES if guide != INSTALL],
                         ids=lambda guide: guide.stem)
def test_the_guide_runs_as_written(guide: Path, installed: Path, deps: Path,
                                   tmp_path: Path) -> None:
    missing = [need for need in NEEDS.get(guide.stem, ())
               if not (Path(need).exists() if need.startswith("/") else shutil.which(need))]
    if missing:
        pytest.skip(f"{guide.name} needs {', '.join(missing)}")
    ran = run_doc(guide, tmp_path, deps, venv=installed)
    runnable = [block for block in blocks(guide) if block.kind != "not run:"]
    assert len(ran) == len(runnable)


def test_the_fast_start_guide_quotes_the_lines_provisioning_logs() -> None:
    """The log lines the guide shows are the ones Core and the provision command write (a
    fresh snapshot takes too long to make in a test just to see its line)."""
    guide = (DOCS / "how-to" / "fast-start.md").read_text(encoding="utf-8")
    source = (REPO / "pedelec_pyodide" / "build" / "snapshot.py").read_text(encoding="utf-8")
    (line,) = re.findall(r'log\(f"(making the \{recipe\.whose\} memory snapshot[^"]*)"\)', source)
    making = line.replace("{recipe.whose}", PAGE.whose)
    assert f'event=provision message="{making}"' in guide  # pedelec serve's log
    assert f"pedelec provision: {making}" in guide  # python -m pedelec_pyodide.build.provision
