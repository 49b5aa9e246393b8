"""`strata-lab tokenize | template | serve | demo | record | reproduce | rewrite`: one handler per command."""
from __future__ import annotations

import argparse
import json
import sys


MAX_INPUT_BYTES = 256 * 1024 * 1024  # a conversation / tokenizer file given on the command line


def read_user_file(path: str, what: str, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of a file named on the command line: a regular file (a FIFO would hang, /dev/zero never end)
    of at most `limit` bytes, else a ValueError naming `what`."""
    import os
    import stat

    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(f"{what} {path}: {exc.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{what} {path} is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{what} {path}: not a regular file")
    if st.st_size > limit:
        raise ValueError(f"{what} {path}: {st.st_size} bytes, over the limit of {limit}")
    with open(path, "rb") as f:
        return f.read(limit + 1)


def _native_panic(exc: BaseException) -> bool:
    """A Rust panic surfacing from a native library (tokenizers' PanicException is a BaseException)."""
    return type(exc).__name__ == "PanicException"


def _load_tokenizer(name: str):
    """load_tokenizer, with any failure (a binary file, a foreign format) as one ValueError naming the option."""
    import os

    from strata_lab.text.tokenizer import load_tokenizer

    if os.path.exists(name) and not os.path.isdir(name):
        read_user_file(name, "--tokenizer", limit=0x7FFFFFFF)[:0]  # regular file, bounded (no FIFO hang)
    try:
        return load_tokenizer(name)
    except (ValueError, OSError) as exc:
        raise ValueError(f"--tokenizer {name}: {exc}") from None
    except BaseException as exc:
        if not _native_panic(exc):
            raise
        raise ValueError(f"--tokenizer {name}: the tokenizer library failed on it ({type(exc).__name__})") from None
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


def _interactive() -> bool:
    return sys.stderr.isatty()


def status(text: str, args: argparse.Namespace | None = None) -> None:
    """A one-line status on stderr (flushed) before work that can take seconds: shown to a person at a
    terminal (stderr a TTY), silent with -q and in pipes and scripts, whose stderr stays errors only."""
    if (args is not None and getattr(args, "quiet", False)) or not _interactive():
        return
    print(f"strata-lab: {text}", file=sys.stderr, flush=True)


def _cmd_tokenize(args: argparse.Namespace) -> int:
    status(f"loading the {args.tokenizer} tokenizer ...", args)
    tok = _load_tokenizer(args.tokenizer)
    text = _utf8_text(args.text)
    try:
        ids = tok.encode(text)
    except BaseException as exc:  # a hostile tokenizer.json (a catastrophic pre-tokenizer regex) panics in Rust
        if not _native_panic(exc):
            raise
        raise ValueError(f"--tokenizer {args.tokenizer}: the tokenizer failed on this text ({type(exc).__name__})") from None
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


def _cmd_template(args: argparse.Namespace) -> int:
    from strata_lab.text.template import TEMPLATE_PRESETS, ChatTemplate

    tmpl = (ChatTemplate.from_name(args.template) if args.template in TEMPLATE_PRESETS
            else ChatTemplate.from_file(args.template))
    try:
        raw = read_user_file(args.conversation, "conversation") if args.conversation != "-" else \
            sys.stdin.buffer.read(MAX_INPUT_BYTES + 1)
        data = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{args.conversation} nests too deeply") from None
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
    """The key from --api-key, else $STRATA_API_KEY when no --api-key-file is given; None: no single key.

    >>> _api_key(argparse.Namespace(api_key=None, api_key_file=None), {"STRATA_API_KEY": "k"})
    'k'
    """
    import os

    if args.api_key is not None and args.api_key_file is not None:
        raise ValueError("--api-key and --api-key-file: give one of them (several keys go in the file)")
    if args.api_key is not None:
        return args.api_key
    if args.api_key_file is not None:
        return None
    return (os.environ if environ is None else environ).get(API_KEY_ENV) or None


MAX_KEY_FILE_BYTES = 1 << 20


def _api_keys_file(path: str | None) -> tuple[tuple[str, str], ...]:
    r"""--api-key-file: one key a line, `KEY` or `NAME KEY` (blank lines and `#` comments skipped); a key without a
    name goes by a hash of it (config.key_name). Errors name the file and the line, never a key's text.

    >>> import os, tempfile
    >>> f = tempfile.NamedTemporaryFile("w", suffix=".keys", delete=False)
    >>> _ = f.write("# team keys\nalice sk-a1\nsk-b2\n"); f.close()
    >>> _api_keys_file(f.name)
    (('alice', 'sk-a1'), ('key-784f0d5b', 'sk-b2'))
    >>> os.unlink(f.name)
    """
    from strata_lab.server.config import MAX_API_KEYS, key_name, key_pair_problem

    if path is None:
        return ()
    try:
        text = read_user_file(path, "--api-key-file", MAX_KEY_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--api-key-file {path}: cannot read it ({type(exc).__name__})") from None
    out, names, keys = [], set(), set()
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) > 2:
            raise ValueError(f"--api-key-file {path}:{lineno}: a line is KEY or NAME KEY (got {len(parts)} words)")
        name, key = (key_name(parts[0]), parts[0]) if len(parts) == 1 else parts
        problem = key_pair_problem(name, key, names, keys, earlier="line")
        if problem:
            raise ValueError(f"--api-key-file {path}:{lineno}: {problem}")
        out.append((name, key))
        if len(out) > MAX_API_KEYS:
            raise ValueError(f"--api-key-file {path}: more than {MAX_API_KEYS} keys")
    if not out:
        raise ValueError(f"--api-key-file {path}: no key in it (one key a line: KEY or NAME KEY)")
    return tuple(out)


def _cmd_serve(args: argparse.Namespace) -> int:
    from strata_lab.server import ServerConfig, serve

    serve(ServerConfig(model=args.model, host=args.host, port=args.port, dump=args.dump, api_key=_api_key(args),
                       api_keys=_api_keys_file(args.api_key_file),
                       max_context=args.ctx, threads=args.threads, kv_cache=args.kv_cache, reply_reuse=not args.no_reply_reuse,
                       max_body_bytes=args.max_body, template=args.template, model_name=args.alias,
                       stop_latency=args.stop_latency, header_checkpoint=not args.no_header_checkpoint,
                       allowed_hosts=tuple(args.allowed_host), cors_origins=tuple(args.cors),
                       body_timeout=args.body_timeout, keep_alive_timeout=args.keep_alive_timeout,
                       max_tokens_default=args.max_tokens_default, no_mmap=args.no_mmap,
                       check_weights=args.check_weights,
                       slots=args.slots, slot_similarity=args.slot_similarity,
                       grammar_max_string=None if args.grammar_max_string == 0 else args.grammar_max_string,
                       grammar_max_items=None if args.grammar_max_items == 0 else args.grammar_max_items,
                       cpu_workers=args.cpu_workers, cpu_queue=args.cpu_queue, cpu_timeout=args.cpu_timeout,
                       shared_cache=args.shared_cache, response_store=args.response_store,
                       response_store_bytes=_mib_bytes(args.response_store_mib, "--response-store-mib"),
                       response_ttl=args.response_ttl,
                       max_client_requests=args.max_client_requests,
                       seed=None if args.seed in (None, -1) else args.seed))
    return 0


def _mib_bytes(mib: float, option: str) -> int:
    """MiB given on the command line as bytes; a value that is not a finite number >= 0 is the option's error."""
    import math

    if not math.isfinite(mib) or mib < 0 or mib > 1 << 20:
        raise ValueError(f"{option}: must be a number of MiB in 0..{1 << 20}, got {mib}")
    return int(mib * 1024 * 1024)


def _cmd_demo(args: argparse.Namespace) -> int:
    import os

    from strata_lab.sessions.demo import run_demo

    if args.model not in ("hybrid", "attention") and not os.path.isfile(os.path.join(args.model, "config.json")):
        raise ValueError(f"--model must be hybrid, attention or a model directory (with config.json), "
                         f"got {args.model!r}")

    if args.turns < 1:
        raise ValueError(f"--turns must be >= 1, got {args.turns}")
    folder = os.path.dirname(os.path.abspath(args.png))
    if not os.path.isdir(folder):
        raise ValueError(f"--png {args.png}: the folder {folder} does not exist")
    if args.out_dir is not None and os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        raise ValueError(f"--out-dir {args.out_dir} is not a directory")

    status(f"serving a scripted agent session twice on the {args.model} model (reply-id reuse off, then on; "
           f"about 20-40 s) ...", args)
    from strata_lab.cli.outputs import output

    with output(args.png) as png:
        run_demo(png, out_dir=args.out_dir, model=args.model, turns=args.turns, progress=not args.quiet)
    return 0


def _check_model_arg(model: str | None) -> None:
    import os

    if model is not None and model not in ("hybrid", "attention") and \
            not os.path.isfile(os.path.join(model, "config.json")):
        raise ValueError(f"--model must be hybrid, attention or a model directory (with config.json), got {model!r}")


def _check_new_file(path: str, option: str) -> None:
    """A file the command will create: its folder must exist and be writable, the file must not exist."""
    import os

    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise ValueError(f"{option} {path}: the folder {folder} is not writable")
    if os.path.lexists(path):
        raise ValueError(f"{option} {path} exists; recordings append, so choose a new file")


def _cmd_record(args: argparse.Namespace) -> int:
    from strata_lab.sessions import record

    _check_model_arg(args.model)
    _check_new_file(args.out, "--out")
    for name, low, high in (("turns", 1, 1000), ("max_tokens", 1, 1 << 16), ("seed", 0, 2**32 - 1)):
        if not low <= getattr(args, name) <= high:
            raise ValueError(f"--{name.replace('_', '-')} must be in {low}..{high}, got {getattr(args, name)}")
    if args.stop_latency is not None and args.stop_latency < 0:
        raise ValueError(f"--stop-latency must be >= 0, got {args.stop_latency}")

    from strata_lab.cli.outputs import output

    status(f"recording the {args.scenario} scenario: starting a server and driving {args.turns} turns ...", args)
    with output(args.out) as out:
        done = record(args.scenario, out, model=args.model, reply_id_reuse=args.reply_id_reuse, turns=args.turns,
                      max_tokens=args.max_tokens, seed=args.seed, stop_latency=args.stop_latency,
                      header_checkpoint=not args.no_header_checkpoint, progress=not args.quiet)
    import dataclasses

    print(dataclasses.replace(done, path=args.out))
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from strata_lab.sessions import reproduce, rewrite

    _check_model_arg(args.model)
    from strata_lab.dump import Dump, load_dump

    dump = load_dump(args.dump)
    if isinstance(dump, Dump) and next(iter(dump), None) is None:  # not "0/0 reproduce exactly"
        raise ValueError(f"no engine calls in {args.dump}: the dump is empty or every line was skipped (see the "
                         f"warnings above); nothing to {args.command}")

    status(f"{args.command}: loading the model and replaying {args.dump} under {args.policy} for the "
           "prediction ...", args)
    kw = dict(model=args.model, policy=args.policy, tokenizer=_load_tokenizer(args.tokenizer),
              allow_model_mismatch=args.allow_model_mismatch, progress=not args.quiet)
    from strata_lab.cli.outputs import output

    with output(args.out) as out:
        if args.command == "reproduce":
            r = reproduce(args.dump, out=out, **kw)
        else:
            r = rewrite(args.dump, out, **kw)
    print(r.summary())
    if args.out:
        print(f"wrote {args.out}")
    return 0 if r.exact else 1
