"""`strata-lab proxy --upstream URL --dump calls.jsonl`: the command (parser and handler)."""
from __future__ import annotations

import argparse
import sys

__all__ = ["add_parser", "serve"]


def add_parser(sub) -> None:
    from strata_lab.proxy.engines import ENGINE_NAMES

    p = sub.add_parser(
        "proxy", help="record any engine: a proxy that writes the engine's own ids and cache figures",
        description="Forward every request to --upstream unchanged and write one strata-dump/1 line per LLM call "
                    "(/v1/chat/completions, /v1/completions, /v1/responses, /v1/messages, llama.cpp /completion; "
                    "streamed or not): the engine's prompt and reply ids where it returns them (asked for by the "
                    "proxy and taken out of the answer again, so the client gets the upstream's answer), its "
                    "reported cached tokens, timings, the upstream's identity and the session (X-Session-Id, "
                    "metadata.session_id, user, else chained). API keys pass through and are never written.",
        epilog="Replay the dump with `strata-lab replay calls.jsonl`: predicted vs reported cached tokens per call. "
               "See docs/RECORD_YOUR_ENGINE.md.")
    p.add_argument("--upstream", required=True, help="the engine's base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--dump", required=True, help="append a strata-dump/1 line per call here (a directory or a path "
                                                 "ending in /: a Parquet store, as serve --dump)")
    p.add_argument("--engine", default="auto", choices=("auto",) + ENGINE_NAMES,
                   help="what the upstream is (default auto: asked with GET /v1/models, /version, /props, "
                        "/get_server_info); strata is strata-lab serve")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8090, help="port to listen on (default 8090)")
    p.add_argument("--max-body", type=int, default=32 << 20, help="request body limit in bytes (413 past it)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds the upstream may take to answer")
    p.set_defaults(func=_cmd_proxy)


def serve(config, *, ready=None) -> None:
    """Probe the upstream, open the dump, serve until interrupted."""
    import uvicorn

    from strata_lab.dump.writer import Recorder, StoreRecorder
    from strata_lab.proxy.app import create_app, probe_upstream

    path = config.dump
    import os

    writer = StoreRecorder(path) if path.endswith(("/", os.sep)) or os.path.isdir(path) else \
        Recorder(path, on_error="count")
    try:
        upstream = probe_upstream(config.upstream, config.engine)
    except BaseException:
        writer.close()
        raise
    app = create_app(config, upstream, writer)
    ident = ", ".join(f"{k} {v}" for k, v in upstream.identity().items() if k != "flags")
    print(f"strata-lab proxy: http://{config.host}:{config.port} -> {config.upstream} ({ident}); "
          f"recording to {path}", file=sys.stderr, flush=True)
    # uvicorn picks httptools and uvloop where installed (the server extra); the upstream's own date and server
    # headers pass through, so uvicorn adds none of its own
    uvicorn.run(app, host=config.host, port=config.port, log_level="warning", server_header=False,
                date_header=False)


def _cmd_proxy(args: argparse.Namespace) -> int:
    from strata_lab.proxy.app import ProxyConfig

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be positive, got {args.timeout}")
    if args.max_body <= 0:
        raise ValueError(f"--max-body must be positive, got {args.max_body}")
    serve(ProxyConfig(upstream=args.upstream, dump=args.dump, engine=args.engine, host=args.host, port=args.port,
                      max_body=args.max_body, timeout=args.timeout))
    return 0
