"""Write notebooks/*.ipynb from the cell sources below (outputs empty): this file is the notebooks' source, and
tests/test_notebooks.py checks that the committed notebooks are what it writes. Edit a notebook here, then run:

    python scripts/make_notebooks.py

The notebooks stay thin: they call strata_lab and write only to a temp dir. tests/test_notebooks.py runs them.
"""
from __future__ import annotations

import pathlib

import nbformat

ROOT = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
SETUP = '''\
import pathlib, tempfile
from strata_lab.dump.examples import example_dumps
DUMPS = example_dumps()   # the recorded sessions shipped with strata_lab (or $STRATA_DUMPS)
TMP = pathlib.Path(tempfile.mkdtemp(prefix="strata-nb-"))  # everything this notebook writes goes here'''


def md(text):
    return nbformat.v4.new_markdown_cell(text.strip())


def code(text):
    return nbformat.v4.new_code_cell(text.strip())


NOTEBOOKS = {}

NOTEBOOKS["01_reuse_divergence"] = [
    md("""
# Reuse and divergence in a recorded agent session

A dump holds one line per engine call: the exact prompt ids, how many the engine reused, what it generated
and drained. Replaying it through the state model (Contract 1) tells how many held tokens were read again,
and why. This notebook loads a session shipped in `dumps/`, replays it, explains the misses and compares
fixes."""),
    code(SETUP + '''
from strata_lab import load_dump, load_tokenizer, replay
tok = load_tokenizer("qwen3")
dump = load_dump(DUMPS / "agent.jsonl")
dump'''),
    md("Replay under the recorded behaviour. The engine's own `reused` must match the state model's prediction."),
    code('''
report = replay(dump, tokenizer=tok)   # the engine the dump names: ours, strata, with its recorded checkpoints
print(report.format(worst=3))
assert report["calls_differ"] == 0   # the replay reuses exactly what the engine reported'''),
    code('''
frame = report.to_frame()
frame[["session", "index", "turn", "prompt_len", "held_before", "lcp_ids", "lcp_text", "reused", "read", "reread",
       "cause"]]'''),
    md("""
## Explaining the misses

`lcp_ids` is where the ids part, `lcp_text` where the *text* parts. When the text goes on past the id
divergence, the prompt re-encoded a reply the model wrote in other pieces (`retokenized_reply`); the hybrid
model cannot roll its recurrent state back, so it restarts from its last checkpoint."""),
    code('''
for r in report.worst(3):
    print(f"call {r['index']}: {r['cause']}, reused {r['reused']} of {r['held_before']} held, reread {r['reread']}")
    print("   ", r["id_context_held"]); print("   ", r["id_context_prompt"])'''),
    md("Step through the calls that missed: held and prompt aligned, the first id and text divergence marked."),
    code('''
from strata_lab.notebook.widgets import DivergenceViewer
viewer = DivergenceViewer(DUMPS / "agent.jsonl", tokenizer=tok, only_misses=True)
viewer'''),
    md("## Policies: what would the fixes have saved?\n\n"
       "`reply-ids` re-encodes each prompt as the server would with reply-id reuse on; `header` adds a "
       "checkpoint just before the generation prompt's `<|im_start|>`, which serves the template rewrite "
       "(the stripped `<think>` block) that the turn-start checkpoint cannot; `every:64` checkpoints inside "
       "replies too, at the cost of snapshot memory."),
    code('''
from strata_lab.caches import compare_policies   # each policy through replay(), our engine, a snapshot per prompt end
table = compare_policies(dump, ["recorded", "reply-ids", "keep-drained", "fixes", "header", "fixes+header",
                                "every:64"], tokenizer=tok, checkpoints="turn")
table'''),
    code('''
best = table.set_index("policy")
assert best.loc["reply-ids", "reread"] <= best.loc["recorded", "reread"]
assert best.loc["header", "reread"] < best.loc["recorded", "reread"]
from strata_lab.notebook.plots import plot_report
plot_report(frame, TMP / "agent.png", policies=table)
print("wrote", TMP / "agent.png")'''),
    md("The thinking-budget session: a late STOP leaves drained ids in the engine. The server keeps the plain-text "
       "ones in the wrap-up call's prompt (pr-1536), so `keep-drained` only matters for ids it had to drop; the "
       "misses left come from the template stripping the reasoning on the next turn."),
    code('''
thinking = replay(DUMPS / "thinking.jsonl", tokenizer=tok)
print(thinking.format(worst=2))
compare_policies(DUMPS / "thinking.jsonl", ["recorded", "keep-drained"], tokenizer=tok, checkpoints="turn")'''),
    code('''
from strata_lab.notebook.widgets import ReuseDashboard
ReuseDashboard(DUMPS / "thinking.jsonl", policies=("recorded", "keep-drained", "fixes"), tokenizer=tok)'''),
]

NOTEBOOKS["02_tokenizer_boundaries"] = [
    md("""
# Tokenizer boundaries

One text, many id sequences. A model samples pieces one at a time, so it can write ` öğrenci` as
`' öğ' 'renci'` while BPE encodes the same text as one token. The next prompt re-encodes the reply and the
ids part although the text is identical. This notebook shows the hazards, the hypothesis strategies that
generate them, and the properties of the `PromptEncoder` that keeps a reply's own ids."""),
    code('''
import tempfile
from hypothesis.configuration import set_hypothesis_home_dir
set_hypothesis_home_dir(tempfile.mkdtemp(prefix="strata-nb-"))  # hypothesis' own files go to a temp dir
from strata_lab import load_tokenizer
from strata_lab.notebook.tokview import tokens_html
from IPython.display import HTML, display
tok = load_tokenizer("qwen3")
for text in [" öğrenci", " hello", "[a-zçğıöşü]+", "2024-05-01", "<think>\\nhm\\n</think>"]:
    ids = tok.encode(text)
    print(f"{text!r:28} -> {ids}")'''),
    md("The same text spelled by ids a model can emit (all valid; they decode to the same bytes):"),
    code('''
alternatives = {" öğrenci": [130947, 5855], " hello": [220, 14990], "ğ": [128, 253]}
for text, ids in alternatives.items():
    assert tok.ids_bytes(ids) == text.encode() and tok.encode(text) != ids
    display(HTML(f"<b>{text!r}</b> canonical" + tokens_html(tok, tok.encode(text)) + "model" + tokens_html(tok, ids)))'''),
    md("""
## Strategies

`strata_lab.testing.strategies` builds texts from boundary hazards (Turkish letters, combining marks, emoji, tag
fragments, whitespace runs, digits, code) and alternative tokenizations of them. Drawn here with a fixed
seed through hypothesis itself."""),
    code('''
from hypothesis import given, settings, HealthCheck, strategies as st
from strata_lab.testing.strategies import alternative_tokenizations, texts

drawn = []
@settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def collect(data):
    text = data.draw(texts(6))
    ids = data.draw(alternative_tokenizations(tok, text))
    assert tok.ids_bytes(ids) == text.encode("utf-8")   # every alternative spells the same bytes
    drawn.append((text, tok.encode(text), ids))
collect()
differ = [(t, c, a) for t, c, a in drawn if c != a]
print(f"{len(drawn)} texts, {len(differ)} drawn with ids other than BPE's")
for t, c, a in differ[:5]:
    print(repr(t)[:50], len(c), "ids canonical,", len(a), "as drawn")'''),
    md("""
## The encoder's properties

* `decode(encode(t)) == nfc(t)`, and without replies `encode(t) == tokenizer.encode(t)`;
* told a reply (`remember_reply(prompt_ids, gen_ids)`), it keeps the model's own ids when the next prompt
  renders the reply again, so the prompt extends what the engine holds."""),
    code('''
from strata_lab.text.encoder import PromptEncoder

@settings(max_examples=30, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(texts(8), texts(8))
def encoder_matches_bpe(a, b):
    enc = PromptEncoder(tok)
    enc.encode(a)
    assert enc.encode(a + b) == tok.encode(a + b)
encoder_matches_bpe()
print("encode(a + b) after encode(a) equals BPE of a + b: ok")'''),
    code('''
enc = PromptEncoder(tok)
prompt = enc.encode("<|im_start|>user\\nname a student<|im_end|>\\n<|im_start|>assistant\\n")
reply = tok.encode("Ali is an") + [130947, 5855] + [tok.im_end_id]          # ' öğrenci' in two pieces
enc.remember_reply(prompt, reply)
next_text = tok.decode(prompt + reply) + "\\n<|im_start|>user\\nthanks<|im_end|>\\n<|im_start|>assistant\\n"
plain, reusing = tok.encode(next_text), enc.encode(next_text)
held = prompt + reply
def lcp(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
    return n
print("held", len(held), "| lcp with BPE prompt", lcp(plain, held), "| lcp with encoder prompt", lcp(reusing, held))
print(enc.last_stats)
assert reusing[:len(held)] == held and lcp(plain, held) < len(held)'''),
]

NOTEBOOKS["03_agent_session"] = [
    md("""
# An agent session: record, reproduce, A/B reply-id reuse

`strata_lab.sessions.runs` drives a scripted agent (tool calls decided by the script, replies by the model)
against the project's OpenAI-compatible server on the embedded tiny hybrid model, recording every engine
call. Then it reproduces the dump through the engine (same prompts, the same generated ids forced) and
rewrites the session under a policy."""),
    code(SETUP + '''
from strata_lab import replay, sessions
off = sessions.record("agent", TMP / "off.jsonl", reply_id_reuse=False, turns=4, max_tokens=24, seed=1)
on = sessions.record("agent", TMP / "on.jsonl", reply_id_reuse=True, turns=4, max_tokens=24, seed=1)
print(off, on, sep="\\n")'''),
    code('''
for name, path in [("reply-id reuse off", off.path), ("reply-id reuse on", on.path)]:
    r = replay(path, "strata", checkpoints="recorded")   # our engine with the snapshots it recorded
    print(f"{name:20} reused {r['reused']:5}  read {r['read']:5}  reread {r['reread']:5}  "
          f"prefill {r['prefill_s']:.3f} s (modelled)  causes {r['causes']}")'''),
    md("Reproduce the recorded session through a fresh engine: reuse and read counts must match exactly."),
    code('''
repro = sessions.reproduce(off.path)
print(repro.summary())
assert repro.exact
repro.to_frame()'''),
    md("Rewrite the same session as if the server had reused reply ids, and run it again."),
    code('''
rewritten = sessions.rewrite(off.path, TMP / "rewritten.jsonl", policy="reply-ids")
print(rewritten.summary())
print("reread before", replay(off.path, "strata", checkpoints="recorded")["reread"],
      "after", replay(TMP / "rewritten.jsonl", "strata", checkpoints="recorded")["reread"])'''),
]

NOTEBOOKS["04_templates_and_prefill"] = [
    md("""
# Templates and prefill

The chat template turns messages into prompt text; an assistant prefix (prefill) starts the reply with text
the model continues. `TemplateExplorer` shows the rendered prompt with token boundaries and where the prefix
starts; `PrefixExperiment` runs an engine with and without the prefix."""),
    code('''
from IPython.display import HTML, display
from strata_lab.notebook.widgets import TemplateExplorer
tools = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
          "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
explorer = TemplateExplorer([{"role": "user", "content": "Öğrenci listesini oku."}], tools=tools,
                            assistant_prefix="<tool_call>\\n", enable_thinking=False)
display(HTML(explorer.summary.value))
explorer'''),
    md("Changing an input re-renders (as typing in the widget does):"),
    code('''
explorer.prefix.value = "\\nSure"
display(HTML(explorer.summary.value))  # the prefix's newline merged with the template's: one token spans both
explorer.thinking.value = "on"
print(repr(explorer.prompt_text[-60:]))'''),
    md("""
## Append-only check

A template that rewrites history (here: Qwen3 drops the reasoning of earlier turns) makes the next prompt
part from what the engine holds. `check_append_only` finds where."""),
    code('''
from strata_lab import ChatTemplate
conversation = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "two and two"},
                {"role": "user", "content": "and 3+3?"}]
for finding in ChatTemplate.from_name("qwen3").check_append_only(conversation):
    print(finding)'''),
    md("## Prefill on an engine (the embedded tiny model: random weights, so the words are noise; the mechanics are real)"),
    code('''
import tempfile
from strata_lab.tiny import make_tiny
from strata_lab.engine import Engine
from strata_lab.notebook.widgets import PrefixExperiment
engine = Engine.load(make_tiny(tempfile.mkdtemp(prefix="strata-nb-")), threads=1)
experiment = PrefixExperiment(engine, [{"role": "user", "content": "Merhaba!"}], assistant_prefix="Tamam,",
                              max_new_tokens=8)
results = experiment.run()
for side, r in results.items():
    print(side, len(r["prompt_ids"]), "prompt ids, first-step top:", [(i, round(p, 4)) for i, _, p in r["top"][:3]])
    assert r["gen_ids"][0] == r["top"][0][0]      # greedy decode starts with the top candidate
experiment'''),
]

NOTEBOOKS["05_import_your_traffic"] = [
    md("""
# Import your traffic

The logs you already have (a Claude Code session, an OpenAI request log, OTel spans, a HAR capture, vLLM /
SGLang / llama.cpp server logs ...) read into one trace table, rendered into the exact token ids a server
would have prefilled with a tokenizer and chat template of your choice, and replayed under our engine's
semantics. This notebook uses small example logs shipped in `dumps/logs/`."""),
    code(SETUP + '''
LOGS = DUMPS / "logs"
import warnings
from strata_lab import load_trace, load_tokenizer, replay
from strata_lab.traces import TraceWarning
warnings.simplefilter("ignore", TraceWarning)   # the example logs hold bad lines on purpose
tok = load_tokenizer("qwen3")'''),
    md("## A Claude Code session (with its subagent)\n\n`format=None` detects each file's format and says why."),
    code('''
claude = load_trace(str(LOGS / "claude-code-*.jsonl"))
for path, (fmt, why) in claude.detected.items():
    print(pathlib.Path(path).name, "->", fmt, "|", why)
calls = claude.to_frame()
calls[["session", "call", "model", "n_messages", "prompt_tokens", "cache_read_tokens", "cache_creation_tokens",
       "notes"]]'''),
    md("## An OpenAI request log\n\nRequest and response pairs; sessions are derived by prefix-chaining the messages."),
    code('''
openai_log = load_trace(LOGS / "openai.jsonl")
frame = openai_log.to_frame()
frame[["session", "call", "n_messages", "response_text", "prompt_tokens", "cached_tokens", "notes"]]'''),
    md("""
## Is this the template the server used?

Rendering each call with our Qwen3 template and vocabulary and comparing with the `prompt_tokens` the log
reports: the first two calls match to the token; the third does not (the server's template differed), and the
Claude Code calls are far off because that log holds neither the system prompt nor the tool definitions."""),
    code('''
check = openai_log.render_check(tok)
print(check.to_string(index=False))
assert check["render_exact"].tolist()[:3] == [True, True, False]
claude.render_check(tok)[["session", "call", "rendered_len", "prompt_tokens", "render_diff"]]'''),
    md("""
## Reuse under our engine's semantics

`to_dump` writes strata-dump/1 lines, so everything that replays dumps works on the imported trace. Per call:
what our engine would reuse and re-read, and the cause of each miss, beside what the hosted cache reported."""),
    code('''
dump = claude.to_dump(tok, out=TMP / "claude.jsonl")
report = replay(dump, engine="strata:checkpoints=turn", tokenizer=tok)   # our engine, a snapshot per prompt end
print(report.format(worst=2))
ours = report.frame().sort_values("index")[["session", "index", "turn", "prompt_len", "reused", "read", "cause"]]
ours["hosted_cache_read"] = calls["cache_read_tokens"].values
ours'''),
    code('''
import matplotlib.pyplot as plt
from strata_lab.caches.plotstyle import house_style, legend_outside   # both JupyterLab themes
labels = ours["session"].str[-12:] + " #" + ours["index"].astype(str)
fig, ax = plt.subplots(figsize=(7, 3), layout="constrained")
ax.bar(labels, ours["prompt_len"], label="prompt (Qwen3 render)")
ax.bar(labels, ours["reused"], label="reused by our engine")
ax.set_ylabel("tokens"); legend_outside(ax); ax.set_title("Claude Code session under our engine's semantics")
house_style(fig);'''),
    md("Counterfactual checkpoint policies on the same calls:"),
    code('''
from strata_lab.caches import compare_policies
compare_policies(dump, ["recorded", "header", "every:16"], tokenizer=tok, kind="hybrid")'''),
    md("""
## Reproduce through the engine

The same prompts run through the embedded tiny hybrid model, each reply forced from the log: the engine's reused
count equals the replay's prediction on every call."""),
    code('''
from strata_lab.sessions import reproduce
engine = reproduce(dump, model="hybrid")
engine_reused = [r["reused"] for r in engine.rows]
predicted = ours["reused"].tolist()
print("engine", engine_reused, "replay", predicted)
assert engine_reused == predicted'''),
]


NOTEBOOKS["06_engines_side_by_side"] = [
    md("""
# The same traffic under vLLM, SGLang, llama.cpp, TensorRT-LLM and hosted prompt caching

`strata_lab.caches` replays a trace under each engine's own prefix-cache rules (block rounding, the
length - 1 cap, slots, checkpoints, TTLs, breakpoints), with every parameter as data in a versioned preset.
This notebook compares engines on the shipped dumps, explains their misses, sweeps the cache budget, and
applies one fix with a before/after measurement."""),
    code(SETUP + '''
import strata_lab as sl
from strata_lab.caches import replay_engines, parse_engine
from strata_lab.caches.sweeps import sweep_budget, plot_budget_sweep, plot_engines
tok = sl.load_tokenizer("qwen3")
AGENT = DUMPS / "agent.jsonl"
parse_engine("vllm"), parse_engine("llama.cpp:slots=4").spec()'''),
    md("""
## Engines side by side

`strata` is our engine (Contract 1): it must reproduce the `reused` our engine recorded on every call.
The others model what their engine would have served from the same prompts."""),
    code('''
report = replay_engines(AGENT, ["strata", "vllm", "sglang", "llama.cpp", "trtllm", "openai", "anthropic",
                                "vllm:model=qwen3-next-80b-a3b", "llama.cpp:model=qwen3-next-80b-a3b"],
                        tokenizer=tok)
print("\\n".join(report.lines()))
summary = report.summary()
assert summary.set_index("spec").loc["strata@1", "calls_differ"] == 0   # exact against our engine
summary[["spec", "hit_rate", "reused", "reread", "dollars"]]'''),
    code('''
fig = plot_engines(report)'''),
    md("""
## Why each engine missed

`cause` uses the replay's vocabulary (`retokenized_reply`, `template_rewrite`, ...) where the prompt parted
from what the session held, and the engine's own reason where the engine lost more than a token-exact cache
would: `block_rounding` (vLLM's full blocks, the inflated block of hybrid models), `below_minimum` (hosted
APIs under 1024 ids), `no_state_checkpoint` (a hybrid model with no recurrent state at the reusable
position), `evicted`, `expired`, `slot_stolen`, `routing`."""),
    code('''
df = report.frame()
df[df["cause"] != "none"][["spec", "index", "prompt_len", "exact", "reused", "reread", "unit", "cause"]]'''),
    md("## Cache budget sweep: hit rate as the cache shrinks"),
    code('''
sweep = sweep_budget(DUMPS / "webui.jsonl", ["vllm", "sglang", "trtllm"], [128, 256, 512, 1024, 4096])
fig = plot_budget_sweep(sweep)
sweep[["spec", "budget", "hit_rate", "reread", "evictions"]]'''),
    md("""
## Lint and fix

The shipped agent dump's system prompt is stable. To show a fix, make a copy whose system prompt carries
the request time (a common habit), lint it, fix it by moving that line to the end of the prompt, and replay
both under every engine."""),
    code('''
import dataclasses
from strata_lab.caches import lint_calls, fix_calls
from strata_lab.caches.call_ids import calls_from_dump, write_calls, as_ids
from strata_lab.caches.lint import before_after

stamped = []
for c in calls_from_dump(AGENT):
    text = tok.decode(c.prompt.tolist())
    cut = text.index("\\n") + 1                      # after "<|im_start|>system\\n"
    text = text[:cut] + f"Request time: 2026-12-01T10:{c.index:02d}:00Z\\n" + text[cut:]
    stamped.append(dataclasses.replace(c, prompt=as_ids(tok.encode(text)), memo=None))
write_calls(stamped, TMP / "stamped.jsonl")
findings = lint_calls(TMP / "stamped.jsonl", tok)
for f in findings:
    print(f)
assert any(f.rule == "volatile_system" for f in findings)'''),
    code('''
fixed = fix_calls(TMP / "stamped.jsonl", findings, tokenizer=tok)
table = before_after(TMP / "stamped.jsonl", fixed, ["vllm", "sglang", "llama.cpp", "strata:kind=attention"])
assert (table["reused_after"] > table["reused_before"]).all()
table'''),
    md("""
## Pick engines yourself

`EngineExplorer` replays under the engines you tick and the specs you type (one per line, e.g.
`vllm:block_size=32,kv_tokens=2000` or `llama.cpp:slots=2,model=qwen3-next-80b-a3b`)."""),
    code('''
from strata_lab.caches.widget import EngineExplorer
explorer = EngineExplorer(AGENT, engines=("vllm", "sglang", "llama.cpp:model=qwen3-next-80b-a3b"))
explorer'''),
]


NOTEBOOKS["07_production_traces"] = [
    md("""
# Production traces: how big must the prefix cache be?

Public KV-cache traces of real services carry no text, only one hash per block of prompt tokens: Mooncake
(Kimi, FAST'25: `timestamp`, `input_length`, `output_length`, `hash_ids` of 512-token blocks) and
Qwen-Bailian (Alibaba, ATC'25: chats with `parent_chat_id`, 16-token blocks). strata_lab reads both,
turns each block into synthetic token ids (equal blocks, equal ids), and replays them under every engine's
cache model, with time and concurrency, across capacities and eviction policies.

This notebook reproduces the Mooncake paper's hit-rate-vs-capacity figure (a 3 M-token cache reaches less
than half of the attainable hit rate, about 50 M tokens nearly all of it), then draws the same figure for
your own traffic after exporting it as an anonymous trace.

**Your trace:** set `TRACE` to a Mooncake or Bailian JSONL file (e.g. Mooncake's
`FAST25-release/traces/conversation_trace.jsonl`), or the environment variable `STRATA_TRACE`. Left empty,
the notebook generates a small Mooncake-shaped trace so that it runs in seconds."""),
    code(SETUP + """
import os
import numpy as np
import strata_lab as sl
from strata_lab.traces.hashtrace import MooncakeShape, generate_mooncake, write_hash_trace

TRACE = os.environ.get("STRATA_TRACE") or None        # your Mooncake / Bailian file here
if TRACE is None:   # a small generated trace (the benchmark uses the full 12,000 requests, 145 M tokens)
    TRACE = TMP / "mooncake.jsonl"
    write_hash_trace(generate_mooncake(MooncakeShape(requests=1500, seed=7)), TRACE, "mooncake")
trace = sl.load_hash_trace(TRACE)
print(f"{trace.format}: {len(trace)} requests, {trace.prompt_tokens / 1e6:.1f} M prompt tokens, "
      f"{trace.block}-token blocks")
trace.to_frame().describe()"""),
    md("""
## Hit rate against capacity

`sl.sweep` replays the trace's block stream under LRU, LFU and the workload-aware policy of the ATC'25
paper (`atc25`: evict the block least likely to be reused soon, per request category), and under vLLM's
own cache model (16-token blocks, outputs cached, hit capped at `prompt_len - 1`), from 10^4 to 10^9
tokens. Hit rate is token-weighted: reused prompt tokens over all prompt tokens. The small generated trace
holds about 17 M tokens, so 3 M tokens is a large share of it; on the full-size generated trace (12,000
requests, 145 M tokens, `benchmarks/hash_traces.py`) 3 M tokens reach 47 % of the attainable hit rate and
50 M all of it, the shape of the paper's figure."""),
    code("""
caps = [10**4, 3 * 10**4, 10**5, 3 * 10**5, 10**6, 3 * 10**6, 10**7, 5 * 10**7, 10**8, 10**9, None]
curve = sl.sweep(trace, capacities=caps, policies=["lru", "lfu", "atc25"])
engine = sl.sweep(trace, capacities=[10**5, 10**6, 3 * 10**6, 5 * 10**7, None], policies=["vllm"])
import pandas as pd
frame = pd.concat([curve, engine], ignore_index=True)
fig = sl.plot_sweep(frame, title=f"{os.path.basename(str(TRACE))}: hit rate vs capacity")
for x in (3e6, 5e7):
    fig.axes[0].axvline(x, color="k", lw=0.6, ls="--")
lru = curve[curve["policy"] == "lru"].set_index("capacity")["hit_rate"]
best = lru[lru.index.isna()].iloc[0]
print(f"unbounded: {best:.1%}; 3 M tokens: {lru.loc[3 * 10**6]:.1%} ({lru.loc[3 * 10**6] / best:.0%} of it); "
      f"50 M tokens: {lru.loc[5 * 10**7]:.1%} ({lru.loc[5 * 10**7] / best:.0%} of it)")
assert lru.loc[3 * 10**6] < lru.loc[5 * 10**7] <= best + 1e-12"""),
    md("""
## Every engine, with time and concurrency

Requests arrive at their timestamps and stay in flight for a modelled time (here 8,000 prefill and 40
decode tokens/s); the blocks of requests in flight are pinned. Sequential replay (the default) is the
same trace one request at a time."""),
    code("""
from strata_lab.caches.call_ids import calls_from_hash_trace
calls = calls_from_hash_trace(trace)
engines = ["vllm:kv_tokens=3000000", "sglang:max_total_tokens=3000000", "trtllm:kv_tokens=3000000"]
seq = sl.replay_engines(calls[:400], engines).summary()
conc = sl.replay_engines(calls[:400], engines, concurrency=True, tokens_per_s=(8000, 40)).summary()
seq[["spec", "hit_rate"]].assign(concurrent_hit_rate=conc["hit_rate"].values)"""),
    md("""
## A second tier, and one shared pool against per-replica caches

A host-RAM tier of 10x the GPU cache (as SGLang HiCache, LMCache or llama.cpp `--cache-ram` keep) catches
what the first tier evicts. A fleet of 4 replicas with one shared pool keeps every prefix once; 4
per-replica caches of a quarter of the size each keep what their own requests saw."""),
    code("""
tiers = sl.sweep(trace, capacities=[3 * 10**5, 10**6, 3 * 10**6], policies=["lru"], tier2=3 * 10**7)
fleet = sl.sweep(trace, capacities=[10**6, 3 * 10**6, 10**7], policies=["lru"], replicas=4)
tiers[["capacity", "tier2", "hit_rate", "tier2_hit_rate"]]"""),
    code("""
fleet[["capacity", "layout", "hit_rate"]].pivot(index="capacity", columns="layout", values="hit_rate")"""),
    md("""
## Your own traffic, published the same way

`strata-lab export DUMP --format mooncake|bailian --out FILE` (here `sl.export_trace`) writes a dump or a
store as an anonymous hash trace: salted block hashes remapped to integers, lengths, relative timestamps,
chat/parent ids; no text and no ids. By default a block shared by fewer than 3 sessions keeps its reuse
only inside its own session (`min_sessions`, so planted guesses cannot be matched); with `min_sessions=1`, as
here, the export re-imported and replayed under vLLM with its block size gives exactly the original's hits.
Set `DUMP` to your own dump or store."""),
    code("""
DUMP = DUMPS / "agent.jsonl"                         # your dump or store here
mine = TMP / "mine.jsonl"
sl.export_trace(DUMP, mine, format="bailian", block=16, min_sessions=1)   # every block's reuse kept
print(open(mine).readline()[:200], "...")
orig = sl.replay_engines(DUMP, ["vllm:block_size=16"]).frame()["reused"].tolist()
again = sl.replay_engines(sl.load_hash_trace(mine), ["vllm:block_size=16"]).frame()["reused"].tolist()
assert again == orig   # the export keeps every hit
own = sl.sweep(sl.load_hash_trace(mine), capacities=[64, 128, 256, 512, 1024, 4096, None],
               policies=["lru", "atc25", "vllm"])
fig = sl.plot_sweep(own, title="your traffic: hit rate vs capacity")"""),
]


def notebook(name: str):
    """The notebook `name` as this script writes it: no outputs, stable cell ids (tests/test_notebooks.py holds the
    committed files equal to it)."""
    nb = nbformat.v4.new_notebook(cells=NOTEBOOKS[name], metadata={
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{name[:2]}-{i:02d}"  # stable ids: regenerating gives the same file
    nbformat.validate(nb)
    return nb


def main() -> None:
    ROOT.mkdir(exist_ok=True)
    for name in NOTEBOOKS:
        nbformat.write(notebook(name), ROOT / f"{name}.ipynb")
        print("wrote", ROOT / f"{name}.ipynb")


if __name__ == "__main__":
    main()
