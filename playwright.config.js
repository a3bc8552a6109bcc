// End-to-end tests in real Chromium (Debian's /usr/bin/chromium; never downloaded).
// Two Cores on loopback, started and stopped by Playwright: one serving the test pages of
// tests/e2e/app/ (`pedelec serve --app`), one running the demo (`pedelec demo`). Both use
// the runtime provisioned into .cache/e2e/ (the same code path as `pedelec demo`), with its
// memory snapshot: pages start from it. PEDELEC_E2E_SNAPSHOT=off runs the suite against a
// runtime provisioned without one (.cache/e2e-nosnap/): pages start the usual way.
// Two projects: every spec in Chromium as it ships (where the WebMCP spec loads the MCP-B
// polyfill), and the WebMCP spec again in Chromium with WebMCP on (native document.modelContext).
// A page offers its tools to the browser the same way however it started, so the second
// project runs with the snapshot only. Specs whose pages run on a runtime of their own
// (JupyterLite's site, a fresh cache's), and those of what follows a page's start (the
// demo's UI, agents, MCP, the tutorial: helpers.js ONCE_STARTED), also run with it only.
import { defineConfig } from "@playwright/test";

export const TOKEN = "e2e-admin-token";
export const APP_PORT = Number(process.env.PEDELEC_E2E_PORT ?? 8777);
export const DEMO_PORT = APP_PORT + 1;
export const SNAPSHOT = process.env.PEDELEC_E2E_SNAPSHOT !== "off";
const OUT = SNAPSHOT ? ".cache/e2e" : ".cache/e2e-nosnap";
/** The runtime the suite's Cores serve (with or without its snapshot). */
export const PYODIDE = `${OUT}/pyodide`;
const provision = `.venv/bin/python -m pedelec_pyodide.build.provision ${OUT}${SNAPSHOT ? "" : " --no-snapshot"}`;
const env = { PEDELEC_ADMIN_TOKEN: TOKEN };
const CHROMIUM = "/usr/bin/chromium";
const ARGS = [
  "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
  "--disable-background-networking", "--disable-component-update", "--disable-sync",
];

export default defineConfig({
  testDir: "tests/e2e",
  timeout: 60_000,
  expect: { timeout: 15_000 },
  fullyParallel: true,
  workers: process.env.CI ? 2 : 4,
  // a failed test runs again, which passes the run only after a renderer crash
  // (crash-retries.js): any other failure fails it
  retries: 1,
  reporter: [["list"], ["./tests/e2e/crash-retries.js"]],
  use: { browserName: "chromium", launchOptions: { executablePath: CHROMIUM, args: ARGS } },
  projects: [
    { name: "chromium", metadata: { webmcp: "polyfill" } },
    ...(SNAPSHOT ? [{
      name: "chromium-webmcp",
      testMatch: "webmcp.spec.js",
      metadata: { webmcp: "native" },
      use: { launchOptions: { executablePath: CHROMIUM, args: [...ARGS, "--enable-features=WebMCP"] } },
    }] : []),
  ],
  webServer: [
    {
      command: `${provision} && exec .venv/bin/pedelec serve --host 127.0.0.1 --port ${APP_PORT} --app tests/e2e/app --pyodide ${PYODIDE} --tool-timeout 20000 --quiet`,
      url: `http://127.0.0.1:${APP_PORT}/pedelec/v1/health`,
      env,
      reuseExistingServer: false,
      timeout: 240_000,
    },
    {
      command: `${provision} && exec .venv/bin/pedelec demo --host 127.0.0.1 --port ${DEMO_PORT} --pyodide ${PYODIDE} --quiet`,
      url: `http://127.0.0.1:${DEMO_PORT}/pedelec/v1/health`,
      env,
      reuseExistingServer: false,
      timeout: 240_000,
    },
  ],
});
