"""Build -> load -> search round trips with a tiny random model and with the offline real models."""

import json
import numpy as np
import pytest
from typer.testing import CliRunner

from densehybrid.encoder.config import EncoderConfig
from densehybrid.index.building import commands
from densehybrid.index.search import gip
from densehybrid.index.building.build import BuildOptions, build_index
from densehybrid.index.served.loading import load_index
from densehybrid.index.search.searcher import Searcher
from densehybrid.index.search.params import SearchParams

PASSAGES = {
    "tides": "Ocean tides are caused by the gravitational pull of the moon and the sun on the oceans.",
    "photosynthesis": "Photosynthesis lets plants turn sunlight, water and carbon dioxide into glucose and oxygen.",
    "volcano": "A volcano erupts when magma from the mantle rises through the crust and reaches the surface.",
    "insulin": "Insulin is a hormone made by the pancreas that lets cells absorb glucose from the blood.",
    "euro": "The euro is the currency used by most member states of the European Union.",
    "everest": "Mount Everest in the Himalayas is the highest mountain above sea level on Earth.",
    "python": "Python is a programming language known for readable code and a large standard library.",
    "bread": "Bread dough rises because yeast ferments sugars and releases carbon dioxide gas.",
}
QUERIES = {"tides": "what causes ocean tides", "insulin": "which organ produces insulin",
           "everest": "highest mountain in the world", "bread": "why does bread dough rise"}


@pytest.fixture()
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": k, "title": "", "text": v}) + "\n" for k, v in PASSAGES.items()))
    return path


@pytest.mark.slow  # an index built with a BERT per kind
@pytest.mark.parametrize("kind", ["dhr", "dlr", "aggretriever"])
def test_tiny_random_model_round_trip(tmp_path, corpus, tiny_bert_dir, kind):
    encoder = commands.load_model(EncoderConfig(str(tiny_bert_dir), kind=kind))
    build_index(encoder, corpus, tmp_path / "ix", BuildOptions(batch_size=3, shard_size=5, progress=False))
    index = load_index(tmp_path / "ix")
    assert index.spec == encoder.spec and index.spec.kind == kind
    passages = encoder.encode(list(PASSAGES.values()), "passage")
    np.testing.assert_allclose(index.values.astype(np.float32), passages.values, rtol=2e-3, atol=1e-3)
    if kind != "aggretriever":
        np.testing.assert_array_equal(index.gates, passages.gates)
    # the model recorded in the manifest is reloaded and accepted for search
    reloaded = commands.encoder_for_index(index)
    queries = reloaded.encode(list(QUERIES.values()), "query")
    found = Searcher(index).search(queries, SearchParams(k=8, candidates=8, lam=2.0))
    xq = Searcher(index).scale(queries.values, 2.0)
    if kind == "aggretriever":  # plain inner product with the one stored (float16) copy the first stage scans
        want = xq.astype(np.float64) @ index.values.astype(np.float64).T
    else:
        want = gip.exhaustive(xq, queries.gates, index.values, index.gates)
    np.testing.assert_allclose(np.array(found.scores), -np.sort(-want, axis=1), rtol=1e-5, atol=1e-4)


def build_real(tmp_path, corpus, name, model, **kwargs):
    encoder = commands.load_model(EncoderConfig(model, **kwargs))
    build_index(encoder, corpus, tmp_path / name, BuildOptions(batch_size=4, progress=False,
                                                               lam="auto" if kwargs.get("kind") == "fusion" else None))
    return encoder, load_index(tmp_path / name)


@pytest.mark.realmodel
@pytest.mark.parametrize("name,model,kwargs", [
    ("fusion", "splade-tiny", {"kind": "fusion", "dense_model": "minilm"}),
    ("dlr", "splade-tiny", {}),
    ("cls", "minilm", {}),
])
def test_offline_models_find_the_right_passage(tmp_path, corpus, name, model, kwargs, splade_tiny_dir, minilm_dir):
    encoder, index = build_real(tmp_path, corpus, name, model, **kwargs)
    found = Searcher(index).search(encoder.encode(list(QUERIES.values()), "query"), SearchParams(k=3))
    assert [ids[0] for ids in found.ids] == list(QUERIES)
    if name == "fusion":
        assert index.manifest["lambda"]["method"] == "auto-margin" and index.lam > 1.0


@pytest.mark.realmodel
def test_cli_search_uses_the_model_the_index_records(tmp_path, corpus, splade_tiny_dir, minilm_dir):
    from densehybrid.cli.main import app

    build_real(tmp_path, corpus, "fusion", "splade-tiny", kind="fusion", dense_model="minilm")
    result = CliRunner().invoke(app, ["search", "--index", str(tmp_path / "fusion"), "what causes ocean tides", "-k", "2"])
    assert result.exit_code == 0, result.output
    assert result.output.index("tides") < result.output.index("encode_ms")
    mismatch = CliRunner().invoke(app, ["search", "--index", str(tmp_path / "fusion"), "--model", "minilm", "tides"])
    assert mismatch.exit_code == 2 and "does not match the index" in " ".join(mismatch.output.split())
