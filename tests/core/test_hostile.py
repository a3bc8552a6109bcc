"""Hostile input (issue 10): each attack class against a real Core process.

Each test starts ``pedelec serve`` on a loopback port, connects a victim page, measures
health latency idle and while one client sends the attack, and asserts issue 10's
figures: health p99 under 1 s (the noisy-machine bound of the 100 ms target), RSS growth
under the issue's bounds, the victim still served (a control-API tool call round-trips),
health answering, SIGTERM stopping Core within 5 s. The attacks and the measuring are in
``hostile.py``, shared with ``bench/attacks.py``.

CI runs the quick scale (smaller payloads, 40 probes a phase); ``PEDELEC_LONG=1`` runs the
issue's full sizes (285 KiB $ref chain, 40 sessions of 1 MiB, 300 bad frames, ...).
"""

from __future__ import annotations

import asyncio
import os

import pytest
from hostile import ATTACKS, FULL, QUICK, Attack, run_attack, table_header, table_row

SCALE = FULL if os.environ.get("PEDELEC_LONG") == "1" else QUICK


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_costs_no_one_else(attack: Attack) -> None:
    bound = SCALE.deadline + 4 * SCALE.probes / 20 + 6 * SCALE.cap + 60
    row = asyncio.run(asyncio.wait_for(run_attack(attack, SCALE), bound))
    print(table_header())
    print(table_row(row))
    print("notes:", "; ".join(row.notes))
    assert row.passed, f"{attack.name} ({attack.what}): " + "; ".join(row.failures)
