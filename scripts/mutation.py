"""Mutation testing of the rule modules; run through ./scripts/mutation (which sets up .venv).

    ./scripts/mutation                     every module in [tool.mutmut] only_mutate
    ./scripts/mutation results schemas     only these (pedelec_pyodide/<name>.py)
    ./scripts/mutation --pyodide results   then re-check the survivors in Pyodide

mutmut (pinned in the ``mutation`` extra) copies the project to mutants/, makes each
mutant of the modules and runs the tests of tests/unit that reach the mutated function
([tool.mutmut] in pyproject.toml). A mutant is caught when a test fails or it times out
(a mutant that loops forever). mutants/ is made afresh on every run, so that no result of
an older source or test is counted. The score printed per module is caught / all mutants.

``--pyodide``: the tests that exist only in Pyodide (a file whose ``pytestmark`` skips it
outside emscripten: the JsProxy values) cannot run in CPython, so mutants of the code only
they reach survive there. Each survivor is put, in turn, into the installed runtime of ONE
Pyodide process under Node (tests/pyodide/run-unit.mjs) and those tests run against it;
the survivors they catch are added to the module's score, printed as a second figure.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tomllib
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MUTANTS = REPO / "mutants"
PACKAGE = "pedelec_pyodide"
# mutmut's exit codes (mutmut/stats.py): 1 and 3 a test failed, 0 survived, 33 and 5 no
# test reached it, 36/24/-24/152/255 timed out
CAUGHT = {1, 3, 36, 24, -24, 152, 255}
SURVIVED = 0
PYODIDE_ONLY = re.compile(r'pytestmark = pytest\.mark\.skipif\(sys\.platform != "emscripten"')


def configured_modules() -> list[str]:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mutmut"]
    return [Path(path).stem for path in config["only_mutate"]]


def run_mutmut(modules: list[str]) -> None:
    shutil.rmtree(MUTANTS, ignore_errors=True)
    names = [f"{PACKAGE}.{module}.*" for module in modules]
    log = REPO / "mutation.log"
    print(f"mutmut run {' '.join(names)}  (progress: {log.name}, then mutants/)", flush=True)
    with open(log, "w") as out:
        done = subprocess.run([str(REPO / ".venv/bin/mutmut"), "run", *names], cwd=REPO,
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    shutil.move(log, MUTANTS / log.name)
    if done.returncode != 0:
        sys.exit(f"mutmut failed (exit {done.returncode}): see mutants/{log.name}")


def results_of(module: str) -> dict[str, int | None]:
    meta = MUTANTS / PACKAGE / f"{module}.py.meta"
    codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
    return codes


def mutated_source(name: str, module: str) -> str:
    """The module's source with this one mutant in it (what ``mutmut apply`` writes)."""
    import libcst as cst
    from mutmut.mutation.diff_apply import (
        find_top_level_function_or_method,
        read_functions_from_index,
        read_mutant_function,
        read_mutants_module,
    )
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    path = Path(PACKAGE) / f"{module}.py"
    function_name = orig_function_and_class_names_from_key(name)[0].rpartition(".")[-1]
    original = cst.parse_module(path.read_text())
    target = find_top_level_function_or_method(original, function_name)
    pair = read_functions_from_index(name, path)
    mutant = pair[1] if pair else read_mutant_function(read_mutants_module(path), name)
    mutant = mutant.with_changes(name=cst.Name(function_name))
    assert target is not None, f"{function_name} is not in {path}"
    changed = original.deep_replace(target, mutant)
    assert isinstance(changed, cst.Module)
    return changed.code


DRIVER = '''\
"""Written by scripts/mutation --pyodide: runs the Pyodide-only tests once per mutant."""
import importlib, json, pathlib, sys
import pytest

def _run(targets):
    for name in [n for n in sys.modules if n.startswith(("pedelec_pyodide", "test_"))]:
        del sys.modules[name]
    importlib.invalidate_caches()
    return int(pytest.main([*targets, "-q", "-p", "no:cacheprovider"]))

def test_mutants():
    here = pathlib.Path(__file__).parent
    plan = json.loads((here / "mutants.json").read_text())
    found = {}
    baseline = _run(plan["targets"])
    assert baseline == 0, f"the Pyodide-only tests fail without any mutant: {baseline}"
    for name, (module, source) in plan["mutants"].items():
        path = pathlib.Path(importlib.util.find_spec(module).origin)
        compiled = pathlib.Path(importlib.util.cache_from_source(str(path)))
        if compiled.exists():  # else the import takes the runtime's compiled original
            compiled.unlink()
        original = path.read_text()
        path.write_text(source)
        try:
            found[name] = _run(plan["targets"])
        finally:
            path.write_text(original)
    (here / "results.json").write_text(json.dumps(found))  # the host's dir (NODEFS)
'''


def recheck_in_pyodide(survivors: dict[str, list[str]]) -> dict[str, int]:
    """Exit codes of the Pyodide-only tests run against each survivor (1: caught)."""
    unit = REPO / "tests" / "unit"
    targets = sorted(f"tests/unit/{test.name}" for test in unit.glob("test_*.py")
                     if PYODIDE_ONLY.search(test.read_text()))
    if not targets or not any(survivors.values()):
        return {}
    scratch = MUTANTS / "pyodide-tests"
    shutil.copytree(unit, scratch / "unit", ignore=shutil.ignore_patterns("__pycache__"))
    plan = {"targets": targets, "mutants": {
        name: [f"{PACKAGE}.{module}", mutated_source(name, module)]
        for module, names in survivors.items() for name in names}}
    (scratch / "unit" / "mutants.json").write_text(json.dumps(plan))
    (scratch / "unit" / "test_mutants_driver.py").write_text(DRIVER)
    print(f"Pyodide: {len(plan['mutants'])} survivors against {', '.join(targets)}", flush=True)
    done = subprocess.run(
        ["node", "tests/pyodide/run-unit.mjs", "--tests-dir", str(scratch),
         "--target", "tests/unit/test_mutants_driver.py"],
        cwd=REPO, capture_output=True, text=True, check=False)
    (MUTANTS / "pyodide.log").write_text(done.stdout + done.stderr)
    written = scratch / "unit" / "results.json"
    if done.returncode != 0 or not written.exists():
        sys.exit("the Pyodide run gave no results: see mutants/pyodide.log")
    found: dict[str, int] = json.loads(written.read_text())
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help="module names (default: all configured)")
    parser.add_argument("--pyodide", action="store_true",
                        help="re-check the survivors against the Pyodide-only tests")
    args = parser.parse_args()
    configured = configured_modules()
    modules = [name.removesuffix(".py").rpartition(".")[-1] for name in args.modules]
    unknown = sorted(set(modules) - set(configured))
    if unknown:
        parser.error(f"not a configured module: {', '.join(unknown)} "
                     f"(configured: {', '.join(configured)})")
    modules = modules or configured

    run_mutmut(modules)
    results = {module: results_of(module) for module in modules}
    survivors = {module: sorted(name for name, code in codes.items() if code == SURVIVED)
                 for module, codes in results.items()}
    in_pyodide = recheck_in_pyodide(survivors) if args.pyodide else {}

    print(f"\n{'module':<12}{'mutants':>8}{'caught':>8}{'survived':>9}{'no test':>8}"
          f"{'score':>8}" + (f"{'+Pyodide':>10}" if args.pyodide else ""))
    for module, codes in results.items():
        count = Counter("caught" if code in CAUGHT else "survived" if code == SURVIVED
                        else "no test" for code in codes.values())
        score = count["caught"] / len(codes)
        line = (f"{module:<12}{len(codes):>8}{count['caught']:>8}{count['survived']:>9}"
                f"{count['no test']:>8}{score:>8.1%}")
        if args.pyodide:
            extra = sum(in_pyodide.get(name, 0) != 0 for name in survivors[module])
            line += f"{(count['caught'] + extra) / len(codes):>10.1%}"
            survivors[module] = [n for n in survivors[module] if in_pyodide.get(n, 0) == 0]
        print(line)
    listing = MUTANTS / "survivors.txt"
    listing.write_text("".join(f"{name}\n" for names in survivors.values() for name in names))
    print(f"\nsurvivors: mutants/{listing.name} (see one: .venv/bin/mutmut show NAME)")


if __name__ == "__main__":
    main()
