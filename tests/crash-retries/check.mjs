// Checks tests/e2e/crash-retries.js: a test that passes again after a renderer crash
// passes the run (the crash listed); one that fails for any other reason fails it, even
// when it passes again. Run: node tests/crash-retries/check.mjs
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

const config = fileURLToPath(new URL("playwright.config.js", import.meta.url));
const expected = [
  ["passes", 0, null],
  ["crashes-once", 0, /renderer crashed under first-attempt\.spec\.js:3 first attempt/],
  ["fails-once", 1, /other than a renderer crash[\s\S]*first attempt: Error: expect\(received\)/],
  ["fails", 1, null],
];
let failed = 0;
for (const [mode, status, output] of expected) {
  const run = spawnSync("npx", ["playwright", "test", "--config", config], {
    env: { ...process.env, MODE: mode }, encoding: "utf8", timeout: 120_000,
  });
  const text = `${run.stdout}${run.stderr}`;
  const ok = run.status === status && (output === null || output.test(text));
  console.log(`${ok ? "ok  " : "FAIL"} ${mode}: exit ${run.status} (expected ${status})`);
  if (!ok) {
    failed += 1;
    console.log(text);
  }
}
process.exit(failed ? 1 : 0);
