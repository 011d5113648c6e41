"""The stdlib HTTP handler the test servers share: quiet, and a JSON reply in one call.

The test servers run as scripts (`python tests/e2e/NAME.py`), so they import it by its bare name.
"""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler


class JsonHandler(BaseHTTPRequestHandler):
    def log_message(self, *_) -> None:  # quiet: the tests read stderr for the listening line only
        pass

    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
