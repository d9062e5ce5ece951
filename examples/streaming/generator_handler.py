"""A streaming text generator, written against TorchServe's streaming API.

Each new token is sent as soon as it is chosen with ``send_intermediate_predict_response``
(``ts.protocol.otf_message_handler``); the last token is the handler's return value, as in
TorchServe. torchbay sends each part as an HTTP chunk on ``/predictions/<model>``, and as one
server-sent event on ``/v2/models/<model>/generate_stream``.

Input per request: text (the prompt), or JSON ``{"prompt": ..., "max_new_tokens": n}`` or the
generate extension's ``{"text_input": ..., "parameters": {"max_new_tokens": n}}``. Decoding is
greedy from the prompt's last known word. The requests of a batch are generated in lockstep:
one model call per step for all of them.
"""

import json
import re

import torch
from ts.protocol.otf_message_handler import send_intermediate_predict_response
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException

TOKEN_RE = re.compile(r"\w+(?:'\w+)?|[^\w\s]")
MAX_TOKENS_LIMIT = 64


def join_token(token: str) -> str:
    """How a token continues the text: punctuation attaches, a word follows a space."""
    return token if re.fullmatch(r"[^\w\s]", token) else " " + token


class GeneratorHandler(BaseHandler):
    def initialize(self, context):
        super().initialize(context)
        with open(f"{context.system_properties['model_dir']}/vocab.json") as f:
            self.tokens = json.load(f)
        self.ids = {token: i for i, token in enumerate(self.tokens)}
        config = (context.model_yaml_config or {}).get("handler", {})
        self.default_tokens = int(config.get("max_new_tokens", 16))

    def _request(self, row):
        body = row.get("data") if row.get("data") is not None else row.get("body")
        if isinstance(body, (bytes, bytearray)):
            body = body.decode("utf-8", "replace")
        params = {}
        if isinstance(body, dict):
            params = dict(body.get("parameters") or {})
            params.setdefault("max_new_tokens", body.get("max_new_tokens", self.default_tokens))
            body = body.get("prompt", body.get("text_input"))
        if not isinstance(body, str):
            raise PredictionException('send a prompt: text, or {"prompt": "..."}', 400)
        n = params.get("max_new_tokens", self.default_tokens)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS_LIMIT:
            raise PredictionException(f"max_new_tokens must be 1..{MAX_TOKENS_LIMIT}", 400)
        known = [self.ids[t] for t in TOKEN_RE.findall(body.lower()) if t in self.ids]
        return (known[-1] if known else self.ids["."]), n

    def preprocess(self, data):
        return self.map_items(data, self._request)

    def inference(self, requests):
        rids = self.context.request_ids
        current = torch.tensor([start for start, _ in requests], device=self.device)
        budgets = [n for _, n in requests]
        last = {}
        for step in range(max(budgets)):
            with torch.inference_mode():
                current = self.model(current).argmax(dim=1)
            sending = {}
            for j, token_id in enumerate(current.tolist()):
                idx = self.kept_indices[j]  # the request index of the j-th kept request
                if step < budgets[j] - 1:  # every token but a request's last goes out now
                    sending[idx] = join_token(self.tokens[token_id])
                elif step == budgets[j] - 1:  # the last is its return value
                    last[idx] = join_token(self.tokens[token_id])
            if sending:
                send_intermediate_predict_response(
                    sending, {idx: rids[idx] for idx in sending}, "Intermediate", 200, self.context
                )
        return [last[idx] for idx in self.kept_indices]

    def postprocess(self, outputs):
        return outputs
