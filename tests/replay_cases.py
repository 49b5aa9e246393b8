"""Hand-built sessions with a known replay answer for each cause, written as real dump files."""
from __future__ import annotations

from strata_lab.dump.writer import Recorder

SYSTEM = "<|im_start|>system\nYou are helpful. Date: 2024-01-01<|im_end|>\n"


def turn(role: str, text: str) -> str:
    return f"<|im_start|>{role}\n{text}<|im_end|>\n"


def p1_text(user="Say something.") -> str:
    return SYSTEM + turn("user", user) + "<|im_start|>assistant\n"


def write(path, calls):
    """calls: list of dicts for Recorder.write_call (session defaults to 's')."""
    with Recorder(path) as rec:
        for i, c in enumerate(calls):
            c = dict(c)
            c.setdefault("session", "s")
            c.setdefault("prefill_ms", 1.0 + 0.01 * (len(c["prompt_ids"]) - c.get("reused", 0)))
            c.setdefault("ts", 1000.0 + i)
            rec.write_call(**c)
    return path


def case(tok, name):
    """(calls, expected) where expected is a dict for the second call: cause, reused (hybrid)."""
    enc = tok.encode
    p1 = enc(p1_text())
    follow = "\n" + turn("user", "And then?") + "<|im_start|>assistant\n"
    if name == "none":
        gen = enc("Hello there, friend.<|im_end|>")
        p2 = p1 + gen + enc(follow)
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen),
                dict(prompt_ids=p2, reused=len(p1) + len(gen))], dict(cause="none", reused=len(p1) + len(gen))
    if name == "retokenized_reply":
        # the model wrote ' öğrenci' as [130947, 5855]; BPE of the same text gives [135992]
        gen = enc("The word") + [130947, 5855] + enc(" is Turkish.<|im_end|>")
        p2 = enc(p1_text() + "The word öğrenci is Turkish.<|im_end|>" + follow)
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen),
                dict(prompt_ids=p2, reused=len(p1))], dict(cause="retokenized_reply", reused=len(p1),
                                                           reread=len(gen), attention_reused=len(p1) + 2)
    if name == "drained_dropped":
        gen = enc("<think>\nLet me think about this")
        drained = enc(" carefully")
        p2 = enc(p1_text() + "<think>\nLet me think about this\n\nTime is up, answering now.\n</think>\n\n")
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen, drained_ids=drained, finish="budget"),
                dict(prompt_ids=p2, reused=len(p1))], dict(cause="drained_dropped", reused=len(p1),
                                                           reread=len(gen))
    if name == "template_rewrite":
        gen = enc("<think>\nTwo plus two is four.\n</think>\n\nThe answer is 4.<|im_end|>")
        p2 = enc(p1_text() + "The answer is 4.<|im_end|>" + follow)   # earlier reasoning stripped
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen),
                dict(prompt_ids=p2, reused=len(p1))], dict(cause="template_rewrite", reused=len(p1), reread=0)
    if name == "template_rewrite_newline":
        # Qwen3's real template, non-thinking: the generation prompt ends with an empty think block, the model
        # writes '\n\nHello there.'. Once the next user query arrives the template drops that block, so the
        # '\n' after 'assistant' now meets the reply's '\n\n' and BPE merges them into one '\n\n\n' token:
        # the ids part one token before the text does, but only because the text after them changed.
        from strata_lab import ChatTemplate

        tmpl = ChatTemplate.from_name("qwen3")
        msgs = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Say hi."}]
        p1 = enc(tmpl.render(msgs, enable_thinking=False))          # ...assistant\n<think>\n\n</think>\n\n
        gen = enc("\n\nHello there.<|im_end|>")
        msgs = msgs + [{"role": "assistant", "content": "\n\nHello there."}, {"role": "user", "content": "More."}]
        p2 = enc(tmpl.render(msgs, enable_thinking=False))          # ...assistant\n\n\nHello there.<|im_end|>...
        think = p1.index(tok.token_id("<think>"))                    # held: 'assistant' '\n' || '<think>'
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen),
                dict(prompt_ids=p2, reused=0)], dict(cause="template_rewrite", reused=0, reread=think,
                                                     lcp_ids=think - 1, lcp_text=think)
    if name == "history_edit":
        gen = enc("Hello there.<|im_end|>")
        p2 = enc(p1_text().replace("2024-01-01", "2024-01-02") + "Hello there.<|im_end|>" + follow)
        prefix = len(enc(SYSTEM.split("2024-01-01")[0] + "2024-01-0"))
        assert p2[prefix + 1:len(p1) + len(gen)] == (p1 + gen)[prefix + 1:]   # one digit edited, the rest repeated
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen),
                dict(prompt_ids=p2, reused=0)], dict(cause="history_edit", reused=0, lcp_ids=prefix,
                                                     reread=len(p1) + len(gen) - 1)
    # (the text agrees up to the last digit: those ids are re-read, the hybrid state has no snapshot there; past
    # the edited digit the prompt repeats every held id, re-read too (Contract 3): all held ids but that digit)
    if name == "checkpoint":
        # the prompt is held up to 3 ids into the reply (an assistant prefix): the engine must re-read the
        # last token for its logits and the only snapshot is at the turn start, so 2 held ids are re-read
        gen = enc("First try.<|im_end|>")
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen),
                dict(prompt_ids=p1 + gen[:3], reused=len(p1))], dict(cause="no_state_checkpoint", reused=len(p1), reread=2)
    if name == "retry":
        # a retry of the same prompt after a reply: the turn-start snapshot kept the logits, nothing is read
        gen = enc("First try.<|im_end|>")
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen),
                dict(prompt_ids=list(p1), reused=len(p1))], dict(cause="none", reused=len(p1), reread=0)
    if name == "new_session":
        gen = enc("Hi.<|im_end|>")
        return [dict(prompt_ids=p1, reused=0, gen_ids=gen, session="a"),
                dict(prompt_ids=p1, reused=0, session="b")], dict(cause="new_session", reused=0, reread=0)
    raise KeyError(name)


CASES = ("none", "retokenized_reply", "drained_dropped", "template_rewrite", "template_rewrite_newline",
         "history_edit", "checkpoint", "retry",
         "new_session")
