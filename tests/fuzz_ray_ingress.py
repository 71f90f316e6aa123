"""The Ray Serve front end's ingress (packrat.frontends.ray_serve.PackratIngress) served by uvicorn on
loopback, its engines' deployment handle a real packrat Engine in this process (a PackratEngine
without a Ray cluster): the server test_fuzz_servers.py fuzzes in place of a cluster, whose start
and per-request hops (proxy, ingress actor, engine actor) would cost the suite far more. Ray Serve's
own HTTP proxy is not in the path: what is fuzzed is packrat's ingress and engine.

    python tests/fuzz_ray_ingress.py PROFILE PORT MAX_BODY_BYTES
"""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace

import uvicorn
from starlette.requests import Request as HttpRequest

from packrat.codec.kserve import model_metadata
from packrat.frontends.ray_serve import PackratEngine, PackratIngress
from packrat.serving.engine import Engine
from packrat.settings import Settings

MODEL = "tiny"


class LocalHandle:
    """A DeploymentHandle's calls, `handle.METHOD.remote(*args)`, answered by one engine in this process."""

    def __init__(self, engine: PackratEngine):
        self._engine = engine

    def __getattr__(self, method: str):
        target = getattr(self._engine, method)

        async def remote(*args):
            result = target(*args)
            return await result if asyncio.iscoroutine(result) else result

        return SimpleNamespace(remote=remote)


def local_engine(settings: Settings) -> PackratEngine:
    """A PackratEngine as Ray Serve builds it on a node, without Ray's runtime context."""
    engine = PackratEngine.__new__(PackratEngine)
    engine.engine = Engine(settings, ".", MODEL, max_batch=settings.max_batch, asynchronous=True)
    engine.node, engine.headers = "local", {}
    engine.metadata = model_metadata(MODEL, engine.engine.spec.inputs)
    return engine


def asgi(ingress: PackratIngress):
    """The ingress as an ASGI app, as Ray Serve's replica calls it: a Starlette request in, a response out."""
    async def app(scope, receive, send):
        if scope["type"] == "http":
            response = await ingress(HttpRequest(scope, receive))
            await response(scope, receive, send)
    return app


def main(profile: str, port: int, max_body_bytes: int) -> None:
    settings = Settings(MODEL, profiles=(profile,), max_batch=4, max_body_bytes=max_body_bytes, reconfigure=False)
    engine = local_engine(settings)
    try:
        ingress = PackratIngress(MODEL, LocalHandle(engine), settings.max_body_bytes)
        uvicorn.run(asgi(ingress), host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    finally:
        engine.engine.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
