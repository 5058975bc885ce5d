"""The exceptions iterflow raises. Pure Python: no Spark import."""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import warnings
from collections.abc import Iterator


class IterflowError(Exception):
    """Base of every error iterflow raises for misuse or a failed round.

    Messages say what was wrong, name the culprit in quotes ('ranks') and say
    what to do about it.
    """


class IterflowValueError(IterflowError, ValueError):
    """A value iterflow was given is wrong (a name, a bound, a schema)."""


class IterflowTypeError(IterflowError, TypeError):
    """An object of the wrong kind was given (e.g. a body returned a dict)."""


class DivergenceError(IterflowError, ArithmeticError):
    """A convergence value became NaN or infinite; ``epoch`` says in which round."""

    def __init__(self, message: str, epoch: int) -> None:
        super().__init__(message)
        self.epoch = epoch


_RAISED = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


def raised_in(text: str) -> list[tuple[str, str]]:
    """The ``(error type, message)`` of every line of ``text`` that reads like a raised
    error (``module.SomeError: message``), in order: a worker's traceback ends with the
    error it raised."""
    return [(m.group(1), m.group(2)) for m in map(_RAISED.match, text.splitlines()) if m]


def gist(cause: BaseException) -> str:
    """The first line of ``cause``; for an error from a Python worker, which opens with
    a header and a traceback, the error the worker raised."""
    lines = str(cause).strip().splitlines()
    if not lines:
        return ""
    # PySpark 4.1+ opens with "...from the Python worker:"; 4.0 with "An exception was
    # thrown from the Python worker. Please see the stack trace below."
    if lines[0].rstrip().endswith(":") or "Python worker" in lines[0]:
        raised = raised_in(str(cause).strip())
        if raised:
            return f"{lines[0].rstrip()} {raised[-1][0]}: {raised[-1][1]}"
    return lines[0]


class CheckpointInUseError(IterflowError):
    """Another live run holds the checkpoint directory (its lease); the message names the
    directory and the holder's host, process id and start time."""


class RoundError(IterflowError):
    """Something raised inside round ``epoch``: the body, a listener or a Spark job.

    The original exception is chained as ``__cause__``; ``stage`` says where it
    happened (``"body"``, ``"materialization"``, ``"listener 'name'"``...). In a run
    nested in a round of another, ``epoch_path`` places it (``(3, 0)``), and the
    message says so.
    """

    def __init__(
        self, epoch: int, stage: str, cause: BaseException, path: tuple[int, ...] = ()
    ) -> None:
        where = f"epoch {epoch}" if len(path) < 2 else f"epoch {epoch} (epoch path {path})"
        super().__init__(f"{where} failed in {stage}: {type(cause).__name__}: {gist(cause)}")
        self.epoch = epoch
        self.stage = stage
        self.epoch_path = path or (epoch,)


@contextlib.contextmanager
def worker_errors(kind: type[IterflowError]) -> Iterator[None]:
    """Inside, an error of type ``kind`` that was raised where the rows are read (a UDF,
    a ``mapInArrow`` kernel or a ``CombineFn`` on an executor) surfaces as ``kind`` again,
    not as the ``RoundError`` around Spark's error that carried it to the driver: its
    message, which names the input and column, stays; the wrapper is chained as
    ``__cause__``. For libraries on iterflow that validate rows in their kernels::

        class GraphError(itf.IterflowError, ValueError): ...

        with itf.worker_errors(GraphError):
            result = iteration.run()   # a kernel's GraphError('edge to no vertex ...')
    """
    try:
        yield
    except kind:
        raise
    except IterflowError as error:
        said = re.compile(rf"(?:^|[\s:])(?:[\w.]*\.)?{kind.__name__}: (.+)$")
        cause: BaseException | None = error
        while cause is not None:
            found = [m.group(1) for m in map(said.search, str(cause).splitlines()) if m]
            if found:
                raise kind(found[-1].strip()) from error
            cause = cause.__cause__ or cause.__context__
        raise


class IterflowWarning(UserWarning):
    """Something works but is probably not what was meant."""


#: Modules whose frames stand between iterflow's code and its caller (``with`` blocks,
#: ``functools.partial``): a warning skips them as it skips iterflow's own frames.
_PASSED_THROUGH = ("contextlib", "functools", "threading")


def warn(
    message: str, category: type[Warning] = IterflowWarning, *, log: logging.Logger | None = None
) -> None:
    """Warn with the caller's line: the first frame outside iterflow (the user's
    ``run()``, or the listener that a round called), however deep iterflow's own
    call chain is at the moment. With ``log``, the message is also a WARNING record
    there (applications that watch logs rather than warnings see it)."""
    if log is not None:
        log.warning("%s", message)
    frame = sys._getframe(1)
    level = 2  # warnings.warn counts this function as 1
    while frame is not None and (
        frame.f_globals.get("__name__", "").partition(".")[0] in ("iterflow", *_PASSED_THROUGH)
    ):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)
