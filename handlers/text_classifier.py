"""The ``text_classifier`` built-in handler: text in, top-k ``{label: prob}`` out.

Vocabulary: ``vocab.json`` (``{token: id}``) or ``vocab.txt`` (one token per line, id = line
number) in the model directory. Tokenization: lower-case (unless ``lowercase: false``), then the
regex ``\\w+|[^\\w\\s]`` (words and single punctuation marks). Unknown tokens map to the id of
``<unk>`` (or ``[UNK]``) in the vocabulary, else ``unk_id``; padding uses ``<pad>``/``[PAD]``'s id,
else ``pad_id`` (default 0).

The model's forward signature, chosen by ``input`` in the ``text`` config section:
  padded (default)  forward(token_ids: LongTensor[B, T]) -> logits[B, C]
  lengths           forward(token_ids: LongTensor[B, T], lengths: LongTensor[B]) -> logits[B, C]
  offsets           forward(tokens: LongTensor[N], offsets: LongTensor[B]) -> logits[B, C]
                    (EmbeddingBag style, as TorchServe's text classifier)
Sequences are padded to the batch's longest (at least 1) and cut at ``max_length`` when set.
Config (``model-config.yaml``, section ``text``): vocab, lowercase, max_length, pad_id, unk_id,
input, topk (5).

Input per request: text body (text/plain), bytes (utf-8), or JSON ``{"text": ...}`` /
``{"data": ...}`` / a string. Empty or undecodable text fails only its request with 400.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch

from .base_handler import BaseHandler
from .classify import handler_config, topk_labels
from .errors import BadInput, HandlerLoadError
from .runtime import explain
from .runtime.explain import target_of

TOKEN_RE = re.compile(r"\w+|[^\w\s]")
_TORCHTEXT_VOCAB = (
    "; TorchServe's source_vocab.pt (a pickled torchtext vocabulary) is not read: write its "
    "tokens to vocab.txt, one a line in id order (vocab.get_itos())"
)


def load_vocab(path: str) -> dict[str, int]:
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            vocab = json.load(f)
        if not isinstance(vocab, dict):
            raise HandlerLoadError(f"{os.path.basename(path)} must map token -> id")
        return {str(k): int(v) for k, v in vocab.items()}
    with open(path, encoding="utf-8") as f:
        return {line.rstrip("\n"): i for i, line in enumerate(f) if line.rstrip("\n")}


class TextClassifier(BaseHandler):
    """Vocabulary-based text classification (see the module docstring)."""

    topk = 5

    def initialize(self, context: Any) -> None:
        super().initialize(context)
        config = handler_config(context, "text")
        model_dir = context.system_properties["model_dir"]
        names = [config["vocab"]] if config.get("vocab") else ["vocab.json", "vocab.txt"]
        paths = [
            os.path.join(model_dir, n) for n in names if os.path.isfile(os.path.join(model_dir, n))
        ]
        if not paths:
            torchserve = os.path.isfile(os.path.join(model_dir, "source_vocab.pt"))
            raise HandlerLoadError(
                f"text_classifier needs a vocabulary file ({' or '.join(names)})"
                + (_TORCHTEXT_VOCAB if torchserve else "")
            )
        self.vocab = load_vocab(paths[0])
        self.lowercase = bool(config.get("lowercase", True))
        self.max_length = int(config["max_length"]) if config.get("max_length") else None
        self.pad_id = self.vocab.get("<pad>", self.vocab.get("[PAD]", int(config.get("pad_id", 0))))
        self.unk_id = self.vocab.get("<unk>", self.vocab.get("[UNK]", int(config.get("unk_id", 0))))
        self.input_mode = str(config.get("input", "padded"))
        if self.input_mode not in ("padded", "lengths", "offsets"):
            raise HandlerLoadError(
                f"text input mode {self.input_mode!r} is not padded/lengths/offsets"
            )
        self.topk = int(config.get("topk", self.topk))

    def words(self, text: str) -> list[str]:
        """The tokens of ``text`` the model sees (before the vocabulary maps them to ids)."""
        if self.lowercase:
            text = text.lower()
        found = TOKEN_RE.findall(text)
        return found[: self.max_length] if self.max_length else found

    def tokenize(self, text: str) -> list[int]:
        return [self.vocab.get(tok, self.unk_id) for tok in self.words(text)]

    def load_item(self, row: Any) -> list[int]:
        ids = self.tokenize(self.read_text(row))
        if not ids:
            raise BadInput("text has no tokens")
        return ids

    def read_text(self, row: Any) -> str:
        """A request's text: the body or ``data`` as text, bytes or JSON (module docstring)."""
        value = row.get("data") if isinstance(row, dict) else row
        if value is None and isinstance(row, dict):
            value = row.get("body")
        if isinstance(value, dict):
            value = value.get("text", value.get("data"))
        if isinstance(value, (bytes, bytearray)):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise BadInput("text is not valid UTF-8") from exc
        if not isinstance(value, str):
            raise BadInput('send text (text/plain, or JSON {"text": ...})')
        return value

    def preprocess(self, data: list[Any]) -> tuple[torch.Tensor, ...]:
        seqs = self.map_items(data, self.load_item)
        lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
        if self.input_mode == "offsets":
            flat = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
            offsets = torch.cumsum(torch.cat([torch.zeros(1, dtype=torch.long), lengths[:-1]]), 0)
            return flat.to(self.device), offsets.to(self.device)
        width = max(1, int(lengths.max()))
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
        if self.input_mode == "lengths":
            return ids.to(self.device), lengths.to(self.device)
        return (ids.to(self.device),)

    def inference(self, data: tuple[torch.Tensor, ...], *args: Any, **kwargs: Any) -> Any:
        with self.model_errors():
            return self.run_model(*data, *args, **kwargs)

    def postprocess(self, data: torch.Tensor) -> list[dict[str, float]]:
        return topk_labels(data, self.topk, self.mapping)

    # -- explanations (TorchServe's text_classifier.get_insights) ---------------------------
    def explain_handle(self, data_preprocess: Any, raw_data: list[Any]) -> list[Any]:
        """One ``{"importances", "words"}`` per request that preprocessing kept, each for its
        own ``target`` (TorchServe's handler explains the first request only: it takes no
        batch)."""
        rows = [raw_data[i] for i in self.kept_indices]
        return [self.get_insights(self.words(self.read_text(r)), r, target_of(r)) for r in rows]

    def get_insights(self, tensor_data: Any, raw_data: Any, target: Any) -> dict[str, Any]:
        """Layer Integrated Gradients over the embedding for one text (``tensor_data``: its
        words), from a reference of padding ids as TorchServe's ``TokenReferenceBase``; the
        model gets its input as ``input`` says (module docstring)."""
        words = list(tensor_data)
        ids = torch.tensor([self.vocab.get(w, self.unk_id) for w in words], dtype=torch.long)
        ids = ids.to(self.device)
        extra: tuple[torch.Tensor, ...] = ()
        if self.input_mode == "offsets":
            extra = (torch.zeros(1, dtype=torch.long, device=self.device),)
        else:
            ids = ids.unsqueeze(0)
            if self.input_mode == "lengths":
                extra = (torch.tensor([len(words)], dtype=torch.long, device=self.device),)
        reference = torch.full_like(ids, self.pad_id)
        with self.model_errors():
            attributions = explain.layer_integrated_gradients(
                self.model, ids, reference, extra, explain.target_class(target)
            )
        if self.input_mode != "offsets":
            attributions = attributions[0]  # one text: its tokens' rows
        return {"importances": explain.summarize(attributions), "words": words}
