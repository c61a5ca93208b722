"""A real SMTP server (aiosmtpd) for the email channel's tests that delivers every accepted
message into the recipient's Maildir: <root>/<local part>/Maildir/new, owned by the mail uid
Dovecot serves them as. Recipients whose local part starts with `slow` are answered
`451 4.7.0` (a rate limit) on the first attempt of each message (a message is known by its
Message-ID, as a retry rebuilds the mail and its Date header may have moved on).

Usage: python smtp_maildir.py ROOT PORT UID GID. Prints `ready` once listening; stops when its
stdin closes (the test binary ended).
"""

import hashlib
import os
import re
import sys
import time
import uuid

from aiosmtpd.controller import Controller


class Maildir:
    def __init__(self, root, uid, gid):
        self.root = root
        self.uid = uid
        self.gid = gid
        self.throttled = set()

    def mkdirs(self, path):
        parts = []
        while not os.path.isdir(path):
            parts.append(path)
            path = os.path.dirname(path)
        for p in reversed(parts):
            os.mkdir(p, 0o700)
            os.chown(p, self.uid, self.gid)

    async def handle_DATA(self, server, session, envelope):
        data = envelope.original_content
        mid = re.search(rb"(?im)^message-id:\s*(\S+)", data)
        digest = mid.group(1) if mid else hashlib.sha256(data).hexdigest()
        slow = [r for r in envelope.rcpt_tos if r.lower().startswith("slow")]
        if slow and digest not in self.throttled:
            self.throttled.add(digest)
            return "451 4.7.0 rate limit exceeded, try again in 1 seconds"
        for rcpt in envelope.rcpt_tos:
            local = rcpt.split("@", 1)[0].lower()
            base = os.path.join(self.root, local, "Maildir")
            for d in ("tmp", "new", "cur"):
                self.mkdirs(os.path.join(base, d))
            name = "%d.%s.weft-test" % (time.time_ns(), uuid.uuid4().hex)
            tmp = os.path.join(base, "tmp", name)
            with open(tmp, "wb") as f:
                f.write(b"Return-Path: <" + envelope.mail_from.encode() + b">\r\n")
                f.write(data)
            os.chown(tmp, self.uid, self.gid)
            os.rename(tmp, os.path.join(base, "new", name))
        return "250 2.0.0 delivered"


def main():
    root, port, uid, gid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    controller = Controller(Maildir(root, uid, gid), hostname="127.0.0.1", port=port)
    controller.start()
    print("ready", flush=True)
    sys.stdin.read()
    controller.stop()


if __name__ == "__main__":
    main()
