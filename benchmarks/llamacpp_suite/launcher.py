#!/usr/bin/env python3
"""Stand in for `llama-server` under llama.cpp's own server test suite: map its command line onto `strata-lab serve`.

llama.cpp's tests (tools/server/tests, run by `run.py` next to this file) start the binary named by
LLAMA_SERVER_BIN_PATH with llama-server flags. This launcher translates the flags `strata-lab serve` honours and
exits with status 2 and a message naming the flag for any it cannot honour, so the tests that need that flag error
out (server process died) instead of passing against a server that ignored it.

Mapped:  --host, --port, -c/--ctx-size -> --ctx, -np/--parallel -> --slots, --api-key, -t/--threads,
         -n/--n-predict -> --max-tokens-default, --alias, --chat-template / --chat-template-file (a template our
         loader reads; an unknown name makes serve exit), --cors-origins -> --cors.
Dropped, with a line on stderr (see the results file for why each is safe to drop):
         the model (--hf-repo/--hf-file/-m/--model-url: we always serve the embedded tiny model, so tests that
         assert the stories260K model's text fail honestly); --offline (we never download); --no-slots (the
         /slots switch: ours always answers /slots); --jinja/--no-jinja (ours always renders the jinja template);
         --temp/--seed (llama-server's defaults for requests that set none: ours are temperature 1 and a fresh
         seed per request; every passing test was checked not to depend on them); -b/--batch-size and
         -ub/--ubatch-size (prompt chunking: a speed knob, no effect on any response of a generation server).
Refused as a whole: a command line with no model at all (llama-server's router mode, which picks the model a
request's `model` field names; ours serves one model and only echoes `model`).
"""
from __future__ import annotations

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# flag -> (serve flag or None to drop, takes a value)
MAPPED = {
    "--host": ("--host", True), "--port": ("--port", True),
    "-c": ("--ctx", True), "--ctx-size": ("--ctx", True),
    "-np": ("--slots", True), "--parallel": ("--slots", True),
    "--api-key": ("--api-key", True),
    "-t": ("--threads", True), "--threads": ("--threads", True),
    "-n": ("--max-tokens-default", True), "--n-predict": ("--max-tokens-default", True),
    "--alias": ("--alias", True),
    "--chat-template": ("--chat-template", True), "--chat-template-file": ("--chat-template", True),
    "--cors-origins": ("--cors", True),
}
DROPPED = {
    "--hf-repo": True, "-hfr": True, "--hf-file": True, "-hff": True, "-m": True, "--model": True,
    "--model-url": True, "-mu": True, "--offline": False, "--no-slots": False, "--jinja": False,
    "--no-jinja": False, "--temp": True, "--seed": True, "-s": True,
    # compute chunking only: how many prompt ids one engine call takes; no effect on any response
    "-b": True, "--batch-size": True, "-ub": True, "--ubatch-size": True,
}


def translate(argv: list[str]) -> list[str]:
    """llama-server's argv (without the program name) -> `strata-lab serve` argv; SystemExit(2) on a flag we
    cannot honour."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in MAPPED:
            target, takes = MAPPED[flag]
            if i + 1 >= len(argv):
                raise SystemExit(f"llamacpp_suite launcher: {flag} needs a value")
            value = argv[i + 1]
            if target == "--max-tokens-default" and int(value) < 0:
                value = "1024"  # llama-server's -1 = no limit; ours is the default cap
            out += [target, value]
            i += 2
        elif flag in DROPPED:
            takes = DROPPED[flag]
            print(f"llamacpp_suite launcher: dropping {flag}{' ' + argv[i + 1] if takes else ''}",
                  file=sys.stderr)
            i += 2 if takes else 1
        else:
            print(f"llamacpp_suite launcher: strata-lab serve cannot honour llama-server flag {flag!r}; "
                  f"refusing to start (full command line: {' '.join(argv)})", file=sys.stderr)
            raise SystemExit(2)
    return out


MODEL_FLAGS = ("--hf-repo", "-hfr", "--hf-file", "-hff", "-m", "--model", "--model-url", "-mu")


def main() -> None:
    if not any(f in sys.argv[1:] for f in MODEL_FLAGS):
        # llama-server without a model is its router: it serves the model each request's `model` field names.
        # strata-lab serve has one model and only echoes `model`, so a router test would pass on an ignored field.
        print("llamacpp_suite launcher: no model given (llama-server's router mode, one model per request's "
              "`model` field) is not supported by strata-lab serve; refusing to start", file=sys.stderr)
        raise SystemExit(2)
    args = translate(sys.argv[1:])
    sys.path.insert(0, REPO)
    os.environ["PYTHONPATH"] = REPO + os.pathsep + os.environ.get("PYTHONPATH", "")
    print(f"llamacpp_suite launcher: strata-lab serve {' '.join(args)}", file=sys.stderr, flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "strata_lab", "serve", *args])


if __name__ == "__main__":
    main()
