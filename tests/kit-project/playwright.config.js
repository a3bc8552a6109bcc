// A user's project testing its own page's tools with the kit (docs/how-to/testing.md).
import { defineConfig } from "@playwright/test";
import { coreWebServer } from "pedelec-pyodide/web/testing.js";

const PORT = Number(process.env.APP_PORT ?? 8790);
const CHROMIUM = { executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] };

export default defineConfig({
  testDir: "tests",
  // the kit's waits (page start 20 s, tool call 15 s) end before this, with their message
  timeout: 30_000,
  use: {
    browserName: "chromium",
    baseURL: `http://127.0.0.1:${PORT}`,
    // any Chromium works; this is Debian's (no browser download needed)
    launchOptions: CHROMIUM,
  },
  projects: [
    // every spec; there the WebMCP spec loads the MCP-B polyfill into its pages
    { name: "chromium" },
    // the WebMCP spec again, in Chromium with its own WebMCP (document.modelContext)
    {
      name: "webmcp-native",
      testMatch: "webmcp.spec.js",
      use: { launchOptions: { ...CHROMIUM, args: [...CHROMIUM.args, "--enable-features=WebMCP"] } },
    },
  ],
  // Core on loopback serving ./public, with a fixed admin token; Playwright starts it,
  // waits until pages can load (a first start provisions Pyodide), and stops it
  webServer: coreWebServer({
    app: "public",
    port: PORT,
    token: "test-token",
    pedelec: process.env.PEDELEC ?? ".venv/bin/pedelec",  // the CLI in your virtualenv
    args: ["--quiet"],  // without it, Playwright echoes every Core event as [WebServer]
  }),
});
