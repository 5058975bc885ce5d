"""Reading, verifying, writing and pruning the checkpoint directories of one run
(their layout: ``iterflow.runtime.checkpoint.format``), on any Hadoop file system."""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
from pyspark.sql import DataFrame, SparkSession

from iterflow.errors import IterflowError, IterflowWarning, warn
from iterflow.runtime.checkpoint.format import (
    DRIVER,
    EPOCH_DIR,
    FORMAT,
    HISTORY,
    MARKER,
    MIN_KEEP,
    Checkpoint,
    DriverSnapshot,
    DriverState,
    HistorySegment,
    epoch_dir,
    load_driver_state,
    load_history,
    manifest_segments,
)
from iterflow.runtime.checkpoint.lease import Lease
from iterflow.runtime.spark.files import files_for

log = logging.getLogger("iterflow.checkpoint")


class UnusableCheckpoint(Exception):
    """Why an epoch cannot be resumed from, naming the file that does not verify."""


class CheckpointStore:
    """Reads and writes the checkpoints under ``root`` (any Hadoop file system path)."""

    def __init__(self, spark: SparkSession, root: str, *, keep: int = 2) -> None:
        self.spark = spark
        self.files, self.root = files_for(spark, str(root))
        #: Committed epochs pruning keeps; never fewer than ``MIN_KEEP``, so that a
        #: checkpoint to fall back to is there when the newest does not verify.
        self.keep = max(keep, MIN_KEEP)
        #: The run's lease on ``root``, checked before anything there is deleted.
        self.lease: Lease | None = None

    def _path(self, *parts: str) -> str:
        return "/".join((self.root, *parts))

    def epochs(self) -> list[int]:
        """Epochs that have a directory, committed or not, in increasing order."""
        found = (EPOCH_DIR.match(name) for name in self.files.children(self.root))
        return sorted(int(m.group(1)) for m in found if m)

    # -- reading -------------------------------------------------------------------

    def latest(self, *, strict: bool = False, remedy: str = "") -> Checkpoint | None:
        """The newest checkpoint whose data all verifies; newer ones that do not are skipped
        with a warning (on ``iterflow.checkpoint`` and as an ``IterflowWarning``) naming
        the bad file. None when no epoch ever committed.

        When epochs committed but none verifies, that is an error naming the bad files
        (``remedy`` says how to start over): starting from round 0 would silently drop
        what they held. With ``strict``, a newer epoch that committed but does not
        verify is an error at once: an unbounded iteration whose stream cannot be put
        back cannot go back to an older commit, because Spark has committed the
        micro-batches after it.
        """
        damaged: list[str] = []
        for epoch in reversed(self.epochs()):
            try:
                return self._read(epoch)
            except UnusableCheckpoint as unusable:
                committed = self.files.exists(self._path(epoch_dir(epoch), MARKER))
                if strict and committed:
                    raise IterflowError(
                        f"checkpoint epoch {epoch} in '{self.root}' committed but is damaged "
                        f"({unusable}); the micro-batches it consumed cannot be read again, "
                        "so the iteration cannot resume exactly once. Restore the directory "
                        "from a copy, or delete the whole location to start over"
                    ) from unusable
                if committed:
                    damaged.append(f"epoch {epoch}: {unusable}")
                message = (
                    f"checkpoint epoch {epoch} in '{self.root}' is not usable ({unusable}); "
                    "skipping it for an older one"
                )
                warn(message, log=log)
        if damaged:
            raise IterflowError(
                f"no checkpoint in '{self.root}' can be resumed from: "
                + "; ".join(damaged)
                + f". Restore the files named from a copy, or {remedy or 'start over'}"
            )
        return None

    def newest(self) -> Checkpoint | None:
        """The newest checkpoint that reads whole now, or None; the others are passed over
        without a word: a reader beside a running writer (the handle of an iteration whose
        loop runs elsewhere) meets commits half written and epochs being pruned."""
        for epoch in reversed(self.epochs()):
            try:
                return self._read(epoch)
            except (UnusableCheckpoint, OSError):
                continue
        return None

    def _manifest(self, epoch: int) -> dict[str, Any]:
        manifest = json.loads(self.files.read_bytes(self._path(epoch_dir(epoch), MARKER)))
        if not isinstance(manifest, dict) or manifest.get("epoch") != epoch:
            raise ValueError("not the manifest of this epoch")
        return manifest

    def _verified(self, epoch: int) -> tuple[dict[str, Any], bytes, list[bytes]]:
        """The manifest of epoch ``epoch``, its ``driver.pkl`` and its history segments,
        each checked against the manifest (sizes, sha256); its parquet data opened. Raises
        ``UnusableCheckpoint`` naming the first file that does not verify."""
        base = self._path(epoch_dir(epoch))
        marker = f"{base}/{MARKER}"
        if not self.files.exists(marker):
            raise UnusableCheckpoint(f"no commit marker '{marker}': its write did not finish")
        try:
            manifest = self._manifest(epoch)
        except Exception as exc:
            raise UnusableCheckpoint(f"unreadable commit marker '{marker}': {exc}") from exc
        sizes = self.files.file_sizes(base)
        for name, size in manifest["files"].items():
            if sizes.get(name) != size:
                raise UnusableCheckpoint(
                    f"file '{base}/{name}' has {sizes.get(name)} bytes, the manifest says {size}"
                )
        driver = self.files.read_bytes(f"{base}/{DRIVER}")
        if hashlib.sha256(driver).hexdigest() != manifest["driver_sha256"]:
            raise UnusableCheckpoint(f"'{base}/{DRIVER}' does not match its sha256")
        segments = manifest_segments(manifest)
        missing = self._missing(segments)
        if missing is not None:
            raise UnusableCheckpoint(missing)
        history = []
        for segment in segments:
            raw = self.files.read_bytes(self._path(segment.name))
            if hashlib.sha256(raw).hexdigest() != segment.sha256:
                path = self._path(segment.name)
                raise UnusableCheckpoint(f"history segment '{path}' does not match its sha256")
            history.append(raw)
        for kind in ("variables", "outputs"):
            for name in manifest[kind]:
                self._check_parquet(f"{base}/{kind}/{name}")
        return manifest, driver, history

    def _check_parquet(self, path: str) -> None:
        """Spark opens the parquet dataset ``path``: every file's footer reads (schemas
        merged), so a file replaced or overwritten in place is found before a round
        reads it."""
        try:
            self._parquet(path, mergeSchema="true").schema  # noqa: B018 (analysis reads it)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise UnusableCheckpoint(
                f"parquet data '{path}' does not read ({type(exc).__name__}: {first})"
            ) from exc

    def _parquet(self, path: str, **options: str) -> DataFrame:
        """The parquet dataset ``path``; a corrupt file fails the read, whatever
        ``spark.sql.files.ignoreCorruptFiles`` says: a checkpoint never loses rows silently."""
        return self.spark.read.options(ignoreCorruptFiles="false", **options).parquet(path)

    def _missing(self, segments: tuple[HistorySegment, ...]) -> str | None:
        """Which of the history ``segments`` is not there whole, or None."""
        sizes = (
            self.files.file_sizes(self._path(HISTORY))
            if self.files.exists(self._path(HISTORY))
            else {}
        )
        for segment in segments:
            size = sizes.get(segment.name.removeprefix(f"{HISTORY}/"))
            if size != segment.size:
                return (
                    f"history segment '{self._path(segment.name)}' has {size} bytes, the "
                    f"manifest says {segment.size}"
                )
        return None

    def _read(self, epoch: int) -> Checkpoint:
        """Epoch ``epoch`` read back, once all its data verifies (``_verified``)."""
        manifest, raw, history = self._verified(epoch)
        base = self._path(epoch_dir(epoch))
        segments = manifest_segments(manifest)
        try:
            driver: DriverState = load_driver_state(raw)
            if segments:
                rounds = [progress for segment in history for progress in load_history(segment)]
                driver = attrs.evolve(driver, history=rounds)
        except Exception as exc:
            raise IterflowError(
                f"checkpoint epoch {epoch} in '{self.root}': its driver state does not load "
                f"({type(exc).__name__}: {exc}); the classes it holds (ctx.state, listener "
                "state) must be importable as when it was written; otherwise start over with "
                "an empty checkpoint directory"
            ) from exc
        return Checkpoint(
            epoch=epoch,
            fingerprint=manifest["fingerprint"],
            variables={n: self._parquet(f"{base}/variables/{n}") for n in manifest["variables"]},
            outputs={n: self._parquet(f"{base}/outputs/{n}") for n in manifest["outputs"]},
            driver=driver,
            segments=segments,
        )

    # -- writing -------------------------------------------------------------------

    def write(
        self,
        epoch: int,
        *,
        fingerprint: Mapping[str, Any],
        variables: Mapping[str, DataFrame],
        outputs: Mapping[str, DataFrame],
        driver: DriverSnapshot,
    ) -> None:
        """Write epoch ``epoch`` and commit it; then delete epochs beyond ``keep``, and the
        history segments no epoch left names."""
        base = self._path(epoch_dir(epoch))
        self._check_lease()
        self.files.delete(base)  # what an interrupted earlier write left
        for kind, frames in (("variables", variables), ("outputs", outputs)):
            for name, df in frames.items():
                df.write.mode("overwrite").parquet(f"{base}/{kind}/{name}")
        for name, raw in driver.new:
            self.files.write_bytes(self._path(name), raw)
        # Never commit a history with a hole: the segments of earlier checkpoints it reads
        # must all be there (they are, unless something else deleted them).
        missing = self._missing(driver.segments)
        if missing is not None:
            raise IterflowError(f"epoch {epoch}: {missing}; the checkpoint is not committed")
        self.files.write_bytes(f"{base}/{DRIVER}", driver.driver)
        manifest = {
            "format": FORMAT,
            "epoch": epoch,
            "fingerprint": dict(fingerprint),
            "variables": sorted(variables),
            "outputs": sorted(outputs),
            "files": self.files.file_sizes(base),
            "driver_sha256": hashlib.sha256(driver.driver).hexdigest(),
            "history": [attrs.asdict(segment) for segment in driver.segments],
        }
        # The manifest is the commit marker: once it is there, whole, the epoch exists.
        raw = json.dumps(manifest, sort_keys=True).encode()
        self.files.write_bytes(f"{base}/{MARKER}", raw, atomic=True)
        try:
            self._prune(epoch)
        except Exception as exc:  # epoch ``epoch`` is committed all the same
            message = (
                f"checkpoint epoch {epoch} committed, but older epochs in '{self.root}' "
                f"could not be deleted: {exc}"
            )
            log.warning("%s", message)
            warnings.warn(message, IterflowWarning, stacklevel=2)

    def _prune(self, committed: int) -> None:
        self._check_lease()
        older = [e for e in self.epochs() if e < committed]
        committed_older = [e for e in older if self.files.exists(self._path(epoch_dir(e), MARKER))]
        keep = set(committed_older[-(self.keep - 1) :])
        for epoch in older:
            if epoch not in keep:
                self.files.delete(self._path(epoch_dir(epoch)))
        self._prune_history()

    def _prune_history(self) -> None:
        """Delete the history segments that no epoch directory left names. Runs after a
        commit, with no other write in flight: a segment not named by a manifest then
        belongs to an epoch deleted, or to a write that never committed."""
        named: set[str] = set()
        for epoch in self.epochs():
            try:
                manifest = self._manifest(epoch)
            except Exception:  # no marker or a damaged one: it cannot be resumed from
                continue
            named.update(segment.name for segment in manifest_segments(manifest))
        for name in self.files.children(self._path(HISTORY)):
            if f"{HISTORY}/{name}" not in named:
                self.files.delete(self._path(HISTORY, name))

    def _check_lease(self) -> None:
        """Raise ``CheckpointInUseError`` when another run has taken the directory over."""
        if self.lease is not None:
            self.lease.check()

    def clear(self) -> None:
        """Delete every epoch directory and the history (an explicit fresh start)."""
        self._check_lease()
        for epoch in self.epochs():
            self.files.delete(self._path(epoch_dir(epoch)))
        self.files.delete(self._path(HISTORY))
