"""Helpers shared by the index build tests."""

import json
from pathlib import Path


def index_files(directory) -> dict[str, bytes]:
    """An index directory's files by name, the manifest without its creation time."""
    out = {}
    for p in sorted(Path(directory).iterdir()):
        data = p.read_bytes()
        if p.name == "manifest.json":
            manifest = json.loads(data)
            del manifest["created"]
            data = json.dumps(manifest, sort_keys=True).encode()
        out[p.name] = data
    return out


def built_stdlib_index(tmp_path: Path, limit: int, model: str = "fake:cls", options: tuple[str, ...] = ()
                       ) -> tuple[Path, list[str]]:
    """``index build`` of ``limit`` stdlib passages (the CLI, as a user runs it, with ``options`` added) -> (the
    index, their texts)."""
    from typer.testing import CliRunner

    from densehybrid.cli.demo_corpus import write_stdlib_corpus
    from densehybrid.cli.main import app

    write_stdlib_corpus(tmp_path / "corpus.jsonl", limit=limit)
    result = CliRunner().invoke(app, ["index", "build", "--corpus", str(tmp_path / "corpus.jsonl"), "--model", model,
                                      "--out", str(tmp_path / "index"), "--no-progress", *options])
    assert result.exit_code == 0, result.output
    return tmp_path / "index", [json.loads(line)["text"] for line in (tmp_path / "corpus.jsonl").read_text().splitlines()]


def write_queries(path: Path, texts: list[str]) -> Path:
    """``texts`` as a BEIR queries.jsonl."""
    path.write_text("".join(json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    return path
