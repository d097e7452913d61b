"""A Fleet-only gateway: the one address of a SuperLink that SuperNodes are given.

Flower 1.42's SuperLink serves its Fleet API (SuperNodes), its Control API (``flwr``: register
keys, start runs) and its Runtime API (the ServerApp's SuperExec) on one HTTPS port, and the
Control API's account authentication needs an external OIDC service (``FLWR_OIDC_ENABLED``, not
in the open-source distribution). A stranger who can reach that port with the public CA
certificate can therefore register a key of its own and join. This gateway closes it: the
SuperLink listens on an address only the operator reaches (loopback, or an operator-only
network), and the gateway, on the address the SuperNodes are given, terminates TLS with the
SuperLink's certificate and forwards only ``POST /v1/fleet/*`` (SuperNode authentication headers
and bodies unchanged) to the SuperLink over TLS, verified with the deployment's CA. Every other
request (``/v1/control/*``, ``/v1/runtime/*``, anything else) gets 403 and is logged.

Usage::

    python fleet_gateway.py --listen HOST:PORT --superlink 127.0.0.1:PORT \\
        --ssl-certfile server.pem --ssl-keyfile server.key --ssl-ca-certfile ca.crt

It needs only what flwr already installs (starlette, uvicorn, httpx).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import re
import ssl
import sys
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

log = logging.getLogger("fleet_gateway")

#: the only requests forwarded: the SuperNodes' Fleet API (one path segment of lower-case words after it)
FLEET_PATH = re.compile(r"/v1/fleet/[a-z][a-z-]*")
#: hop-by-hop headers (RFC 9110 7.6.1) and those httpx sets itself: not forwarded either way
_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length"}
#: the largest request body forwarded (a model is far smaller); a larger one is refused with 413
MAX_BODY = 1 << 30


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def make_app(superlink: str, ca_file: str) -> Starlette:
    """The gateway's ASGI app, forwarding Fleet API requests to ``https://superlink``."""
    context = ssl.create_default_context(cafile=ca_file)
    client = httpx.AsyncClient(base_url=f"https://{superlink}", verify=context, timeout=None)

    async def forward(request: Request) -> Response:
        path = request.url.path
        if request.method != "POST" or not FLEET_PATH.fullmatch(path):
            peer = f"{request.client.host}:{request.client.port}" if request.client else "?"
            log.warning("refused %s %s from %s: this address serves the Fleet API only", request.method, path, peer)
            return PlainTextResponse("this address serves the Fleet API only\n", status_code=403)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                return PlainTextResponse("request body too large\n", status_code=413)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP]
        query = f"?{request.url.query}" if request.url.query else ""
        try:
            reply = await client.post(path + query, content=bytes(body), headers=headers)
        except httpx.HTTPError as exc:
            log.warning("the SuperLink did not answer %s: %s", path, exc)
            return PlainTextResponse("the SuperLink did not answer\n", status_code=502)
        out = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP and k.lower() != "content-encoding"}
        return Response(reply.content, status_code=reply.status_code, headers=out)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    methods = ["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)], lifespan=lifespan)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", type=_host_port, required=True, help="HOST:PORT the SuperNodes are given")
    ap.add_argument("--superlink", required=True, help="the SuperLink's own HOST:PORT (operator-only)")
    ap.add_argument("--ssl-certfile", required=True, help="the certificate served to the SuperNodes")
    ap.add_argument("--ssl-keyfile", required=True)
    ap.add_argument("--ssl-ca-certfile", required=True, help="the CA that verifies the SuperLink's certificate")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fleet_gateway %(levelname)s: %(message)s")
    host, port = args.listen
    uvicorn.run(
        make_app(args.superlink, args.ssl_ca_certfile),
        host=host,
        port=port,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        log_level="warning",
    )


if __name__ == "__main__":
    sys.exit(main())
