"""The library log records nobody can act on are dropped at their own loggers, and only those."""

from __future__ import annotations

import logging

import engine  # noqa: F401  (importing the engine installs the filters)


def test_bitsandbytes_asking_for_the_hub_kernels_package_is_dropped_and_its_other_records_are_not(caplog):
    logger = logging.getLogger("bitsandbytes.backends.cpu.ops")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please make sure you "
                       "already `pip install kernels`", "No module named 'kernels'")
        logger.warning("some other bitsandbytes warning")
    assert [record.getMessage() for record in caplog.records] == ["some other bitsandbytes warning"]
