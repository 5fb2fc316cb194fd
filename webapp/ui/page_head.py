"""An idle dashboard's cost, in the browser and in the server: what the page runs before Gradio's own scripts
(`HeadScript`, an ASGI middleware that puts a script first in the <head> of the page at GET /, and
`IDLE_FRAMES_JS`, the script it puts there), and how often Gradio's queue looks for work (`quiet_queue`).

Why: Gradio 6.31's status tracker counts a pending event's seconds with a requestAnimationFrame loop that only a
status change stops. The app's own "Loading..." tracker is removed while still pending, so its loop runs for as long
as the page is open, 60 callbacks a second: 5-6% of a core in headless Chromium for a page that shows nothing new
(measured on a bare gr.Blocks; 0.4% with the loop slowed). `IDLE_FRAMES_JS` runs the tracker's counter callbacks
every STATUS_TICK_MS instead of every frame (the counter shows tenths of a second), and leaves every other
animation frame alone. Gradio captures requestAnimationFrame when its modules load, which is why this cannot be
Gradio's own `js=` or `head=` (both run after). tests/webapp/test_ui_browser.py measures the page idle.

Gradio's queue, on Linux, looks for queued events every millisecond and for progress updates every 10 ms: 3% of a
core with no browser connected. `quiet_queue` makes those QUEUE_POLL_S and PROGRESS_POLL_S (its values on
Windows): an event waits at most that long to start.
"""

from __future__ import annotations

STATUS_TICK_MS = 100
QUEUE_POLL_S = 0.05
PROGRESS_POLL_S = 0.1
# A status tracker's counter callback reads `performance.now()` and divides by 1e3 (seconds): the only frames
# slowed. Were Gradio to change it, the browser test's idle CPU figure says so.
IDLE_FRAMES_JS = f"""(() => {{
    const frame = window.requestAnimationFrame.bind(window);
    const counts = (callback) => {{
        const source = Function.prototype.toString.call(callback);
        return source.includes("performance.now()") && source.includes("/1e3");
    }};
    window.requestAnimationFrame = (callback) => counts(callback)
        ? setTimeout(() => callback(performance.now()), {STATUS_TICK_MS})
        : frame(callback);
}})();"""


class HeadScript:
    """ASGI middleware: `script` inserted first in the <head> of the HTML page served at GET /, so that it runs
    before any script of the page (the response's Content-Length follows)."""

    def __init__(self, app, script: str):
        self.app = app
        self.tag = f"<script>{script}</script>".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] != "/":
            await self.app(scope, receive, send)
            return
        started: dict = {}
        body: list[bytes] = []

        async def rewrite(message):
            if message["type"] == "http.response.start":
                started.update(message)
                return
            if message["type"] != "http.response.body":
                await send(message)
                return
            body.append(message.get("body", b""))
            if message.get("more_body"):
                return
            page = b"".join(body)
            headers = [(k, v) for k, v in started.get("headers", []) if k.lower() != b"content-length"]
            if any(k.lower() == b"content-type" and v.startswith(b"text/html") for k, v in headers):
                page = page.replace(b"<head>", b"<head>" + self.tag, 1)
            await send({**started, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
            await send({"type": "http.response.body", "body": page})

        await self.app(scope, receive, rewrite)


def quiet_queue(blocks) -> None:
    """Gradio's queue of `blocks` (after its `queue()`) polling every QUEUE_POLL_S / PROGRESS_POLL_S, not 1 / 10 ms."""
    queue = blocks._queue  # the attributes Gradio sets per platform (gradio/queueing.py)
    queue.sleep_when_free = QUEUE_POLL_S
    queue.progress_update_sleep_when_free = PROGRESS_POLL_S
