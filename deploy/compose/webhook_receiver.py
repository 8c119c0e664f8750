"""The compose file's webhook receiver: checks MailRelay's signature, prints each message, answers 204.

Standard library and mailrelay.verify_signature only; a stand-in for your own endpoint (docs/deployment.md).
"""

import json
import os
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mailrelay import verify_signature

SECRET = os.environ["WEBHOOK_SECRET"]
MAX_BODY = 64 * 1024 * 1024


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            self.send_response(413)
            self.end_headers()
            return
        body = self.rfile.read(length)
        signed = verify_signature(
            SECRET,
            timestamp=self.headers.get("X-MailRelay-Timestamp", ""),
            signature=self.headers.get("X-MailRelay-Signature-256", ""),
            body=body,
            now=time.time(),
        )
        if not signed:
            self.send_response(401)
            self.end_headers()
            return
        message = json.loads(body)
        print(
            json.dumps({"delivery_id": self.headers.get("X-MailRelay-Delivery-Id"), "subject": message.get("subject")})
        )
        self.send_response(204)
        self.end_headers()


if __name__ == "__main__":
    ThreadingHTTPServer(("0.0.0.0", 9000), Receiver).serve_forever()
