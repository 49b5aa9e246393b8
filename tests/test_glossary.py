"""The glossary (docs/CONTRACTS.md, "Words") holds everywhere: one word, one meaning.

Each rule is a phrase that would give a glossary word a second meaning: "checkpoint" for a weights folder
(it is a state snapshot), "engine model" (a cache model or the network?), a class or module the docs name
that does not exist. The scan covers the library, the C++ engine, benchmarks, scripts, tests, notebooks, the
README and docs/. A hit names file:line and the rule; ALLOWED lists the few lines that quote someone else.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
I = re.I

# (rule, pattern): the rule says what to write instead
RULES = [
    ("a weights folder is a model folder, not a checkpoint",
     re.compile(r"\b(hf|hugging ?face|transformers|safetensors|pretrained|hub)[ -]checkpoints?\b", I)),
    ("a weights folder is a model folder, not a checkpoint",
     re.compile(r"\bcheckpoints? (folder|dir|directory|path|file|weights|tensors|views?)s?\b", I)),
    ("a weights folder is a model folder, not a checkpoint",
     re.compile(r"\bcheckpoint's (files|weights|tensors|config|view)\b", I)),
    ("a model folder is loaded; a checkpoint is restored",
     re.compile(r"\b(load|loads|loaded|loading|download\w*)( (a|an|the|any|its|one|each))?"
                r"( (random|tiny|real|generated|bf16|f16|f32|int8|dense|hybrid|qwen3))* checkpoints?\b", I)),
    ("weights have a dtype, a checkpoint is state: 'bf16 weights', 'an f32 model folder'",
     re.compile(r"\b(bf16|f16|f32|fp16|fp32|float16|float32|bfloat16|int8|int8-stored|random|random-weight|tiny|"
                r"sharded|quantised|quantized|gguf|mmapped)( [\w/-]+)? checkpoints?\b", I)),
    ("a model's shape is not a checkpoint's",
     re.compile(r"\b(qwen3[\w.-]*|llama-?\d[\w.-]*|[\w.-]+-shaped|decoder-only) checkpoints?\b", I)),
    ("there is no `Checkpoint` class: model folders load through `ModelFolder`",
     re.compile(r"`Checkpoint`|\bclass Checkpoint\b|checkpoints\.embedded_model")),
    ("'engine model' has two readings: say 'cache model' (a simulated prefix cache) or 'the model' (the network)",
     re.compile(r"\bengine models?\b", I)),
    ("'plan' is what a cache would reuse (Words); the server's rendered prompt is a RenderedPrompt",
     re.compile(r"\bPromptPlan\b|\bmake_plan\b")),
    ("a session is a sequence of calls sharing one state, not a connection",
     re.compile(r"\b(http|browser|login|tcp) sessions?\b", I)),
]

# (file, text on the line) that may match: vocabulary and quotes, not our own words
ALLOWED = {
    ("strata_lab/fleet/generator.py", "session engine model"),          # a bag of words for generated text
    ("docs/CONTRACTS.md", 'never "engine model"'),                    # the glossary itself
}

SUFFIXES = {".py", ".pyi", ".md", ".h", ".cpp", ".toml", ".ipynb", ".jinja", ".txt", ".cfg"}
ROOTS = ["strata_lab", "engine", "benchmarks", "scripts", "tests", "notebooks", "docs"]


def scanned_files():
    files = [REPO / "README.md", REPO / "pyproject.toml", REPO / "CMakeLists.txt"]
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*")):
            rel = path.relative_to(REPO)
            if not path.is_file() or path.suffix not in SUFFIXES or "__pycache__" in rel.parts:
                continue
            if rel.parts[:2] == ("tests", "fixtures") or rel.parts[:2] == ("tests", "data"):
                continue  # other tools' logs, quoted as they are
            if path == Path(__file__).resolve():
                continue
            files.append(path)
    return [f for f in files if f.is_file()]


def offences(text: str, rel: str):
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for rule, pattern in RULES:
            m = pattern.search(line)
            if m and not any(rel == f and s in line for f, s in ALLOWED):
                out.append(f"{rel}:{i}: {m.group(0)!r} ({rule})")
    return out


def test_the_scan_sees_the_tree():
    rels = {str(p.relative_to(REPO)) for p in scanned_files()}
    assert {"README.md", "docs/CONTRACTS.md", "strata_lab/engine.py", "engine/include/strata/model_folder.h",
            "benchmarks/engine.py", "notebooks/01_reuse_divergence.ipynb"} <= rels


@pytest.mark.parametrize("line,hit", [
    ("Load a Hugging Face checkpoint from disk", True),
    ("the checkpoint directory holds config.json", True),
    ("on one random Qwen3-0.6B-shaped checkpoint", True),
    ("A tiny Qwen3 checkpoint with float32 weights", True),
    ("f16 for bf16/f16 checkpoints and int8 weights", True),
    ("`Checkpoint` memory-maps model.safetensors", True),
    ("How close the engine models are", True),
    ("restore the largest checkpoint <= l", False),
    ("a hybrid model with no checkpoint inside a reply", False),
    ("llama.cpp hybrid checkpoints now match every call", False),
    ("Checkpoint policies (a parameter of the session)", False),
    ("the engine cache models against the engines themselves", False),
])
def test_rules_catch_the_phrases(line, hit):
    assert bool(offences(line, "x.md")) is hit, offences(line, "x.md")


def test_glossary_holds_everywhere():
    found = []
    for path in scanned_files():
        try:
            text = path.read_text("utf-8")
        except UnicodeDecodeError:
            continue
        found += offences(text, str(path.relative_to(REPO)))
    assert not found, "words used against docs/CONTRACTS.md (Words):\n" + "\n".join(found)


def test_the_server_calls_a_rendered_prompt_rendered():
    # a RenderedPrompt held in a variable named `plan` would give "plan" its second meaning back
    found = []
    for path in sorted((REPO / "strata_lab" / "server").glob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"\bplans?\b", line):
                if not line[m.end():].startswith("("):   # Session.plan(...) is the reuse plan
                    found.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_every_allowance_is_used():
    # an allowance nothing needs any more is dropped, so the list stays the few quotes it is
    unused = []
    for rel, snippet in ALLOWED:
        text = (REPO / rel).read_text("utf-8")
        if not any(snippet in line and pattern.search(line) for line in text.splitlines() for _, pattern in RULES):
            unused.append((rel, snippet))
    assert not unused, unused

