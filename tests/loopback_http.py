"""The test servers' common part: an ``http.server`` served on a thread until shut down
(the registry of ``tests.registry_server``, the token endpoint of ``tests.secure_broker``)."""

from __future__ import annotations

import threading
from http.server import HTTPServer


def serve_in_thread(httpd: HTTPServer, name: str) -> threading.Thread:
    """Serve ``httpd`` on a daemon thread (polling for shutdown every 50 ms); the thread."""
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True)
    thread.start()
    return thread


def shut_down(httpd: HTTPServer, thread: threading.Thread) -> None:
    """Stop serving, close the socket, and wait for the thread."""
    httpd.shutdown()
    httpd.server_close()
    thread.join()
