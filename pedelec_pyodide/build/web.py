"""Where the JS bridge and the demo are: served by Core, read when a snapshot is made."""

from __future__ import annotations

from pathlib import Path

__all__ = ["default_web_dir"]


def default_web_dir() -> Path | None:
    """The JS bridge and the demo: the repository's ``web/`` in a source checkout, else the
    copy the wheel carries as ``pedelec_pyodide/web``."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package.parent / "web", package / "web"):
        if (candidate / "pedelec-pyodide.js").is_file():
            return candidate
    return None
