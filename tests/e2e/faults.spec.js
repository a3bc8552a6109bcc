// Fault injection on real pages: parallel tool calls through Core's control API while the
// page is reloaded or its WebSocket dropped at seeded random moments. Invariants: every
// call gets exactly one result (the handler's value, or TOOL_OUTCOME_UNKNOWN for a side
// effect a reload interrupted); the side-effecting tool never runs twice for one call
// (run counts per call key in localStorage); the page ends idle. Seed: PEDELEC_FAULT_SEED.
import { expect, test } from "@playwright/test";
import { app, callTool, openPage, runPython, waitForReady, waitForState } from "./helpers.js";

function mulberry32(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test("reloads and drops during parallel calls: nothing lost, no side effect twice", async ({ page }) => {
  test.setTimeout(120_000);
  const seed = Number(process.env.PEDELEC_FAULT_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`fault seed ${seed} (PEDELEC_FAULT_SEED=${seed} to run it again)`);
  const rand = mulberry32(seed);
  const { sessionId } = await openPage(page, `${app.url}/faults.html`);
  const faults = { reload: 0, drop: 0 };
  const results = { ok: 0, TOOL_OUTCOME_UNKNOWN: 0 };
  const calls = [];
  for (let round = 0; round < 6; round++) {
    const batch = [];
    for (let i = 0; i < 5; i++) {
      const tool = rand() < 0.6 ? "w" : "r";
      const key = `${seed}-${round}-${i}`;
      batch.push({ tool, key, answer: callTool(app, sessionId, tool, { key }, { timeoutMs: 30_000 }) });
    }
    calls.push(...batch);
    await page.waitForTimeout(Math.floor(rand() * 150));
    if (rand() < 0.5) {
      faults.reload++;
      await page.reload();
      await waitForReady(page);
    } else {
      faults.drop++;
      // Drop a live connection: the previous drop's reconnect may still be backing off.
      await runPython(page, [
        "import asyncio",
        "from pedelec_pyodide.browser import bridge_of",
        "for _ in range(500):",
        "    if session.connected:",
        "        break",
        "    await asyncio.sleep(0.01)",
        "bridge_of(session)._socket.close()",
      ].join("\n"));
    }
    for (const call of batch) call.response = await call.answer;
  }
  await waitForState(page, "idle");
  const runs = await page.evaluate(() => Object.fromEntries(
    Object.keys(localStorage).filter((k) => k.startsWith("faults:")).map((k) => [k, Number(localStorage.getItem(k))])));
  for (const { tool, key, response } of calls) {
    const result = response.result;
    const count = runs[`faults:${tool}:${key}`] ?? 0;
    if (result.error) {
      expect(result.error.code, `${tool} ${key}`).toBe("TOOL_OUTCOME_UNKNOWN");
      expect(tool).toBe("w");
      expect(count).toBe(1);
      results.TOOL_OUTCOME_UNKNOWN++;
    } else {
      expect(result).toEqual({ tool, key });
      expect(count, `${tool} ${key} ran`).toBeGreaterThanOrEqual(1);
      results.ok++;
    }
    if (tool === "w") expect(count, `w ${key} ran twice`).toBeLessThanOrEqual(1);
  }
  console.log(`faults ${JSON.stringify(faults)}; calls ${calls.length}; results ${JSON.stringify(results)}`);
});
