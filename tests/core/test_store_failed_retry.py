"""Found by the fault run (tests/core/test_fault_run.py, Redis restarted): a call that
ended STORE_FAILED (retryable, never sent to the page) kept its Idempotency-Key, so every
retry with that key got the same STORE_FAILED back and the call could never succeed."""

from __future__ import annotations

from pathlib import Path

from corekit import config, echo_page, run, running_core
from storekit import read_only

from pedelec_pyodide.core.store import STORE_FAILED


def test_a_retry_with_the_key_of_a_call_the_store_refused_runs_it(tmp_path: Path) -> None:
    """The store refuses the call's writes: STORE_FAILED, retryable, nothing sent. Once
    the store takes writes again, the retry with the same Idempotency-Key runs it, once."""

    async def main() -> None:
        async with running_core(config(store=str(tmp_path / "core.sqlite"))) as core:
            page = await echo_page().connect(core.ws_url)
            sid = page.session.session_id
            assert sid is not None
            path = f"/pedelec/v1/sessions/{sid}/tool-calls"
            body = {"tool": "echo", "args": {"n": 1}}
            key = {"Idempotency-Key": "call-1"}
            await read_only(core.registry.store, True)
            answer = (await core.http.post(path, json=body, headers=key)).json()
            error = answer["result"]["error"]
            assert (error["code"], error["retryable"]) == (STORE_FAILED, True)
            await read_only(core.registry.store, False)
            answer = (await core.http.post(path, json=body, headers=key)).json()
            assert answer["result"] == {"n": 1}, answer
            assert [f["args"] for f in page.frames("tool.request")] == [{"n": 1}]
            # the refused call, its key forgotten, takes no place among keyed results
            callers = core.registry.sessions[sid].callers
            assert list(callers.results) == [answer["toolRequestId"]]
            assert len(callers.others) == 1

    run(main())
