"""The offline real models (docs/indexes.md): SPLADE-tiny's DLR against exact SPLADE, fusion, MiniLM."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from densehybrid.encoder import representations as R
from densehybrid.encoder.loading import load_encoder

pytestmark = pytest.mark.realmodel

# (query, its obviously relevant passage) first, then distractors on other topics
PAIRS = [
    ("how many legs does a spider have", "Spiders are arachnids with eight legs and two main body segments."),
    ("what is the capital of france", "Paris is the capital and largest city of France, on the river Seine."),
    ("how do vaccines work", "Vaccines train the immune system to recognise a pathogen by exposing it to a harmless piece of it."),
    ("when did the titanic sink", "The Titanic sank in the North Atlantic on 15 April 1912 after striking an iceberg."),
    ("how to brew green tea", "Brew green tea with water at about 80 degrees Celsius for two to three minutes."),
    ("what causes earthquakes", "Earthquakes are caused by the sudden release of energy when tectonic plates slip along faults."),
    ("who painted the mona lisa", "The Mona Lisa was painted by Leonardo da Vinci in the early sixteenth century."),
    ("boiling point of water at sea level", "At sea level, pure water boils at 100 degrees Celsius, or 212 degrees Fahrenheit."),
]
DISTRACTORS = [
    "The stock market fell sharply after the central bank raised interest rates.",
    "Photosynthesis converts sunlight, water and carbon dioxide into glucose and oxygen.",
    "A marathon is a long-distance running race of 42.195 kilometres.",
    "The piano has 88 keys and was invented in Italy around the year 1700.",
    "Python is a programming language known for its readable syntax.",
    "Mount Everest is the highest mountain above sea level, in the Himalayas.",
    "Bees communicate the location of flowers to each other with a waggle dance.",
    "The Great Wall of China stretches thousands of kilometres across northern China.",
    "Coffee beans are the roasted seeds of the coffee plant's cherries.",
    "Jupiter is the largest planet in our solar system and has dozens of moons.",
    "The French Revolution began in 1789 with the storming of the Bastille.",
    "Whales are mammals that breathe air through a blowhole on top of their heads.",
    "A healthy adult heart beats between 60 and 100 times per minute at rest.",
    "The novel Pride and Prejudice was written by Jane Austen and published in 1813.",
    "Solar panels convert sunlight into electricity using photovoltaic cells.",
    "Football is played by two teams of eleven players on a rectangular field.",
    "Antibiotics kill bacteria but have no effect on viruses such as the flu.",
    "The Amazon rainforest produces a large share of the world's oxygen and is home to many species.",
    "Iron rusts when it reacts with oxygen and water over time.",
    "Violins have four strings tuned in perfect fifths.",
    "The Roman Empire was ruled from Rome for several centuries before it split in two.",
    "Chess is a strategy board game played on a board of sixty-four squares.",
    "Glaciers form where snow accumulates faster than it melts, compressing into ice.",
    "Bread rises because yeast produces carbon dioxide gas during fermentation.",
    "The human skeleton of an adult has 206 bones.",
    "Electric cars are powered by batteries instead of petrol engines.",
    "Tsunamis are large ocean waves often triggered by undersea earthquakes.",
    "The moon orbits the earth about once every 27 days.",
]
QUERIES = [q for q, _ in PAIRS]
PASSAGES = [p for _, p in PAIRS] + DISTRACTORS


def _ranks(x: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def exact_splade(model_dir, texts, max_length):
    """30522-d SPLADE vectors straight from transformers, one text at a time (no padding)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForMaskedLM.from_pretrained(model_dir).eval()
    rows = []
    for text in texts:
        batch = tokenizer(text, truncation=True, max_length=max_length, return_tensors="pt")
        with torch.no_grad():
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[0]
        rows.append(np.log1p(np.maximum(logits.double().numpy(), 0.0)).max(0))
    return np.stack(rows)


@pytest.fixture(scope="module")
def splade(splade_tiny_dir):
    return load_encoder("splade-tiny")


def test_splade_tiny_dlr_gip_tracks_exact_splade(splade, splade_tiny_dir):
    q_exact = exact_splade(splade_tiny_dir, QUERIES, splade.spec.max_query_length)
    p_exact = exact_splade(splade_tiny_dir, PASSAGES, splade.spec.max_passage_length)
    exact = q_exact @ p_exact.T
    q, p = splade.encode(QUERIES, "query"), splade.encode(PASSAGES, "passage")
    # the DLR is a lossless max over each row group: its values are the exact vector's
    np.testing.assert_allclose(q.values, R.densify(torch.from_numpy(q_exact), 768)[0].numpy(), atol=1e-4)
    gip = R.gated_inner_product(*(torch.from_numpy(a) for a in (q.values, q.gates, p.values, p.gates))).numpy()
    # with non-negative SPLADE weights, GIP keeps a subset of the exact dot product's terms
    assert (gip >= 0).all() and (gip <= exact + 1e-3).all()
    per_query = [spearman(gip[i], exact[i]) for i in range(len(QUERIES))]
    overall = spearman(gip.ravel(), exact.ravel())
    # measured on these sentences: per query 0.98-1.00, mean 0.997, overall 0.996, same top-1 8/8
    assert min(per_query) > 0.9 and np.mean(per_query) > 0.97 and overall > 0.97, (per_query, overall)
    same_top1 = np.mean(gip.argmax(1) == exact.argmax(1))
    assert same_top1 >= 7 / 8, same_top1


def test_fusion_ranks_the_relevant_sentence_first(splade_tiny_dir, minilm_dir):
    fusion = load_encoder("splade-tiny", kind="fusion", dense_model="minilm", lam=20.0)
    assert fusion.spec.dim == 768 + 384 and fusion.spec.gated_dim == 768 and fusion.spec.lam == 20.0
    q, p = fusion.encode(QUERIES, "query"), fusion.encode(PASSAGES, "passage")
    g = fusion.spec.gated_dim
    lexical = R.gated_inner_product(torch.from_numpy(q.values[:, :g]), torch.from_numpy(q.gates),
                                    torch.from_numpy(p.values[:, :g]), torch.from_numpy(p.gates)).numpy()
    scores = lexical + fusion.spec.lam * q.values[:, g:] @ p.values[:, g:].T
    assert scores.argmax(1).tolist() == list(range(len(QUERIES)))


def test_minilm_mean_normalized_equals_independent_computation(minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    encoder = load_encoder("minilm")
    assert (encoder.spec.kind, encoder.spec.pooling, encoder.spec.normalize, encoder.spec.dim) == \
        ("cls", "mean", True, 384)
    texts = [QUERIES[0], PASSAGES[20], "x"]
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)
    model = AutoModel.from_pretrained(minilm_dir).eval()
    expected = []
    for text in texts:  # one at a time: no padding involved in the reference
        batch = tokenizer(text, truncation=True, max_length=encoder.spec.max_passage_length, return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch).last_hidden_state[0].double().numpy()
        mean = hidden.mean(0)
        expected.append(mean / np.linalg.norm(mean))
    np.testing.assert_allclose(encoder.encode(texts, "passage").values, np.stack(expected), atol=1e-5)
