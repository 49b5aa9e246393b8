"""The Jinja environment chat templates render in: the same as transformers' (sandboxed, trim/lstrip blocks,
`tojson`, `raise_exception`, `strftime_now`, loop controls, `{% generation %}`), and template errors that name
the template and line."""
from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager
from datetime import datetime
from functools import lru_cache

__all__ = ["TemplateRenderError", "RENDER_SECONDS", "RENDER_MAX_CHARS", "render_budget", "compile_guarded"]

# A template is code from a file (a downloaded model folder's tokenizer_config.json included): every render
# gets a time budget and an output-size limit. Loops are counted (every {% for %} iterates through a guard),
# and the operations that can build huge values in one step (str/list * n, n ** m, lipsum, padding filters
# and methods) are checked before they run.
RENDER_SECONDS = 10.0
RENDER_MAX_CHARS = 32 * 1024 * 1024
_budget = threading.local()


class RenderLimitError(Exception):
    """A render ran past its time budget or built a value over the size limit."""


@contextmanager
def render_budget(seconds: float | None = None, max_chars: int | None = None):
    """Limits for the renders inside this block (on this thread); None: RENDER_SECONDS / RENDER_MAX_CHARS."""
    seconds = RENDER_SECONDS if seconds is None else seconds
    max_chars = RENDER_MAX_CHARS if max_chars is None else max_chars
    old = getattr(_budget, "limits", None)
    _budget.limits = (time.monotonic() + seconds, seconds, max_chars)
    try:
        yield
    finally:
        _budget.limits = old


def _limits():
    limits = getattr(_budget, "limits", None)
    return limits if limits is not None else (time.monotonic() + RENDER_SECONDS, RENDER_SECONDS, RENDER_MAX_CHARS)


def _tick() -> None:
    limits = getattr(_budget, "limits", None)
    if limits is not None and time.monotonic() > limits[0]:
        raise RenderLimitError(f"rendering took longer than {limits[1]:g} s (a template loop that does not end?)")


def _check_size(n: int, what: str) -> None:
    limit = _limits()[2]
    if n > limit:
        raise RenderLimitError(f"{what} would be {n} characters, over the limit of {limit}")


def _loop_guard(iterable):
    """Every template loop iterates through this: the render's time budget is checked as it goes."""
    if iterable is None:
        return iterable
    try:
        it = iter(iterable)
    except TypeError:
        return iterable  # Jinja reports the error itself
    return _guarded(it)


def _guarded(it):
    for i, item in enumerate(it):
        if not i & 255:
            _tick()
        yield item


def compile_guarded(env, source: str, name: str, filename: str):
    """`env.compile` of `source` with every {% for %} iterating through the loop guard."""
    from jinja2 import nodes

    tree = env.parse(source, name, filename)
    for node in tree.find_all(nodes.For):
        node.iter = nodes.Call(nodes.Name("strata_loop_guard", "load"), [node.iter], [], None, None,
                               lineno=node.lineno)
    return env.compile(tree, name, filename)


class TemplateRenderError(ValueError):
    """The Jinja template failed to compile or render; names the template and the line."""

    def __init__(self, template: str, line: int | None, message: str):
        self.template = template
        self.line = line
        at = f", line {line}" if line is not None else ""
        super().__init__(f"chat template {template!r}{at}: {message}")


# ---------------------------------------------------------------------------------------------------------
# The Jinja environment: the same as transformers' (utils/chat_template_utils.py), so HF templates render
# identically: sandboxed, trim_blocks, lstrip_blocks, loop controls, a {% generation %} tag, a tojson that does
# not escape HTML, raise_exception, strftime_now, and the restricted dict/namespace globals.

@lru_cache(maxsize=1)
def _environment():
    import jinja2
    import jinja2.ext
    import jinja2.runtime
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        # HF uses {% generation %} to mark assistant text for training masks; rendering passes it through.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_passthrough"), [], [], body).set_lineno(lineno)

        def _passthrough(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        # namespaces reject underscore attributes, so templates cannot reach CPython internals
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with '_'")

    dict_attrs = frozenset(dir(dict))
    loop_context = jinja2.runtime.LoopContext

    def cls_names(obj):
        # LoopContext: its properties; namespaces: the names set on them (jinja keeps them in an internal dict)
        if obj.__class__ is loop_context:
            return loop_names
        return obj._Namespace__attrs

    loop_names = frozenset(n for n in dir(loop_context) if not n.startswith("_"))

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        # * ** + are checked before they run (a sandbox hook); every call checks the time budget
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context, operator, left, right):
            _tick()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        _check_size(len(seq) * max(n, 0), "a repeated value")
            elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1:
                if right * max(abs(left).bit_length(), 1) > 65536:
                    raise RenderLimitError(f"{left} ** {right} is too large a number")
            elif operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, type(left)):
                _check_size(len(left) + len(right), "a concatenated value")
            return super().call_binop(context, operator, left, right)

        # `message.content` on a plain dict: the sandbox first tries the attribute (which a dict never has
        # unless it is one of dict's own names), fails, then subscribes. Going straight to the key gives the
        # same value or the same undefined, without the exception (templates read message fields a lot).
        def getattr(self, obj, attribute):
            cls = obj.__class__
            if cls is dict and attribute not in dict_attrs:
                try:
                    return obj[attribute]
                except (TypeError, LookupError):
                    return self.undefined(obj=obj, name=attribute)
            # loop.index0, ns.flag: the sandbox allows every public attribute of these (none is internal or
            # mutating; a str.format a template stored in a namespace was wrapped when it was read): the same
            # answer without its checks
            if (cls is loop_context or cls is TemplateNamespace) and attribute[:1] != "_" \
                    and attribute in cls_names(obj):
                return getattr(obj, attribute)
            return ImmutableSandboxedEnvironment.getattr(self, obj, attribute)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
            _tick()
            name = getattr(__obj, "__name__", "")
            owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # the sandbox wraps str.format
            if name == "format" and isinstance(owner, str):
                _check_size(_widest(owner), "a formatted value")
            if name == "join" and isinstance(owner, str) and args and isinstance(args[0], (list, tuple)):
                _check_size(_joined_size(args[0], owner), "str.join()'s result")
            if name == "replace" and isinstance(owner, str) and len(args) >= 2:
                _check_size(_replaced_size(owner, *args[:3]), "str.replace()'s result")
            # a width passed as an argument: padding methods, and a format string with a nested {width} field
            if name in _WIDTH_METHODS or (name == "format" and isinstance(owner, str) and re.search(r"{[^{}]*{", owner)):
                for value in list(args) + list(kwargs.values()):
                    if isinstance(value, int) and not isinstance(value, bool):
                        _check_size(value, f"{name}()'s result")
            out = super().call(__context, __obj, *args, **kwargs)
            if isinstance(out, (str, list)):
                _check_size(len(out), "a value")
            return out

    env = LimitedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.globals["strata_loop_guard"] = _loop_guard
    lipsum = env.globals.get("lipsum")

    def bounded_lipsum(n=5, html=True, min=20, max=100):
        if not (isinstance(n, int) and isinstance(min, int) and isinstance(max, int)) or n > 100 or max > 1000:
            raise RenderLimitError("lipsum() is limited to n <= 100 paragraphs of max <= 1000 words")
        return lipsum(n=n, html=html, min=min, max=max)

    env.globals["lipsum"] = bounded_lipsum
    for fname in ("center", "indent", "format"):
        env.filters[fname] = _bounded_filter(env.filters[fname], fname)
    env.filters["join"] = _bounded_join(env.filters["join"])
    env.filters["replace"] = _bounded_replace(env.filters["replace"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}


def _widest(fmt: str) -> int:
    """The largest number written in a format string (a width or precision such as `{:>1000000000}`)."""
    return max((int(m) for m in re.findall(r"\d+", fmt)), default=0)


def _joined_size(items, sep) -> int:
    """The length of `sep.join(items)` (strings counted as they are, other values by their str()), found before
    the string is built: a 60-byte template must not build a gigabyte to be refused."""
    sep_len = len(sep) if isinstance(sep, str) else 0
    total = sep_len * max(len(items) - 1, 0)
    for item in items:
        total += len(item) if isinstance(item, str) else len(str(item)) if isinstance(item, (int, float)) else 0
    return total


def _replaced_size(s: str, old, new, count=-1) -> int:
    """The length of `s.replace(old, new, count)`, from the number of matches (counting is cheap)."""
    if not (isinstance(old, str) and isinstance(new, str)):
        return len(s)
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        hits = min(hits, count)
    return len(s) + hits * (len(new) - len(old))


def _bounded_join(fn):
    from jinja2 import pass_eval_context

    @pass_eval_context
    def join(eval_ctx, value, d="", attribute=None):
        if attribute is None and not isinstance(value, str):
            value = list(value) if not isinstance(value, (list, tuple)) else value
            _check_size(_joined_size(value, d), "the join filter's result")
        out = fn(eval_ctx, value, d, attribute)
        _check_size(len(out), "the join filter's result")
        return out

    return join


def _bounded_replace(fn):
    from jinja2 import pass_eval_context

    @pass_eval_context
    def replace(eval_ctx, s, old, new, count=None):
        if isinstance(s, str):
            _check_size(_replaced_size(s, old, new, -1 if count is None else count), "the replace filter's result")
        return fn(eval_ctx, s, old, new, count)

    return replace


def _bounded_filter(fn, name: str):
    def bounded(*args, **kwargs):
        values = list(args[1:]) + list(kwargs.values())
        # a width argument (center(n), indent(n), ...; format only with a '*' width in its string)
        if name != "format" or (args and isinstance(args[0], str) and "*" in args[0]):
            for value in values:
                if isinstance(value, int) and not isinstance(value, bool):
                    _check_size(value, f"the {name} filter's result")
        if name == "format" and args and isinstance(args[0], str):
            _check_size(_widest(args[0]), "a formatted value")
        out = fn(*args, **kwargs)
        if isinstance(out, str):
            _check_size(len(out), f"the {name} filter's result")
        return out

    for attr in ("jinja_pass_arg",):  # keep Jinja's context/environment passing markers
        if hasattr(fn, attr):
            setattr(bounded, attr, getattr(fn, attr))
    return bounded


def _template_line(exc: BaseException, filename: str) -> int | None:
    # Jinja rewrites tracebacks so template frames carry the template's file name and line numbers.
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
