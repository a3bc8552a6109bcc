# tests/kit-project is a user's project (its own pyproject.toml and pythonpath), run by
# tests/e2e/kit-core.spec.js as a user would run it, not by this suite's pytest
collect_ignore = ["kit-project"]
