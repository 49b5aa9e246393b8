"""The transformers peer's timing, shared by engine.py and hybrid.py: one prefill, then greedy decode with
the model's own cache, tok/s for each (run in the peer's own interpreter; see those scripts)."""
import time


def prefill_decode_tok_s(model, prompt, n_decode: int, warm: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of `model` on `prompt`, after a `warm`-token warm-up call."""
    import torch

    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model(ids[:, :warm])  # warm up
        t0 = time.perf_counter()
        out = model(ids, use_cache=True)
        t1 = time.perf_counter()
        cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t2 = time.perf_counter()
        for _ in range(n_decode):
            out = model(nxt, past_key_values=cache, use_cache=True)
            cache, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
        t3 = time.perf_counter()
    return len(prompt) / (t1 - t0), n_decode / (t3 - t2)
