"""The GPU run's results in one file named for the device: ``python -m densehybrid.bench.gpu.results OUT_DIR``.

benchmarks/gpu/gpu_run.sh runs the benchmark in steps, each writing ``bench-STEP.json``, so that a step cut
short by its time limit costs only its own numbers. This merges the steps, checks the targets on the
whole, and writes ``gpu-DEVICE.json`` and ``gpu-DEVICE.md`` beside them: DEVICE is the CUDA device name in
lower case with dashes for spaces (``cpu-rehearsal`` for the CPU rehearsal).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from densehybrid.bench import report
from densehybrid.bench.config import SECTIONS
from densehybrid.bench.targets import check_all


def merge(steps: list[dict]) -> dict:
    """One results dict from the steps' (the first step's run details, every step's sections)."""
    merged = {key: value for key, value in steps[0].items() if key not in (*SECTIONS, "seconds", "targets")}
    merged["seconds"] = {}
    for step in steps:
        merged.update({name: step[name] for name in SECTIONS if name in step})
        merged["seconds"].update(step["seconds"])
    merged["sections_missing"] = [name for name in SECTIONS if name not in merged]
    merged["targets"] = check_all(merged)
    return merged


def device_name(results: dict) -> str:
    cuda = results["machine"]["cuda"]
    return cuda.lower().replace(" ", "-") if cuda else "cpu-rehearsal"


def main(out_dir: Path) -> Path:
    steps = [json.loads(path.read_text()) for path in sorted(out_dir.glob("bench-*.json"))]
    if not steps:
        raise SystemExit(f"no bench-*.json in {out_dir}: every benchmark step failed (see its log there)")
    results = merge(steps)
    path = report.write_json(results, out_dir / f"gpu-{device_name(results)}.json")
    path.with_suffix(".md").write_text(report.markdown(results))
    report.print_table(results)
    return path


if __name__ == "__main__":
    main(Path(sys.argv[1]))
