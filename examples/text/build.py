"""Train a topic classifier on sentences generated in code; archive it with the built-in
``text_classifier`` handler.

    python examples/text/build.py [--out examples/text/out]

No text data set ships offline, so the sentences are generated from word lists (three topics:
weather, sport, cooking). Tokenization is the one the built-in handler ships
(``torchbay.handlers.text_classifier.TOKEN_RE``: lower-cased words and punctuation), used here to
build the vocabulary so that training and serving split text the same way. Writes
OUT/model_store/topics.mar and OUT/held_out.json (sentences never seen in training, with labels).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from torchbay.handlers.testing import example_out, import_by_path, package_example_model

HERE = Path(__file__).resolve().parent


def model_module():
    """This example's model.py (by path: every example has one, see ``import_by_path``)."""
    return import_by_path(HERE / "model.py", f"_torchbay_example_{HERE.name}_model")


LABELS = ["weather", "sport", "cooking"]
WORDS = {
    "weather": [
        "rain",
        "sunny",
        "cloudy",
        "storm",
        "wind",
        "snow",
        "forecast",
        "cold",
        "warm",
        "thunder",
        "fog",
        "humid",
        "temperature",
        "showers",
        "breeze",
    ],
    "sport": [
        "match",
        "goal",
        "team",
        "score",
        "coach",
        "league",
        "player",
        "win",
        "referee",
        "season",
        "tournament",
        "striker",
        "defence",
        "penalty",
        "stadium",
    ],
    "cooking": [
        "recipe",
        "oven",
        "bake",
        "flour",
        "sauce",
        "garlic",
        "simmer",
        "pan",
        "butter",
        "onion",
        "roast",
        "dough",
        "spices",
        "chop",
        "boil",
    ],
}
FILLER = ["the", "a", "today", "was", "very", "and", "then", "we", "saw", "some", "really", "!"]
TEMPLATES = ["{a} {f} {b} {f} {c}", "{f} {a} {b} , {f} {c} .", "{a} and {b} {f}", "{f} {f} {a} {c}"]
MODEL_CONFIG = """\
# The built-in text_classifier: vocabulary file, model input style, labels returned.
handler:
  text:
    vocab: vocab.json
    input: offsets
    topk: 3
"""


def sentences(rng: random.Random, n: int) -> list[tuple[str, int]]:
    out = []
    for _ in range(n):
        label = rng.randrange(len(LABELS))
        words = WORDS[LABELS[label]]
        text = rng.choice(TEMPLATES).format(
            a=rng.choice(words), b=rng.choice(words), c=rng.choice(words), f=rng.choice(FILLER)
        )
        out.append((text, label))
    return out


def build_vocab(texts: list[str]) -> dict[str, int]:
    from torchbay.handlers.text_classifier import TOKEN_RE

    vocab = {"<pad>": 0, "<unk>": 1}
    for text in texts:
        for token in TOKEN_RE.findall(text.lower()):
            vocab.setdefault(token, len(vocab))
    return vocab


def train(data: list[tuple[str, int]], vocab: dict[str, int], seed: int = 0):
    import torch

    from torchbay.handlers.text_classifier import TOKEN_RE

    VOCAB_SIZE = model_module().VOCAB_SIZE
    BagOfWords = model_module().BagOfWords

    assert len(vocab) <= VOCAB_SIZE, "grow VOCAB_SIZE in model.py"
    torch.manual_seed(seed)
    seqs = [[vocab.get(t, 1) for t in TOKEN_RE.findall(text.lower())] for text, _ in data]
    tokens = torch.tensor([t for s in seqs for t in s])
    offsets = torch.tensor([0] + [len(s) for s in seqs[:-1]]).cumsum(0)
    labels = torch.tensor([label for _, label in data])
    model = BagOfWords()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(tokens, offsets), labels)
        loss.backward()
        optimizer.step()
    return model.eval()


def build(out: Path) -> Path:
    import torch

    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    data = sentences(rng, 600)
    vocab = build_vocab([text for text, _ in data])
    model = train(data, vocab)
    torch.save(model.state_dict(), out / "topics.pt")
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "index_to_name.json").write_text(json.dumps(dict(enumerate(LABELS))))
    (out / "model-config.yaml").write_text(MODEL_CONFIG)
    held_out = [{"text": t, "label": LABELS[y]} for t, y in sentences(random.Random(99), 30)]
    (out / "held_out.json").write_text(json.dumps(held_out, indent=1))
    extra = (str(out / "vocab.json"), str(out / "index_to_name.json"))
    return package_example_model(HERE, out, "topics", "text_classifier", extra_files=extra)


if __name__ == "__main__":
    out = example_out(__doc__, HERE / "out")
    print(f"wrote {build(out)}; held-out sentences in {out}/held_out.json")
