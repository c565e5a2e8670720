"""A learned reward: how likely this user is to keep an answer, from the answers they kept and undid.

The similarity rewards (`feedback.rewards`) compare a fresh sample with one episode's own outcome, so
they teach "write what was kept here": they carry nothing from one function to the next. What a user
keeps across episodes (a docstring first, annotations, a short body) is a preference, and a
preference can be learned from the recorded outcomes alone: the texts a user ended with and answers
kept as they were are positive, answers the user reverted or rewrote are negative.

`PreferenceModel` is a logistic regression over hashed code n-grams (identifiers, keywords and
punctuation runs, in pairs), with the opening line's n-grams as features of their own, since how an
answer starts is what a user sees first. It trains in well under a second on a round's episodes. It
is only used when it predicts the user: `fit_preference` cross-validates it by group (the function an
episode was about, so a fold never sees the code it is scored on) and enables it only when its
balanced accuracy clears `MIN_BALANCED_ACCURACY` with enough examples of both kinds.
"""

from __future__ import annotations

import re
import textwrap
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "MIN_BALANCED_ACCURACY",
    "MIN_PER_CLASS",
    "PreferenceFit",
    "PreferenceModel",
    "fit_preference",
    "labelled_texts",
]

DIMENSIONS = 1 << 14
MIN_PER_CLASS = 6  # examples of each kind (kept, not kept) before a model is fitted at all
MIN_BALANCED_ACCURACY = 0.65  # the cross-validated score it must reach to be used
FOLDS = 4
MAX_CHARS = 2000  # an answer's first characters decide; long texts would drown the opening
UNCHANGED = 0.9  # an answer at least this similar to the kept text was kept as it was
MAX_OUTCOMES = 2000  # the newest outcomes are fitted on (the fit holds them as a dense matrix)

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|[^\w\s]{1,3}")


def _tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def features(text: str) -> dict[int, float]:
    """Hashed feature indices of one answer, each present once, scaled to unit length."""
    text = textwrap.dedent(text.strip("\n"))[:MAX_CHARS]
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    names: set[str] = set()
    for scope, part in (("a", text), ("o", lines[0])):
        toks = _tokens(part)
        names.update(f"{scope}1:{t}" for t in toks)
        names.update(f"{scope}2:{a} {b}" for a, b in zip(toks, toks[1:], strict=False))
    names.add(f"lines:{min(len(lines), 12)}")
    indices = {zlib.crc32(name.encode()) % DIMENSIONS for name in names}
    value = 1.0 / len(indices) ** 0.5
    return {i: value for i in indices}


def _matrix(texts: Sequence[str]) -> np.ndarray:
    x = np.zeros((len(texts), DIMENSIONS), dtype=np.float32)
    for row, text in enumerate(texts):
        for index, value in features(text).items():
            x[row, index] = value
    return x


@dataclass
class PreferenceModel:
    """P(the user keeps this answer), a logistic regression on `features`."""

    weights: np.ndarray  # [DIMENSIONS]
    bias: float

    @classmethod
    def train(cls, texts: Sequence[str], labels: Sequence[int], l2: float = 1e-3,
              iterations: int = 400, learning_rate: float = 2.0) -> PreferenceModel:
        """Full-batch gradient descent on the class-balanced logistic loss (deterministic)."""
        x = _matrix(texts)
        y = np.asarray(labels, dtype=np.float32)
        positives = float(y.sum())
        negatives = float(len(y) - positives)
        if not positives or not negatives:
            raise ValueError("a preference needs both kept and not-kept answers")
        # Balanced: each class carries half the loss whatever its share of the episodes.
        sample_weight = np.where(y > 0, 0.5 / positives, 0.5 / negatives).astype(np.float32)
        w = np.zeros(DIMENSIONS, dtype=np.float32)
        b = 0.0
        for _ in range(iterations):
            p = 1.0 / (1.0 + np.exp(-(x @ w + b)))
            err = (p - y) * sample_weight
            w -= learning_rate * (x.T @ err + l2 * w)
            b -= learning_rate * float(err.sum())
        return cls(w, b)

    def score(self, text: str) -> float:
        """Probability in (0, 1) that the user keeps `text`."""
        z = self.bias + sum(self.weights[i] * v for i, v in features(text).items())
        return float(1.0 / (1.0 + np.exp(-z)))


@dataclass(frozen=True)
class PreferenceFit:
    """What `fit_preference` found: the model (None when it is not to be used) and why."""

    model: PreferenceModel | None
    kept: int
    not_kept: int
    balanced_accuracy: float | None  # cross-validated by group; None when too few to tell
    reason: str

    def summary(self) -> dict:
        accuracy = None if self.balanced_accuracy is None else round(self.balanced_accuracy, 3)
        return {"enabled": self.model is not None, "kept": self.kept, "not_kept": self.not_kept,
                "balanced_accuracy": accuracy, "reason": self.reason}


def labelled_texts(examples: Sequence) -> tuple[list[str], list[int], list[str]]:
    """(texts, labels, groups) from training examples: 1 = what the user kept, 0 = what they undid
    or rewrote. The text a user ended with is kept; the model's answer is kept only when it is
    (nearly) that text."""
    from feedback.rewards import similarity

    texts, labels, groups = [], [], []

    def add(text: str | None, label: int, group: str) -> None:
        if text and text.strip():
            texts.append(text)
            labels.append(label)
            groups.append(group)

    for ex in examples:
        group = ex.group or ex.id
        if ex.reverted:
            add(ex.reverted_text or ex.output, 0, group)
            continue
        if ex.kept_text is None:
            continue
        add(ex.kept_text, 1, group)
        if ex.output and similarity(ex.output, ex.kept_text) < UNCHANGED:
            add(ex.output, 0, group)
    return texts, labels, groups


def _balanced_accuracy(labels: Sequence[int], predicted: Sequence[int]) -> float:
    pairs = list(zip(labels, predicted, strict=True))
    rates = []
    for cls in (0, 1):
        of_class = [p for y, p in pairs if y == cls]
        if of_class:
            rates.append(sum(p == cls for p in of_class) / len(of_class))
    return sum(rates) / len(rates)


def fit_preference(examples: Sequence) -> PreferenceFit:
    """Fit the user's preference on training examples (oldest first), if it can be learned from them."""
    texts, labels, groups = (part[-MAX_OUTCOMES:] for part in labelled_texts(examples))
    kept, not_kept = sum(labels), len(labels) - sum(labels)
    if kept < MIN_PER_CLASS or not_kept < MIN_PER_CLASS:
        return PreferenceFit(None, kept, not_kept, None, f"too few outcomes ({kept} kept, {not_kept} not "
                             f"kept; {MIN_PER_CLASS} of each needed)")
    folds = [zlib.crc32(g.encode()) % FOLDS for g in groups]
    truth, predicted = [], []
    for fold in range(FOLDS):
        train = [i for i, f in enumerate(folds) if f != fold]
        test = [i for i, f in enumerate(folds) if f == fold]
        train_labels = [labels[i] for i in train]
        if not test or len(set(train_labels)) < 2:
            continue
        model = PreferenceModel.train([texts[i] for i in train], train_labels)
        truth.extend(labels[i] for i in test)
        predicted.extend(int(model.score(texts[i]) >= 0.5) for i in test)
    if len(set(truth)) < 2:
        return PreferenceFit(None, kept, not_kept, None, "the folds did not hold both kinds of outcome")
    accuracy = _balanced_accuracy(truth, predicted)
    if accuracy < MIN_BALANCED_ACCURACY:
        return PreferenceFit(None, kept, not_kept, accuracy, f"does not predict the user (balanced "
                             f"accuracy {accuracy:.2f} < {MIN_BALANCED_ACCURACY})")
    return PreferenceFit(PreferenceModel.train(texts, labels), kept, not_kept, accuracy,
                         f"balanced accuracy {accuracy:.2f} over {len(labels)} outcomes")
