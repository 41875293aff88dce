"""Rerankers: how well a document answers a query, as a probability, from one prompt per query-document pair
pooled at its last token (the same pooled requests as embeddings, engine/pooling.py).

Qwen3-Reranker is a causal LM asked, in a fixed judging prompt, whether the document meets the query; the
score is P(yes) over the two answers, softmax([l_no, l_yes])[1] = sigmoid(l_yes - l_no), where l are the
next-token logits: the `yes` and `no` rows of its LM head times the final-normed hidden state. The same
model ships converted with that difference as a one-row classifier (transformers'
Qwen3ForSequenceClassification, `score.weight`; score = sigmoid) and as a llama.cpp GGUF pooled by rank
(`cls.output.weight`, rows labelled yes / no; score = softmax[yes]). ninfer keeps the head's rows apart
from the decoder, copied out of the checkpoint's tensors as the loader reads them (`HeadTap`), and scores
on the host: two dot products a document.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.config import EngineConfig, ModelConfig
from engine.errors import NinferError
from engine.formats.source import ModelSource
from engine.quant.groupwise import QuantizedTensor, dequantize
from engine.tokenizer import Tokenizer

JUDGE = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the "
    'answer can only be "yes" or "no".'
)
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
ANSWERS = ("no", "yes")  # a causal LM's head rows, in this order; the score is P(yes)
LM_HEAD = ("lm_head.weight", "model.embed_tokens.weight")  # the second stands in when the head is tied
CLASSIFIER = ("score.weight", "score.bias")  # HF sequence classifiers; a GGUF's cls.output.* maps here

NOT_A_RERANKER = (
    "this model is not a reranker; serve a Qwen3-Reranker checkpoint (recognised by its model card, a "
    "Qwen3ForSequenceClassification conversion or a GGUF pooled by rank), or add --rerank to judge pairs by "
    "the model's yes / no next token"
)


def pair_prompt(
    query: str, document: str, instruction: str | None = None, template: str | None = None
) -> str:
    """The prompt that asks the reranker about one pair: Qwen3-Reranker's judging prompt with the task
    `instruction` (its default when None), or the checkpoint's own `template` with {query} and {document}
    (a GGUF's), whose default instruction `instruction` replaces."""
    if template is None:
        return (
            f"<|im_start|>system\n{JUDGE}<|im_end|>\n<|im_start|>user\n<Instruct>: "
            f"{DEFAULT_INSTRUCTION if instruction is None else instruction}\n<Query>: {query}\n"
            f"<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        )
    if instruction is not None:
        if DEFAULT_INSTRUCTION not in template:
            raise NinferError(
                "this reranker's own pair prompt (its GGUF rerank template) has no instruction to replace; "
                "leave 'instruction' out"
            )
        template = template.replace(DEFAULT_INSTRUCTION, instruction)
    values = {"query": query, "document": document}
    return re.sub(r"\{(query|document)\}", lambda m: values[m.group(1)], template)


@dataclass(frozen=True)
class RerankHead:
    """The rows that score a pooled hidden state: one (sigmoid of its logit) or two (softmax, the score
    being `positive`'s probability)."""

    weight: torch.Tensor  # [L, hidden] fp32, L = 1 or 2
    bias: torch.Tensor | None  # [L] fp32
    positive: int

    def log_odds(self, hidden: Sequence[float]) -> float:
        """log(p / (1 - p)) of the pair the final-normed hidden state `hidden` [hidden] pooled."""
        logits = self.weight @ torch.as_tensor(hidden, dtype=torch.float32)  # [L]
        if self.bias is not None:
            logits = logits + self.bias
        if logits.numel() == 1:
            return float(logits[0])
        return float(logits[self.positive] - logits[1 - self.positive])

    def score(self, hidden: Sequence[float]) -> float:
        """The relevance: a probability in [0, 1]."""
        return sigmoid(self.log_odds(hidden))


def sigmoid(log_odds: float) -> float:
    """The probability of `log_odds` (no overflow either way)."""
    if log_odds >= 0:
        return 1.0 / (1.0 + math.exp(-log_odds))
    return math.exp(log_odds) / (1.0 + math.exp(log_odds))


def classifier_head(weight: torch.Tensor, bias: torch.Tensor | None, labels: Sequence[str]) -> RerankHead:
    """A classifier's head: one row (sigmoid), or two whose `yes` label (or else the second row, as
    transformers' binary classifiers put the positive class) is the score."""
    rows = weight.shape[0]
    if rows not in (1, 2):
        raise NinferError(
            f"this checkpoint's classifier has {rows} labels; a reranker's has one (a relevance logit) or two "
            "(no / yes)"
        )
    named = [str(label).lower() for label in labels]
    positive = named.index("yes") if rows == 2 and "yes" in named else rows - 1
    return RerankHead(weight.float(), None if bias is None else bias.float(), positive)


def _rows(tensor: torch.Tensor | QuantizedTensor, ids: list[int]) -> torch.Tensor:
    """Rows `ids` of a checkpoint matrix, dense or quantized (only those rows dequantized), fp32 on the CPU
    (a matrix quantized as it loads is on the GPU already)."""
    if isinstance(tensor, QuantizedTensor):
        index = torch.tensor(ids, device=tensor.packed.device)

        def rows(t):
            return None if t is None else t.index_select(0, index)

        picked = replace(
            tensor,
            shape=(len(ids), tensor.shape[1]),
            packed=rows(tensor.packed),
            scales=rows(tensor.scales),
            minimums=rows(tensor.minimums),
        )
        return dequantize(picked).cpu()
    return tensor[ids].float().cpu()


class HeadTap:
    """Copies a reranker's head out of the tensors the loader reads: the classifier's (`score.*`), or a
    causal LM's `no` / `yes` rows of lm_head (of the embedding when the head is tied)."""

    def __init__(self, config: ModelConfig, tokenizer: Tokenizer | None, engine_config: EngineConfig):
        self.kind = config.rerank or ("yes_no" if engine_config.rerank else "")
        self.labels = config.rerank_labels
        self.ids: list[int] = []
        self.seen: dict[str, torch.Tensor] = {}
        if self.kind == "yes_no":
            if config.embedding_model:
                raise NinferError(
                    "--rerank judges pairs by a causal LM's yes / no next token, and this checkpoint has no LM "
                    "head (an embedding model); serve a Qwen3-Reranker"
                )
            ids = [tokenizer.token_to_id(a) if tokenizer is not None else None for a in ANSWERS]
            if None in ids:
                raise NinferError(
                    "--rerank needs single 'yes' and 'no' tokens in the vocabulary (as Qwen3-Reranker's); this "
                    "model has none — serve a Qwen3-Reranker"
                )
            self.ids = [int(i) for i in ids if i is not None]

    @property
    def names(self) -> tuple[str, ...]:
        return {"yes_no": LM_HEAD, "classifier": CLASSIFIER}.get(self.kind, ())

    def wrap(self, source: ModelSource) -> ModelSource:
        """The source whose weight streams pass the head's tensors here on their way to the loader."""
        if not self.kind:
            return source

        def tapped(stream: Callable[[], Iterator[tuple[str, Any]]] | None):
            if stream is None:
                return None

            def run() -> Iterator[tuple[str, Any]]:
                for name, tensor in stream():
                    if name in self.names:
                        self.seen[name] = tensor if name in CLASSIFIER else _rows(tensor, self.ids)
                    yield name, tensor

            return run

        return replace(
            source,
            weights=tapped(source.weights),
            quantized_weights=tapped(source.quantized_weights),
            unquantized_weights=tapped(source.unquantized_weights),
        )

    def head(self) -> RerankHead | None:
        """The head, once the weights have loaded; None for a model that is not a reranker."""
        if self.kind == "classifier":
            if "score.weight" not in self.seen:
                raise NinferError(
                    "this reranker checkpoint lacks its classifier (score.weight / cls.output.weight); it is "
                    "incomplete — download it again"
                )
            return classifier_head(self.seen["score.weight"], self.seen.get("score.bias"), self.labels)
        if self.kind == "yes_no":
            rows = next((self.seen[n] for n in LM_HEAD if n in self.seen), None)
            if rows is None:
                raise NinferError("the checkpoint holds neither lm_head nor the embedding; it is incomplete")
            return RerankHead(rows, None, positive=1)
        return None
