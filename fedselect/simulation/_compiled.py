"""Kept importable: the compiled chain step lives in :mod:`fedselect.simulation.engine.compiled`."""

from .engine.compiled import PATHS, CompiledChainStep, compile_unusable, dropout_keep

__all__ = ["PATHS", "CompiledChainStep", "compile_unusable", "dropout_keep"]
