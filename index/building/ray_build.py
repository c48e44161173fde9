"""The encode step of an index build on Ray Data: ``densehybrid index build --ray``.

Only the encoding moves to Ray: the driver reads the corpus shard by shard as a
plain build does, Ray Data hands each shard's forward batches to a pool of
encoder actors (one GPU each when the cluster has GPUs, otherwise one CPU each
with one CPU left for Ray's read tasks), and the driver writes the same shards,
manifest and resume state as :func:`index.build.build_index`. The forward
batches are the plain build's (length-sorted within the shard, ``batch_size``
passages), so a Ray build reproduces a plain one.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from densehybrid.encoder.base import Encoded, Encoder
from densehybrid.encoder.batches import encode_in_batches, plan_batches
from densehybrid.encoder.config import EncoderConfig

log = logging.getLogger(__name__)


class RayBuildError(RuntimeError):
    """Ray is not installed, or the cluster cannot run the encoder actors."""


@dataclass(frozen=True)
class RayOptions:
    # "local": start Ray on this machine's CPUs; "auto" or "host:port" / "ray://...": join a cluster
    address: str = "local"
    # passages per Ray Data batch handed to an actor (whole forwards of the build's batch_size); None: 4 forwards
    batch_size: int | None = None


class _EncodeForwards:
    """A Ray Data actor: loads the model once (the plain build's load path), encodes whole forward batches."""

    def __init__(self, config: EncoderConfig, device: str | None, backend: str = "torch", precision: str = "fp32"):
        from densehybrid.index.building import commands

        self.encoder = commands.load_model(config, device, backend=backend, precision=precision)

    def __call__(self, batch: dict) -> dict:
        positions = np.concatenate([np.asarray(p, dtype=np.int64) for p in batch["rows"]])
        texts = [str(t) for texts in batch["texts"] for t in texts]
        sizes = np.cumsum([0, *(len(p) for p in batch["rows"])])
        plan = [range(start, end) for start, end in zip(sizes[:-1], sizes[1:])]  # the driver's forwards, as given
        done = list(encode_in_batches(self.encoder, texts, "passage", plan=plan))
        encoded = Encoded.concat([b.encoded for b in done])
        out = {"row": positions[np.concatenate([b.rows for b in done])], "values": encoded.values.astype(np.float32)}
        if encoded.gates is not None:
            out["gates"] = encoded.gates.astype(np.uint8)
        return out


class RayShardEncoder:
    """A context manager: connects to Ray on enter, shuts it down on exit; called once per shard."""

    def __init__(self, encoder: Encoder, config: EncoderConfig, device: str | None, forward_size: int,
                 options: RayOptions):
        self.encoder, self.config, self.device = encoder, config, device
        self.forward_size, self.options = forward_size, options
        self.forwards_per_batch = max(1, (options.batch_size or 4 * forward_size) // forward_size)
        self.actors = 0
        self.use_gpus = False

    def __enter__(self) -> "RayShardEncoder":
        try:
            import ray
        except ImportError as exc:
            raise RayBuildError("--ray needs Ray Data: pip install -e '.[ray]'") from exc
        try:
            if self.options.address == "local":
                ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
            else:
                ray.init(address=self.options.address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RayBuildError(f"--ray {self.options.address}: cannot start or join Ray: {exc}") from exc
        try:
            resources = ray.cluster_resources()
            gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
            self.use_gpus = gpus > 0
            # a CPU-only pool leaves one CPU for the read tasks: with none free, Ray Data waits forever
            self.actors = gpus if self.use_gpus else cpus - 1
            if self.actors < 1:
                raise RayBuildError(f"the Ray cluster has {cpus} CPUs and no GPU: an encoder actor needs one CPU "
                                    "and Ray Data's reading another")
            ray.data.DataContext.get_current().enable_progress_bars = False
        except BaseException:
            ray.shutdown()
            raise
        log.info("Ray build: %d encoder actors on %s, %d passages per Ray batch", self.actors,
                 "GPUs" if self.use_gpus else "CPUs", self.forwards_per_batch * self.forward_size)
        return self

    def __exit__(self, *exc) -> None:
        import ray

        ray.shutdown()

    def record(self) -> dict:
        """The manifest's ``build`` additions."""
        return {"engine": "ray", "ray": {"address": self.options.address, "actors": self.actors,
                                         "batch_size": self.forwards_per_batch * self.forward_size}}

    def __call__(self, texts: Sequence[str], on_batch: Callable[[int], object]) -> Encoded:
        import ray

        tokenized = self.encoder.tokenize(texts, "passage")
        forwards = plan_batches([t.length for t in tokenized], self.forward_size, by_length=True)
        items = [{"rows": rows, "texts": [texts[i] for i in rows]} for rows in forwards]
        placement = {"num_gpus": 1} if self.use_gpus else {"num_cpus": 1}
        dataset = ray.data.from_items(items).map_batches(
            _EncodeForwards, batch_size=self.forwards_per_batch, batch_format="numpy", concurrency=self.actors,
            fn_constructor_kwargs={"config": self.config, "device": self.device, "backend": self.encoder.backend,
                                   "precision": self.encoder.precision}, **placement)
        spec = self.encoder.spec
        values = np.empty((len(texts), spec.dim), dtype=np.float32)
        gates = np.empty((len(texts), spec.gated_dim), dtype=np.uint8) if spec.gated_dim else None
        filled = np.zeros(len(texts), dtype=bool)
        for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
            rows = batch["row"]
            values[rows] = batch["values"]
            if gates is not None:
                gates[rows] = batch["gates"]
            filled[rows] = True
            on_batch(len(rows))
        if not filled.all():
            raise RayBuildError(f"Ray returned {int(filled.sum())} of {len(texts)} passages of a shard")
        return Encoded(values, gates)
