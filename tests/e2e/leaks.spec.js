// No proxy leaks: 10,000 tool calls Core -> page -> Core, and sendText() turns, leave
// the number of live PyProxies (pyodide's allocation tracing) and of JS values held by
// Python (hiwire refs) where they were.
import { expect, test } from "@playwright/test";
import { app, callTool, openPage } from "./helpers.js";

test.setTimeout(300_000);

const counts = (page) => page.evaluate(() => {
  const m = window.pedelec.pyodide._module;
  window.pedelec.pyodide.runPython("import gc; gc.collect()");
  return { pyproxies: m.pyproxy_alloc_map.size, jsrefs: m._hiwire_num_refs() };
});

async function calls(sessionId, n, parallel = 16) {
  let next = 0;
  const worker = async () => {
    while (next < n) {
      next += 1;
      const { result } = await callTool(app, sessionId, "add", { a: next, b: 1 });
      if (typeof result !== "number") throw new Error(`unexpected result ${JSON.stringify(result)}`);
    }
  };
  await Promise.all(Array.from({ length: parallel }, worker));
}

test("10,000 tool calls and 200 turns create no lasting proxies", async ({ page }) => {
  const { sessionId } = await openPage(page, `${app.url}/tools.html`);
  await page.evaluate(() => window.pedelec.pyodide._module.enable_pyproxy_allocation_tracing());
  await calls(sessionId, 200); // warm up (jsonschema, caches)
  for (let i = 0; i < 20; i += 1) await page.evaluate(() => window.pedelec.session.sendText("/call add {\"a\": 1, \"b\": 2}"));
  const before = await counts(page);

  await calls(sessionId, 10_000);
  for (let i = 0; i < 200; i += 1) await page.evaluate(() => window.pedelec.session.sendText("/call add {\"a\": 1, \"b\": 2}"));

  const after = await counts(page);
  console.log(`live PyProxies ${before.pyproxies} -> ${after.pyproxies}; hiwire refs ${before.jsrefs} -> ${after.jsrefs}`);
  // a leak per call or per turn would show as thousands; allow the one or two proxies a
  // turn still in flight (its promise's callbacks) may hold at the moment of counting
  expect(after.pyproxies - before.pyproxies).toBeLessThanOrEqual(2);
  expect(after.jsrefs - before.jsrefs).toBeLessThanOrEqual(2);
});
