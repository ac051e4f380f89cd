"""`prefill lab`: open the lesson page in a browser once the server answers."""

from __future__ import annotations

import threading
import time
import urllib.request
import webbrowser
from collections.abc import Callable


def open_when_up(url: str, opened: Callable[[bool], None], timeout_s: float = 60.0) -> threading.Thread:
    """On a background thread: wait until `url` answers, then open it; `opened(False)` when no browser can be
    opened (a server without a display), so the caller can print the URL instead."""

    def wait_and_open() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2):
                    break
            except OSError:
                time.sleep(0.2)
        try:
            ok = webbrowser.open(url)
        except webbrowser.Error:
            ok = False
        opened(ok)

    thread = threading.Thread(target=wait_and_open, name="open-browser", daemon=True)
    thread.start()
    return thread
