"""Build the streaming text generator: a word bigram model of the Zen of Python, in code.

    python examples/streaming/build.py [--out examples/streaming/out]

The text is the Zen of Python, which Python ships (the ``this`` module, ROT13-encoded); the
model's table holds log P(next | word) counted on it. Writes OUT/model_store/zen.mar.
``generate(prompt, n)`` is the greedy decoding the handler does, for comparison.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import itertools
import json
import math
import re
from collections import Counter
from pathlib import Path

from torchbay.handlers.testing import example_out, import_by_path, package_example_model

HERE = Path(__file__).resolve().parent


def model_module():
    """This example's model.py (by path: every example has one, see ``import_by_path``)."""
    return import_by_path(HERE / "model.py", f"_torchbay_example_{HERE.name}_model")


TOKEN_RE = re.compile(r"\w+(?:'\w+)?|[^\w\s]")  # as generator_handler.py
MODEL_CONFIG = """\
handler:
  max_new_tokens: 16   # when the request does not say
"""


def zen_tokens() -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):  # importing `this` prints the Zen
        import this
    text = codecs.decode(this.s, "rot13").split("\n", 2)[2]  # without the title line
    return TOKEN_RE.findall(text.lower())


def bigram_table() -> tuple[list[str], dict[str, Counter]]:
    tokens = zen_tokens()
    vocab = sorted(set(tokens))
    follows: dict[str, Counter] = {t: Counter() for t in vocab}
    for a, b in itertools.pairwise(tokens):
        follows[a][b] += 1
    return vocab, follows


def generate(prompt: str, n: int) -> str:
    """Greedy decoding, as the handler does (ties: the first token in vocabulary order)."""
    vocab, follows = bigram_table()
    known = [t for t in TOKEN_RE.findall(prompt.lower()) if t in follows]
    word, out = (known[-1] if known else "."), ""
    for _ in range(n):
        counts = follows[word]
        word = max(vocab, key=lambda t: (counts[t], -vocab.index(t))) if counts else "."
        out += word if re.fullmatch(r"[^\w\s]", word) else " " + word
    return out


def build(out: Path) -> Path:
    import torch

    VOCAB_SIZE = model_module().VOCAB_SIZE
    Bigram = model_module().Bigram

    out.mkdir(parents=True, exist_ok=True)
    vocab, follows = bigram_table()
    assert len(vocab) <= VOCAB_SIZE, "grow VOCAB_SIZE in model.py"
    model = Bigram()
    with torch.no_grad():
        model.table.weight.fill_(-1e4)  # unseen pairs and unused rows
        for i, word in enumerate(vocab):
            total = sum(follows[word].values())
            for nxt, count in follows[word].items():
                model.table.weight[i, vocab.index(nxt)] = math.log(count / total)
            if not total:  # the last word of the text: back to a sentence start
                model.table.weight[i, vocab.index(".")] = 0.0
    torch.save(model.state_dict(), out / "zen.pt")
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "model-config.yaml").write_text(MODEL_CONFIG)
    handler = str(HERE / "generator_handler.py")
    return package_example_model(HERE, out, "zen", handler, extra_files=(str(out / "vocab.json"),))


if __name__ == "__main__":
    out = example_out(__doc__, HERE / "out")
    print(f"wrote {build(out)}")
    print(f"e.g. 'Errors should' ->{generate('Errors should', 12)}")
