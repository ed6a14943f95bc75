"""The float32 reference perplexity: measured once per model through the pool, in float32 with the model's
defaults, and shown beside the configuration's own figure in the chat's panel and Compare's table."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

from engine import EngineConfig, PerplexityResult
from playground.compare.comparison import FIGURES
from playground.figures.features import quality_row
from playground.figures.run_views import compare_table_html
from playground.shared.reference_perplexity import ReferencePerplexities
from tests.playground.units.test_measure_views import comparison


def result(value: float) -> PerplexityResult:
    return PerplexityResult(perplexity=value, mean_nll=0.0, tokens=100, windows=1, seconds=0.5, source="held-out")


class FakePool:
    """Leases engines whose perplexity is 105.5 for float32 and 221.8 otherwise, counting the measurements."""

    def __init__(self):
        self.leased: list[EngineConfig] = []

    @contextmanager
    def lease(self, config: EngineConfig):
        self.leased.append(config)
        yield SimpleNamespace(engine=SimpleNamespace(
            perplexity=lambda progress=None: result(105.5 if config.dtype == "float32" else 221.8)))


def test_the_reference_is_the_models_defaults_in_float32_measured_once_per_model():
    pool = FakePool()
    references = ReferencePerplexities(pool, EngineConfig.from_dict)
    pooled = EngineConfig(gqa=4, kv_cache_dtype="int8")
    assert references.cached("demo") is None
    assert references.measure(pooled).perplexity == 105.5
    assert references.measure(EngineConfig(quantization="nf4")).perplexity == 105.5
    assert pool.leased == [EngineConfig(dtype="float32")], "measured once, with every other field at its default"
    assert references.cached("demo").perplexity == 105.5


def test_every_perplexity_figure_shows_the_float32_reference_beside_it():
    row = quality_row(result(221.8), reference=result(105.5))
    assert "221.800" in row and "float32 reference 105.500 (2.10x)" in row
    assert "float32 reference" not in quality_row(result(221.8)), "no reference shown before one is measured"
    outcome = comparison(1, [1.0, 1.0], [1.0, 1.0])
    for label, value in (("A", 105.5), ("B", 221.8)):
        outcome["sides"][label]["figures"]["perplexity"] = value
        outcome["sides"][label]["perplexity_reference"] = 105.5
    table = compare_table_html(outcome, FIGURES)
    cell = table.split('data-side="B" data-key="perplexity">')[1].split("</td>")[0]
    assert "221.80" in cell and "float32 reference 105.50 (2.10x)" in cell
