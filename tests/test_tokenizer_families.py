"""Any tokenizer: five families' tokenizer.json files (built offline, tests/tokenizer_families.py) against
transformers loading the same file, with each family's special tokens in the text: the same ids, the same
text back, a byte table that spells exactly that text, and alternative tokenizations that spell it too. Ids a
vocabulary does not have, and dumps that name another family's model, are clear errors."""
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import tokenizer_families as tf
from strata_lab.testing.strategies import alternative_tokenizations, texts
from strata_lab.text.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("families")
    out = {}
    for fam in tf.FAMILIES:
        folder = tf.build(fam, root / fam)
        out[fam] = (load_tokenizer(folder), PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")))
    return out


def _prompts(fam):
    return st.lists(st.one_of(st.sampled_from(tf.SPECIALS[fam]), texts(4)), max_size=6).map("".join)


# SentencePiece files whose decoder strips the space the normalizer put before the first piece
_STRIPS_FIRST = {"mistral"}


@pytest.mark.parametrize("fam", tf.FAMILIES)
def test_files_are_small_and_of_their_kind(families, fam, tmp_path):
    tok, _ = families[fam]
    if fam != "qwen3":
        path = tf.build(fam, tmp_path) / "tokenizer.json"
        assert path.stat().st_size < 200_000
        cfg = json.loads(path.read_text())
        assert cfg["model"]["type"] == {"gemma": "Unigram"}.get(fam, "BPE")
        assert cfg["model"].get("byte_fallback", False) == (fam in ("mistral", "gemma"))
    for s in tf.SPECIALS[fam]:
        assert tok.encode(s) == [tok.added_tokens[s]] and tok.token_bytes(tok.added_tokens[s]) == s.encode()


@pytest.mark.parametrize("fam", tf.FAMILIES)
def test_parity_with_transformers(families, fam):
    tok, hf = families[fam]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(text=_prompts(fam), data=st.data())
    def check(text, data):
        ids = tok.encode(text)
        assert ids == hf(text, add_special_tokens=False)["input_ids"]
        back = hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert tok.decode(ids) == back
        spelled = tok.ids_bytes(ids).decode("utf-8")  # every id's bytes, joined: exactly the decoded text
        assert spelled == back or (fam in _STRIPS_FIRST and spelled == " " + back)
        for s in tf.SPECIALS[fam]:  # special-token strings in the text are their ids (parse_special)
            if text.count(s) and not any(o != s and s in o and o in text for o in tf.SPECIALS[fam]):
                assert ids.count(tok.added_tokens[s]) == text.count(s)
        alt = data.draw(alternative_tokenizations(tok, text))
        if tok.ids_bytes(ids) == text.encode("utf-8") or tok.decode(ids) == text:
            assert tok.ids_bytes(alt) == tok.ids_bytes(ids)
            assert hf.decode(alt, skip_special_tokens=False, clean_up_tokenization_spaces=False) == back
        else:  # the normalizer changed the text: the alternatives spell the text given, not its normal form
            # (SentencePiece families may still add their word-start space after a special token)
            assert tok.ids_bytes(alt).replace(b" ", b"") == text.encode("utf-8").replace(b" ", b"")

    check()


def test_deepseek_pieces_that_are_not_byte_level_have_their_own_bytes(families):
    tok, _ = families["deepseek_v3"]
    bos = tok.added_tokens["<｜begin▁of▁sentence｜>"]
    assert bos < 3  # inside the model's vocabulary, as in DeepSeek-V3's file: this gave KeyError '｜'
    assert tok.token_bytes(bos) == "<｜begin▁of▁sentence｜>".encode()
    assert tok.id_to_piece(tok.added_tokens["<｜User｜>"]) == "<｜User｜>"


@pytest.mark.parametrize("fam", tf.FAMILIES)
def test_ids_outside_the_vocabulary_are_a_clear_error(families, fam):
    tok, _ = families[fam]
    with pytest.raises(ValueError, match=f"token id {tok.embedding_rows} is out of range"):
        tok.decode([1, tok.embedding_rows])
    with pytest.raises(ValueError, match="out of range"):
        tok.token_bytes(tok.embedding_rows + 7)


@pytest.mark.parametrize("fam,model", [("qwen3", "deepseek-ai/DeepSeek-V3.1"), ("deepseek_v3", "Qwen/Qwen3-8B"),
                                       ("llama3", "mistralai/Mistral-7B-Instruct-v0.3"),
                                       ("gemma", "meta-llama/Llama-3.1-8B-Instruct")])
def test_a_model_of_another_family_is_refused(families, fam, model):
    tok, _ = families[fam]
    with pytest.raises(ValueError, match="names model .* but the tokenizer is"):
        tok.check_model(model)
    tok.check_model("hybrid")  # our tiny models, config hashes: no family, nothing to check


@pytest.mark.parametrize("fam,model", [("qwen3", "Qwen/Qwen3-8B"), ("qwen3", "DeepSeek-R1-Distill-Qwen-7B"),
                                       ("deepseek_v3", "deepseek-ai/DeepSeek-V3.1"), ("gemma", "google/gemma-3-4b-it"),
                                       ("llama3", "meta-llama/Llama-3.1-8B-Instruct"),
                                       ("mistral", "mistralai/Mistral-7B-Instruct-v0.3")])
def test_the_own_family_passes(families, fam, model):
    families[fam][0].check_model(model)


def _dump(path, model, ids):
    path.write_text(json.dumps({"schema": "strata-dump/1", "session": "s", "prompt_ids": ids, "gen_ids": [5],
                                "model": model}) + "\n")
    return str(path)


@pytest.mark.parametrize("cmd", ["replay", "lint"])
def test_cli_refuses_to_read_foreign_ids_with_the_qwen3_vocabulary(tmp_path, capsys, cmd):
    from strata_lab.cli import main

    path = _dump(tmp_path / "d.jsonl", "deepseek-ai/DeepSeek-V3.1", [0, 100, 200])
    assert main([cmd, path, "--quiet"] if cmd == "replay" else [cmd, path]) == 2
    err = capsys.readouterr().err
    assert "names model 'deepseek-ai/DeepSeek-V3.1' (deepseek ids) but the tokenizer is qwen3" in err


def test_cli_names_ids_past_the_vocabulary(tmp_path, capsys, families):
    from strata_lab.cli import main

    tok, _ = families["llama3"]
    path = _dump(tmp_path / "d.jsonl", "some-model", [1, 2, 151000])
    folder = tmp_path / "tok"
    folder.mkdir()
    tok.save(folder / "tokenizer.json")
    assert main(["replay", path, "--tokenizer", str(folder), "--quiet"]) == 2
    assert f"has id 151000, past the {tok.embedding_rows} ids of --tokenizer" in capsys.readouterr().err


def test_an_ids_log_of_another_family_is_refused_on_render(tmp_path):
    from strata_lab import load_trace

    log = tmp_path / "calls.jsonl"
    log.write_text(json.dumps({"request": {"model": "deepseek-chat", "messages": [{"role": "user", "content": "hi"}]},
                               "response": {"model": "deepseek-ai/DeepSeek-V3.1", "prompt_token_ids": [0, 5, 6],
                                            "choices": [{"message": {"content": "x"}, "token_ids": [7]}]}}) + "\n")
    with pytest.raises(ValueError, match="names model 'deepseek-ai/DeepSeek-V3.1'"):
        load_trace(log).to_dump("qwen3", out=tmp_path / "d.jsonl")


@pytest.mark.parametrize("fam", tf.FAMILIES)
def test_prefix_encoder_is_exact(families, fam):
    from strata_lab.traces.render import PrefixEncoder

    tok, _ = families[fam]
    enc = PrefixEncoder(tok)

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(first=_prompts(fam), rest=st.lists(st.tuples(st.floats(0, 1), _prompts(fam)), max_size=4))
    def check(first, rest):
        text = first
        assert enc.encode(text, "s") == tok.encode(text)
        for keep, more in rest:  # the next prompt keeps some of the last one (append, edit) and adds text
            text = text[: int(len(text) * keep)] + more if keep < 0.5 else text + more
            assert enc.encode(text, "s") == tok.encode(text), text

    check()


def test_replay_engines_refuses_a_foreign_models_ids(tmp_path):
    from strata_lab.caches import replay_engines

    path = _dump(tmp_path / "d.jsonl", "google/gemma-3-4b-it", [2, 10, 11])
    with pytest.raises(ValueError, match="'google/gemma-3-4b-it' \\(gemma ids\\)"):
        replay_engines(path, ["vllm"], tokenizer="qwen3")
    assert len(replay_engines(path, ["vllm"]).frame()) == 1  # no tokenizer: ids are only compared


def test_replay_and_lint_read_deepseek_ids_with_their_tokenizer(families, tmp_path, capsys):
    from strata_lab.cli import main

    tok, _ = families["deepseek_v3"]
    folder = tmp_path / "deepseek"
    folder.mkdir()
    tok.save(folder / "tokenizer.json")
    p1 = "<｜begin▁of▁sentence｜>You help.<｜User｜>Is 1001 prime?<｜Assistant｜></think>"
    reply = "The quick brown fox: öğrenciler çalışıyor."
    gen = [i for t in tok.encode(reply) for i in _split_bytes(tok, t)]  # the reply in other pieces than BPE's
    assert gen != tok.encode(reply)
    gen += [tok.added_tokens["<｜end▁of▁sentence｜>"]]
    p2 = p1 + reply + "<｜end▁of▁sentence｜><｜User｜>And 1009?<｜Assistant｜></think>"
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"schema": "strata-dump/1", "session": "s", "model": "deepseek-ai/DeepSeek-V3.1",
                                        "prompt_ids": ids, "gen_ids": g, "reused": 0}) + "\n"
                            for ids, g in ((tok.encode(p1), gen), (tok.encode(p2), []))))
    assert main(["replay", str(path), "--tokenizer", str(folder), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "retokenized_reply" in out, out  # the byte table read DeepSeek's pieces
    assert main(["replay", str(path), "--tokenizer", str(folder), "--engine", "vllm", "--quiet"]) == 0
    assert main(["lint", str(path), "--tokenizer", str(folder)]) in (0, 1)
    assert "error" not in capsys.readouterr().err


def _split_bytes(tok, token_id):
    """A multi-byte token as single-byte pieces (what `alternative_tokenizations` may draw)."""
    pieces = {tok.token_bytes(i): i for i in range(tok.vocab_size) if i not in tok.added_tokens.values()}
    return [pieces[bytes([b])] for b in tok.token_bytes(token_id)]


def test_a_gguf_path_is_judged_by_its_file_name():
    # llama-server names its model by the GGUF's path; the folders (here one named after llama) say nothing
    from strata_lab.text.vocab import model_family

    assert model_family("/tmp/run/test_live_llama_server/validate-qwen3.gguf") == "qwen"
    assert model_family("/srv/models/llama.cpp/DeepSeek-R1-Distill-Qwen-7B-Q4_K_M.gguf") == "qwen"
    assert model_family("/srv/llama/unnamed.gguf") is None
    # a hub id's organisation still counts when the name alone says nothing
    assert model_family("mistralai/Some-Small-2505") == "mistral"
    assert model_family("Qwen/Qwen3-8B") == "qwen"
