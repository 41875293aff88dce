"""What every causal LM shares: checkpoint name mapping, streaming weight loading, logits."""

from __future__ import annotations

import logging

import torch
from torch import nn

from engine.config import ModelConfig
from engine.errors import NinferError
from engine.formats.source import WeightIterator
from engine.layers.linear import Embedding, Linear
from engine.layers.module import Module
from engine.layers.moe import expert_shard
from engine.vision.config import VisionConfig
from engine.vision.tower import VisionTower
from engine.worker.forward_context import current_forward_context

log = logging.getLogger("ninfer")


class DecoderModel(Module):
    """embed -> decoder layers (each returns (hidden, residual)) -> final norm. Subclasses build the parts."""

    embed_tokens: Embedding
    layers: nn.ModuleList
    norm: nn.Module

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None  # [T, hidden]
        ctx = current_forward_context()
        images = None if ctx is None or ctx.image_rows is None else ctx.image_embeds.to(hidden.dtype)
        if images is not None:  # [M, 1 + deepstack levels, H]: the image tokens' embeddings
            hidden = hidden.index_copy(0, ctx.image_rows, images[:, 0])
        for i, layer in enumerate(self.layers):
            hidden, residual = layer(positions, hidden, residual)
            if images is not None and i + 1 < images.shape[1]:
                # deepstack (Qwen3-VL): the first layers' outputs at the image rows get a tower level each
                hidden = hidden.index_add(0, ctx.image_rows, images[:, i + 1])
        hidden, _ = self.norm(hidden, residual)
        return hidden


# tensor names of a checkpoint saved from the bare decoder (no "model." prefix, no lm_head)
BARE_DECODER = ("embed_tokens.", "layers.", "norm.")


class CausalLM(Module):
    # checkpoint sub-name -> (fused parameter sub-name, shard id)
    packed_modules_mapping: dict[str, tuple[str, str]] = {}
    # checkpoint sub-name -> parameter sub-name, for tensors stored under another name
    renamed_params: dict[str, str] = {}

    model: DecoderModel

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        # the multi-token-prediction head, when built (spec mtp); otherwise a checkpoint's mtp.* is skipped
        self.mtp: Module | None = None
        self.draft_head: Linear | None = None  # lm_head's first rows for the MTP drafts (lm_head_draft)
        self.visual: Module | None = None  # the vision tower, when built (vision)
        # a bare decoder without an output head (an embedding model: Qwen3-Embedding): it pools, never
        # generates text; its lm_head is the embedding matrix, so the engine's one code path still samples
        self.headless = config.embedding_model

    def build_mtp(self) -> None:
        """Add the MTP head (spec mtp), before the weights load; models without one refuse."""
        raise NinferError(
            f"this {self.config.architecture} model has no MTP head (mtp_num_hidden_layers is 0, or a GGUF "
            "without nextn blocks); use spec ngram or none"
        )

    def build_vision(self) -> None:
        """Add the vision tower (vision), before the weights load; a checkpoint without one refuses."""
        if not self.config.vision_config:
            raise NinferError(
                f"this {self.config.architecture} checkpoint has no vision tower (no vision_config: a text-only "
                "model or export, or a GGUF, which keeps it in a separate mmproj file ninfer does not read); "
                "drop --vision, or serve a multimodal HF checkpoint (Qwen3.5, Qwen3-VL)"
            )
        if not self.config.mrope_section:
            raise NinferError(
                "this checkpoint's text config has no mrope_section, so image tokens have no 3D positions; "
                "its config.json is incomplete"
            )
        self.visual = VisionTower(VisionConfig.from_dict(self.config.vision_config))

    def build_draft_head(self, num_tokens: int) -> None:
        """The drafts' own head (lm_head_draft): lm_head's first `num_tokens` rows, sharing its storage.
        Built after the weights load; on the CPU it is then quantized as lm_head is."""
        if num_tokens >= self.config.vocab_size:
            return
        params = {id(p): n for n, p in self.named_parameters()}
        source = params.get(id(self.lm_head.weight)) if self.lm_head.weight is not None else None
        self.draft_head = self.lm_head.first_rows(num_tokens)
        if source in self.weight_bits:
            self.weight_bits["draft_head.weight"] = self.weight_bits[source]

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [B, hidden] -> [B, V'] fp32: the whole vocabulary, or the draft head's first V' token ids
        if self.draft_head is None:
            return self.compute_logits(hidden)
        return self.draft_head(hidden).float()

    def make_lm_head(self, embed: Embedding) -> None:
        """Call after the decoder is built, so a tied head's weight is named after the embedding."""
        self.lm_head = Linear(self.config.hidden_size, self.config.vocab_size)
        if self.config.tie_word_embeddings:
            self.lm_head.weight = embed.weight

    def checkpoint_name(self, name: str) -> str | None:
        """Map a checkpoint tensor name to this model's naming; None skips the tensor. A multimodal
        checkpoint (Qwen3_5ForConditionalGeneration, Qwen3VLForConditionalGeneration) nests the text model
        under model.language_model and the tower under model.visual (loaded when built: vision)."""
        if name.startswith("model.visual."):
            return None if self.visual is None else name[len("model.") :]
        if name.startswith("model.language_model."):
            return "model." + name[len("model.language_model.") :]
        if name.startswith(BARE_DECODER):  # saved from the bare decoder (transformers' Qwen3Model)
            return "model." + name
        return name

    def param_for(self, ckpt_name: str) -> tuple[str, str | None] | None:
        """(parameter name, shard id or None) a checkpoint tensor loads into; None when it has none here
        (skipped tensors, mtp.* heads, a tied head stored anyway)."""
        name = self.checkpoint_name(ckpt_name)
        if name is None or (name.startswith("mtp.") and self.mtp is None):
            return None
        expert = expert_shard(name)  # one expert's matrix: a shard of the stacked experts
        if expert is not None:
            return expert
        shard = None
        for part, (fused, shard_id) in self.packed_modules_mapping.items():
            if f".{part}." in name:
                name, shard = name.replace(f".{part}.", f".{fused}."), shard_id
                break
        for part, new in self.renamed_params.items():
            if name.endswith(part):
                name = name[: -len(part)] + new
        return name, shard

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # input_ids, positions: [T] -> hidden: [T, hidden]
        return self.model(input_ids, positions)

    def _unplaced(self, ckpt_name: str, name: str, tensor: torch.Tensor, ignored: list[str]) -> None:
        """A checkpoint tensor this model has no parameter for. Expected: a tied head stored anyway, a
        classifier's score head (read by engine/rerank.py), rotary buffers of old checkpoints, zero biases
        (AutoGPTQ saves one for every layer). A bias that is not zero is refused (the layer would run
        without it: wrong output); anything else is named in one warning after the load."""
        if name in ("lm_head.weight", "score.weight") or "rotary_emb." in name:
            return
        if name.endswith(".bias"):
            if bool(tensor.any()):
                raise NinferError(
                    f"tensor {ckpt_name} is a bias this {self.config.architecture} config has no place for "
                    "(its config.json says attention_bias false, or the layer never has one); the "
                    "checkpoint and its config.json disagree"
                )
            return
        ignored.append(ckpt_name)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [B, hidden] -> [B, vocab] fp32
        return self.lm_head(hidden).float()

    @torch.no_grad()
    def load_weights(
        self,
        weights: WeightIterator,
        tensor_bits: dict[str, int] | None = None,
        provided: set[tuple[str, str | None]] | None = None,
    ) -> None:
        """Copy checkpoint tensors in; `tensor_bits` (quantized checkpoint tensors) fills `weight_bits`:
        the widest source precision of each parameter (None where any part was stored unquantized).
        `provided`: (parameter, shard) pairs another path fills (quantized weights), not missing here."""
        tensor_bits = tensor_bits or {}
        self.weight_bits: dict[str, int | None] = {}
        params = dict(self.named_parameters())
        expected = {(n, s) for n, p in params.items() for s in (p.shard_names or (None,))}
        loaded: set[tuple[str, str | None]] = set(provided or ())
        ignored: list[str] = []  # checkpoint tensors with no parameter here (_unplaced)
        for ckpt_name, tensor in weights:
            self.headless |= ckpt_name.startswith(BARE_DECODER)
            mapped = self.param_for(ckpt_name)
            if mapped is None:
                continue
            name, shard = mapped
            param = params.get(name)
            if param is None:
                self._unplaced(ckpt_name, name, tensor, ignored)
                continue
            try:
                param.weight_loader(param, tensor, shard) if shard else param.weight_loader(param, tensor)
            except ValueError as e:
                raise NinferError(
                    f"tensor {ckpt_name} does not fit this {self.config.architecture} config ({e}); "
                    "the checkpoint and its config.json disagree"
                ) from e
            # a whole tensor fills every shard of its parameter (stacked experts stored stacked)
            loaded.update(
                [(name, shard)] if shard or not param.shard_names else [(name, s) for s in param.shard_names]
            )
            bits, prev = tensor_bits.get(ckpt_name), self.weight_bits.get(name, 0)
            self.weight_bits[name] = None if bits is None or prev is None else max(prev, bits)
        if ignored:
            more = f" and {len(ignored) - 3} more" if len(ignored) > 3 else ""
            log.warning(
                "ignored %d checkpoint tensor(s) this %s model has no place for: %s%s",
                len(ignored),
                self.config.architecture,
                ", ".join(ignored[:3]),
                more,
            )
        if self.headless and ("lm_head.weight", None) in expected - loaded:
            self.lm_head.weight = self.model.embed_tokens.weight  # no head: the embedding stands in
            loaded.add(("lm_head.weight", None))
        missing = sorted(f"{n}" + (f" [{s}]" if s else "") for n, s in expected - loaded)
        if missing and all(n.startswith("mtp.") for n in missing):
            raise NinferError(
                f"this checkpoint declares an MTP head but lacks its weights ({missing[0]}; converted or "
                "quantized without them?); use spec ngram or none"
            )
        if missing and all(n.startswith("visual.") for n in missing):
            raise NinferError(
                f"this checkpoint declares a vision tower but lacks its weights ({missing[0]}; converted "
                "without them?); drop --vision, or serve the multimodal HF checkpoint"
            )
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise NinferError(
                f"the checkpoint lacks {', '.join(missing[:3])}{more}; "
                f"it is incomplete or not a {self.config.architecture} checkpoint"
            )
