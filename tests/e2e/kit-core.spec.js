// The test kit's own promises: Core counts as started only once pages can load (a fresh
// cache provisions first), a Core that cannot serve pages fails with its reason, the kit's
// waits end with the kit's message before Playwright's test timeout, runPython returns
// JSON-like values, and a user's project runs as documented.
import { execFile, spawn } from "node:child_process";
import {
  cpSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync,
} from "node:fs";
import { homedir, tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { expect, test } from "@playwright/test";
import {
  CORE_READY_TIMEOUT_MS, LOADER_TIMEOUT_MS, PAGE_START_TIMEOUT_MS, STATE_TIMEOUT_MS,
  PYODIDE, SNAPSHOT, TOOL_CALL_TIMEOUT_MS, app, coreWebServer, freePort, openPage, runPython,
  startCore,
} from "./helpers.js";
import * as kit from "../../web/testing.js";

const PEDELEC = ".venv/bin/pedelec";
const PLAYWRIGHT_DEFAULT_TEST_TIMEOUT_MS = 30_000;

/** startCore resolved where it should not have: stop that Core, report no error. */
async function failedToFail(core) {
  await core.stop();
  return null;
}

/** A cache with the downloads but no provisioned site: Core provisions on start. */
function copyCache(cache) {
  const source = process.env.PEDELEC_CACHE_DIR ?? join(homedir(), ".cache", "pedelec-pyodide");
  for (const part of ["npm", "wheels", "own"]) {
    cpSync(join(source, part), join(cache, part), { recursive: true });
  }
}


// A fresh cache's Core provisions its own runtime, with its snapshot, whichever runtime the
// suite's Cores serve: these run in the pass with the snapshot only.
const OWN_RUNTIME = "a fresh cache provisions its own runtime: run in the pass with the snapshot";

test("on a fresh cache, startCore resolves only once pages can load, and a page then starts", async ({ page }) => {
  test.skip(!SNAPSHOT, OWN_RUNTIME);
  test.setTimeout(240_000);
  // a cache with the downloads but no provisioned site: Core provisions in the background
  const cache = mkdtempSync(join(tmpdir(), "pedelec-kit-cache-"));
  copyCache(cache);
  const core = await startCore({
    app: "tests/e2e/app", port: await freePort(), pedelec: PEDELEC, args: ["--quiet"],
    env: { PEDELEC_CACHE_DIR: cache }, timeoutMs: 200_000,
  });
  try {
    // at once, no polling: the runtime is served, health says so
    expect((await fetch(`${core.url}/pedelec/pyodide/pyodide.mjs`)).status).toBe(200);
    const health = await (await fetch(`${core.url}/pedelec/v1/health`)).json();
    expect(health).toMatchObject({ status: "ok", pyodide: "ready", ready: true });
    const { sessionId } = await openPage(page, `${core.url}/classic.html`, { timeout: 60_000 });
    expect(sessionId).toBeTruthy();
  } finally {
    await core.stop();
    rmSync(cache, { recursive: true, force: true });
  }
});

test("a Core that cannot serve pages fails startCore with Core's reason, fast", async () => {
  const started = Date.now();
  const error = await startCore({
    port: await freePort(), pedelec: PEDELEC, args: ["--no-provision", "--quiet"], timeoutMs: 60_000,
  }).then(failedToFail, (e) => e);
  expect(error?.message).toContain("pages cannot load");
  expect(error.message).toContain("--pyodide DIR");  // Core's own 503 text
  expect(Date.now() - started).toBeLessThan(30_000);  // not the whole timeoutMs
});

test("callTool to a Core that is not there says so, with Core's URL", async () => {
  const core = kit.coreAt(await freePort(), "t");
  const error = await kit.callTool(core, "s1", "update_counter", { delta: 1 }).then(() => null, (e) => e);
  expect(error?.message).toContain(`pedelec test kit: Core is not reachable at ${core.url} (ECONNREFUSED)`);
});

test("a CLI that is not there says to point `pedelec` at the virtualenv's", async () => {
  const error = await startCore({ port: await freePort(), pedelec: "no-such-pedelec-cli", timeoutMs: 10_000 })
    .then(failedToFail, (e) => e);
  expect(error?.message).toContain(".venv/bin/pedelec");
});

test("a script that dies with its Core running leaves no Core behind", async () => {
  test.setTimeout(120_000);
  const port = await freePort();
  // starts a Core, says so, then dies on an uncaught error without stopping it
  const script = `
    import { startCore } from ${JSON.stringify(new URL("../../web/testing.js", import.meta.url).href)};
    const core = await startCore({ port: ${port}, pedelec: ${JSON.stringify(PEDELEC)}, pyodide: ${JSON.stringify(PYODIDE)} });
    console.log("pid " + core.process.pid);  // one string: FORCE_COLOR colours a number
    throw new Error("the script dies here");
  `;
  const { stdout, stderr, code } = await new Promise((resolve) => {
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    let err = "";
    child.stdout.on("data", (chunk) => { out += chunk; });
    child.stderr.on("data", (chunk) => { err += chunk; });
    child.once("close", (exitCode) => resolve({ stdout: out, stderr: err, code: exitCode }));  // its output all read
  });
  expect(stderr).toContain("the script dies here");
  expect(code).not.toBe(0);
  const pid = Number(/pid (\d+)/.exec(stdout)?.[1]);
  expect(pid, stderr).toBeGreaterThan(0);
  const alive = () => {  // a zombie (exited, not yet reaped by whoever adopted it) is gone
    try {
      return readFileSync(`/proc/${pid}/stat`, "utf8").split(") ").pop()[0] !== "Z";
    } catch {
      return false;
    }
  };
  for (let i = 0; i < 100 && alive(); i += 1) await new Promise((r) => setTimeout(r, 100));
  const outlived = alive();
  if (outlived) process.kill(pid, "SIGTERM");  // this test's Core all the same
  expect(outlived, "Core outlived the script that started it").toBe(false);
});

test("coreWebServer's command: ready when pages can load, a clear exit when they cannot", async () => {
  // as Playwright runs it: a shell in its own process group, stopped by a signal to the group
  const run = (entry) => new Promise((resolve) => {
    const child = spawn("sh", ["-c", entry.command], { env: { ...process.env, ...entry.env }, detached: true });
    let stdout = "";
    let stderr = "";
    const stop = () => { try { process.kill(-child.pid, "SIGTERM"); } catch { /* gone */ } };
    const timer = setTimeout(stop, 60_000);
    child.stderr.on("data", (chunk) => { stderr += chunk; });
    child.stdout.on("data", (chunk) => {
      stdout += chunk;
      if (stdout.includes("Core is ready")) stop();
    });
    child.once("close", (code) => { clearTimeout(timer); resolve({ code, stdout, stderr }); });
  });
  const entry = coreWebServer({ port: await freePort(), pedelec: PEDELEC, args: ["--no-provision", "--quiet"] });
  expect(entry.url).toMatch(/\/pedelec\/pyodide\/pyodide\.mjs$/);
  expect(entry.timeout).toBeGreaterThan(CORE_READY_TIMEOUT_MS);  // the kit's message comes first
  const refused = await run(entry);
  expect(refused.code).toBe(1);
  expect(refused.stderr).toContain("pages cannot load");

  const ready = await run(coreWebServer({
    port: await freePort(), pedelec: PEDELEC, pyodide: PYODIDE, args: ["--quiet"],
  }));
  expect(ready.stdout).toContain("pedelec test kit: Core is ready at http://127.0.0.1:");
});

test("the kit's waits end before Playwright's default test timeout, with the kit's message", async ({ page }) => {
  for (const wait of [PAGE_START_TIMEOUT_MS, TOOL_CALL_TIMEOUT_MS, STATE_TIMEOUT_MS]) {
    expect(wait).toBeLessThan(PLAYWRIGHT_DEFAULT_TEST_TIMEOUT_MS);
  }
  expect(LOADER_TIMEOUT_MS).toBeLessThan(PAGE_START_TIMEOUT_MS);
  // a page whose script tag points nowhere: no window.pedelecReady, ever
  await page.route("http://kit.invalid/**", (route) => route.fulfill({
    contentType: "text/html",
    body: '<script type="module" src="http://127.0.0.1:9/pedelec/pedelec-pyodide.js"></script>',
  }));
  const error = await openPage(page, "http://kit.invalid/", { timeout: 3_000 }).then(() => null, (e) => e);
  expect(error?.message).toContain("window.pedelecReady is not defined");
  expect(error.message).toContain('src="/pedelec/pedelec-pyodide.js"');
});

test("runPython returns JSON-like values; a Python object stays in the namespace", async ({ page }) => {
  await openPage(page, `${app.url}/tools.html`);
  expect(await runPython(page, "1 + 1")).toBe(2);
  expect(await runPython(page, "{'a': [1, (2, 'x')], 'b': None}")).toEqual({ a: [1, [2, "x"]], b: null });
  expect(await runPython(page, "x = 1")).toBeUndefined();
  // a disposer has no JSON form: undefined, so keep it in the namespace (the documented way)
  expect(await runPython(page, "session.on_tool(lambda tool: 'fallback')")).toBeUndefined();
  await runPython(page, "dispose_fallback = session.on_tool(lambda tool: 'fallback')");
  expect(await runPython(page, "callable(dispose_fallback)")).toBe(true);
  await runPython(page, "dispose_fallback()");
  expect(kit.runPython).toBe(runPython);
});

test("a user's project: the kit from the checkout by `npm install`, its Playwright run on a fresh cache, its pytest", async () => {
  test.skip(!SNAPSHOT, OWN_RUNTIME);
  test.setTimeout(300_000);
  const repo = process.cwd();
  const project = mkdtempSync(join(tmpdir(), "pedelec-kit-project-"));
  const cache = mkdtempSync(join(tmpdir(), "pedelec-kit-cache-"));
  const run = (command, args, env = {}) => new Promise((resolve) => {
    execFile(command, args, { cwd: project, env: { ...process.env, ...env }, timeout: 240_000, maxBuffer: 1 << 24 },
      (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, output: `${stdout}\n${stderr}` }));
  });
  try {
    cpSync(join(repo, "tests/kit-project"), project, { recursive: true });
    copyCache(cache);
    // the documented way to depend on a checkout (no registry serves pedelec-pyodide);
    // offline, so without the project's other (registry) dependencies
    const manifest = join(project, "package.json");
    const { devDependencies, ...bare } = JSON.parse(readFileSync(manifest, "utf8"));
    expect(devDependencies["pedelec-pyodide"]).toMatch(/^file:/);
    writeFileSync(manifest, JSON.stringify(bare));
    const installed = await run("npm", ["install", "--offline", "--no-audit", "--no-fund", "--save-dev", repo]);
    expect(installed.code, installed.output).toBe(0);
    expect(JSON.parse(readFileSync(manifest, "utf8")).devDependencies["pedelec-pyodide"]).toMatch(/^file:/);
    expect(realpathSync(join(project, "node_modules/pedelec-pyodide"))).toBe(realpathSync(repo));
    // Playwright itself and the WebMCP polyfill: this checkout's copies (no download in a test)
    for (const pkg of ["@playwright/test", "playwright", "playwright-core", "@mcp-b/webmcp-polyfill"]) {
      mkdirSync(dirname(join(project, "node_modules", pkg)), { recursive: true });
      symlinkSync(join(repo, "node_modules", pkg), join(project, "node_modules", pkg));
    }
    const e2e = await run(process.execPath, [join(repo, "node_modules/@playwright/test/cli.js"), "test", "--reporter=line"], {
      APP_PORT: String(await freePort()), PEDELEC: join(repo, ".venv/bin/pedelec"), PEDELEC_CACHE_DIR: cache, CI: "",
    });
    expect(e2e.code, e2e.output).toBe(0);
    // counter.spec.js, and webmcp.spec.js with the polyfill and with Chromium's own WebMCP
    expect(e2e.output).toContain("3 passed");
    const unit = await run(join(repo, ".venv/bin/pytest"), ["-q", "-p", "no:cacheprovider"]);
    expect(unit.code, unit.output).toBe(0);
    expect(unit.output).toContain("1 passed");
  } finally {
    rmSync(project, { recursive: true, force: true });
    rmSync(cache, { recursive: true, force: true });
  }
});
