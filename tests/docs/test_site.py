"""The docs site builds, and its reference pages list everything the code has.

- ``mkdocs build --strict`` (into a temporary directory): every page is in the nav, every
  internal link and anchor resolves (``validation`` in mkdocs.yml);
- every option of ``pedelec serve`` / ``demo`` / ``lite`` (read from their ``--help``) is in
  the CLI reference;
- every error code the package defines (a module constant ``NAME = "NAME"``) is on the
  error-codes page.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
MKDOCS = Path(sys.executable).with_name("mkdocs")
CODE = re.compile(r'^([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:\s*:\s*[\w\[\]]+)?\s*=\s*"\1"\s*$',
                  re.MULTILINE)
NOT_ERROR_CODES = re.compile(r"_ENV$")  # environment variable names, spelled the same way


def test_the_site_builds_with_every_link_and_anchor_resolved(tmp_path: Path) -> None:
    assert MKDOCS.exists(), "mkdocs comes with the test extra: pip install -e '.[test]'"
    built = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(tmp_path)],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-4000:]
    assert (tmp_path / "tutorial" / "index.html").exists()
    assert (tmp_path / "reference" / "errors" / "index.html").exists()
    for page in tmp_path.rglob("*.html"):
        html = page.read_text(encoding="utf-8")
        # the site works offline: no script or style sheet from elsewhere
        remote = re.findall(r'<(?:script|link)[^>]*(?:src|href)="(?:https?:)?//[^"]*"', html)
        assert not remote, (page, remote)
        # an example's HTML is shown, never run (a fence Markdown did not see as code)
        assert not re.findall(r"<script[^>]*pedelec", html), page


def help_options(*command: str) -> set[str]:
    shown = subprocess.run([sys.executable, "-m", "pedelec_pyodide.core.cli", *command,
                            "--help"], capture_output=True, text=True, timeout=60, check=True)
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]+", shown.stdout)) - {"--help"}


def test_the_cli_reference_lists_every_option_of_every_command() -> None:
    page = (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(--[a-z][a-z-]+)", page))
    for command in ("serve", "demo", "lite"):
        options = help_options(command)
        assert options, command
        assert not options - documented, f"pedelec {command}: not in docs/reference/cli.md"


def error_codes() -> set[str]:
    codes = set()
    for source in (REPO / "pedelec_pyodide").rglob("*.py"):
        codes |= {name for name in CODE.findall(source.read_text(encoding="utf-8"))
                  if not NOT_ERROR_CODES.search(name)}
    return codes


def test_the_error_codes_page_lists_every_code_the_package_defines() -> None:
    codes = error_codes()
    assert {"INVALID_ARGS", "TOOL_TIMEOUT", "FRAME_NOT_JSON", "PAGE_NOT_CONNECTED"} <= codes
    page = (DOCS / "reference" / "errors.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\|(?:[^|]*\|)?\s*`([A-Z_]+)`\s*\|", page, re.MULTILINE))
    assert not codes - rows, "error codes with no row in docs/reference/errors.md"


def test_the_readme_links_to_pages_that_exist() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((?!https?:)([^)#]+)(?:#[^)]*)?\)", readme)
    assert "docs/tutorial.md" in links
    missing = [link for link in links if not (REPO / link).exists()]
    assert not missing, f"README.md links to missing files: {missing}"


def test_the_readme_and_the_home_page_list_every_how_to_guide() -> None:
    guides = {page.name for page in (DOCS / "how-to").glob("*.md")}
    assert len(guides) >= 10
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    assert not guides - set(re.findall(r"\]\(docs/how-to/([^)#]+\.md)", readme)), "README.md"
    assert not guides - set(re.findall(r"\]\(how-to/([^)#]+\.md)", home)), "docs/index.md"
