"""Open every page of the built documentation in headless Chromium and fail on what a reader would see broken.

``python -m sphinx -W`` catches warnings, not what the theme or the browser does with the
result. This script loads each ``*.html`` of a built site (``file://``, no network) in one
headless Chromium, driven over the DevTools protocol on a pipe, waits for the page's load
event and looks at the rendered page:

* **theme error boxes**: an element whose ``::before`` or ``::after`` content says
  ``ERROR`` (Furo draws "ERROR: Adding a table of contents in Furo-based documentation is
  unnecessary ..." over a ``.. contents::`` directive with CSS, so it is not in the HTML);
* **docutils system messages**: ``.system-message`` boxes and ``.problematic`` markers
  (an inline error docutils left in the page);
* **broken images**: an ``<img>`` that did not load (``naturalWidth == 0`` after the load
  event);
* **tracebacks in executed output**: ``Traceback (most recent call last)`` in the output
  of an executed example (Sphinx-Gallery's ``.sphx-glr-script-out``) or of a ``.. plot::``;
* **requests off the machine**: any resource the page asks for that is not a local file
  (a script, stylesheet, font or image from a CDN), recorded from the browser's network
  events until the page and its maths are done, so the site reads the same without
  internet; before any browser starts, every page's HTML is also read for ``<script>``
  and ``<link>`` elements pointing off the machine (``remote script``);
* **maths**: once MathJax has finished, a formula left as raw LaTeX (``unrendered maths``:
  MathJax did not load or did not typeset it) or typeset as an error box (``maths error``).

Usage::

    python docs/check_rendered.py docs/_build/html            # exit 1 listing page: problem
    python docs/check_rendered.py docs/_build/html --browser /usr/bin/chromium

Exit status: 0 when no page has a problem, 1 when some do (each printed as
``page: kind: message``), 2 when the browser is missing or fails (the message says which) and
the HTML alone showed no remote script.
Chromium is the Debian package ``chromium`` (``apt-get install chromium``).
"""

from __future__ import annotations

import argparse
import fcntl
import html.parser
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# Run in the page after its load event; resolves to a list of [kind, message] once MathJax is done
# (or after MATHS_WAIT_MS, reported as a problem).
MATHS_WAIT_MS = 20000
PROBE = r"""
(async () => {
  const out = [];
  const maths = document.querySelectorAll('.math');
  if (maths.length && window.MathJax && MathJax.startup && MathJax.startup.promise) {
    const late = new Promise((resolve) => setTimeout(() => resolve('late'), MATHS_WAIT_MS));
    const done = await Promise.race([MathJax.startup.promise.then(() => 'done', (e) => 'failed: ' + e), late]);
    if (done !== 'done') out.push(['unrendered maths', 'MathJax did not finish: ' + done]);
  }
  const clip = (s) => (s || '').replace(/\s+/g, ' ').trim().slice(0, 240);
  for (const el of document.querySelectorAll('body *')) {
    for (const pseudo of ['::before', '::after']) {
      const c = getComputedStyle(el, pseudo).content;
      if (c && c !== 'none' && c !== 'normal' && /\bERROR\b/.test(c)) {
        out.push(['theme error box', clip(c.replace(/^"|"$/g, ''))]);
      }
    }
  }
  for (const el of document.querySelectorAll('.system-message')) {
    out.push(['docutils system message', clip(el.innerText)]);
  }
  for (const el of document.querySelectorAll('.problematic')) {
    out.push(['docutils problematic markup', clip(el.innerText)]);
  }
  for (const img of document.querySelectorAll('img')) {
    if (!img.complete || img.naturalWidth === 0) {
      out.push(['broken image', img.getAttribute('src') || '(no src)']);
    }
  }
  for (const el of maths) {
    if (!el.querySelector('mjx-container')) out.push(['unrendered maths', clip(el.textContent)]);
  }
  for (const el of document.querySelectorAll('mjx-merror')) {
    out.push(['maths error', clip(el.getAttribute('data-mjx-error') || el.textContent)]);
  }
  const outputs = document.querySelectorAll('.sphx-glr-script-out, .cell_output, .output, .plot-output');
  for (const el of outputs) {
    const text = el.innerText || '';
    const at = text.indexOf('Traceback (most recent call last)');
    if (at >= 0) out.push(['traceback in executed output', clip(text.slice(at))]);
  }
  return out;
})()
""".replace("MATHS_WAIT_MS", str(MATHS_WAIT_MS))
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")


class BrowserError(RuntimeError):
    """The browser could not be started or stopped answering."""


class Chromium:
    """One headless Chromium driven over ``--remote-debugging-pipe`` (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, executable: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="fedselect-check-rendered-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # runs in the child before exec: the pipe ends become fds 3 and 4
            # Copy both ends above fd 9 first (either may itself be fd 3 or 4), then place them;
            # dup2 onto a different number leaves the new descriptor inheritable across exec.
            high_r = fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10)
            high_w = fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        args = [
            executable,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--disable-sync",
            "--mute-audio",
            "--remote-debugging-pipe",
            f"--user-data-dir={self._profile}",
            "about:blank",
        ]
        try:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=False,
                preexec_fn=child_fds,
            )
        except OSError as exc:
            raise BrowserError(f"cannot start {executable}: {exc}") from exc
        finally:
            os.close(to_browser_r)
            os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []  # (resource type, url) of every request the page made
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Network.enable", session=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError(f"the browser did not answer within {self.timeout:.0f} s")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"the browser exited (status {self._proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if message.get("method") == "Network.requestWillBeSent":  # kept apart: other waits drop events
            params = message.get("params", {})
            self.requests.append((params.get("type") or "Other", params.get("request", {}).get("url", "")))
        return message

    def call(self, method: str, params: dict[str, Any] | None = None, *, session: bool = False) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message', reply['error'])}")
                return reply.get("result", {})
            self._events.append(reply)

    def _wait_event(self, method: str) -> None:
        deadline = time.monotonic() + self.timeout
        while True:
            for i, event in enumerate(self._events):
                if event.get("method") == method and event.get("sessionId") == self._session:
                    del self._events[: i + 1]
                    return
            self._events.clear()
            self._events.append(self._read_message(deadline))

    def problems(self, url: str) -> list[tuple[str, str]]:
        """Load ``url``, wait for its load event and its maths, and return the [kind, message] pairs found.

        Those of PROBE, then one ``request off the machine`` per request the page made for
        anything but a local file.
        """
        self._events.clear()
        self.requests.clear()
        self.call("Page.navigate", {"url": url}, session=True)
        self._wait_event("Page.loadEventFired")
        expression = {"expression": PROBE, "returnByValue": True, "awaitPromise": True}
        saved, self.timeout = self.timeout, max(self.timeout, MATHS_WAIT_MS / 1000 + 10)
        try:
            result = self.call("Runtime.evaluate", expression, session=True)
        finally:
            self.timeout = saved
        if "exceptionDetails" in result:
            raise BrowserError(f"the page check raised in {url}: {result['exceptionDetails'].get('text')}")
        found = [tuple(p) for p in result["result"]["value"]]
        remote = sorted({(kind, u) for kind, u in self.requests if not u.startswith(LOCAL_SCHEMES)})
        found += [("request off the machine", f"{kind}: {u}") for kind, u in remote]
        return found

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)


class _RemoteRefs(html.parser.HTMLParser):
    """Collects a page's ``<script src>`` and ``<link href>`` (stylesheets, preloads) that leave the machine."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = dict(attrs)
        url = attr.get("src") if tag == "script" else attr.get("href") if tag == "link" else None
        if tag == "link" and not {"stylesheet", "preload", "modulepreload", "prefetch"} & set(
            (attr.get("rel") or "").lower().split()
        ):
            return
        if url and _is_remote(url):
            self.found.append(f"<{tag}> {url}")


def _is_remote(url: str) -> bool:
    url = url.strip().lower()
    return url.startswith(("http:", "https:", "//", "ftp:", "ws:", "wss:"))


def remote_references(site: Path) -> list[tuple[str, str, str]]:
    """Every ``<script>`` and ``<link>`` of the site's pages that points off the machine, as (page, kind, url).

    Reads the HTML only (no browser), so it also runs where no browser is installed.
    """
    found: list[tuple[str, str, str]] = []
    for page in _pages(site):
        parser = _RemoteRefs()
        parser.feed(page.read_text(encoding="utf-8", errors="replace"))
        found += [(str(page.relative_to(site)), "remote script", ref) for ref in parser.found]
    return found


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "_static" not in p.relative_to(site).parts)


def find_browser(explicit: str | None) -> str | None:
    if explicit:
        return shutil.which(explicit) or (explicit if Path(explicit).is_file() else None)
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    return None


def check_site(site: Path, browser: str, *, timeout: float = 30.0) -> tuple[int, list[tuple[str, str, str]]]:
    """Check every page of ``site``; return the number of pages and the (page, kind, message) problems."""
    pages = _pages(site)
    found: list[tuple[str, str, str]] = []
    chrome = Chromium(browser, timeout=timeout)
    try:
        for page in pages:
            for kind, message in chrome.problems(page.resolve().as_uri()):
                found.append((str(page.relative_to(site)), kind, message))
    finally:
        chrome.close()
    return len(pages), found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "site",
        nargs="?",
        default=str(Path(__file__).resolve().parent / "_build" / "html"),
        help="the built HTML directory (default docs/_build/html)",
    )
    parser.add_argument("--browser", help=f"the browser executable (default: the first of {', '.join(BROWSERS)})")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for one page (default 30)")
    args = parser.parse_args(argv)
    site = Path(args.site)
    if not (site / "index.html").is_file():
        print(
            f"check_rendered: {site}/index.html does not exist; build the docs first "
            "(python -m sphinx -W --keep-going -b html docs docs/_build/html)",
            file=sys.stderr,
        )
        return 2
    remote = remote_references(site)
    for page, kind, message in remote:
        print(f"{page}: {kind}: {message}")
    browser = find_browser(args.browser)
    if browser is None:
        print(
            f"check_rendered: no browser found (looked for {args.browser or ', '.join(BROWSERS)}); "
            "on Debian: apt-get install chromium",
            file=sys.stderr,
        )
        return 1 if remote else 2
    start = time.monotonic()
    try:
        n_pages, found = check_site(site, browser, timeout=args.timeout)
    except BrowserError as exc:
        print(f"check_rendered: {browser}: {exc}", file=sys.stderr)
        return 2
    for page, kind, message in found:
        print(f"{page}: {kind}: {message}")
    found += remote
    pages_hit = len({p for p, _, _ in found})
    status = f"{len(found)} problem(s) on {pages_hit} page(s)" if found else "no problems"
    print(
        f"check_rendered: {n_pages} pages opened in {Path(browser).name} in {time.monotonic() - start:.1f} s: {status}",
        file=sys.stderr,
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
