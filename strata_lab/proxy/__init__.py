"""`strata-lab proxy`: a recording proxy in front of any engine (vLLM, SGLang, llama.cpp, OpenAI, Anthropic, or
`strata-lab serve`). It forwards every request to `--upstream` as it came and writes one strata-dump/1 line per
LLM call: the engine's own prompt and reply ids where it can return them (asked for by the proxy, taken out
of the answer again), its reported cache figures, timings, the upstream's identity and the session.

`engines` holds what the proxy knows about each engine, `app` the ASGI app, `cli` the command.
See docs/RECORD_YOUR_ENGINE.md.
"""
from __future__ import annotations

__all__ = ["ProxyConfig", "create_app", "probe_upstream", "serve"]


def __getattr__(name):
    if name in ("ProxyConfig", "create_app", "probe_upstream"):
        from strata_lab.proxy import app

        return getattr(app, name)
    if name == "serve":
        from strata_lab.proxy.cli import serve

        return serve
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
