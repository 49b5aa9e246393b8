"""Counterfactual policies: replay the recorded sessions as if a fix had shipped.

A `Policy` names a way to serve the dump's sessions: the recorded prompts, prompts rebuilt with reply-id
reuse (`PromptEncoder.remember_reply`), prompts that keep a reply's drained ids, or another snapshot
policy. `PromptRewriter` rebuilds, call by call, the prompts a server under a prompt-changing policy would
have sent; `strata_lab.sessions` replays those prompts on the real engine.

>>> parse_policy("fixes").reply_ids, parse_policy("every:256").checkpoint_policy.every
(True, 256)
"""
from __future__ import annotations

from dataclasses import dataclass

from strata_lab.rules import CheckpointPolicy, parse_checkpoint_policy
from strata_lab.text.stream import ends_mid_character, plain_drained
from strata_lab.replayer.divergence import find_divergence
from strata_lab.replayer.state import SessionState, lcp_len

__all__ = ["Policy", "parse_policy", "policy_changes_prompts", "PromptRewriter", "keep_drained_prompt"]


@dataclass(frozen=True)
class Policy:
    """One way to serve the dump's sessions: the recorded prompts, or a fix applied to them.

    reply_ids: prompts rebuilt by a PromptEncoder that was told each previous reply (reply-id reuse).
    keep_drained: the server keeps the leading plain-text run of a reply's drained ids (the server's
    `plain_drained` rule) in the next prompt.
    checkpoint_policy: a CheckpointPolicy, "recorded" (the dump's own checkpoints), or None (replay's).
    """

    name: str = "recorded"
    reply_ids: bool = False
    keep_drained: bool = False
    checkpoint_policy: CheckpointPolicy | str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        cp = self.checkpoint_policy
        if not (cp is None or cp == "recorded" or isinstance(cp, CheckpointPolicy)):
            raise TypeError(f"checkpoint_policy must be a strata_lab.CheckpointPolicy, 'recorded' or None, "
                            f"got {type(cp).__name__}")

    @property
    def changes_prompts(self) -> bool:
        """Whether the policy sends other prompts than the recorded ones."""
        return self.reply_ids or self.keep_drained


def policy_changes_prompts(policy: Policy) -> bool:
    return policy.changes_prompts


def parse_policy(spec: str) -> Policy:
    """A policy from a CLI spec: parts joined by "+", each one of recorded, reply-ids, keep-drained,
    fixes (both), or a checkpoint spec (turn, none, every:N, at:P,.., budget:MIB[:N], ckpt-recorded,
    header, before-last:ID; "every:N,header" adds the header snapshot to another kind).

    "header" keeps, besides the turn start, a snapshot just before the last ``<|im_start|>`` of each prompt
    (the generation prompt's header): on a hybrid model it serves the next prompt when the template
    rewrites the previous reply (Qwen3 strips its empty ``<think>`` block once a user turn arrives).
    "before-last:ID" does the same for any token id.

    >>> parse_policy("reply-ids+every:256")
    Policy(name='reply-ids+every:256', reply_ids=True, keep_drained=False, checkpoint_policy=CheckpointPolicy(at_prompt_end=True, every=256, positions=(), budget_mib=0.0, before_last=None))
    >>> parse_policy("header").checkpoint_policy.before_last
    151644
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"policy must be a non-empty spec, got {spec!r}")
    kw: dict = {}
    for part in spec.split("+"):
        p = part.strip().lower().replace("_", "-")
        if p in ("recorded", "baseline"):
            continue
        if p in ("reply-ids", "reply-id-reuse", "reuse-reply-ids"):
            kw["reply_ids"] = True
        elif p in ("keep-drained", "drained"):
            kw["keep_drained"] = True
        elif p == "fixes":
            kw["reply_ids"] = kw["keep_drained"] = True
        elif p == "ckpt-recorded":
            kw["checkpoint_policy"] = "recorded"
        else:
            kw["checkpoint_policy"] = parse_checkpoint_policy(part.strip())
    return Policy(name=spec.strip(), **kw)


def _stop_ids(tok) -> tuple:
    return tuple(i for i in (tok.im_end_id, tok.eos_id) if i is not None)


def keep_drained_prompt(prompt, state: SessionState, tok):
    """The prompt a server that kept the last reply's drained ids would have sent, or None (no change).

    It keeps what the server keeps (`plain_drained`: the leading plain-text run, nothing when the reply
    ends inside a character), and only where the recorded prompt's text parts from held at those ids.
    """
    seg = next((s for s in reversed(state.segments) if s[2] == "drained"), None)
    if seg is None or seg[1] != len(state.held):
        return None
    start = seg[0]
    held = state.held
    gen = next((s for s in reversed(state.segments) if s[2] == "gen" and s[1] == start), None)
    stops = _stop_ids(tok)
    mid = ends_mid_character(tok, held[gen[0]:gen[1]], stops) if gen is not None else False
    kept = plain_drained(tok, held[start:seg[1]], stops, mid_character=mid)
    if not kept:
        return None
    end = start + len(kept)
    lcp = lcp_len(prompt, held)
    if lcp >= end:
        return None
    div = find_divergence(held, prompt, tok, lcp_ids=lcp)
    if not start <= div.lcp_text < end:
        return None  # the text does not part at the kept drained ids: nothing was dropped there
    if lcp >= start:  # ids intact up to the drained ones: splice them back in
        return held[:end] + prompt[start:]
    cut = len(tok.ids_bytes(held[:start]))  # text agrees up to here; splice the drained text in
    pb = tok.ids_bytes(prompt)
    return tok.encode((pb[:cut] + tok.ids_bytes(kept) + pb[cut:]).decode("utf-8", errors="replace"))


class _Request:
    """The request a session's server is serving, as the counterfactual tracks it.

    The server (strata_lab/server/generation.py) encodes a request's prompt once; a thinking-budget wrap-up
    continues with prompt = first prompt + thought ids + kept drained ids + wrap-up ids, built from ids and
    never re-encoded; and it calls remember_reply(first prompt, every id of the reply) once, after the
    request's last engine call. A counterfactual that re-encoded the wrap-up prompt's text would re-tokenize
    ids the engine holds (drained ' ],\\n' + wrap-up '\\n\\n' encode as ' ],\\n\\n\\n') and lose reuse the
    server keeps.
    """

    def __init__(self, request_id, recorded_prompt, prompt):
        self.request_id = request_id
        self.recorded_prompt = list(recorded_prompt)
        self.prompt = list(prompt)
        self.reply: list[int] = []

    def continued_by(self, rec) -> bool:
        """Whether `rec` is a later engine call of this request (a wrap-up continuation)."""
        rp = rec["prompt_ids"]
        return (self.request_id is not None and rec.get("request_id") == self.request_id
                and int(rec.get("call") or 0) > 0 and len(rp) >= len(self.recorded_prompt)
                and rp[:len(self.recorded_prompt)] == self.recorded_prompt)

    def continuation(self, rec) -> list[int]:
        """This call's prompt in the counterfactual: our first prompt plus the ids the server appended."""
        return self.prompt + list(rec["prompt_ids"][len(self.recorded_prompt):])

    def add_call(self, prompt, gen, drained, tok) -> None:
        """The reply so far, as the server assembles it: ids after the first prompt, this call's generated
        ids, and the leading plain drained ids (`plain_drained`, the server's rule)."""
        stops = _stop_ids(tok)
        reply = list(prompt[len(self.prompt):]) + list(gen)
        mid = ends_mid_character(tok, reply, stops)  # does the reply's text end inside a character?
        self.reply = reply + plain_drained(tok, drained, stops, mid_character=mid)

    def remember(self, encoder, tok) -> None:
        # ids past the vocabulary (a random model's spare rows) have no text: the server stops there
        known = next((k for k, i in enumerate(self.reply) if i >= tok.vocab_size), len(self.reply))
        encoder.remember_reply(self.prompt, self.reply[:known])


class PromptRewriter:
    """The prompts a server under a prompt-changing policy would have sent, call by call.

    `prompt(rec, state)` before each call (state: the session's SessionState, for the drained splice),
    `finish(rec, prompt)` after it. A request's first call is rebuilt (drained splice, then the session's
    PromptEncoder, which remembers earlier replies); a later call of the same request (a wrap-up) is the
    rebuilt first prompt plus the ids the server appended, as the server does.
    """

    def __init__(self, policy: Policy, tok):
        if not isinstance(policy, Policy):
            raise TypeError(f"policy must be a Policy, got {type(policy).__name__}")
        self.policy = policy
        self.tok = tok
        self.encoders: dict = {}
        self.requests: dict[str, _Request] = {}  # per session: the request in flight

    def prompt(self, rec, state: SessionState) -> list[int]:
        sid, tok, policy = str(rec["session"]), self.tok, self.policy
        req = self.requests.get(sid)
        if req is not None and req.continued_by(rec):
            return req.continuation(rec)
        if req is not None and policy.reply_ids:
            req.remember(self.encoders[sid], tok)  # the server remembers a reply when its request ends
        prompt = list(rec["prompt_ids"])
        if policy.keep_drained:
            prompt = keep_drained_prompt(prompt, state, tok) or prompt
        if policy.reply_ids:
            enc = self.encoders.get(sid)
            if enc is None:
                enc = self.encoders[sid] = _make_encoder(tok)
            prompt = list(enc.encode(tok.decode(prompt)))
        self.requests[sid] = _Request(rec.get("request_id"), rec["prompt_ids"], prompt)
        return prompt

    def finish(self, rec, prompt) -> None:
        self.requests[str(rec["session"])].add_call(prompt, rec["gen_ids"], rec["drained_ids"], self.tok)


def _make_encoder(tok):
    from strata_lab.text.encoder import PromptEncoder

    return PromptEncoder(tok)
