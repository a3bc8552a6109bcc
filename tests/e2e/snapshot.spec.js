// The memory snapshot (issue 12): a page restored from it is the page a boot gives, and any
// snapshot that does not fit (stale, another build) is detected and the page starts the
// usual way with a console note. Run with the snapshot on (PEDELEC_E2E_SNAPSHOT unset);
// with it off, only the tests that need no snapshot run.
import { expect, test } from "@playwright/test";
import { SNAPSHOT, app, callTool, consoleOf, openPage, runPython } from "./helpers.js";

const PAGE = `${app.url}/snapshot.html`;
const NOTE = "pedelec: starting without the memory snapshot";

async function state(page, url) {
  const { sessionId } = await openPage(page, url);
  const snapshot = await page.evaluate(() => window.pedelec.snapshot);
  return { sessionId, snapshot, ...JSON.parse(await runPython(page, "state")) };
}

test("a restored page sees what a booted one does, with fresh random and its own packages", async ({ page, context }) => {
  test.skip(!SNAPSHOT, "needs the snapshot");
  const restored = await state(page, PAGE);
  const again = await state(await context.newPage(), PAGE);
  const booted = await state(await context.newPage(), `${PAGE}?snapshot=off`);
  expect([restored.snapshot, again.snapshot, booted.snapshot]).toEqual([true, true, false]);
  for (const key of ["executable", "environ", "locale"]) expect(restored[key], key).toEqual(booted[key]);
  expect(restored.environ.LANG).toMatch(/^[a-z]{2}(_[A-Z]{2})?\.UTF-8$/); // the browser's, not Node's C.UTF-8
  expect(restored.random).not.toBe(again.random); // reseeded: not the snapshot's sequence
  // the wheels' files are back: jsonschema reads its metaschemas from them at the first check
  const bad = await callTool(app, restored.sessionId, "bump", { delta: "x" });
  expect(bad.result.error.code).toBe("INVALID_ARGS");
  expect((await callTool(app, restored.sessionId, "bump", { delta: 1 })).result).toEqual({ value: 2 });
  // the page's own data-packages still install after a restore
  expect(await runPython(page, "import micropip; micropip.__name__")).toBe("micropip");
  expect(await page.evaluate(() => Object.keys(window.pedelec.pyodide.loadedPackages).sort()))
    .toEqual(expect.arrayContaining(["attrs", "jsonschema", "micropip", "pedelec-pyodide", "pyrsistent"]));
});

test("data-snapshot=\"off\" does not fetch it", async ({ page }) => {
  const requested = [];
  page.on("request", (r) => { if (r.url().includes("pedelec-snapshot")) requested.push(r.url()); });
  const lines = consoleOf(page);
  const booted = await state(page, `${PAGE}?snapshot=off`);
  expect(booted.snapshot).toBe(false);
  expect(requested).toEqual([]);
  expect(lines.filter((l) => l.text.startsWith(NOTE))).toEqual([]);
});

test("a stale snapshot (another wheel than the lock's) is not used", async ({ page }) => {
  test.skip(!SNAPSHOT, "needs the snapshot");
  await page.route("**/pedelec-snapshot.json", async (route) => {
    const manifest = await (await route.fetch()).json();
    manifest.packages.jsonschema = "0".repeat(64);
    await route.fulfill({ json: manifest });
  });
  const lines = consoleOf(page);
  const booted = await state(page, PAGE);
  expect(booted.snapshot).toBe(false);
  const note = lines.find((l) => l.text.startsWith(NOTE));
  expect(note?.type).toBe("warning");
  expect(note?.text).toContain("another jsonschema");
  expect((await callTool(app, booted.sessionId, "bump", { delta: 1 })).result).toEqual({ value: 2 });
});

test("a snapshot of another Pyodide build is refused by its build id", async ({ page }) => {
  test.skip(!SNAPSHOT, "needs the snapshot");
  await page.route("**/pedelec-snapshot.bin", async (route) => {
    const bytes = await (await route.fetch()).body(); // decoded
    bytes[16] ^= 0xff; // the build id's first byte
    await route.fulfill({ body: bytes, contentType: "application/octet-stream" });
  });
  const lines = consoleOf(page);
  const booted = await state(page, PAGE);
  expect(booted.snapshot).toBe(false);
  const note = lines.find((l) => l.text.startsWith(NOTE));
  expect(note?.type).toBe("warning");
  expect(note?.text).toContain("build id mismatch");
  expect((await callTool(app, booted.sessionId, "bump", { delta: 1 })).result).toEqual({ value: 2 });
});

test("without a snapshot on Core the page starts the usual way, with an info note", async ({ page }) => {
  if (SNAPSHOT) await page.route("**/pedelec-snapshot.*", (route) => route.fulfill({ status: 404, body: "none" }));
  const lines = consoleOf(page);
  const booted = await state(page, PAGE);
  expect(booted.snapshot).toBe(false);
  const note = lines.find((l) => l.text.startsWith(NOTE));
  expect(note?.type).toBe("info");
  expect(note?.text).toContain("HTTP 404");
});

test("a snapshot cut short (a half-written file) is detected before Pyodide restores it", async ({ page }) => {
  test.skip(!SNAPSHOT, "needs the snapshot");
  await page.route("**/pedelec-snapshot.bin", async (route) => {
    const bytes = await (await route.fetch()).body(); // decoded, header intact
    await route.fulfill({ body: bytes.subarray(0, bytes.length >> 1), contentType: "application/octet-stream" });
  });
  const lines = consoleOf(page);
  const booted = await state(page, PAGE);
  expect(booted.snapshot).toBe(false);
  const note = lines.find((l) => l.text.startsWith(NOTE));
  expect(note?.type).toBe("warning");
  expect((await callTool(app, booted.sessionId, "bump", { delta: 1 })).result).toEqual({ value: 2 });
});

test("a page whose data-packages name a package in the snapshot is restored and works", async ({ page }) => {
  test.skip(!SNAPSHOT, "needs the snapshot");
  const lines = consoleOf(page);
  const restored = await state(page, `${PAGE}?packages=jsonschema,attrs,micropip`);
  expect(restored.snapshot).toBe(true);
  expect(lines.filter((l) => l.type === "warning" || l.type === "error").map((l) => l.text)).toEqual([]);
  const bad = await callTool(app, restored.sessionId, "bump", { delta: "x" });
  expect(bad.result.error.code).toBe("INVALID_ARGS");
  expect((await callTool(app, restored.sessionId, "bump", { delta: 1 })).result).toEqual({ value: 2 });
});

// An async handler's first step runs in the JS task its request arrived in (no turn of the
// loop spent), except where Pyodide can switch stacks (JSPI, no snapshot): there a handler
// may suspend on a JS promise before its first await, which it can only in a loop turn.
const SUSPENDS = `
import js
from pyodide.ffi import run_sync
from pedelec_pyodide import define_tool

@define_tool
async def suspends() -> str:
    """Wait 20 ms for a JS promise, synchronously, before any await."""
    run_sync(js.Promise.new(lambda resolve, reject: js.setTimeout(resolve, 20)))
    return "resumed"

session.add_tool(suspends)
session._scheduler.eager
`;

for (const snapshot of ["on", "off"]) {
  test(`an async handler's first step: at once, or in a turn of the loop where it may suspend (snapshot ${snapshot})`, async ({ page }) => {
    test.skip(snapshot === "on" && !SNAPSHOT, "needs the snapshot");
    const { sessionId } = await state(page, snapshot === "on" ? PAGE : `${PAGE}?snapshot=off`);
    const eager = await runPython(page, SUSPENDS);
    // a runtime restored from the snapshot (made under Node, without JSPI) cannot suspend;
    // a booted one can where the browser has JSPI (Chromium 137+)
    const jspi = snapshot === "off" && await page.evaluate(() => typeof WebAssembly.Suspending === "function");
    expect(eager).toBe(!jspi);
    const { result } = await callTool(app, sessionId, "suspends", {});
    if (jspi) expect(result).toBe("resumed");
    else expect(result.error.message).toContain("not supported in this JavaScript runtime");
  });
}
