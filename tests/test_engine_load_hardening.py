"""Engine tier: checkpoints a careless operator or an attacker could hand the loader (issue 13).

FIFOs, out-of-range config values, overlapping tensor offsets, NaN weights, a file truncated under a
running engine. Each must be a ModelFolderError naming the field/tensor/file, or (no-mmap) harmless.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

_engine = pytest.importorskip("strata_lab._engine")
from strata_lab.engine import Engine  # noqa: E402


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `code` in a child (a hang or a SIGBUS must fail the test, not kill or stall the test process)."""
    from strata_lab._spawn import child_process_args

    spawn = child_process_args([])
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=spawn["env"], cwd=spawn["cwd"],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_fifo_in_place_of_a_checkpoint_file_is_refused(tiny_dir, tmp_path, name):
    path = _copy(tiny_dir, tmp_path / "ck")
    (path / name).unlink()
    os.mkfifo(path / name)
    r = _run_python(f"""
        from strata_lab.engine import Engine
        try:
            Engine.load({str(path)!r}, threads=1)
        except ValueError as exc:
            print("REFUSED", exc)
        """, timeout=60)  # before the fix, the open blocked forever waiting for a writer
    assert "REFUSED" in r.stdout and "not a regular file" in r.stdout and name in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("field, value", [
    ("rope_theta", 0), ("rope_theta", -1.0), ("rms_norm_eps", -1e-6), ("max_position_embeddings", -5),
    ("max_position_embeddings", 0), ("num_attention_heads", 0), ("head_dim", -128), ("vocab_size", 2**40),
])
def test_out_of_range_config_values_name_the_field(tiny_dir, tmp_path, field, value):
    path = _copy(tiny_dir, tmp_path / "ck")
    cfg = json.loads((path / "config.json").read_text())
    cfg[field] = value
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(_engine.ModelFolderError, match=f"field '{field}'"):
        Engine.load(path, threads=1)


def test_rope_parameters_theta_is_checked(tiny_dir, tmp_path):
    path = _copy(tiny_dir, tmp_path / "ck")
    cfg = json.loads((path / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "default", "rope_theta": -5.0}
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(_engine.ModelFolderError, match="rope_parameters.rope_theta"):
        Engine.load(path, threads=1)


def test_overlapping_tensor_offsets_are_refused():
    hdr = {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
           "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
           "empty": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]}}
    with pytest.raises(_engine.ModelFolderError, match="tensor 'b': data_offsets overlap those of tensor 'a'"):
        _engine.parse_safetensors_header(json.dumps(hdr).encode(), 24)
    hdr["b"]["data_offsets"] = [16, 32]  # adjacent is fine
    assert len(_engine.parse_safetensors_header(json.dumps(hdr).encode(), 32)) == 3


def _poison(path, tensor: str, value: float) -> None:
    """Write `value` into the first element of `tensor` (f32) in model.safetensors."""
    f = path / "model.safetensors"
    raw = bytearray(f.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    begin = header[tensor]["data_offsets"][0]
    assert header[tensor]["dtype"] == "F32"
    raw[8 + n + begin:8 + n + begin + 4] = struct.pack("<f", value)
    f.write_bytes(bytes(raw))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_weights_refused_when_checked(tiny_dir, tmp_path, value):
    path = _copy(tiny_dir, tmp_path / "ck")
    _poison(path, "model.norm.weight", value)
    Engine.load(path, threads=1)  # unchecked: loads (the check costs a pass over the weights)
    with pytest.raises(_engine.ModelFolderError, match="tensor 'model.norm.weight' holds NaN or infinity"):
        Engine.load(path, threads=1, check_weights=True)
    with pytest.raises(_engine.ModelFolderError, match="NaN"):
        Engine.load(path, threads=1, check_weights=True, mmap=False)


def test_no_mmap_load_matches_and_survives_truncation(tiny_dir, tmp_path):
    path = _copy(tiny_dir, tmp_path / "ck")
    ids = [9707, 1879, 13]
    expected = Engine.load(tiny_dir, threads=1).forward(ids)
    r = _run_python(f"""
        import os, numpy as np
        from strata_lab.engine import Engine
        engine = Engine.load({str(path)!r}, threads=1, mmap=False)
        before = engine.forward({ids})
        os.truncate({str(path / "model.safetensors")!r}, 0)  # a mapped engine dies of SIGBUS here
        after = engine.forward({ids})
        np.save({str(tmp_path / "out.npy")!r}, after)
        print("OK", bool((before == after).all()))
        """)
    assert r.returncode == 0 and "OK True" in r.stdout, (r.returncode, r.stderr[-2000:])
    assert np.array_equal(np.load(tmp_path / "out.npy"), expected)


def test_load_options_are_checked(tiny_dir):
    with pytest.raises(ValueError, match="threads must be <="):
        Engine.load(tiny_dir, threads=1_000_000)
    with pytest.raises(TypeError, match="mmap must be a bool"):
        Engine.load(tiny_dir, mmap="no")


@pytest.mark.parametrize("tied", [False, True])
def test_copied_weights_survive_truncation(tiny_dir, tmp_path, tied):
    """weights_memory 'hugepages' copies every tensor, the embedding included (issue 34: it stayed mapped, and
    a truncated file killed the process with SIGBUS on the next token's embedding row)."""
    path = _copy(tiny_dir, tmp_path / "ck")
    if tied:
        cfg = json.loads((path / "config.json").read_text())
        cfg["tie_word_embeddings"] = True
        (path / "config.json").write_text(json.dumps(cfg))
    ids = [9707, 1879, 13, 151643, 5]
    r = _run_python(f"""
        import os
        os.environ["STRATA_WEIGHTS_HUGEPAGES"] = "1"
        import numpy as np
        from strata_lab.engine import Engine
        engine = Engine.load({str(path)!r}, threads=1)
        assert engine.info["weights_memory"] == "hugepages", engine.info["weights_memory"]
        before = engine.forward({ids})
        os.truncate({str(path / "model.safetensors")!r}, 0)
        after = engine.forward({ids})
        print("OK", bool((after == before).all()))
        """)
    assert r.returncode == 0 and "OK True" in r.stdout, (r.returncode, r.stdout, r.stderr[-2000:])
