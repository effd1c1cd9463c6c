"""The chunked safetensors reader against files written by the safetensors library."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import save_file

from steadytune.forensics.stread import (
    SafetensorsError,
    _fp8_table,
    iter_chunks,
    read_header,
    read_tensor,
    tensor_index,
)


def test_round_trip_in_chunks(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {
        "b": rng.standard_normal((7, 5)).astype(np.float16),
        "a": rng.standard_normal(13).astype(np.float32),
        "i": np.arange(6, dtype=np.int64).reshape(2, 3),
    }
    path = tmp_path / "m.safetensors"
    save_file(tensors, str(path))
    refs = read_header(path)
    assert set(refs) == {"a", "b", "i"}
    for name, arr in tensors.items():
        np.testing.assert_array_equal(
            read_tensor(refs[name]), arr.astype(np.float64 if name == "i" else np.float32)
        )
    chunks = list(iter_chunks(refs["b"], chunk=4))
    assert [len(c) for c in chunks] == [4] * 8 + [3]


def test_bfloat16_is_widened_exactly(tmp_path):
    values = np.array([1.0, -2.5, 3.140625, 0.0, np.inf], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)  # these values are exact in bf16
    path = tmp_path / "bf.safetensors"
    header = b'{"x":{"dtype":"BF16","shape":[5],"data_offsets":[0,10]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + bf16.tobytes())
    np.testing.assert_array_equal(read_tensor(read_header(path)["x"]), values)


def test_fp8_tables():
    e4m3, e5m2 = _fp8_table("F8_E4M3"), _fp8_table("F8_E5M2")
    assert e4m3[0x38] == 1.0 and e4m3[0x7E] == 448.0 and np.isnan(e4m3[0x7F])
    assert e5m2[0x3C] == 1.0 and e5m2[0x7C] == np.inf and np.isnan(e5m2[0x7D])


def test_truncated_file_and_folder_without_safetensors(tmp_path):
    path = tmp_path / "m.safetensors"
    save_file({"w": np.ones(100, dtype=np.float32)}, str(path))
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(SafetensorsError, match="truncated"):
        read_header(path)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(SafetensorsError, match="convert to safetensors"):
        tensor_index(tmp_path / "ck")


def test_folder_merges_shards_and_skips_optimizer(tmp_path):
    save_file({"a": np.ones(2, dtype=np.float32)}, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file({"b": np.ones(2, dtype=np.float32)}, str(tmp_path / "model-00002-of-00002.safetensors"))
    save_file({"state": np.ones(2, dtype=np.float32)}, str(tmp_path / "optimizer.safetensors"))
    assert sorted(tensor_index(tmp_path)) == ["a", "b"]
