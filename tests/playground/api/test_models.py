"""The model list is honest: it names only what this server can load now, and any other model is 404
`model_not_found` (fast: no engine is loaded, the hub probe is faked)."""

from __future__ import annotations

import pytest
from huggingface_hub import constants

from playground.api.errors import APIError
from playground.api.models import ModelCatalogue
from playground.app import create_playground
from playground.shared.settings import Settings

CACHED_HUB_ID = "some-org/cached-model"


@pytest.fixture(scope="module")
def context():
    return create_playground(Settings(), default_model="demo")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """A local Hugging Face cache holding one snapshot of CACHED_HUB_ID."""
    repo = tmp_path / f"models--{CACHED_HUB_ID.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    return tmp_path


def not_found(catalogue: ModelCatalogue, name: str) -> APIError:
    with pytest.raises(APIError) as error:
        catalogue.check(name)
    assert (error.value.status, error.value.code, error.value.param) == (404, "model_not_found", "model")
    return error.value


def test_the_model_list_names_only_loadable_models(context, hub_cache):
    offline = ModelCatalogue(context, probe=lambda: False)
    assert offline.listed() == ["demo", "demo-draft"], "a hub model not in the cache was listed, hub unreachable"
    offline.check(CACHED_HUB_ID)  # in the local cache: loadable offline
    assert "cannot be reached" in str(not_found(offline, "smollm2-135m"))
    assert "unknown model" in str(not_found(offline, "no-such-model"))
    online = ModelCatalogue(context, probe=lambda: True)
    assert "smollm2-135m" in online.listed()
    online.check("other-org/not-cached")


def test_a_model_the_allow_list_forbids_is_not_found():
    restricted = create_playground(Settings(allowed_models=frozenset({"demo"})), default_model="demo")
    catalogue = ModelCatalogue(restricted, probe=lambda: True)
    assert catalogue.listed() == ["demo"]
    assert "not allowed" in str(not_found(catalogue, "demo-draft"))
