"""A server process over the weightless :class:`~densehybrid.bench.servers.hash_encoder.HashEncoder`: what
the load benchmarks start when they measure the service, not a model (``densehybrid serve`` loads one).

    python -m densehybrid.bench.servers.hash_server --index DIR --port P [--kind cls --dense-dim 768]
        [--forward-ms 40 10] [--max-batch-size 4] [--queue-size 32] [--writes --compact-after-changes 200]

``--forward-ms BASE PER_TEXT`` makes each forward take ``BASE + PER_TEXT * texts`` ms, sleeping as a device
forward does (the GIL released), so batching and shedding behave as on a real model. ``--writes`` serves
the index writable, its write-ahead log beside it. Started by ``servers.start.start_server``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from densehybrid.bench.servers.hash_encoder import HashEncoder


class DeviceLikeEncoder(HashEncoder):
    """Forward time grows with the batch, like a real model; the sleep releases the GIL like a GPU call."""

    def __init__(self, *args, base_ms: float, per_text_ms: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.base_ms, self.per_text_ms = base_ms, per_text_ms

    def encode_tokenized(self, items, role):
        time.sleep((self.base_ms + self.per_text_ms * len(items)) / 1000)
        return super().encode_tokenized(items, role)


def command(index: Path, *args: str) -> list[str]:
    """The command line of this server over ``index`` (``start_server`` adds the port)."""
    return [sys.executable, "-m", __name__, "--index", str(index), *args]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--kind", default="dhr")
    parser.add_argument("--dense-dim", type=int, help="the encoder's dense dims (default: the HashEncoder's)")
    parser.add_argument("--forward-ms", type=float, nargs=2, metavar=("BASE", "PER_TEXT"),
                        help="a device-like forward: BASE + PER_TEXT * texts ms of sleep")
    parser.add_argument("--max-batch-size", type=int)
    parser.add_argument("--queue-size", type=int)
    parser.add_argument("--writes", action="store_true", help="serve the index writable")
    parser.add_argument("--compact-after-changes", type=int)
    parser.add_argument("--write-share", type=float)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    import uvicorn

    from densehybrid.index.served.loading import load_index
    from densehybrid.service.app import create_app
    from densehybrid.service.settings import ServiceSettings

    given = {name: value for name, value in vars(args).items()
             if name in ("max_batch_size", "queue_size", "compact_after_changes", "write_share") and value is not None}
    settings = ServiceSettings(log_level="WARNING", **({"index": args.index} if args.writes else {}), **given)
    shape = {"dense_dim": args.dense_dim} if args.dense_dim else {}
    encoder = (DeviceLikeEncoder(args.kind, base_ms=args.forward_ms[0], per_text_ms=args.forward_ms[1], **shape)
               if args.forward_ms else HashEncoder(args.kind, **shape))
    uvicorn.run(create_app(settings, encoder=encoder, index=load_index(args.index)), host="127.0.0.1",
                port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
