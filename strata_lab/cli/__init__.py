"""The `strata-lab` command line: the parser and `main`. Each subcommand's handler (in `commands` and
`analysis`) imports what it needs when it runs."""
from __future__ import annotations

import argparse
import sys

from strata_lab.cli.analysis import (_cmd_convert, _cmd_import, _cmd_lint, _cmd_replay)
from strata_lab.cli.production import add_parsers as _production_parsers
from strata_lab.cli.commands import (API_KEY_ENV, _cmd_demo, _cmd_record, _cmd_reproduce, _cmd_serve, _cmd_template,
                                     _cmd_tokenize)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="strata-lab",
        description="Understand and fix prompt re-reading in LLM serving.")
    parser.add_argument("--version", action="version", version=f"strata-lab {__import__('strata_lab').__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("tokenize", help="show the ids and pieces of a text")
    p.add_argument("text", nargs="?", help="text to tokenize (default: standard input)")
    p.add_argument("--tokenizer", default="qwen3", help="qwen3, qwen3.5, or a tokenizer.json / model dir")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_cmd_tokenize)

    from strata_lab.traces.log_calls import CHAINING_RULE

    p = sub.add_parser("import", help="read a log (OpenAI, Anthropic, OTel, Claude Code, Codex, HAR, proxy captures, "
                                      "OpenAI Batch, vLLM, SGLang, llama.cpp, ShareGPT) into a trace table or a "
                                      "strata-dump/1 file",
                       epilog=CHAINING_RULE + " Formats and what each keeps or loses: docs/FORMATS.md.")
    p.add_argument("log", nargs="+", help="log files, a directory or a glob")
    p.add_argument("--format", help="reader name (default: detected per file)")
    p.add_argument("--session-key", metavar="FIELD.PATH",
                   help="dotted path of the field that names each record's session (e.g. metadata.session_id, "
                        "request.body.metadata.session_id, attributes.session.id); records without it are chained")
    p.add_argument("--tokenizer", default="qwen3", help="qwen3, qwen3.5, or a HF model folder / tokenizer.json")
    p.add_argument("--template", help="chat template: preset, .jinja, tokenizer_config.json, .gguf or folder "
                                      "(default: the tokenizer's folder, else qwen3)")
    p.add_argument("--out", help="trace.parquet (the table) or dump.jsonl (rendered ids); required unless --inspect")
    p.add_argument("--messages-path", metavar="PATH",
                   help="read the files with the generic reader, their message lists (OpenAI, Anthropic or Gemini "
                        "shaped) at this path in each record, e.g. data.messages or turns[*].messages")
    p.add_argument("--inspect", action="store_true",
                   help="print what each file holds (record keys, message lists and their paths, usage fields, "
                        "the reader detection picks and why) and import nothing")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("replay", help="replay dumps or imported logs: reuse, re-read cost and the cause of each miss",
                       epilog="Logs other than strata dumps are imported first. " + CHAINING_RULE)
    p.add_argument("dump", nargs="+", help="strata-dump/1 JSONL files (or one directory of them), a Parquet "
                                          "store, or any log `strata-lab import` reads")
    p.add_argument("--format", help="log format (default: detected; strata dumps replay as they are)")
    p.add_argument("--messages-path", metavar="PATH",
                   help="for logs: read them with the generic reader, their message lists at this path in each "
                        "record (see strata-lab import --inspect)")
    p.add_argument("--session-key", metavar="FIELD.PATH",
                   help="for imported logs: dotted path of the field naming each record's session (see below)")
    p.add_argument("--template", help="chat template for message-level logs (default: the tokenizer's folder, "
                                      "else qwen3)")
    p.add_argument("--policy", action="append", default=[],
                   help="compare a counterfactual policy (repeatable): reply-ids, keep-drained, fixes, every:N, "
                        "budget:MIB[:N], at:P1,P2, none, header (also snapshot before the generation "
                        "prompt's <|im_start|>), before-last:ID; join with '+'")
    p.add_argument("--engine", action="append", default=[],
                   help="replay under an engine's cache (repeatable; default: the engine the trace names, our dumps: "
                        "strata with their recorded checkpoints): vllm, sglang, llama.cpp, trtllm, openai, "
                        "anthropic, gemini, strata; name@version and :key=value,... overrides, e.g. llama.cpp:slots=4")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="write the deterministic JSON report (to stdout without PATH)")
    p.add_argument("--model", choices=["hybrid", "attention"], default=None,
                   help="the strata engine's reuse rule: hybrid (restart from a state snapshot at a divergence) or "
                        "attention (any prefix); default hybrid (same as --engine strata:kind=...)")
    p.add_argument("--checkpoints", default=None,
                   help="the strata engine's checkpoint policy (default: recorded for our dumps, the snapshots each "
                        "line reports, as the engine kept them; turn for other tools' logs; turn, every:N, header, "
                        "budget:MIB model others; same as --engine strata:checkpoints=...)")
    p.add_argument("--full-hit", choices=["held_logits", "last_held_only", "reread_last", "saved_logits"],
                   default=None,
                   help="what the strata engine does when the whole prompt is held (default held_logits)")
    p.add_argument("--tokenizer", default="qwen3", help="qwen3, qwen3.5, or a HF model folder / tokenizer.json")
    p.add_argument("--worst", type=int, default=5, help="how many worst divergences to show")
    p.add_argument("--rows", type=int, default=10, metavar="N",
                   help="per engine, show its N calls that re-read the most (default 10; an engine with no more "
                        "calls shows them all); --json and --csv hold every call")
    p.add_argument("--all-rows", action="store_true", help="show every call of every engine")
    p.add_argument("--csv", metavar="PATH", help="write every (engine, call) row to this CSV file")
    p.add_argument("--png", help="write the plots to this PNG file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--dask", metavar="ADDRESS|local[:N]",
                   help="replay a store on Dask: a scheduler address (tcp://host:8786) or local[:N] (a LocalCluster "
                        "of N workers); one task per replica")
    p.set_defaults(func=_cmd_replay)

    p = sub.add_parser("convert", help="convert JSONL dumps to a Parquet store (and back with --to-jsonl)")
    p.add_argument("dump", nargs="+", help="strata-dump/1 JSONL files, in time order (or one store with --to-jsonl)")
    p.add_argument("--out", required=True, help="store directory to write (or the JSONL file with --to-jsonl)")
    p.add_argument("--row-group", type=int, default=8192, help="calls per Parquet row group (default 8192)")
    p.add_argument("--to-jsonl", action="store_true", help="write a store back to JSONL, line for line")
    p.add_argument("--tokenizer", help="check ids against this vocabulary (qwen3, qwen3.5, or a HF model folder / "
                                       "tokenizer.json) and models against its family: a store with other ids is "
                                       "refused, JSONL lines with them skipped (default: ids only within int32)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)
    _production_parsers(sub)
    from strata_lab.proxy.cli import add_parser as _proxy_parser

    _proxy_parser(sub)
    p = sub.add_parser("lint", help="find text that breaks the prompt prefix across calls; --fix moves it",
                       description="Find what breaks the prompt prefix across a dump's calls (a timestamp or a "
                                   "user's name in the system message, tool schemas re-serialised, reasoning the "
                                   "template strips, Anthropic breakpoints past the look-back, ...), each finding "
                                   "priced in ids per engine. --fix moves only what a finding names (found by the "
                                   "template's structure, any template), re-checks each fix on the engines asked "
                                   "for, keeps a fix only where they read fewer ids and no session it rewrites gets worse there (a session "
                                   "it leaves as it was may lose a prefix it shared: shown), and prints what each "
                                   "fix gains or costs per engine (others shown, marked) and before/after per "
                                   "engine and per session (or says 'nothing to fix'). Without --fix, exit 1 when "
                                   "there are findings.")
    p.add_argument("dump", nargs="+", help="strata-dump/1 JSONL files (or one directory of them), or any log "
                                           "`import` reads (rendered with --template and --tokenizer first)")
    p.add_argument("--format", help="log format (default: detected; strata dumps are read as they are)")
    p.add_argument("--engine", action="append", default=[],
                   help="engine spec to price findings and judge fixes on (repeatable; overrides apply, e.g. "
                        "vllm:block_size=64; default: the engines the dump names: the one its cached-token figures "
                        "come from, else ours, strata). A fix is kept when the engines asked for read fewer ids and no "
                        "session it rewrites reads more on them; vllm, sglang, llama.cpp, anthropic and strata are replayed beside them and what "
                        "a fix gains or costs there is shown, marked 'not asked for', never judged")
    p.add_argument("--fix", metavar="OUT", help="write the fixed trace here and replay before/after")
    p.add_argument("--template", help="the chat template the dump's prompts were rendered with (preset, .jinja, "
                                      "tokenizer_config.json or folder): where its system message lies (default: "
                                      "ChatML, as qwen3; dumps imported from logs say what the client changed)")
    p.add_argument("--tokenizer", default="qwen3", help="qwen3, qwen3.5, or a HF model folder / tokenizer.json "
                                                       "(decodes prompts to find and move text)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress or status lines")
    p.set_defaults(func=_cmd_lint)

    p = sub.add_parser("template", help="render a conversation with a chat template, or lint it")
    p.add_argument("conversation", help="JSON file: a list of messages or {messages, tools, ...} ('-': stdin)")
    p.add_argument("--template", default="qwen3", help="qwen3, a .jinja file, or a tokenizer_config.json")
    p.add_argument("--prefix", help="assistant prefix (prefill) for the final turn")
    p.add_argument("--no-generation-prompt", action="store_true", help="do not open an assistant turn")
    p.add_argument("--lint", action="store_true", help="report where the template is not append-only")
    p.set_defaults(func=_cmd_template)

    p = sub.add_parser("serve", help="run the OpenAI/Anthropic-compatible server")
    p.add_argument("--model", help="model folder (default: the tiny generated hybrid model folder)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("--dump", help="append a strata-dump/1 line per engine call here ($STRATA_PROMPT_DUMP)")
    p.add_argument("--api-key", help="require this key (Authorization: Bearer or x-api-key); it shows in the "
                   f"process list, so prefer --api-key-file or ${API_KEY_ENV}")
    p.add_argument("--api-key-file", metavar="PATH",
                   help="read the accepted keys from this file: one a line, KEY or NAME KEY (# comments); each key "
                        "has its own --max-client-requests limit and goes by its NAME (else a hash of it) in "
                        "errors and logs")
    p.add_argument("--ctx", type=int, default=4096, help="context length in tokens")
    p.add_argument("--threads", type=int, default=0, help="engine threads (0 = engine default; at most 4 per core)")
    p.add_argument("--kv-cache", default="auto", metavar="{auto,f32,f16,q8}",
                   help="what the attention KV caches hold (Engine.load's kv_cache): auto (f32 for f32 weights, else "
                        "f16), f32, f16, or q8 (int8 blocks of 32 with an f32 scale: 1.125 bytes a value)")
    p.add_argument("--no-reply-reuse", action="store_true", help="do not reuse a reply's own ids (A/B runs)")
    p.add_argument("--max-body", type=int, default=4 * 1024 * 1024, help="request body limit in bytes")
    p.add_argument("--chat-template", "--template", "--chat-template-file", dest="template", default="qwen3",
                   help="chat template: a preset name (qwen3), or any HF template (.jinja, tokenizer_config.json, "
                        "model folder)")
    p.add_argument("--slots", type=int, default=1,
                   help="engine sessions, one request each at a time, their decode steps batched together "
                        "(id_slot / x-session-id / user pick one, else the LCP similarity rule, else least "
                        "recently used)")
    p.add_argument("--grammar-max-string", type=int, default=256,
                   help="constrained output: unbounded strings in a schema get this maxLength (0: unbounded)")
    p.add_argument("--grammar-max-items", type=int, default=16,
                   help="constrained output: unbounded arrays in a schema get this maxItems (0: unbounded)")
    p.add_argument("--cpu-workers", type=int, default=2,
                   help="threads for large requests' CPU work: tokenizing, rendering, schemas, grammars (default 2)")
    p.add_argument("--cpu-queue", type=int, default=8, help="large requests that may wait for a CPU worker (503 "
                   "after; default 8)")
    p.add_argument("--cpu-timeout", type=float, default=120.0,
                   help="seconds of CPU work one request may take before its 503 (default 120)")
    p.add_argument("--max-client-requests", type=int, default=16,
                   help="requests one API key may have in flight (one client address when no key is "
                        "required; 429 after; default 16)")
    p.add_argument("--slot-similarity", type=float, default=0.5,
                   help="share of the prompt a slot's held ids must cover to be chosen by similarity")
    p.add_argument("--shared-cache", action="store_true",
                   help="let all API keys share one prompt cache (by default a slot's cached prompt, and the "
                        "cached_tokens it reports, serve only the key that sent it)")
    p.add_argument("--response-store", type=int, default=256, metavar="N",
                   help="/v1/responses held for previous_response_id, each for its own API key only (0: none; "
                        "default 256)")
    p.add_argument("--response-store-mib", type=float, default=64.0, metavar="MIB",
                   help="the held responses' JSON, metadata included, at most this many MiB (default 64)")
    p.add_argument("--response-ttl", type=float, default=3600.0, metavar="SECONDS",
                   help="a held response expires this long after it was made (default 3600)")
    p.add_argument("--alias", help="model name reported to clients")
    p.add_argument("--seed", type=int, default=None,
                   help="the sampler seed of requests that name none (default: a fresh one per request; "
                        "-1 as llama-server: the same)")
    p.add_argument("--stop-latency", type=int, default=0,
                   help="engine steps before a STOP lands (model a production engine's late STOP; drained ids)")
    p.add_argument("--no-header-checkpoint", action="store_true",
                   help="no checkpoint before the generation prompt's <|im_start|> (only the turn start)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="also answer requests whose Host header is NAME (repeatable; by default only the bound "
                        "address, and localhost when bound to loopback)")
    p.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                   help="allow browser requests from ORIGIN, e.g. https://app.example (repeatable; default: none)")
    p.add_argument("--body-timeout", type=float, default=30.0, help="seconds a request body may take (408 after)")
    p.add_argument("--keep-alive-timeout", type=float, default=5.0, help="seconds an idle connection is kept")
    p.add_argument("--max-tokens-default", type=int, default=1024,
                   help="output cap of a request that sets none (OpenAI max_tokens absent or null; default 1024)")
    p.add_argument("--no-mmap", action="store_true",
                   help="read the weights into memory instead of mapping model.safetensors")
    p.add_argument("--check-weights", action="store_true", help="refuse weights holding NaN or infinity at load")
    p.epilog = (f"The API key can come from --api-key, --api-key-file (several keys) or the {API_KEY_ENV} "
                "environment variable (used when neither option is given). Limits (see docs/SECURITY.md): "
                "--max-body, --body-timeout, --max-client-requests (per key), --cpu-workers/--cpu-queue/"
                "--cpu-timeout (large CPU work: a job over its budget is stopped), --ctx, --max-tokens-default.")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("demo", help="serve an agent session with reply-id reuse off and on; replay and compare")
    p.add_argument("--png", default="strata-demo.png", help="where to write the plot (default: strata-demo.png)")
    p.add_argument("--out-dir", help="keep the two dumps here (default: a temp dir)")
    p.add_argument("--model", default="hybrid", help="hybrid or attention (embedded tiny models), or a model dir")
    p.add_argument("--turns", type=int, default=4, help="agent turns (default 4)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="only the comparison: no progress bar, no status lines")
    p.set_defaults(func=_cmd_demo)

    from strata_lab.sessions.agents import SCENARIOS

    p = sub.add_parser("record", help="record a scripted agent session against a real server into a dump",
                       description="Start `strata-lab serve` on a free port (the embedded tiny hybrid model "
                                   "unless --model names one), drive a scripted client session against it with "
                                   "the openai SDK, and keep the server's strata-dump/1 lines in --out.")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="agent",
                   help="the scripted session: agent (tools), thinking (budget STOPs), webui (cache warm-ups); "
                        "default agent")
    p.add_argument("--out", required=True, help="dump file to write")
    p.add_argument("--model", help="model folder, or hybrid / attention (embedded tiny models)")
    p.add_argument("--reply-id-reuse", action="store_true", help="server reuses the replies' own ids")
    p.add_argument("--turns", type=int, default=4, help="user turns of the session (default 4)")
    p.add_argument("--max-tokens", type=int, default=24, help="output cap of each request (default 24)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the requests (default 0)")
    p.add_argument("--stop-latency", type=int, help="engine steps a STOP takes (default: 2 for thinking, else 0)")
    p.add_argument("--no-header-checkpoint", action="store_true",
                   help="server keeps turn-start checkpoints only (template rewrites then fall back further)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_record)
    descriptions = {
        "reproduce": "Send a dump's prompts through a fresh engine (each reply forced as recorded) and compare the "
                     "engine's reused ids with the replay's prediction for the same policy, and with the recorded "
                     "reused where the dump has it (an imported log has none). Names the model it runs on and "
                     "refuses a model of another kind than the dump's unless --allow-model-mismatch. Exit 1 when "
                     "the engine and the prediction (or the recording) differ.",
        "rewrite": "Run a dump's calls under a replay policy on the engine: prompt policies (reply-ids, "
                   "keep-drained, fixes) rebuild the prompts, checkpoint policies (header, every:N, ...) set the "
                   "engine's checkpoints; the run is written to --out, and the engine's reuse is compared with the "
                   "replay's prediction, so every predicted win can be measured.",
    }
    for name, text in (("reproduce", "send a dump's prompts through a fresh engine and compare reuse"),
                       ("rewrite", "run a dump's calls under any replay policy on the engine")):
        q = sub.add_parser(name, help=text, description=descriptions[name])
        q.add_argument("dump", help="strata-dump/1 JSONL file (a recorded session or an imported log's dump)")
        q.add_argument("--model", help="model folder, or hybrid / attention (default: the kind the dump names, "
                                       "else the embedded hybrid model)")
        q.add_argument("--out", required=name == "rewrite", help="dump file the engine calls are recorded to")
        q.add_argument("--policy", default="reply-ids" if name == "rewrite" else "recorded",
                       help="replay policy (see `strata-lab replay --help`): reply-ids, keep-drained, fixes, "
                            "header, every:N, at:P1,P2, budget:MIB[:N], none, before-last:ID, joined with '+' "
                            f"(default: {'reply-ids' if name == 'rewrite' else 'recorded'})")
        q.add_argument("--tokenizer", default="qwen3", help="qwen3, qwen3.5, or a HF model folder / tokenizer.json")
        q.add_argument("--allow-model-mismatch", action="store_true",
                       help="run on --model even when the dump was recorded on a model of another kind")
        q.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
        q.set_defaults(func=_cmd_reproduce)
    for name, q in sub.choices.items():   # every subcommand's --help opens with what it does
        if not q.description:
            q.description = next(a.help for a in sub._choices_actions if a.dest == name)[:1].upper() + \
                next(a.help for a in sub._choices_actions if a.dest == name)[1:] + "."

    return parser


# third-party module -> the extra that brings it (pyproject.toml [project.optional-dependencies])
_EXTRAS = {"fastapi": "server", "uvicorn": "server", "openai": "server", "httpx": "server",
           "ipywidgets": "notebook", "hypothesis": "testing"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):  # one line, no source quoted
        print(f"strata-lab {args.command}: warning: {message}", file=sys.stderr)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            from strata_lab.cli.outputs import check_outputs

            check_outputs(args)  # no output may overwrite an input (before any work)
            return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"strata-lab {args.command}: error: {exc.name} is missing; install it with "
              f"pip install 'strata-lab[{extra}]'", file=sys.stderr)
        return 2
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the exception held
        print(f"strata-lab {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
