// A small stdio MCP server for the src/mcp tests, on the official SDK:
// - `slow {ms}`: waits ms (default 60000) unless cancelled; cancellations are counted.
// - `cancelled_count`: how many `slow` calls were cancelled (notifications/cancelled).
// - `add_tool`: registers `extra` and sends notifications/tools/list_changed.
// - `extra`: returns "extra".
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

let cancelled = 0;
let extra = false;
const obj = (props = {}) => ({ type: "object", properties: props });
const server = new Server(
  { name: "clawft-test-server", version: "1.0.0" },
  { capabilities: { tools: { listChanged: true } } },
);
server.setRequestHandler(ListToolsRequestSchema, async () => ({
  tools: [
    { name: "slow", description: "Wait.", inputSchema: obj({ ms: { type: "number" } }) },
    { name: "cancelled_count", description: "Cancelled slow calls.", inputSchema: obj() },
    { name: "add_tool", description: "Add the extra tool.", inputSchema: obj() },
    ...(extra ? [{ name: "extra", description: "Extra.", inputSchema: obj() }] : []),
  ],
}));
server.setRequestHandler(CallToolRequestSchema, async (req, ctx) => {
  const text = (t) => ({ content: [{ type: "text", text: String(t) }] });
  switch (req.params.name) {
    case "slow": {
      const ms = req.params.arguments?.ms ?? 60000;
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, ms);
        ctx.signal.addEventListener("abort", () => {
          cancelled += 1;
          clearTimeout(timer);
          resolve();
        });
      });
      return text("slept");
    }
    case "cancelled_count":
      return text(cancelled);
    case "add_tool":
      extra = true;
      await server.sendToolListChanged();
      return text("added");
    case "extra":
      if (extra) return text("extra");
      break;
  }
  return { content: [{ type: "text", text: `unknown tool ${req.params.name}` }], isError: true };
});
await server.connect(new StdioServerTransport());
