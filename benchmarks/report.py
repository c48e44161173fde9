"""One table from a results dict, and the JSON file."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table


def num(value: float | None, digits: int) -> str:
    """A figure for the table; a missing one (None: not measured on this device) prints as '-'."""
    return "-" if value is None else f"{value:.{digits}f}"


def _ms(t: dict) -> str:
    return f"p50 {num(t['p50'], 2)} / p99 {num(t['p99'], 2)} ms"


def _memory(r: dict):
    m = r["memory"]
    yield "memory", f"read bandwidth ({m['array_bytes'] >> 20} MiB numpy max)", \
        f"{num(m['read_gbps_1_thread'], 1)} GB/s 1 thread, {num(m['read_gbps_2_threads'], 1)} GB/s 2 threads"


def _search(r: dict):
    if "first_stage" in r["search"]:  # the CPU (Faiss) parts; the GPU run measures only the torch path
        yield from _faiss_search(r)
    ts = r["search"].get("torch")
    if ts:
        yield "first stage", f"torch exact {ts['rows']:,} x {ts['dim']} {ts['dtype']} on {ts['device']}, batch 1, k={ts['k']}", \
            f"{_ms(ts['batch1_ms'])} = {num(ts['scan_gbps'], 1)} GB/s = {num(ts['fraction_of_bandwidth'], 2)} of {ts['bandwidth_kind']}"
        if "batch1_k11_ms" in ts:
            yield "first stage", "the same at k=11 (a search without a rerank: k=10 and one past the cut)", \
                f"{_ms(ts['batch1_k11_ms'])} = {num(ts['fraction_of_bandwidth_k11'], 2)} of {ts['bandwidth_kind']}"
        yield "rerank", f"torch exact GIP of {ts['rerank_candidates']:,} candidates on {ts['device']}", _ms(ts["rerank_ms"])


def _faiss_search(r: dict):
    fs, rr, ap = r["search"]["first_stage"], r["search"]["rerank"], r["search"]["approx_vs_ip"]
    shape = f"{fs['rows']:,} x {fs['dim']}" + ("" if fs["rows"] == fs["requested_rows"] else " (capped by memory)")
    yield "first stage", f"FlatIP {shape}, batch 1, 1 thread", f"{_ms(fs['batch1_ms_1_thread'])} = {fs['batch1_qps']} q/s"
    yield "first stage", "batch 1, 2 threads", _ms(fs["batch1_ms_2_threads"])
    yield "first stage", "batch-1 scan rate / bandwidth", (
        f"{num(fs['batch1_scan_gbps'], 1)} GB/s = {num(fs['batch1_scan_fraction_of_1_thread_bandwidth'], 2)} of 1-thread, "
        f"{num(fs['batch1_scan_fraction_of_2_thread_bandwidth'], 2)} of 2-thread bandwidth")
    batch = r["config"]["batch_size"]
    yield "first stage", f"batch {batch} q/s: Faiss default vs BLAS threshold lowered", \
        f"{fs[f'batch{batch}_faiss_default_qps']} vs {fs[f'batch{batch}_blas_tuned_qps']} q/s"
    yield "rerank", f"exact GIP of {rr['candidates']:,} candidates ({rr['rows']:,} rows)", \
        f"{_ms(rr['ms'])} = {num(rr['fraction_of_first_stage_batch1'], 3)} x first stage"
    yield "approx GIP", f"first stage over {ap['rows']:,} x {ap['dim']}, θ={ap['theta']}", \
        f"IP {num(ap['ip_ms']['p50'], 2)} ms vs approx-GIP {num(ap['approx_gip_ms']['p50'], 2)} ms ({num(ap['approx_over_ip'], 2)} x)"


def _encoder(r: dict):
    e = r["encoder"]
    for backend, by_length in e["query_latency_ms"].items():
        if backend == "cuda_graphs_captured":
            yield "encoder", "CUDA graphs captured per encoder", "; ".join(
                f"{b}: " + ", ".join(f"{v} {n}" for v, n in counts.items()) for b, counts in by_length.items())
            continue
        if backend == "onnx_speedup_p50":
            continue
        for length, row in by_length.items():
            if not length.startswith("len"):
                cells = ", ".join(f"{v} {num(t['p50'], 2)}/{num(t['p99'], 2)}" for v, t in row.items())
                yield "encoder", f"{e['shape']} batch 1, a 12-token text with tokenization, {backend} (p50/p99 ms)", cells
                continue
            cells = ", ".join(f"{v} {num(t['p50'], 2)}/{num(t['p99'], 2)} ({num(t['ratio_to_cls_p50'], 2)}x)" for v, t in row.items())
            yield "encoder", f"{e['shape']} batch 1, {length[3:]} tokens, {backend} (p50/p99 ms, x cls)", cells
    mb = e["mlm_breakdown"]
    for length, row in mb.items():
        if length.startswith("len"):
            yield "encoder", f"full Aggretriever, torch, {length[3:]} tokens: where the time goes", (
                f"backbone {num(row['backbone_ms'], 1)} + MLM head {num(row['head_ms'], 1)} + representation math {num(row['math_ms'], 1)} ms "
                f"-> {num(row['measured_bound_ratio'], 2)}x backbone (FLOP bound {num(mb['flop_bound_ratio'], 2)}x)")
    pt = e["passage_throughput"]
    for variant, row in pt.items():
        if not isinstance(row, dict):
            continue
        backends = ", ".join(f"{k[:-4]} {num(v, 1)}" for k, v in row.items() if k.endswith("_pps") and not k.startswith("bare"))
        ratios = ", ".join(f"{k[:-10]} {num(v, 2)}" for k, v in row.items() if k.endswith("_over_bare"))
        yield "passages", f"{variant}: {pt['batch']} x {pt['length']} tokens, passages/s", \
            f"bare forward {num(row['bare_transformers_pps'], 1)}; ours {backends} (ours/bare: {ratios})"


def _service(r: dict):
    s = r["service"]
    ip = s["in_process"]
    yield "service", f"in process ({s['kind']}, {s['backend']}, {s['docs']:,} docs)", \
        f"encode {num(ip['encode_ms']['p50'], 2)} ms, encode+search {num(ip['search_ms']['p50'], 2)} ms (p50)"
    for mode in s["search_overhead_p50_ms"]:
        for route, levels in s[f"batching_{mode}"].items():
            cells = ", ".join(f"{c}: {num(v['p50_ms'], 1)}/{num(v['p95_ms'], 1)} ms {num(v['rps'], 1)} rps" for c, v in levels.items())
            yield "service", f"{route} batching {mode} (p50/p95, throughput)", cells
    for mode, value in s["search_overhead_p50_ms"].items():
        yield "service", f"/search c1 overhead per request (latency - encode - search - rerank), batching {mode}", \
            (f"p50 {num(value, 2)} ms, of which outside the server's total (HTTP+JSON): "
             f"{num(s['search_http_json_p50_ms'][mode], 2)} ms; p50 - in-process p50: {num(s['search_in_process_delta_p50_ms'][mode], 2)} ms")
    if "noop_floor_c1" in s:
        floor = s["noop_floor_c1"]
        yield "service", "floor: do-nothing FastAPI /search in its own process, c1", \
            f"p50 {num(floor['p50_ms'], 2)} / p95 {num(floor['p95_ms'], 2)} ms"
    gains = ", ".join(f"{mode} {num(v, 2)}x" for mode, v in s["encode_rps_ratio_max_vs_1"].items() if v is not None)
    yield "service", "/encode rps at max concurrency / at c1", gains


def _first_stage_parts(r: dict):
    p = r["first_stage_parts"]
    ms = p["ms"]
    yield "first stage parts", f"{p['rows']:,} x 768 {p['dtype']} on {p['device']}: the product, a copy of the rows", \
        f"q @ V.T {num(ms['q @ V.T'], 3)} ms, copy {num(ms['copy of the rows'], 3)} ms ({num(p['copy_gbps'], 0)} GB/s)"
    for k in (1000, 11):
        splits = {name.rsplit(", ", 1)[1]: value for name, value in ms.items() if name.startswith(f"device part k={k},")}
        if splits:
            chosen = p.get("split_chosen", {}).get(str(k), p.get("split_chosen", {}).get(k))
            yield "first stage parts", f"k={k}: product + top-k replayed from a graph, by split (search's choice: " \
                f"{chosen} parts)", ", ".join(f"{name} {num(value, 3)} ms" for name, value in splits.items())
    around = {name: value for name, value in ms.items() if name.startswith(("graphed call", "host ordering"))}
    if around:
        yield "first stage parts", f"around the graph, k=1000 (the whole search: {num(ms['search'], 3)} ms)", \
            ", ".join(f"{name} {num(value, 3)} ms" for name, value in around.items())


def _msmarco_scale(r: dict):
    m = r["msmarco_scale"]
    fs, svc, w = m["first_stage"], m["service"], m["write"]
    rows = f"{m['rows']:,} x {m['dim']}" + ("" if m["fits"] else f" (of {m['requested_rows']:,} asked: the most that fit)")
    yield "MS MARCO scale", f"{rows} float16 drawn on {m['device_name']} and written as an index", \
        f"vectors {num(w['vectors_s'], 1)} s ({w['vectors_bytes'] / 1e9:.1f} GB), ids and passages " \
        f"{num(w['ids_and_passages_s'], 1)} s, manifest {num(w['manifest_s'], 1)} s"
    for k in (1000, 11):
        t = fs[f"k{k}"]
        yield "MS MARCO scale", f"first stage in process, batch 1, k={k} ({fs['chunks']} chunks)", \
            f"{_ms(t['ms'])} = {num(t['scan_gbps'], 0)} GB/s = {num(t['fraction_of_copy_bandwidth'], 2)} of copy bandwidth"
    memory = svc["device_memory_mib"] if svc["device_memory_mib"] is not None else svc.get("device_used_delta_mib")
    yield "MS MARCO scale", f"densehybrid serve ({m['kind']}, {m['encoder_shape']} query encoder)", \
        f"ready in {num(svc['ready_s'], 1)} s, device memory {'-' if memory is None else f'{memory:,.0f} MiB'}"
    for level, v in svc.items():
        if level.startswith("/search"):
            yield "MS MARCO scale", f"{level} over HTTP (p50/p95, throughput)", \
                f"{num(v['p50_ms'], 2)}/{num(v['p95_ms'], 2)} ms, {num(v['rps'], 1)} rps (server total p50 " \
                f"{num(v['server_total_p50_ms'], 2)} ms)"


def _live_recall(r: dict):
    run = r["live_recall"]
    live = run["live_recall"]
    cost, control, truth = live["cost"], live["control"], live["truth"]
    yield "live recall", f"sampling {cost['rate']:.0%} of {cost['queries']:,} /search on {run['device_name']}, " \
        f"{run['rows']:,} rows: p50 and p99 against a server that does not sample", \
        f"x{num(cost['p50_ratio'], 3)} and x{num(cost['p99_ratio'], 3)} (A/A control: x{num(control['p50_ratio'], 3)} " \
        f"and x{num(control['p99_ratio'], 3)}); {cost['sampled']} sampled, {cost['dropped']} dropped; the sampling " \
        f"thread {num(100 * cost['sampling_cpu_share_of_one_core'], 2)} % of one core"
    default = truth["default"]
    yield "live recall", f"a server sampling each of {sum(truth['queries'].values()):,} queries: its live recall@10 " \
        f"against an exact scan of its answers", \
        f"{num(default['live_recall_at_10'], 4)} against {num(default['offline_recall_at_10'], 4)} " \
        f"({default['samples']} samples, {default['dropped']} dropped)"


def _corpus_encode(r: dict):
    for c in r["corpus_encode"]:
        projected = c["projected_build_s"]
        yield "corpus encode", f"{c['label']}: `index build` of {c['passages']:,} passages ({c['mean_tokens']} tokens " \
            f"on average), batch {c['batch_size']}, {c['device_name']}", \
            f"{num(c['build_pps'], 0)} passages/s; bare forward {num(c['bare_forward_pps'], 0)}/s " \
            f"({num(c['bare_with_tokenization_pps'], 0)}/s with tokenizing): {num(c['build_over_bare_forward'], 2)}x; " \
            f"at this rate 827k in {num(projected['packages_827k'], 0)} s, 8.8M in {num(projected['msmarco_8.8M'], 0)} s"


def _targets(r: dict):
    for t in r["targets"]:
        mark = {True: "met", False: "MISSED", None: "n/a"}[t["met"]]
        value = "-" if t["value"] is None else f"{num(t['value'], 3)}"
        yield "target", t["description"], f"{value} {t['op']} {t['limit']}: {mark}"


SECTIONS = {"memory": _memory, "search": _search, "encoder": _encoder, "service": _service,
            "first_stage_parts": _first_stage_parts, "msmarco_scale": _msmarco_scale, "live_recall": _live_recall,
            "corpus_encode": _corpus_encode}


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
    """The same table as Markdown (for docs/performance.md)."""
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
