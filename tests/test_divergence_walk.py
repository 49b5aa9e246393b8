"""The divergence walk (windows of held ids compared in C, then id by id) against the plain id-by-id walk
it replaced, on texts that part anywhere: same lcp_text, byte offset, contexts and retokenization flag."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_lab.replayer.divergence import _CTX_TOKENS, Divergence, _show, find_divergence
from strata_lab.text.ids import lcp_len


def reference(held, prompt, tok, *, lcp_ids, context_chars=40):
    """The id-by-id walk, as the replay computed it before the windows."""
    tb = tok.token_bytes

    def ids_bytes(ids):
        return b"".join(tb(i) for i in ids)

    nh, np_ = len(held), len(prompt)
    hi, pi, pbuf, k = lcp_ids, lcp_ids, b"", 0
    while hi < nh:
        hb = tb(held[hi])
        while len(pbuf) < len(hb) and pi < np_:
            pbuf += tb(prompt[pi])
            pi += 1
        if pbuf.startswith(hb):
            pbuf = pbuf[len(hb):]
            hi += 1
            continue
        m = min(len(hb), len(pbuf))
        while k < m and hb[k] == pbuf[k]:
            k += 1
        break
    retok = False
    if lcp_ids < hi:
        if hi >= nh:
            retok = True
        else:
            ends, off = set(), 0
            for i in range(lcp_ids, hi):
                off += len(tb(held[i]))
                ends.add(off)
            last, off = off, 0
            for i in range(lcp_ids, np_):
                off += len(tb(prompt[i]))
                if off in ends:
                    retok = True
                    break
                if off > last:
                    break
    d = Divergence(lcp_ids=lcp_ids, lcp_text=hi, byte_in_token=k, retokenized=retok)
    if lcp_ids < nh or lcp_ids < np_:
        before = ids_bytes(held[max(0, lcp_ids - _CTX_TOKENS):lcp_ids])
        d.id_context_held = "held: " + _show(before, ids_bytes(held[lcp_ids:lcp_ids + _CTX_TOKENS]), context_chars)
        d.id_context_prompt = "prompt: " + _show(before, ids_bytes(prompt[lcp_ids:lcp_ids + _CTX_TOKENS]),
                                                 context_chars)
        d.held_ids_at = tuple(held[lcp_ids:lcp_ids + 4])
        d.prompt_ids_at = tuple(prompt[lcp_ids:lcp_ids + 4])
    if hi < nh:
        hb = tb(held[hi])
        before = ids_bytes(held[max(0, hi - _CTX_TOKENS):hi]) + hb[:k]
        d.text_context_held = "held: " + _show(before, hb[k:] + ids_bytes(held[hi + 1:hi + _CTX_TOKENS]),
                                               context_chars)
        d.text_context_prompt = "prompt: " + _show(before, pbuf[k:] + ids_bytes(prompt[pi:pi + _CTX_TOKENS]),
                                                   context_chars)
    return d


WORDS = ["the", " cat", " öğrenci", " naïve", "\n\n", " 東京", "<think>", " is", " here", "!!", " 123", "ab",
         " café", "\n", " ", "--", " résumé", "x", " ∑", " 🙂"]


def pieces(tok, text, rng):
    """`text` as ids, some of them split into their byte-level pieces (a reply's own ids, not BPE's)."""
    out = []
    for part in text.split("|"):
        ids = tok.encode(part)
        if rng.random() < 0.3 and part:
            ids = [i for ch in part for i in tok.encode(ch)]
        out += ids
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=0, max_size=40), reps=st.integers(1, 30),
       cut=st.floats(0, 1), edit=st.lists(st.sampled_from(WORDS), max_size=5),
       tail=st.lists(st.sampled_from(WORDS), max_size=30), seed=st.integers(0, 2**16))
def test_windowed_walk_matches_the_id_by_id_walk(qwen3, words, reps, cut, edit, tail, seed):
    import random

    rng = random.Random(seed)
    words = words * reps  # long held texts: windows of 64+ ids get consumed before the texts part
    cut = int(cut * len(words))
    held = pieces(qwen3, "|".join(words), rng)
    prompt = pieces(qwen3, "|".join(words[:cut] + edit + words[cut:] + tail), rng)
    lcp = lcp_len(held, prompt)
    got = find_divergence(held, prompt, qwen3, lcp_ids=lcp)
    want = reference(held, prompt, qwen3, lcp_ids=lcp)
    assert got == want


def test_long_shared_text_is_walked_in_windows(qwen3):
    """A reply re-encoded by BPE over thousands of ids: the texts never part, every held id counts."""
    text = " öğrenci naïve café" * 400
    held = [i for ch in text for i in qwen3.encode(ch)]
    prompt = qwen3.encode(text + " and more")
    got = find_divergence(held, prompt, qwen3, lcp_ids=lcp_len(held, prompt))
    assert got == reference(held, prompt, qwen3, lcp_ids=lcp_len(held, prompt))
    assert got.lcp_text == len(held) and got.retokenized
