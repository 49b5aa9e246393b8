"""Fields the OpenAI/Anthropic APIs define that this server does not implement (yet): one table.

A client that sets one gets a 400 naming it and saying it is unsupported, never a silent 200 that ignored
it. The request parsers (request.py) call `refuse_unsupported` first. When a feature lands, delete its row
here and parse the field (features.py parses n, logprobs, tool_choice, grammar and the other issue-17 fields).
"""
from __future__ import annotations

from strata_lab.server.errors import RequestError

__all__ = ["UNSUPPORTED", "refuse_unsupported"]

# One row per field: (dialect, field, unsupported(value, body) -> bool, what is not supported).
UNSUPPORTED: tuple = (
    ("completions", "suffix", lambda v, b: v not in (None, ""),
     "suffix (text after the insertion, fill-in-the-middle) is not supported: the models here have no FIM tokens"),
    ("completions", "best_of", lambda v, b: v not in (None, 1),
     "best_of > 1 (server-side candidates ranked by log probability) is not supported: ask for n choices"),
    ("openai", "add_generation_prompt", lambda v, b: v is not None and v is not (not b.get("continue_final_message")),
     "the assistant turn is always opened, except with continue_final_message, which continues it"),
)


def _off(default):
    """unsupported(value, body): set to anything but null and `default` (the value that changes nothing)."""
    return lambda v, b: v is not None and v != default


# llama.cpp sampler and server fields (tools/server/README.md) this server does not implement: a request
# that sets one to a value that would change the output is refused, on the chat and completion routes.
_LLAMA = (
    ("mirostat", _off(0), "mirostat sampling"), ("mirostat_tau", _off(5.0), "mirostat sampling"),
    ("mirostat_eta", _off(0.1), "mirostat sampling"), ("typical_p", _off(1.0), "locally typical sampling"),
    ("tfs_z", _off(1.0), "tail-free sampling"), ("dynatemp_range", _off(0.0), "dynamic temperature"),
    ("dynatemp_exponent", _off(1.0), "dynamic temperature"), ("xtc_probability", _off(0.0), "XTC sampling"),
    ("xtc_threshold", _off(0.1), "XTC sampling"), ("dry_multiplier", _off(0.0), "DRY repetition penalty"),
    ("dry_base", _off(1.75), "DRY repetition penalty"), ("dry_allowed_length", _off(2), "DRY repetition penalty"),
    ("dry_penalty_last_n", _off(-1), "DRY repetition penalty"),
    ("dry_sequence_breakers", lambda v, b: v is not None, "DRY repetition penalty"),
    ("penalize_nl", _off(False), "penalize_nl"), ("min_keep", _off(0), "min_keep"),
    ("samplers", lambda v, b: v is not None, "a custom sampler order (the order is fixed: bias, penalties, "
                                              "temperature, top_k, top_p, min_p)"),
    ("n_keep", _off(0), "context shifting (n_keep): a prompt over the context is an error"),
    ("n_discard", _off(0), "context shifting"), ("n_indent", _off(0), "n_indent"),
    ("t_max_predict_ms", _off(0), "a generation time limit"), ("t_max_prompt_ms", _off(-1), "a prompt time limit"),
    ("post_sampling_probs", _off(False), "post-sampling probabilities (logprobs are of the raw logits)"),
    ("timings_per_token", _off(False), "timings in every streamed chunk (the last one carries them)"),
    ("response_fields", lambda v, b: v is not None, "response_fields"),
    ("return_progress", _off(False), "prompt progress events"), ("lora", lambda v, b: v not in (None, []), "LoRA"),
    ("backend_sampling", _off(False), "backend sampling"), ("verbose", _off(False), "the verbose debug output"),
    ("speculative.n_max", lambda v, b: v is not None, "speculative decoding"),
    ("speculative.n_min", lambda v, b: v is not None, "speculative decoding"),
    ("speculative.p_min", lambda v, b: v is not None, "speculative decoding"),
)
UNSUPPORTED += tuple((d, name, test, f"{what} is not implemented") for name, test, what in _LLAMA
                     for d in ("openai", "completions"))


def refuse_unsupported(body: dict, dialect: str) -> None:
    """RequestError for the first UNSUPPORTED field `body` sets.

    >>> refuse_unsupported({"add_generation_prompt": False}, "openai")
    Traceback (most recent call last):
    ...
    strata_lab.server.errors.RequestError: add_generation_prompt: is not supported by this server: the assistant turn is always opened, except with continue_final_message, which continues it
    """
    for row_dialect, name, unsupported, why in UNSUPPORTED:
        if row_dialect == dialect and name in body and unsupported(body[name], body):
            raise RequestError(name, f"is not supported by this server: {why}", code="unsupported_parameter")
