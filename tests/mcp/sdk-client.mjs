// An MCP client on the official TypeScript SDK, to check clawft's server mode.
//   node sdk-client.mjs REPORT.json                       client over this process's stdio
//   node sdk-client.mjs REPORT.json -- weft mcp-server    client of a spawned server
// Lists the tools and makes the calls given in $CALLS (JSON: [[name, args], ...]); writes
// {server, capabilities, ping, tools: [...], results: [{name, isError, text}]} to REPORT.json
// (`server`, `ping` and `tools` are what the conformance suite's server-initialize, ping and
// tools-list scenarios look at; the suite itself only tests HTTP servers). Exit 0 on success.
import { writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";

const [report, sep, command, ...args] = process.argv.slice(2);
const transport = sep === "--"
  ? new StdioClientTransport({ command, args, stderr: "inherit" })
  : new StdioServerTransport(); // plain newline-delimited JSON over our own stdin/stdout
const client = new Client({ name: "sdk-client-check", version: "1.0.0" });
try {
  await client.connect(transport);
  const server = client.getServerVersion();
  const capabilities = client.getServerCapabilities();
  const ping = await client.ping();
  const { tools } = await client.listTools();
  const results = [];
  for (const [name, a] of JSON.parse(process.env.CALLS ?? "[]")) {
    const r = await client.callTool({ name, arguments: a });
    results.push({ name, isError: r.isError === true, text: r.content.map((c) => c.text ?? "").join("") });
  }
  writeFileSync(report, JSON.stringify({ server, capabilities, ping, tools, results }));
  await client.close();
  process.exit(0);
} catch (e) {
  process.stderr.write(`sdk-client: ${e?.stack ?? e}\n`);
  process.exit(1);
}
