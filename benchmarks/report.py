"""One table from a results dict, and the JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _ms(t: dict) -> str:
    return f"p50 {t['p50']:.2f} / p99 {t['p99']:.2f} ms"


def _memory(r: dict):
    m = r["memory"]
    yield "memory", f"read bandwidth ({m['array_bytes'] >> 20} MiB numpy max)", \
        f"{m['read_gbps_1_thread']:.1f} GB/s 1 thread, {m['read_gbps_2_threads']:.1f} GB/s 2 threads"


def _search(r: dict):
    fs, rr, ap = r["search"]["first_stage"], r["search"]["rerank"], r["search"]["approx_vs_ip"]
    shape = f"{fs['rows']:,} x {fs['dim']}" + ("" if fs["rows"] == fs["requested_rows"] else " (capped by memory)")
    yield "first stage", f"FlatIP {shape}, batch 1, 1 thread", f"{_ms(fs['batch1_ms_1_thread'])} = {fs['batch1_qps']} q/s"
    yield "first stage", "batch 1, 2 threads", _ms(fs["batch1_ms_2_threads"])
    yield "first stage", "batch-1 scan rate / bandwidth", (
        f"{fs['batch1_scan_gbps']:.1f} GB/s = {fs['batch1_scan_fraction_of_1_thread_bandwidth']:.2f} of 1-thread, "
        f"{fs['batch1_scan_fraction_of_2_thread_bandwidth']:.2f} of 2-thread bandwidth")
    batch = r["config"]["batch_size"]
    yield "first stage", f"batch {batch} q/s: Faiss default vs BLAS threshold lowered", \
        f"{fs[f'batch{batch}_faiss_default_qps']} vs {fs[f'batch{batch}_blas_tuned_qps']} q/s"
    yield "rerank", f"exact GIP of {rr['candidates']:,} candidates ({rr['rows']:,} rows)", \
        f"{_ms(rr['ms'])} = {rr['fraction_of_first_stage_batch1']:.3f} x first stage"
    yield "approx GIP", f"first stage over {ap['rows']:,} x {ap['dim']}, θ={ap['theta']}", \
        f"IP {ap['ip_ms']['p50']:.2f} ms vs approx-GIP {ap['approx_gip_ms']['p50']:.2f} ms ({ap['approx_over_ip']:.2f} x)"


def _encoder(r: dict):
    e = r["encoder"]
    for backend, by_length in e["query_latency_ms"].items():
        if backend == "onnx_speedup_p50":
            continue
        for length, row in by_length.items():
            cells = ", ".join(f"{v} {t['p50']:.1f}/{t['p99']:.1f} ({t['ratio_to_cls_p50']:.2f}x)" for v, t in row.items())
            yield "encoder", f"{e['shape']} batch 1, {length[3:]} tokens, {backend} (p50/p99 ms, x cls)", cells
    mb = e["mlm_breakdown"]
    for length, row in mb.items():
        if length.startswith("len"):
            yield "encoder", f"full Aggretriever, torch, {length[3:]} tokens: where the time goes", (
                f"backbone {row['backbone_ms']:.1f} + MLM head {row['head_ms']:.1f} + §2 math {row['math_ms']:.1f} ms "
                f"-> {row['measured_bound_ratio']:.2f}x backbone (FLOP bound {mb['flop_bound_ratio']:.2f}x)")
    pt = e["passage_throughput"]
    for variant, row in pt.items():
        if not isinstance(row, dict):
            continue
        backends = ", ".join(f"{k[:-4]} {v:.1f}" for k, v in row.items() if k.endswith("_pps") and not k.startswith("bare"))
        ratios = ", ".join(f"{k[:-10]} {v:.2f}" for k, v in row.items() if k.endswith("_over_bare"))
        yield "passages", f"{variant}: {pt['batch']} x {pt['length']} tokens, passages/s", \
            f"bare forward {row['bare_transformers_pps']:.1f}; ours {backends} (ours/bare: {ratios})"


def _service(r: dict):
    s = r["service"]
    ip = s["in_process"]
    yield "service", f"in process ({s['kind']}, {s['backend']}, {s['docs']:,} docs)", \
        f"encode {ip['encode_ms']['p50']:.2f} ms, encode+search {ip['search_ms']['p50']:.2f} ms (p50)"
    for mode in ("on", "on_nowait", "off"):
        for route, levels in s[f"batching_{mode}"].items():
            cells = ", ".join(f"{c}: {v['p50_ms']:.1f}/{v['p95_ms']:.1f} ms {v['rps']:.1f} rps" for c, v in levels.items())
            yield "service", f"{route} batching {mode} (p50/p95, throughput)", cells
    for mode, value in s["search_overhead_p50_ms"].items():
        yield "service", f"/search c1 overhead per request (latency - encode - search - rerank), batching {mode}", \
            (f"p50 {value:.2f} ms, of which outside the server's total (HTTP+JSON): "
             f"{s['search_http_json_p50_ms'][mode]:.2f} ms; p50 - in-process p50: {s['search_in_process_delta_p50_ms'][mode]:.2f} ms")
    if "noop_floor_c1" in s:
        floor = s["noop_floor_c1"]
        yield "service", "floor: do-nothing FastAPI /search in its own process, c1", \
            f"p50 {floor['p50_ms']:.2f} / p95 {floor['p95_ms']:.2f} ms"
    gains = ", ".join(f"{mode} {v:.2f}x" for mode, v in s["encode_rps_ratio_max_vs_1"].items() if v is not None)
    yield "service", "/encode rps at max concurrency / at c1", gains


def _targets(r: dict):
    for t in r["targets"]:
        mark = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        value = "-" if t["value"] is None else f"{t['value']:.3f}"
        yield "target", t["description"], f"{value} {t['op']} {t['limit']}: {mark}"


SECTIONS = {"memory": _memory, "search": _search, "encoder": _encoder, "service": _service}


def rows(results: dict) -> list[tuple[str, str, str]]:
    out = []
    for name, make in SECTIONS.items():
        if name in results:
            out.extend(make(results))
    out.extend(_targets(results))
    return out


def print_table(results: dict, console: Console | None = None) -> None:
    machine = results["machine"]
    title = (f"densehybrid benchmark ({results['config']['preset']}) on {results['device']}, {machine['cpus']} CPUs, "
             f"load avg {machine['load_average_at_start'][0] if machine['load_average_at_start'] else '?'}")
    table = Table("section", "what", "result", title=title, show_lines=False)
    for row in rows(results):
        table.add_row(*row)
    (console or Console(width=200)).print(table)


def markdown(results: dict) -> str:
    """The same table as Markdown (for the README and issue notes)."""
    machine = results["machine"]
    lines = [f"Preset `{results['config']['preset']}` on {results['device']}, {machine['cpus']} CPUs, "
             f"{machine['torch_threads']} torch threads, load average {machine['load_average_at_start']} at start, "
             f"started {results['started']}.", "", "| section | what | result |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c.replace('|', '/')} |" for a, b, c in rows(results)]
    return "\n".join(lines) + "\n"


def write_json(results: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return path
