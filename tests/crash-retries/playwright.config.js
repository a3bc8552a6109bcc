// The check of tests/e2e/crash-retries.js (run by check.mjs): one test, failing on its
// first attempt the way $MODE says, in Debian's chromium as the e2e suite runs it.
import { defineConfig } from "@playwright/test";

export default defineConfig({
  testDir: ".",
  retries: 1,
  workers: 1,
  outputDir: "../../.cache/crash-retries-results",
  reporter: [["../e2e/crash-retries.js"]],
  use: {
    browserName: "chromium",
    launchOptions: { executablePath: "/usr/bin/chromium", args: ["--no-sandbox", "--disable-gpu"] },
  },
});
