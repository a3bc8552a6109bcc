"""One base for every exception the package raises on purpose: :class:`PedelecError`.

Walks every module (Core's too, hence here and not in tests/unit, which also runs in
Pyodide), so an exception class added later is checked without being listed."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pedelec_pyodide
from pedelec_pyodide import PedelecError


def _exception_classes() -> dict[str, type[BaseException]]:
    """``module.Name`` -> class, for every exception class the package defines at the top
    level of a module (each once, in the module that defines it)."""
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(pedelec_pyodide.__path__, "pedelec_pyodide."):
        module = importlib.import_module(info.name)
        for name, item in vars(module).items():
            if (inspect.isclass(item) and issubclass(item, BaseException)
                    and item.__module__ == module.__name__):
                found[f"{module.__name__}.{name}"] = item
    return found


def _public(qualified: str) -> bool:
    return not any(part.startswith("_") for part in qualified.split("."))


def test_every_public_exception_class_is_a_pedelec_error() -> None:
    public = {name: cls for name, cls in _exception_classes().items() if _public(name)}
    assert len(public) >= 25  # the walk found Core's modules, not just the page's
    outside = sorted(name for name, cls in public.items() if not issubclass(cls, PedelecError))
    assert outside == []


def test_exceptions_keep_the_standard_bases_callers_catch_them_by() -> None:
    from pedelec_pyodide.build.report import LiteError, ProvisionError
    from pedelec_pyodide.build.snapshot import SnapshotError
    from pedelec_pyodide.core.agents.model import AgentUnavailable
    from pedelec_pyodide.core.cluster.messages import BadMessage
    from pedelec_pyodide.core.store.errors import StoreError, StoreUnavailable
    from pedelec_pyodide.core.store.seal import Refused

    for cls in (AgentUnavailable, BadMessage, Refused):
        assert issubclass(cls, ValueError)
    for cls in (LiteError, ProvisionError, SnapshotError):
        assert issubclass(cls, RuntimeError)
    assert issubclass(StoreUnavailable, StoreError)
