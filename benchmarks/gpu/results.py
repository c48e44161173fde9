"""The GPU run's results in one file named for the device: ``python -m densehybrid.bench.gpu.results OUT_DIR``.

benchmarks/gpu/gpu_run.sh runs in steps, each writing its own file, so that a step cut short by its time limit
costs only its own numbers: ``bench-STEP.json`` (the benchmark's sections), ``first-stage-parts.json``,
``msmarco-scale.json``, ``live-recall.json`` and ``corpus-*.json``. This merges whatever is there (also the files of two runs
copied into one folder), checks the targets on the whole, and writes ``gpu-DEVICE.json`` and
``gpu-DEVICE.md`` beside them: DEVICE is the CUDA device name in lower case with dashes for spaces
(``cpu-rehearsal`` for the CPU rehearsal).
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

from densehybrid.bench import report
from densehybrid.bench.config import PRESETS, SECTIONS
from densehybrid.bench.runner import machine
from densehybrid.bench.targets import check_all

# the run's other steps: the results key each file's JSON goes under
EXTRA_FILES = {"first_stage_parts": "first-stage-parts.json", "msmarco_scale": "msmarco-scale.json",
               "live_recall": "live-recall.json"}
CORPUS_FILES = "corpus-*.json"


def merge(steps: list[dict], extras: dict) -> dict:
    """One results dict from the steps' (the first step's run details, every step's sections) and the extras."""
    if steps:
        merged = {key: value for key, value in steps[0].items() if key not in (*SECTIONS, "seconds", "targets")}
    else:  # only the steps outside the benchmark ran: this process's machine, the preset its device implies
        on_gpu = machine()["cuda"] is not None
        merged = {"started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "config": PRESETS["gpu" if on_gpu else "gpu-rehearsal"].to_dict(),
                  "device": "cuda" if on_gpu else "cpu", "machine": machine()}
    merged["seconds"] = {}
    for step in steps:
        merged.update({name: step[name] for name in SECTIONS if name in step})
        merged["seconds"].update(step["seconds"])
    merged.update(extras)
    merged["sections_missing"] = [name for name in (*SECTIONS, *EXTRA_FILES, "corpus_encode") if name not in merged]
    merged["targets"] = check_all(merged)
    return merged


def read_extras(out_dir: Path) -> dict:
    extras = {key: json.loads((out_dir / name).read_text()) for key, name in EXTRA_FILES.items()
              if (out_dir / name).is_file() and (out_dir / name).stat().st_size}
    corpus = [json.loads(path.read_text()) for path in sorted(out_dir.glob(CORPUS_FILES))]
    return extras | ({"corpus_encode": corpus} if corpus else {})


def device_name(results: dict) -> str:
    cuda = results["machine"]["cuda"]
    return cuda.lower().replace(" ", "-") if cuda else "cpu-rehearsal"


def main(out_dir: Path) -> Path:
    steps = [json.loads(path.read_text()) for path in sorted(out_dir.glob("bench-*.json"))]
    extras = read_extras(out_dir)
    if not steps and not extras:
        raise SystemExit(f"no results in {out_dir}: every step failed (see its log there)")
    results = merge(steps, extras)
    path = report.write_json(results, out_dir / f"gpu-{device_name(results)}.json")
    path.with_suffix(".md").write_text(report.markdown(results))
    report.print_table(results)
    return path


if __name__ == "__main__":
    main(Path(sys.argv[1]))
