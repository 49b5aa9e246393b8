"""The `strata-lab` command line. Each subcommand imports what it needs when it runs."""
from __future__ import annotations

import argparse
import json
import sys


def _cmd_tokenize(args: argparse.Namespace) -> int:
    from strata_lab.text.tokenizer import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    text = args.text if args.text is not None else sys.stdin.read()
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

    dump = load_dump(args.dump if len(args.dump) > 1 else args.dump[0])
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
    with open(args.conversation, encoding="utf-8") if args.conversation != "-" else sys.stdin as f:
        data = json.load(f)
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


def _cmd_serve(args: argparse.Namespace) -> int:
    from strata_lab.server import ServerConfig, serve

    serve(ServerConfig(model=args.model, host=args.host, port=args.port, dump=args.dump, api_key=args.api_key,
                       max_context=args.ctx, threads=args.threads, reply_reuse=not args.no_reply_reuse,
                       max_body_bytes=args.max_body, template=args.template, model_name=args.alias,
                       stop_latency=args.stop_latency, header_checkpoint=not args.no_header_checkpoint,
                       slots=args.slots, slot_similarity=args.slot_similarity,
                       grammar_max_string=args.grammar_max_string or None, grammar_max_items=args.grammar_max_items or None))
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from strata_lab.sessions.demo import run_demo

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
    p.add_argument("--api-key", help="require this key (Authorization: Bearer or x-api-key)")
    p.add_argument("--ctx", type=int, default=4096, help="context length in tokens")
    p.add_argument("--threads", type=int, default=0, help="engine threads (0 = engine default)")
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
    except (ValueError, FileNotFoundError, KeyError) as exc:
        print(f"strata-lab {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
