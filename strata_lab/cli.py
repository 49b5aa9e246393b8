"""The `strata-lab` command line. Each subcommand imports what it needs when it runs."""
from __future__ import annotations

import argparse
import json
import sys


def _load_tokenizer(name: str):
    """load_tokenizer, with any failure (a binary file, a foreign format) as one ValueError naming the option."""
    from strata_lab.text.tokenizer import load_tokenizer

    try:
        return load_tokenizer(name)
    except (ValueError, OSError):
        raise
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


def _cmd_replay(args: argparse.Namespace) -> int:
    from strata_lab.dump import load_dump
    from strata_lab.replayer import compare_policies, replay
    rows = _load_tokenizer(args.tokenizer).embedding_rows  # ids past the model's rows make a line bad
    dump = load_dump(args.dump if len(args.dump) > 1 else args.dump[0], vocab_size=rows)
    if next(iter(dump), None) is None:
        raise ValueError(f"no engine calls in {', '.join(dump.paths)}: the dump is empty or every line was "
                         "skipped (see the warnings above); nothing to replay")
    kw = dict(model=args.model, checkpoint_policy=args.checkpoints, tokenizer=args.tokenizer,
              full_hit=args.full_hit)
    report = replay(dump, policy="recorded", progress=not args.quiet, **kw)
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
                       check_weights=args.check_weights))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import os

    from strata_lab.sessions.demo import run_demo

    if args.model not in ("hybrid", "attention") and not os.path.isfile(os.path.join(args.model, "config.json")):
        raise ValueError(f"--model must be hybrid, attention or a model directory (with config.json), "
                         f"got {args.model!r}")

    run_demo(args.png, out_dir=args.out_dir, model=args.model, turns=args.turns)
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

    p = sub.add_parser("replay", help="replay dumps: reuse, re-read cost and the cause of each miss")
    p.add_argument("dump", nargs="+", help="strata-dump/1 JSONL files (or one directory of them)")
    p.add_argument("--policy", action="append", default=[],
                   help="compare a counterfactual policy (repeatable): reply-ids, keep-drained, fixes, every:N, "
                        "budget:MIB[:N], at:P1,P2, none, header (also snapshot before the generation "
                        "prompt's <|im_start|>), before-last:ID; join with '+'")
    p.add_argument("--model", choices=["hybrid", "attention"], default="hybrid")
    p.add_argument("--checkpoints", default="turn", help="checkpoint policy of the baseline (default: turn)")
    p.add_argument("--full-hit", choices=["held_logits", "last_held_only", "reread_last", "saved_logits"],
                   default="held_logits",
                   help="what the engine does when the whole prompt is held")
    p.add_argument("--tokenizer", default="qwen3")
    p.add_argument("--worst", type=int, default=5, help="how many worst divergences to show")
    p.add_argument("--png", help="write the plots to this PNG file")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_replay)

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
    p.add_argument("--template", default="qwen3", help="chat template preset")
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

    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, KeyError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the exception held
        print(f"strata-lab {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
