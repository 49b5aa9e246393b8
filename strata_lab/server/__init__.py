"""A small OpenAI/Anthropic-compatible server over the strata_lab engine.

`serve(ServerConfig(...))` runs it; `create_app(load_state(config))` gives the ASGI app. Importing this
package loads nothing heavy: FastAPI and the engine are imported when the app is built.
"""
from __future__ import annotations

from strata_lab.server.config import ServerConfig
from strata_lab.server.errors import RequestError
from strata_lab.server.request import ChatRequest, parse_anthropic, parse_openai

__all__ = ["ServerConfig", "ChatRequest", "RequestError", "parse_openai", "parse_anthropic", "serve",
           "create_app", "load_state"]


def serve(config: ServerConfig) -> None:
    """Serve until interrupted (see strata_lab.server.app.serve)."""
    from strata_lab.server.app import serve as _serve

    _serve(config)


def create_app(state):
    from strata_lab.server.app import create_app as _create

    return _create(state)


def load_state(config: ServerConfig):
    from strata_lab.server.app import load_state as _load

    return _load(config)
