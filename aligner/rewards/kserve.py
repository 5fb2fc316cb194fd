"""KServe v2 tensors as JSON (Triton's HTTP protocol): how the reward and critic clients build what they send and
read what a server answers, in one place.

    {"name": "tokens", "shape": [2, 3], "datatype": "INT64", "data": [1, 2, 3, 4, 5, 6]}    # data: flat, row-major

An input is `tensor(name, datatype, values)`, or `bytes_column(name, strings)` for one string per row ([B, 1]);
an answer's outputs are found by name (`outputs_by_name`, `output_data`); a model's metadata names its inputs
(`declared_inputs`). The clients: aligner/rewards/remote.py (rewards) and aligner/rewards/critic_client.py (the
critic); their connection and retries: aligner/rewards/http.py. The interfaces they speak: docs/servers.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# The numpy type each KServe datatype's values take on the way out; BYTES stays Python strings (object: numpy's own
# string type would drop a trailing NUL).
DTYPES = {"BYTES": object, "INT64": np.int64, "FP32": np.float32}


def tensor(name: str, datatype: str, values: Any) -> dict[str, Any]:
    """An input tensor of `values` (an array, or rectangular nested lists) as `datatype` (a DTYPES key): its shape,
    and its data flattened row-major as JSON numbers or strings."""
    array = np.asarray(values, dtype=DTYPES[datatype])
    return {"name": name, "shape": list(array.shape), "datatype": datatype, "data": array.reshape(-1).tolist()}


def bytes_column(name: str, strings: list[str]) -> dict[str, Any]:
    """A BYTES tensor [B, 1] of `strings`, one per row: how a batch of texts is sent."""
    return {**tensor(name, "BYTES", [[s] for s in strings]), "shape": [len(strings), 1]}


def outputs_by_name(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A KServe v2 answer's outputs by name; malformed entries are left out (the caller says what is missing)."""
    outputs = answer.get("outputs")
    if not isinstance(outputs, list):
        return {}
    return {o["name"]: o for o in outputs if isinstance(o, dict) and isinstance(o.get("name"), str)}


def output_data(answer: dict[str, Any], name: str) -> Any:
    """The `data` of an answer's output `name`, unchecked; None when there is no such output or it has no data."""
    return outputs_by_name(answer).get(name, {}).get("data")


def declared_inputs(metadata: dict[str, Any]) -> set[str] | None:
    """The input names a KServe v2 model metadata answer (`GET /v2/models/NAME`) declares; None when it lists none (a
    server that does not say: Aligner's own interface is assumed)."""
    inputs = metadata.get("inputs")
    if not isinstance(inputs, list):
        return None
    names = {i["name"] for i in inputs if isinstance(i, dict) and isinstance(i.get("name"), str)}
    return names or None
