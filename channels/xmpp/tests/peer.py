"""The other side of the XMPP channel's tests: a real XMPP client (slixmpp, PyPI) driven by JSON
lines on stdin, reporting what it receives as JSON lines on stdout.

argv: jid password port ca_file. In: {"send": {"to", "body", "id", "receipt": bool}},
{"subscribe": "jid"}. Out: {"ready": true}, {"message": {"from", "body", "id"}},
{"receipt": "id"}, {"subscribed": "jid"}, {"unavailable": "jid"} (a contact went offline).
"""
import asyncio
import json
import ssl
import sys

import slixmpp


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


class Peer(slixmpp.ClientXMPP):
    def __init__(self, jid, password, ca):
        super().__init__(jid, password)
        self.ssl_context = ssl.create_default_context(cafile=ca)
        self.register_plugin("xep_0184")
        self["xep_0184"].auto_ack = False
        self.add_event_handler("session_start", self.start)
        self.add_event_handler("message", self.on_message)
        self.add_event_handler("receipt_received", self.on_receipt)
        self.add_event_handler("presence_subscribed", self.on_subscribed)
        self.add_event_handler("got_offline", self.on_unavailable)

    async def start(self, _):
        self.send_presence()
        await self.get_roster()
        asyncio.get_event_loop().add_reader(sys.stdin.fileno(), self.on_line)
        out({"ready": True})

    def on_line(self):
        line = sys.stdin.readline()
        if not line:
            self.disconnect()
            return
        cmd = json.loads(line)
        if "send" in cmd:
            s = cmd["send"]
            m = self.make_message(mto=s["to"], mbody=s["body"], mtype="chat")
            m["id"] = s["id"]
            if s.get("receipt"):
                m["request_receipt"] = True
            m.send()
        elif "subscribe" in cmd:
            self.send_presence(pto=cmd["subscribe"], ptype="subscribe")

    def on_message(self, m):
        if m["type"] in ("chat", "normal") and m["body"]:
            out({"message": {"from": str(m["from"].bare), "body": m["body"], "id": m["id"]}})

    def on_receipt(self, m):
        out({"receipt": m["receipt"]})

    def on_subscribed(self, p):
        out({"subscribed": str(p["from"].bare)})

    def on_unavailable(self, p):
        if p["from"].bare != self.boundjid.bare:
            out({"unavailable": str(p["from"].bare)})


jid, password, port, ca = sys.argv[1:5]
peer = Peer(jid, password, ca)
peer.connect(("127.0.0.1", int(port)))
asyncio.get_event_loop().run_until_complete(peer.disconnected)
