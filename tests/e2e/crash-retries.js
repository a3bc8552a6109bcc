// A failed test is run again (playwright.config.js: `retries: 1`), and its passing then
// counts only when Chromium's renderer crashed under it: a known bug of Chromium and
// Pyodide when Pyodide switches stacks (JSPI: a page started without the memory snapshot;
// pyodide/pyodide#5702, #6106), rare here (a SIGSEGV at a stack's guard page, about one
// test in several hundred) and not this project's to fix. Any other failure fails the
// run, passed again or not; each crash is listed at the end, so that none goes unseen.

const CRASHED = /\b(Target|Page) crashed\b/;
const COLOURS = /\u001b\[[0-9;]*m/g;

export default class CrashRetries {
  constructor() {
    this.crashes = [];
    this.retriedOther = [];
  }

  printsToStdio() {
    return false;
  }

  onTestEnd(test, result) {
    if (result.status === "passed" || result.status === "skipped" || result.retry >= test.retries) {
      return; // (a last attempt's failure fails the run on its own)
    }
    const where = `${test.location.file.split("/").pop()}:${test.location.line} ${test.title}`;
    const messages = result.errors.map((error) => (error.message ?? String(error.value ?? "")).replace(COLOURS, ""));
    if (messages.length > 0 && messages.some((message) => CRASHED.test(message))) {
      this.crashes.push(where);
    } else {
      this.retriedOther.push(`${where}: ${(messages[0] ?? result.status).split("\n")[0]}`);
    }
  }

  onEnd() {
    for (const where of this.crashes) {
      console.log(`Chromium's renderer crashed under ${where}; run again (tests/e2e/crash-retries.js)`);
    }
    if (this.retriedOther.length === 0) return undefined;
    console.log("Failed for a reason other than a renderer crash (a retry does not make these pass):");
    for (const line of this.retriedOther) console.log(`  ${line}`);
    return { status: "failed" };
  }
}
