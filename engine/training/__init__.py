"""Builds the bundled demo model pair (chat target + distilled draft) from stdlib text.

Everything here runs offline from text every Python installation carries, so the
playground ships a model that was trained reproducibly in the repository itself.
Run it with ``python -m engine.training``.
"""
