"""Which models the `/v1` routes offer: only those this server can load now.

Why: a model list that names hub models which then fail offline with a name-resolution error sends clients to
models they cannot use. A model is loadable when the allow-list permits it and its files are here (a bundled model,
a local folder with config.json, a hub model in the local Hugging Face cache) or the hub can be reached to fetch
them. Whether the hub can be reached is decided once, at start, by one connection attempt in the background (never
per request; `HF_HUB_OFFLINE` means no). Anything else, and a model the allow-list forbids, is 404
`model_not_found`, as OpenAI answers for a model a caller cannot use.
"""

from __future__ import annotations

import socket
import threading

from engine import ModelLoadError, hub_repo, resolve_model_path
from playground.api.errors import APIError

HUB_HOST = ("huggingface.co", 443)
PROBE_TIMEOUT_S = 3.0


def hub_reachable_now() -> bool:
    """Whether the Hugging Face Hub takes a connection (False in offline mode, without trying)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    try:
        socket.create_connection(HUB_HOST, timeout=PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


class ModelCatalogue:
    """Decides which model names are loadable here; the hub is probed once, in the background."""

    def __init__(self, context, probe=hub_reachable_now):
        self.context = context
        self._hub: bool | None = None
        self._probed = threading.Event()
        threading.Thread(target=self._probe, args=(probe,), name="hub-probe", daemon=True).start()

    def _probe(self, probe) -> None:
        try:
            self._hub = probe()
        finally:
            self._probed.set()

    def hub_reachable(self) -> bool:
        """The probe's answer (waiting for it at most PROBE_TIMEOUT_S once, at start)."""
        self._probed.wait(PROBE_TIMEOUT_S + 1)
        return bool(self._hub)

    def refusal(self, name: str) -> str | None:
        """Why `name` cannot be loaded here now, or None when it can."""
        refusal = self.context.settings.model_refusal(name)
        if refusal:
            return refusal
        try:
            resolve_model_path(name, download=False)
        except ModelLoadError as error:
            if hub_repo(name) is None:
                return self.context.describe(error)
            if self.hub_reachable():
                return None  # fetched from the hub when first loaded
            return f"{self.context.describe(error)}, and the Hugging Face Hub cannot be reached from here"
        return None

    def check(self, name: str) -> None:
        """APIError 404 `model_not_found` when `name` cannot be loaded here now."""
        refusal = self.refusal(name)
        if refusal:
            raise APIError(404, f"the model {name!r} does not exist or cannot be used here: {refusal}",
                           param="model", code="model_not_found")

    def listed(self) -> list[str]:
        """The default model, then every other curated one that is loadable now."""
        default = self.context.default_config.model
        names = [default] + [name for name in self.context.curated if name != default]
        return [name for name in names if self.refusal(name) is None]
