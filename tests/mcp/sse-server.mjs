// A legacy (2024-11-05) HTTP+SSE MCP server for the src/mcp tests, on the SDK's
// SSEServerTransport: `GET /sse` opens the event stream (first event: `endpoint`),
// `POST /messages?sessionId=...` carries the client's messages. Only these two routes exist,
// so a streamable-HTTP `POST /sse` gets 404 like from a real legacy-only server.
// Binds 127.0.0.1 on the port given as argv[2] (default: ephemeral); prints `PORT <n>`.
// Tools:
// - `echo {message}`: returns "Echo: <message>".
// - `add {a, b}`: returns the sum.
// - `slow {ms}`: answers after ms milliseconds (default 60000).
// - `exit`: the process exits (a server dying mid-session).
import express from "express";
import { Server } from "@modelcontextprotocol/sdk/server/index.js";
import { SSEServerTransport } from "@modelcontextprotocol/sdk/server/sse.js";
import { CallToolRequestSchema, ListToolsRequestSchema } from "@modelcontextprotocol/sdk/types.js";

const obj = (props = {}, required = []) => ({ type: "object", properties: props, required });
const text = (t) => ({ content: [{ type: "text", text: String(t) }] });

function makeServer() {
  const server = new Server(
    { name: "clawft-sse-test-server", version: "1.0.0" },
    { capabilities: { tools: {} } },
  );
  server.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: [
      { name: "echo", description: "Echo.", inputSchema: obj({ message: { type: "string" } }, ["message"]) },
      { name: "add", description: "Add.", inputSchema: obj({ a: { type: "number" }, b: { type: "number" } }, ["a", "b"]) },
      { name: "slow", description: "Wait.", inputSchema: obj({ ms: { type: "number" } }) },
      { name: "exit", description: "Exit the process.", inputSchema: obj() },
    ],
  }));
  server.setRequestHandler(CallToolRequestSchema, async (req) => {
    const args = req.params.arguments ?? {};
    switch (req.params.name) {
      case "echo":
        return text(`Echo: ${args.message}`);
      case "add":
        return text(Number(args.a) + Number(args.b));
      case "slow":
        await new Promise((resolve) => setTimeout(resolve, args.ms ?? 60000));
        return text("slept");
      case "exit":
        setTimeout(() => process.exit(0), 50);
        return text("bye");
      default:
        throw new Error(`unknown tool ${req.params.name}`);
    }
  });
  return server;
}

const app = express();
const transports = new Map();

app.get("/sse", async (req, res) => {
  const transport = new SSEServerTransport("/messages", res);
  transports.set(transport.sessionId, transport);
  res.on("close", () => transports.delete(transport.sessionId));
  await makeServer().connect(transport);
});
app.post("/messages", express.json(), async (req, res) => {
  const t = transports.get(String(req.query.sessionId));
  if (!t) {
    res.status(404).send("no session");
    return;
  }
  await t.handlePostMessage(req, res, req.body);
});

const listener = app.listen(Number(process.argv[2] ?? 0), "127.0.0.1", () => {
  console.log(`PORT ${listener.address().port}`);
});
