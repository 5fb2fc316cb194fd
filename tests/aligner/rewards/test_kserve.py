"""KServe v2 tensors as the reward and critic clients send and read them (aligner/rewards/kserve.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aligner.rewards.kserve import bytes_column, declared_inputs, output_data, outputs_by_name, tensor


def test_a_tensor_is_its_shape_and_its_data_flat_row_major_as_plain_json():
    tokens = tensor("tokens", "INT64", np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32))
    assert tokens == {"name": "tokens", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6]}
    assert tensor("lengths", "INT64", [[3], [2]])["shape"] == [2, 1]
    mask = tensor("mask", "FP32", np.array([[0.1, 1.0]], dtype=np.float32))
    assert mask["data"] == [np.float32(0.1).item(), 1.0] and mask["shape"] == [1, 2]
    assert json.loads(json.dumps(tokens)) == tokens  # Python numbers, nothing numpy's json cannot write


def test_a_bytes_column_is_one_string_a_row_kept_exactly():
    texts = ["a", "b c\x00", ""]  # numpy's own string type would drop the trailing NUL
    assert bytes_column("prompts", texts) == {"name": "prompts", "shape": [3, 1], "datatype": "BYTES", "data": texts}
    assert bytes_column("prompts", [])["shape"] == [0, 1]
    assert tensor("path", "BYTES", np.full([1], "/abs/p", dtype=object))["data"] == ["/abs/p"]


def test_outputs_are_found_by_name_and_malformed_ones_left_out():
    answer = {"outputs": [{"name": "rewards", "data": [0.5]}, {"data": [1]}, "junk", {"name": "status"}]}
    assert set(outputs_by_name(answer)) == {"rewards", "status"}
    assert output_data(answer, "rewards") == [0.5]
    assert output_data(answer, "status") is None and output_data(answer, "missing") is None
    assert outputs_by_name({"outputs": "no list"}) == {}


@pytest.mark.parametrize(
    ("metadata", "declared"),
    [
        ({"inputs": [{"name": "tokens"}, {"name": "lengths"}, {"shape": [1]}]}, {"tokens", "lengths"}),
        ({"inputs": []}, None),
        ({"name": "m"}, None),
    ],
)
def test_declared_inputs(metadata, declared):
    assert declared_inputs(metadata) == declared
