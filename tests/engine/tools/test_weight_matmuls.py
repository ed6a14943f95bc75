"""The matmul forms `python -m engine.tools.weight_matmuls` times compute the product they stand for, so its table
compares like with like; and the tool prints one row per form and row count."""

from __future__ import annotations

import pytest
import torch

from engine.tools import weight_matmuls


@pytest.mark.parametrize("form", sorted(weight_matmuls.FORMS))
def test_every_form_computes_x_times_the_weight(form):
    torch.manual_seed(0)
    weight = torch.randn(96, 256) / 16
    x = torch.randn(5, 256)
    expected = x @ weight.T
    got = weight_matmuls.FORMS[form](weight)(x)
    tolerance = 0.15 if "int4" in form else 0.02  # relative error of the whole product
    assert (got - expected).norm() / expected.norm() < tolerance


def test_the_shapes_are_one_layer_and_the_lm_head():
    assert weight_matmuls.layer_shapes("random-llama-20m") == [(1024, 512), (512, 512), (2752, 512), (512, 1376),
                                                               (8192, 512)]


def test_each_row_count_times_every_form_against_float32(monkeypatch):
    monkeypatch.setattr(weight_matmuls, "ROWS", (1, 2))
    monkeypatch.setattr(weight_matmuls, "layer_shapes", lambda model: [(64, 128), (32, 64)])
    rows = weight_matmuls.measure("random-llama-20m", repeats=1)
    assert [(row["rows"], row["form"]) for row in rows] == [(count, form) for count in (1, 2)
                                                            for form in weight_matmuls.FORMS]
    assert all(row["ms"] > 0 for row in rows)
    assert all(row["x float32"] == 1 for row in rows if row["form"] == "float32")
