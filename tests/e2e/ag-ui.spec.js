// Bring your own agent: the demo's chat talks to a Pydantic AI agent served over AG-UI
// (tests/core/aguikit.py: its AGUIAdapter with an offline FunctionModel), behind a Core
// started with --agent ag-ui:URL, and that agent calls the page's Python tool.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";
import { expect, test } from "@playwright/test";
import { ONCE_STARTED, PYODIDE, SNAPSHOT, freePort, openPage, startCore } from "./helpers.js";

test.skip(!SNAPSHOT, ONCE_STARTED);


/** The Pydantic AI agent on a free loopback port: `{ url, stop() }` once it listens. */
async function startAgent() {
  const child = spawn(".venv/bin/python", ["tests/core/aguikit.py"], {
    stdio: ["ignore", "pipe", "inherit"],
  });
  const stop = () => new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once("exit", () => resolve());
    child.kill("SIGTERM");
  });
  try {
    const url = await new Promise((resolve, reject) => {
      createInterface({ input: child.stdout }).once("line", resolve);
      child.once("exit", (code) => reject(new Error(`the AG-UI agent exited (${code})`)));
      setTimeout(() => reject(new Error("the AG-UI agent did not start in 30 s")), 30_000);
    });
    return { url, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

test("the chat talks to a Pydantic AI agent over AG-UI, which calls the page's Python tool", async ({ page }) => {
  test.setTimeout(120_000);
  const agent = await startAgent();
  let core = null;
  try {
    core = await startCore({
      app: "web/demo", port: await freePort(), pedelec: ".venv/bin/pedelec", pyodide: PYODIDE,
      args: ["--agent", `ag-ui:${agent.url}`, "--quiet"], timeoutMs: 60_000,
    });
    await openPage(page, `${core.url}/`);
    await expect(page.locator("#status")).toHaveAttribute("data-state", "idle");

    await page.getByLabel("Message").fill('update_counter {"delta": 4}');
    await page.getByRole("button", { name: "Send" }).click();
    await expect(page.locator("#counter-value")).toHaveText("4");
    const row = page.locator("#log tr[data-tool=update_counter]");
    await expect(row.locator("td.result")).toHaveText('{"value":4}');
    // the agent's answer, from the result it got back in its next run
    await expect(page.locator(".msg.agent").last()).toContainText('The tool answered: {"value": 4}');
    await expect(page.getByLabel("Message")).toBeEnabled();
    await expect(page.locator("#status")).toHaveAttribute("data-state", "idle");
  } finally {
    await core?.stop();
    await agent.stop();
  }
});
