"""The embedding model of the semantic ranker (the `embeddings` extra): what is embedded for a chunk,
the vector encoding, and the real all-MiniLM-L6-v2 from its wheel (fp32 and int8)."""

from __future__ import annotations

import numpy as np
import pytest

from context.index.embeddings import (
    EMBEDDING_DIM,
    ChunkEmbedder,
    EmbedderConfig,
    blob_to_vectors,
    embedding_text,
    embeddings_available,
    vector_key,
    vector_to_blob,
)

GAUSS = '''# code merged in before the definition
_ONE = 1

def gauss(self, mu=0.0, sigma=1.0):
    """Gaussian distribution.

    mu is the mean, and sigma is the standard deviation."""
    z = self.gauss_next
''' + "    x = 1\n" * 40


def test_embedding_text_is_module_name_words_and_the_head():
    text = embedding_text("random.py", "Random.gauss", GAUSS)
    first, *rest = text.splitlines()
    assert first == "random Random gauss"
    # The head starts at the definition, not at the code merged in before it, and is cut short.
    assert rest[0] == "def gauss(self, mu=0.0, sigma=1.0):"
    assert "_ONE" not in text
    assert "Gaussian distribution." in text
    assert len(rest) <= 12
    window = embedding_text("docs/notes.txt", None, "  first line\n\n  second\n")
    assert window == "docs.notes.txt\nfirst line\nsecond"
    snake = embedding_text("pkg/shutil.py", "copy_tree", "def copy_tree(src, dst):\n    pass\n")
    assert snake.splitlines()[0] == "pkg.shutil copy tree"


def test_vector_keys_depend_on_model_and_text():
    assert vector_key("m1", "text") == vector_key("m1", "text")
    assert vector_key("m1", "text") != vector_key("m2", "text")
    assert vector_key("m1", "text") != vector_key("m1", "text ")
    assert EmbedderConfig().model_id != EmbedderConfig(quantize=False).model_id
    assert EmbedderConfig(max_tokens=64).model_id != EmbedderConfig(max_tokens=128).model_id


def test_blobs_round_trip_as_float16():
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3, EMBEDDING_DIM)).astype(np.float32)
    matrix = blob_to_vectors([vector_to_blob(v) for v in vectors])
    assert matrix.shape == (3, EMBEDDING_DIM) and matrix.dtype == np.float32
    np.testing.assert_allclose(matrix, vectors, rtol=1e-3, atol=1e-3)
    assert blob_to_vectors([]).shape == (0, EMBEDDING_DIM)


needs_model = pytest.mark.skipif(not embeddings_available(), reason="the embeddings extra is not installed")

TEXTS = [
    embedding_text("random.py", "Random.gauss", GAUSS),
    embedding_text("shlex.py", "split", 'def split(s, comments=False, posix=True):\n'
                   '    """Split the string *s* using shell-like syntax."""\n'),
    embedding_text("gzip.py", "GzipFile.read", "def read(self, size=-1):\n    self._check_not_closed()\n"),
]
QUERIES = ["draw a normally distributed random number", "break a command line into words like a shell",
           "read bytes from a compressed file"]


@pytest.fixture(scope="module")
def fp32():
    return ChunkEmbedder(EmbedderConfig(quantize=False))


@pytest.fixture(scope="module")
def int8():
    return ChunkEmbedder(EmbedderConfig(quantize=True))


@needs_model
@pytest.mark.parametrize("which", ["fp32", "int8"])
def test_real_model_matches_paraphrases_to_their_definitions(which, request):
    embedder = request.getfixturevalue(which)
    chunks = embedder.embed(TEXTS)
    assert chunks.shape == (3, EMBEDDING_DIM) and chunks.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(chunks, axis=1), 1.0, atol=1e-5)
    queries = np.stack([embedder.embed_query(q) for q in QUERIES])
    similarity = queries @ chunks.T  # [query, chunk]
    assert list(similarity.argmax(axis=1)) == [0, 1, 2], similarity


@needs_model
def test_int8_stays_close_to_fp32_and_to_itself_across_batches(fp32, int8):
    a, b = fp32.embed(TEXTS + QUERIES), int8.embed(TEXTS + QUERIES)
    cosine = (a * b).sum(axis=1)
    assert cosine.min() > 0.9, cosine
    # fp32 does not depend on what else is in the batch (padding is masked out)...
    np.testing.assert_allclose(np.stack([fp32.embed([t])[0] for t in TEXTS]), fp32.embed(TEXTS), atol=1e-4)
    # ...nor does int8, which embeds each text alone (dynamic quantization scales activations per
    # batch): a vector is a function of its text, as its content key assumes.
    alone = np.stack([int8.embed([t])[0] for t in TEXTS])
    np.testing.assert_array_equal(alone, int8.embed(TEXTS))
    assert fp32.embed([]).shape == (0, EMBEDDING_DIM)


@needs_model
def test_truncation_bounds_the_tokens_read(int8):
    long = "def f():\n" + "    value = compute(value)\n" * 400
    short = ChunkEmbedder(EmbedderConfig(max_tokens=16))
    # Everything after the first 16 word pieces is ignored: the two texts share those.
    same = short.embed([long, long[: len(long) // 2]])
    assert float(same[0] @ same[1]) > 0.999
    assert int8.embed([long]).shape == (1, EMBEDDING_DIM)
