"""The `strata-lab` command line. Each subcommand imports what it needs when it runs."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile


def _load_tokenizer(name: str):
    """load_tokenizer, with any failure (a binary file, a foreign format) as one ValueError naming the option."""
    from strata_lab.text.tokenizer import load_tokenizer

    try:
        return load_tokenizer(name)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--tokenizer {name}: {exc}") from None
    except Exception as exc:  # the tokenizers library raises plain Exception for unreadable files
        raise ValueError(f"--tokenizer {name}: cannot load it ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__})") from None


def _utf8_text(text: str | None) -> str:
    """The argument, or standard input decoded strictly: invalid UTF-8 is a clear error, not a traceback."""
    if text is None:
        raw = sys.stdin.buffer.read()
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"standard input is not valid UTF-8 (byte {exc.start})") from None
    try:
        text.encode("utf-8")  # the shell passes undecodable bytes as lone surrogates
    except UnicodeEncodeError as exc:
        raise ValueError(f"the text argument is not valid UTF-8 (character {exc.start})") from None
    return text


def _cmd_tokenize(args: argparse.Namespace) -> int:
    tok = _load_tokenizer(args.tokenizer)
    text = _utf8_text(args.text)
    ids = tok.encode(text)
    if args.json:
        rows = []
        for i in ids:
            raw = tok.token_bytes(i)
            try:
                piece, valid = raw.decode("utf-8"), True
            except UnicodeDecodeError:
                piece, valid = None, False
            rows.append({"id": i, "piece": piece, "bytes": raw.hex(), "utf8": valid})
        print(json.dumps({"tokenizer": tok.name, "count": len(ids), "ids": ids, "tokens": rows},
                         ensure_ascii=False))
        return 0
    for i in ids:
        raw = tok.token_bytes(i)
        try:
            shown = repr(raw.decode("utf-8"))
        except UnicodeDecodeError:  # half a character: show the raw bytes
            shown = "bytes " + raw.hex(" ")
        print(f"{i:>8}  {shown}")
    print(f"{len(ids)} tokens")
    return 0


def _describe(trace) -> None:
    for path, (fmt, why) in trace.detected.items():
        print(f"{path}: {fmt} ({why})")


def _replay_input(args: argparse.Namespace, tmp: str):
    """A Dump for `replay`: strata dumps as they are; any other log imported through Trace.to_dump."""
    from strata_lab.dump import load_dump
    from strata_lab.traces.trace import load_trace

    import warnings

    from strata_lab.traces.source import TraceWarning

    from strata_lab.dump import is_store

    paths = args.dump if len(args.dump) > 1 else args.dump[0]
    if isinstance(paths, str) and is_store(paths):  # a Parquet store (strata-lab convert)
        return load_dump(paths)
    rows = _load_tokenizer(args.tokenizer).embedding_rows  # ids past the model's rows make a line bad
    try:
        with warnings.catch_warnings():  # a dumps/ folder holds a README: only say so if it is not all dumps
            warnings.simplefilter("ignore", TraceWarning)
            trace = load_trace(paths, format=args.format, progress=not args.quiet)
    except ValueError:
        names = [paths] if isinstance(paths, str) else list(paths)
        if args.format is not None or not all(str(n).endswith(".jsonl") for n in names):
            raise
        return load_dump(paths, vocab_size=rows)  # no format to detect (empty, or no valid line): a dump
    if trace.formats == ["strata"]:
        return load_dump(paths, vocab_size=rows)
    _describe(trace)
    return trace.to_dump(args.tokenizer, args.template, os.path.join(tmp, "imported.jsonl"))


def _cmd_import(args: argparse.Namespace) -> int:
    from collections import Counter

    from strata_lab.traces.trace import load_trace

    trace = load_trace(args.log if len(args.log) > 1 else args.log[0], format=args.format, progress=not args.quiet)
    _describe(trace)
    if args.out.endswith(".parquet"):
        df = trace.to_frame()
        trace.write(args.out)
        fidelity = Counter(df["fidelity"].astype(str))
        print(f"{len(df)} calls in {df['session'].nunique()} sessions "
              f"({', '.join(f'{n} {k}' for k, n in sorted(fidelity.items()))}) -> {args.out}")
        return 0
    if not args.out.endswith(".jsonl"):
        raise ValueError(f"--out: {args.out} must end in .parquet (trace table) or .jsonl (strata-dump/1)")
    dump = trace.to_dump(args.tokenizer, args.template, args.out)
    records = dump.records()
    reported = [r for r in records if r.get("render_exact") is not None]
    exact = sum(bool(r["render_exact"]) for r in reported)
    print(f"{len(records)} calls in {len({r['session'] for r in records})} sessions -> {args.out}")
    if reported:
        print(f"render check: {exact}/{len(reported)} calls render to exactly the prompt_tokens the log reports"
              + ("" if exact == len(reported) else " (another template or tokenizer than the server's?)"))
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="strata-replay-") as tmp:  # an imported log's rendered dump
        return _replay(args, _replay_input(args, tmp))


def _replay(args: argparse.Namespace, dump) -> int:
    from strata_lab.replayer import compare_policies, replay

    if type(dump).__name__ == "Dump" and next(iter(dump), None) is None:
        raise ValueError(f"no engine calls in {', '.join(dump.paths)}: the dump is empty or every line was "
                         "skipped (see the warnings above); nothing to replay")
    if args.engine:
        return _replay_engines(dump, args)

    kw = dict(model=args.model, checkpoint_policy=args.checkpoints, tokenizer=args.tokenizer,
              full_hit=args.full_hit)
    report = replay(dump, policy="recorded", progress=not args.quiet, cluster=args.dask, **kw)
    print(report.format(worst=args.worst))
    table = None
    if args.policy:
        policies = ["recorded"] + [p for p in args.policy if p != "recorded"]
        table = compare_policies(dump, policies, cost_model=report.cost_model, **kw)
        print("\npolicy comparison:")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    if args.png:
        from strata_lab.notebook.plots import plot_report

        plot_report(report.to_frame(), args.png, policies=table)
        print(f"\nwrote {args.png}")
    return 0


def _replay_engines(dump, args: argparse.Namespace) -> int:
    from strata_lab.caches.replay import replay_engines

    report = replay_engines(dump, args.engine, tokenizer=args.tokenizer, progress=not args.quiet and not args.json)
    if args.json:
        text = report.to_json()
        if args.json == "-":
            sys.stdout.write(text)
        else:
            with open(args.json, "w", encoding="utf-8") as f:
                f.write(text)
            print(f"wrote {args.json}")
        return 0
    print(report.format())
    if args.png:
        from strata_lab.caches.sweeps import plot_engines

        plot_engines(report, args.png)
        print(f"\nwrote {args.png}")
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    from strata_lab.caches.calls import write_calls
    from strata_lab.caches.lint import before_after, fix_calls, lint_calls
    from strata_lab.dump import load_dump

    dump = load_dump(args.dump if len(args.dump) > 1 else args.dump[0])
    engines = args.engine or ["vllm", "sglang", "llama.cpp", "anthropic"]
    findings = lint_calls(dump, args.tokenizer, engines=engines)
    for f in findings:
        print(f)
    print(f"{len(findings)} finding(s)")
    if args.fix:
        fixed = fix_calls(dump, findings, tokenizer=args.tokenizer)
        write_calls(fixed, args.fix)
        print(f"wrote {args.fix}\n")
        print(before_after(dump, fixed, engines).to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    return 1 if findings and not args.fix else 0


def _cmd_template(args: argparse.Namespace) -> int:
    from strata_lab.text.template import TEMPLATE_PRESETS, ChatTemplate

    tmpl = (ChatTemplate.from_name(args.template) if args.template in TEMPLATE_PRESETS
            else ChatTemplate.from_file(args.template))
    try:
        with open(args.conversation, encoding="utf-8") if args.conversation != "-" else sys.stdin as f:
            data = json.load(f)
    except UnicodeDecodeError:
        raise ValueError(f"{args.conversation} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{args.conversation} is not valid JSON ({exc})") from None
    if not isinstance(data, (list, dict)):
        raise ValueError(f"{args.conversation} must hold a list of messages or an object with 'messages', "
                         f"got {type(data).__name__}")
    request = {"messages": data} if isinstance(data, list) else dict(data)
    messages = request.pop("messages", None)
    options = {k: request[k] for k in ("tools", "response_format", "enable_thinking") if k in request}
    if args.lint:
        findings = tmpl.check_append_only(messages, **options)
        for finding in findings:
            print(finding)
        print(f"{len(findings)} finding(s): template {tmpl.name!r} is "
              f"{'not ' if findings else ''}append-only on this conversation")
        return 1 if findings else 0
    sys.stdout.write(tmpl.render(messages, assistant_prefix=args.prefix or request.get("assistant_prefix"),
                                 add_generation_prompt=not args.no_generation_prompt, **options))
    return 0


API_KEY_ENV = "STRATA_API_KEY"


def _api_key(args: argparse.Namespace, environ=None) -> str | None:
    """The key from --api-key, else --api-key-file (first line), else $STRATA_API_KEY; None: no key.

    >>> _api_key(argparse.Namespace(api_key=None, api_key_file=None), {"STRATA_API_KEY": "k"})
    'k'
    """
    import os

    if args.api_key is not None:
        return args.api_key
    if args.api_key_file is not None:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                key = f.readline().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--api-key-file {args.api_key_file}: cannot read it ({exc})") from None
        if not key:
            raise ValueError(f"--api-key-file {args.api_key_file}: the first line is empty")
        return key
    return (os.environ if environ is None else environ).get(API_KEY_ENV) or None


def _cmd_serve(args: argparse.Namespace) -> int:
    from strata_lab.server import ServerConfig, serve

    serve(ServerConfig(model=args.model, host=args.host, port=args.port, dump=args.dump, api_key=_api_key(args),
                       max_context=args.ctx, threads=args.threads, reply_reuse=not args.no_reply_reuse,
                       max_body_bytes=args.max_body, template=args.template, model_name=args.alias,
                       stop_latency=args.stop_latency, header_checkpoint=not args.no_header_checkpoint,
                       allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(args.cors),
                       body_timeout=args.body_timeout, keep_alive_timeout=args.keep_alive_timeout,
                       max_tokens_default=args.max_tokens_default, no_mmap=args.no_mmap,
                       check_weights=args.check_weights,
                       slots=args.slots, slot_similarity=args.slot_similarity,
                       grammar_max_string=args.grammar_max_string or None,
                       grammar_max_items=args.grammar_max_items or None))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import os

    from strata_lab.sessions.demo import run_demo

    if args.model not in ("hybrid", "attention") and not os.path.isfile(os.path.join(args.model, "config.json")):
        raise ValueError(f"--model must be hybrid, attention or a model directory (with config.json), "
                         f"got {args.model!r}")

    run_demo(args.png, out_dir=args.out_dir, model=args.model, turns=args.turns)
    return 0


def _cmd_record(args: argparse.Namespace) -> int:
    from strata_lab.sessions import record

    print(record(args.scenario, args.out, model=args.model, reply_id_reuse=args.reply_id_reuse, turns=args.turns,
                 max_tokens=args.max_tokens, seed=args.seed, stop_latency=args.stop_latency,
                 header_checkpoint=not args.no_header_checkpoint))
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from strata_lab.sessions import reproduce, rewrite

    if args.command == "reproduce":
        r = reproduce(args.dump, model=args.model, out=args.out)
    else:
        r = rewrite(args.dump, args.out, policy=args.policy, model=args.model)
    print(r.summary())
    return 0 if args.command != "reproduce" or r.exact else 1


def _cmd_convert(args: argparse.Namespace) -> int:
    from strata_lab.dump import Store, convert_jsonl

    if args.to_jsonl:
        if len(args.dump) != 1:
            raise ValueError("dump: --to-jsonl reads one store")
        n = Store(args.dump[0]).to_jsonl(args.out)
        print(f"wrote {n} lines to {args.out}")
        return 0
    info = convert_jsonl(args.dump, args.out, row_group_rows=args.row_group, progress=not args.quiet)
    ratio = info["bytes_in"] / info["bytes_out"] if info["bytes_out"] else float("nan")
    print(f"{info['lines']} calls ({info['skipped']} bad lines skipped): {info['bytes_in'] / 2**20:.1f} MB JSONL -> "
          f"{info['bytes_out'] / 2**20:.1f} MB Parquet ({ratio:.1f}x smaller) in {args.out}")
    return 0


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

    p = sub.add_parser("import", help="read a log (OpenAI, Anthropic, OTel, Claude Code, Codex, HAR, vLLM, SGLang, "
                                      "llama.cpp, ShareGPT) into a trace table or a strata-dump/1 file")
    p.add_argument("log", nargs="+", help="log files, a directory or a glob")
    p.add_argument("--format", help="reader name (default: detected per file)")
    p.add_argument("--tokenizer", default="qwen3", help="qwen3, qwen3.5, or a HF model folder / tokenizer.json")
    p.add_argument("--template", help="chat template: preset, .jinja, tokenizer_config.json, .gguf or folder "
                                      "(default: the tokenizer's folder, else qwen3)")
    p.add_argument("--out", required=True, help="trace.parquet (the table) or dump.jsonl (rendered ids)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_import)

    p = sub.add_parser("replay", help="replay dumps or imported logs: reuse, re-read cost and the cause of each miss")
    p.add_argument("dump", nargs="+", help="strata-dump/1 JSONL files (or one directory of them), a Parquet "
                                          "store, or any log `strata-lab import` reads")
    p.add_argument("--format", help="log format (default: detected; strata dumps replay as they are)")
    p.add_argument("--template", help="chat template for message-level logs (default: the tokenizer's folder, "
                                      "else qwen3)")
    p.add_argument("--policy", action="append", default=[],
                   help="compare a counterfactual policy (repeatable): reply-ids, keep-drained, fixes, every:N, "
                        "budget:MIB[:N], at:P1,P2, none, header (also snapshot before the generation "
                        "prompt's <|im_start|>), before-last:ID; join with '+'")
    p.add_argument("--engine", action="append", default=[],
                   help="replay under another engine's cache (repeatable): vllm, sglang, llama.cpp, trtllm, openai, "
                        "anthropic, strata; name@version and :key=value,... overrides, e.g. llama.cpp:slots=4")
    p.add_argument("--json", nargs="?", const="-", metavar="PATH",
                   help="with --engine: write the deterministic JSON report (to stdout without PATH)")
    p.add_argument("--model", choices=["hybrid", "attention"], default="hybrid")
    p.add_argument("--checkpoints", default="turn", help="checkpoint policy of the baseline (default: turn)")
    p.add_argument("--full-hit", choices=["held_logits", "last_held_only", "reread_last", "saved_logits"],
                   default="held_logits",
                   help="what the engine does when the whole prompt is held")
    p.add_argument("--tokenizer", default="qwen3", help="qwen3, qwen3.5, or a HF model folder / tokenizer.json")
    p.add_argument("--worst", type=int, default=5, help="how many worst divergences to show")
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
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_convert)
    p = sub.add_parser("lint", help="find text that breaks the prompt prefix across calls; --fix moves it")
    p.add_argument("dump", nargs="+", help="strata-dump/1 JSONL files (or one directory of them)")
    p.add_argument("--engine", action="append", default=[], help="engines to price findings on (repeatable)")
    p.add_argument("--fix", metavar="OUT", help="write the fixed trace here and replay before/after")
    p.add_argument("--tokenizer", default="qwen3")
    p.set_defaults(func=_cmd_lint)

    p = sub.add_parser("template", help="render a conversation with a chat template, or lint it")
    p.add_argument("conversation", help="JSON file: a list of messages or {messages, tools, ...} ('-': stdin)")
    p.add_argument("--template", default="qwen3", help="qwen3, a .jinja file, or a tokenizer_config.json")
    p.add_argument("--prefix", help="assistant prefix (prefill) for the final turn")
    p.add_argument("--no-generation-prompt", action="store_true", help="do not open an assistant turn")
    p.add_argument("--lint", action="store_true", help="report where the template is not append-only")
    p.set_defaults(func=_cmd_template)

    p = sub.add_parser("serve", help="run the OpenAI/Anthropic-compatible server")
    p.add_argument("--model", help="model directory (default: the tiny generated hybrid checkpoint)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--dump", help="append a strata-dump/1 line per engine call here ($STRATA_PROMPT_DUMP)")
    p.add_argument("--api-key", help="require this key (Authorization: Bearer or x-api-key); it shows in the "
                   f"process list, so prefer --api-key-file or ${API_KEY_ENV}")
    p.add_argument("--api-key-file", metavar="PATH", help="read the key from the first line of this file")
    p.add_argument("--ctx", type=int, default=4096, help="context length in tokens")
    p.add_argument("--threads", type=int, default=0, help="engine threads (0 = engine default; at most 4 per core)")
    p.add_argument("--no-reply-reuse", action="store_true", help="do not reuse a reply's own ids (A/B runs)")
    p.add_argument("--max-body", type=int, default=4 * 1024 * 1024, help="request body limit in bytes")
    p.add_argument("--chat-template", "--template", "--chat-template-file", dest="template", default="qwen3",
                   help="chat template: a preset name (qwen3), or any HF template (.jinja, tokenizer_config.json, "
                        "model folder)")
    p.add_argument("--slots", type=int, default=1,
                   help="engine sessions served in turn (id_slot / x-session-id / user pick one, else the LCP "
                        "similarity rule, else least recently used)")
    p.add_argument("--grammar-max-string", type=int, default=256,
                   help="constrained output: unbounded strings in a schema get this maxLength (0: unbounded)")
    p.add_argument("--grammar-max-items", type=int, default=16,
                   help="constrained output: unbounded arrays in a schema get this maxItems (0: unbounded)")
    p.add_argument("--slot-similarity", type=float, default=0.5,
                   help="share of the prompt a slot's held ids must cover to be chosen by similarity")
    p.add_argument("--alias", help="model name reported to clients")
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
    p.epilog = (f"The API key can come from --api-key, --api-key-file or the {API_KEY_ENV} environment variable "
                "(in that order). See docs/SECURITY.md.")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("demo", help="serve an agent session with reply-id reuse off and on; replay and compare")
    p.add_argument("--png", default="strata-demo.png", help="where to write the plot (default: strata-demo.png)")
    p.add_argument("--out-dir", help="keep the two dumps here (default: a temp dir)")
    p.add_argument("--model", default="hybrid", help="hybrid or attention (embedded tiny models), or a model dir")
    p.add_argument("--turns", type=int, default=4, help="agent turns (default 4)")
    p.set_defaults(func=_cmd_demo)

    from strata_lab.sessions.agents import SCENARIOS

    p = sub.add_parser("record", help="record a scripted agent session against a real server into a dump")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="agent")
    p.add_argument("--out", required=True, help="dump file to write")
    p.add_argument("--model", help="model folder, or hybrid / attention (embedded tiny models)")
    p.add_argument("--reply-id-reuse", action="store_true", help="server reuses the replies' own ids")
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stop-latency", type=int, help="engine steps a STOP takes (default: 2 for thinking, else 0)")
    p.add_argument("--no-header-checkpoint", action="store_true",
                   help="server keeps turn-start checkpoints only (template rewrites then fall back further)")
    p.set_defaults(func=_cmd_record)
    for name, text in (("reproduce", "send a dump's prompts through a fresh engine and compare reuse"),
                       ("rewrite", "rebuild a dump's prompts under a replay policy and run them on the engine")):
        q = sub.add_parser(name, help=text)
        q.add_argument("dump")
        q.add_argument("--model", help="model folder, or hybrid / attention (default: the one the dump names)")
        q.add_argument("--out", required=name == "rewrite", help="dump file the engine calls are recorded to")
        if name == "rewrite":
            q.add_argument("--policy", default="reply-ids", help="replay policy (see `strata-lab replay --help`)")
        q.set_defaults(func=_cmd_reproduce)

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
    try:
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:
        extra = _EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(f"strata-lab {args.command}: error: {exc.name} is missing; install it with "
              f"pip install 'strata-lab[{extra}]'", file=sys.stderr)
        return 2
    except (ValueError, OSError, KeyError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the exception held
        print(f"strata-lab {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
