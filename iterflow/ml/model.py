"""What every iterflow.ml trainer shares: its error type, one-row vectors, fitted models."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

import iterflow as itf


class MLError(itf.IterflowError, ValueError):
    """Bad input to an ``iterflow.ml`` algorithm: a column, a shape, a parameter."""


def cell(values: np.ndarray) -> pa.ListArray:
    """One list cell holding ``values`` (a whole vector in one row)."""
    array = pa.array(values)
    return pa.ListArray.from_arrays(pa.array(np.array([0, len(array)], dtype=np.int32)), array)


class Fitted:
    """The run behind a fitted model: ``rounds``, ``termination`` and ``history``."""

    result: Any

    @property
    def rounds(self) -> int:
        return int(self.result.rounds)

    @property
    def termination(self) -> itf.Termination:
        return self.result.termination

    @property
    def history(self) -> list[itf.RoundProgress]:
        return list(self.result.history)
