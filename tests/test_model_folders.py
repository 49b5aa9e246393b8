"""Any model's tokenizer and chat template, loaded offline from a Hugging Face folder (or a GGUF), must render
and tokenize a conversation to exactly the ids transformers gives: three tokenizer families, three template styles.

* byte-level BPE: the real Qwen3 vocabulary plus Gemma-style turn tokens, template in tokenizer_config.json as a
  named list (``default`` / ``tool_use``);
* SentencePiece-style BPE (Llama 2 layout: ``▁`` metaspace) trained here with `tokenizers` on a few KB of text,
  Llama-3-style template in chat_template.jinja, bos/eos in special_tokens_map.json;
* Unigram (T5/Mistral layout) trained the same way, Mistral-style template as a string in tokenizer_config.json.
"""
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from strata_lab import ChatTemplate, load_tokenizer
from test_template import TOOLS, conversations

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"

# a few KB of training text: prose, code, JSON and the chat words the templates use
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the weather in Paris stays sunny and mild.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    '{"name": "get_weather", "arguments": {"city": "Paris", "n": 1}, "id": "call_1"}',
    "You are a helpful assistant. Answer the user's question about the tools and their results.",
    "Environment: ipython\nTools:\nsearch the web, read a file, write a file, list the directory.",
    "Hello, hi, thanks! Can you help me with this? Sure, here is the answer: 42.",
    "öğrenci çalışıyor, the student works; l'élève travaille; der Schüler arbeitet.",
]


def _train_text():
    return [line for _ in range(12) for line in _CORPUS]


def _write_config(folder: Path, **config):
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False, **config}))


@pytest.fixture(scope="module")
def folders(tmp_path_factory, qwen3):
    from tokenizers import AddedToken, Tokenizer
    from tokenizers.implementations import SentencePieceBPETokenizer, SentencePieceUnigramTokenizer

    root = tmp_path_factory.mktemp("model_folders")
    out = {}

    # 1. byte-level BPE: the real Qwen3 vocabulary with Gemma-style turn tokens added
    d = root / "bytelevel-gemma"
    d.mkdir()
    tok = Tokenizer.from_str(qwen3.hf.to_str())
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in
                            ("<bos>", "<start_of_turn>", "<end_of_turn>")])
    tok.save(str(d / "tokenizer.json"))
    gemma = (TEMPLATES / "gemma_style.jinja").read_text()
    _write_config(d, bos_token="<bos>", eos_token={"__type": "AddedToken", "content": "<end_of_turn>", "special": True,
                                               "lstrip": False, "rstrip": False, "normalized": False,
                                               "single_word": False},
                  pad_token="<|endoftext|>",
                  chat_template=[{"name": "default", "template": gemma},
                                 {"name": "tool_use", "template": gemma.replace("You can call", "Call")}])
    out["bytelevel"] = d

    # 2. SentencePiece-style BPE, Llama-3 turn tokens, template in chat_template.jinja
    d = root / "spbpe-llama"
    d.mkdir()
    specials = ["<unk>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                "<|eot_id|>"]
    bpe = SentencePieceBPETokenizer()
    bpe.train_from_iterator(_train_text(), vocab_size=400, min_frequency=2, special_tokens=specials,
                            show_progress=False)
    bpe.save(str(d / "tokenizer.json"))
    shutil.copy(TEMPLATES / "llama_style.jinja", d / "chat_template.jinja")
    (d / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "unk_token": "<unk>"}))
    _write_config(d)
    out["spbpe"] = d

    # 3. Unigram, Mistral-style control tokens, template as a string in tokenizer_config.json
    d = root / "unigram-mistral"
    d.mkdir()
    specials = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[THINK]", "[/THINK]"]
    uni = SentencePieceUnigramTokenizer()
    uni.train_from_iterator(_train_text(), vocab_size=300, special_tokens=specials, unk_token="<unk>",
                            show_progress=False)
    uni.save(str(d / "tokenizer.json"))
    _write_config(d, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                  chat_template=(TEMPLATES / "mistral_style.jinja").read_text())
    out["unigram"] = d
    return out


@pytest.fixture(scope="module")
def hf_tokenizers(folders):
    from transformers import AutoTokenizer

    return {k: AutoTokenizer.from_pretrained(str(d)) for k, d in folders.items()}


def _hf_ids(hf, messages, **kwargs):
    out = hf.apply_chat_template(messages, tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _normalized(messages):
    # the traces and the server hand templates reasoning as reasoning_content (validate_messages renames it)
    return [{("reasoning_content" if k == "reasoning" else k): v for k, v in m.items()} for m in messages]


def test_folders_load_their_family(folders):
    kinds = {}
    for key, d in folders.items():
        tok = load_tokenizer(d)
        kinds[key] = json.loads(tok.hf.to_str())["model"]["type"]
        assert load_tokenizer(d / "tokenizer.json") is tok  # one object per file
    assert kinds == {"bytelevel": "BPE", "spbpe": "BPE", "unigram": "Unigram"}
    assert ChatTemplate.from_file(folders["bytelevel"]).special_tokens["eos_token"] == "<end_of_turn>"
    assert ChatTemplate.from_file(folders["spbpe"]).special_tokens["bos_token"] == "<|begin_of_text|>"
    assert ChatTemplate.from_file(folders["unigram"]).special_tokens == {"bos_token": "<s>", "eos_token": "</s>",
                                                                         "unk_token": "<unk>"}
    assert "Call these" not in ChatTemplate.from_file(folders["bytelevel"]).source
    assert "Call these" in ChatTemplate.from_file(folders["bytelevel"], variant="tool_use").source


def test_token_bytes_of_sentencepiece_pieces(folders):
    tok = load_tokenizer(folders["spbpe"])
    ids = tok.encode("Hello world")
    assert tok.ids_bytes(ids).strip() == b"Hello world"


@pytest.mark.parametrize("family", ["bytelevel", "spbpe", "unigram"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=conversations(), with_tools=st.booleans(), add_generation_prompt=st.booleans())
def test_render_parity_with_transformers(folders, hf_tokenizers, family, messages, with_tools,
                                         add_generation_prompt):
    messages = _normalized(messages)
    tok, tmpl = load_tokenizer(folders[family]), ChatTemplate.from_file(folders[family])
    tools = TOOLS if with_tools else None
    ours = tok.encode(tmpl.render(messages, tools=tools, add_generation_prompt=add_generation_prompt))
    theirs = _hf_ids(hf_tokenizers[family], messages, tools=tools, add_generation_prompt=add_generation_prompt)
    assert ours == theirs


def test_gguf_chat_template_and_special_tokens(tmp_path, folders, hf_tokenizers):
    import gguf

    src = ChatTemplate.from_file(folders["spbpe"])
    tokens = ["<unk>", "<|begin_of_text|>", "<|eot_id|>", "hello"]
    path = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_chat_template(src.source)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmpl = ChatTemplate.from_file(path)
    assert tmpl.special_tokens == {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    assert tmpl.source == src.source
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "Hello"}]
    assert load_tokenizer(folders["spbpe"]).encode(tmpl.render(msgs)) == _hf_ids(
        hf_tokenizers["spbpe"], msgs, add_generation_prompt=True)
    d = tmp_path / "gguf_only"
    d.mkdir()
    shutil.copy(path, d / "m.gguf")
    assert ChatTemplate.from_file(d).source == src.source  # a folder holding just a GGUF


def test_folder_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="no chat_template.jinja"):
        ChatTemplate.from_file(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a tokenizer.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "x.gguf").write_bytes(b"nope")
    with pytest.raises(ValueError, match="not a readable GGUF"):
        ChatTemplate.from_file(tmp_path / "x.gguf")


@pytest.mark.parametrize("family", ["bytelevel", "spbpe", "unigram"])
def test_imported_trace_renders_and_replays_with_any_family(folders, hf_tokenizers, family, tmp_path):
    import warnings

    from strata_lab import load_trace, replay
    from strata_lab.traces import TraceWarning

    fixture = Path(__file__).parent / "fixtures" / "traces" / "openai.jsonl"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TraceWarning)
        trace = load_trace(fixture)
        calls = trace.calls()
        dump = trace.to_dump(folders[family], out=tmp_path / "d.jsonl")  # template from the same folder
        report = replay(dump, engine="strata:kind=attention", tokenizer=load_tokenizer(folders[family]))
    hf = hf_tokenizers[family]
    for call, rec in zip(calls, dump.records()):
        assert rec["prompt_ids"] == _hf_ids(hf, call["messages"], tools=call["tools"], add_generation_prompt=True)
    assert len(report.rows) == len(calls) and report.rows[1]["reused"] > 0
