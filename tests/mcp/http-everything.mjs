// server-everything over streamable HTTP, bound to 127.0.0.1 on an ephemeral port (its own
// `streamableHttp` mode listens on every interface on a fixed PORT). Prints `PORT <n>` on
// stdout once listening. Used by src/mcp tests.
import { randomUUID } from "node:crypto";
import express from "express";
import { StreamableHTTPServerTransport } from "@modelcontextprotocol/sdk/server/streamableHttp.js";
import { isInitializeRequest } from "@modelcontextprotocol/sdk/types.js";
import { createServer } from "@modelcontextprotocol/server-everything/dist/server/index.js";

const app = express();
app.use(express.json());
const transports = new Map();

app.post("/mcp", async (req, res) => {
  const sid = req.headers["mcp-session-id"];
  let transport = sid ? transports.get(sid) : undefined;
  if (!transport) {
    if (sid || !isInitializeRequest(req.body)) {
      res.status(400).json({ jsonrpc: "2.0", error: { code: -32000, message: "no session" }, id: null });
      return;
    }
    const { server, cleanup } = createServer();
    transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => randomUUID(),
      onsessioninitialized: (id) => transports.set(id, transport),
    });
    transport.onclose = () => {
      if (transport.sessionId) transports.delete(transport.sessionId);
      cleanup(transport.sessionId);
    };
    await server.connect(transport);
  }
  await transport.handleRequest(req, res, req.body);
});
const byHeader = async (req, res) => {
  const t = transports.get(req.headers["mcp-session-id"]);
  if (!t) {
    res.status(400).send("no session");
    return;
  }
  await t.handleRequest(req, res);
};
app.get("/mcp", byHeader);
app.delete("/mcp", byHeader);

const listener = app.listen(0, "127.0.0.1", () => {
  console.log(`PORT ${listener.address().port}`);
});
