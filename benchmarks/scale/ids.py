"""How long the id list takes to open, and the first id lookup after it, at N ids: the stored arrays
(``doc_ids.npy`` + ``doc_ids.order.npy``, memory-mapped) against format 2's ``doc_ids.json``.

``python -m densehybrid.bench.scale.ids --ids 1000000`` writes both forms of N MS MARCO-like ids into
a temporary directory and, ``--repeats`` times each, opens them as a load does and looks one id up as
the first write after a reload does (for the JSON list that builds its sorted lookup array, as the
index did before the arrays). A reload runs this while readers wait for the GIL, so the open is the
stall. Prints one JSON report of medians in ms; the numbers are of this machine and this run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from densehybrid.index.storage import doc_ids


def _json_lookup(ids: list[str], wanted: str) -> int:
    """What the index did with a JSON id list: one numpy string array and its sort order, then a search."""
    keys = np.array(ids, dtype=str)
    order = np.argsort(keys, kind="stable")
    return int(order[np.searchsorted(keys, wanted, sorter=order)])


def _median_ms(fn, repeats: int) -> tuple[float, object]:
    samples, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 2), out


def run(count: int, repeats: int) -> dict:
    ids = [f"{i * 7 + 3}" for i in range(count)]  # MS MARCO's ids are decimal numbers of up to 7 digits
    probe = ids[count // 3]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / doc_ids.LEGACY_JSON).write_text(json.dumps(ids, separators=(",", ":")), encoding="utf-8")
        write_ms, _ = _median_ms(lambda: doc_ids.write(directory, ids), 1)
        # what a reload of a format-2 index did (this release also encodes them, once, for the lookup)
        json_open, loaded = _median_ms(lambda: json.loads((directory / doc_ids.LEGACY_JSON).read_text("utf-8")),
                                       repeats)
        json_first, row_json = _median_ms(lambda: _json_lookup(loaded, probe), repeats)
        arrays_open, _ = _median_ms(lambda: doc_ids.load(directory, count), repeats)
        arrays_first, rows = _median_ms(lambda: doc_ids.load(directory, count).rows_of([probe]), repeats)
        sizes = {p.name: p.stat().st_size for p in sorted(directory.iterdir())}
    if row_json != count // 3 or rows.tolist() != [count // 3]:
        raise AssertionError("a lookup found the wrong row")
    return {"ids": count, "repeats": repeats, "write_arrays_ms": write_ms, "files_bytes": sizes,
            "json": {"open_ms": json_open, "first_lookup_ms": json_first},
            "arrays": {"open_ms": arrays_open, "open_and_first_lookup_ms": arrays_first},
            "open_ratio_json_over_arrays": round(json_open / max(arrays_open, 1e-3), 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    print(json.dumps(run(args.ids, args.repeats), indent=2))


if __name__ == "__main__":
    main()
