"""The Jinja environment chat templates render in: the same as transformers' (sandboxed, trim/lstrip blocks,
`tojson`, `raise_exception`, `strftime_now`, loop controls, `{% generation %}`), and template errors that name
the template and line."""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

__all__ = ["TemplateRenderError"]


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

    class Environment(ImmutableSandboxedEnvironment):
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

    env = Environment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


def _template_line(exc: BaseException, filename: str) -> int | None:
    # Jinja rewrites tracebacks so template frames carry the template's file name and line numbers.
    line = getattr(exc, "lineno", None)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line
