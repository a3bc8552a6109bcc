// The official MCP TypeScript SDK as a client of Core's MCP endpoint, for tests/core/test_mcp.py.
//   node mcp_ts_client.mjs URL TOKEN TOOL [cancel]
// Calls TOOL with an onprogress callback; writes one JSON line per event on stdout:
// {"called": true} once the call is sent, {"progress": {...}} for each notification, then
// {"result": {...}}; with "cancel", aborts the call at its first progress ({"aborted": "..."}).
// The client stays connected until its stdin ends (as a live client would).
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, tool, mode] = process.argv.slice(2);
const say = (line) => process.stdout.write(`${JSON.stringify(line)}\n`);

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "pedelec-test", version: "1.0.0" });
await client.connect(transport);
const abort = new AbortController();
const call = client.callTool({ name: tool, arguments: {} }, undefined, {
  signal: abort.signal,
  timeout: 30_000,
  onprogress: (progress) => {
    say({ progress });
    if (mode === "cancel") abort.abort("the user stopped it");
  },
});
say({ called: true });
try {
  const result = await call;
  say({ result });
} catch (error) {
  say({ aborted: String(error) });
}
for await (const _ of process.stdin);
await client.close();
