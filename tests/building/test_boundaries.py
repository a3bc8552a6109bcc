"""Building is not serving: pedelec_pyodide.build never imports Core (Core may import it,
for what it provisions and the snapshot files it serves)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pedelec_pyodide.build


def test_building_imports_nothing_of_core() -> None:
    modules = sorted(f"pedelec_pyodide.build.{m.name}"
                     for m in pkgutil.iter_modules(pedelec_pyodide.build.__path__))
    assert {"pedelec_pyodide.build.provision", "pedelec_pyodide.build.lite"} <= set(modules)
    loaded = subprocess.run(
        [sys.executable, "-c", f"import sys\nfor m in {modules!r}: __import__(m)\n"
         "print('\\n'.join(sorted(sys.modules)))"],
        check=True, capture_output=True, text=True, timeout=60).stdout.split()
    assert [m for m in loaded if m.startswith("pedelec_pyodide.core")] == []
