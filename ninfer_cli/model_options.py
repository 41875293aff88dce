"""Flags that change how the checkpoint is read, shared by serve, chat, bench (and plan: --rope-scaling,
--state-snapshots)."""

from __future__ import annotations

from typing import Annotated

import typer

from engine.config import DTYPES

Device = Annotated[str, typer.Option(help="cpu or cuda.")]
Dtype = Annotated[
    str, typer.Option(help=f"auto (bfloat16 on a GPU, float32 on the CPU) or one of {', '.join(DTYPES)}.")
]
WeightQuant = Annotated[
    str,
    typer.Option(
        help="Linear weights: auto (as the checkpoint stores them), none, int8, int4 (CPU: its int8 / int4 "
        "kernels; GPU: a 16-bit checkpoint quantized at load into packed groups of 128)."
    ),
]
RopeScaling = Annotated[
    str | None,
    typer.Option(
        help="Stretch the model's positions: yarn:FACTOR[:ORIGINAL_CONTEXT] (Qwen3 to 128K: yarn:4:32768), "
        "none (drop the checkpoint's own scaling), or a JSON object as in config.json's rope_scaling.",
    ),
]
StateSnapshots = Annotated[
    int | None,
    typer.Option(
        help="A hybrid model's (Qwen3.5's) recurrent-state snapshots kept for the prefix cache (default: 2 x "
        "--max-concurrency + 2): each is where a later prompt can resume (a conversation's last turn, a shared "
        "tool list or system prompt); each takes the memory of one running request's state.",
    ),
]
ChatTemplate = Annotated[
    str | None,
    typer.Option(help="A Jinja chat template file to use instead of the checkpoint's."),
]
ChatTemplateKwargs = Annotated[
    str | None,
    typer.Option(
        "--chat-template-kwargs",
        "--default-chat-template-kwargs",
        help="Chat template variables as JSON, for every request that does not set them itself: "
        "'{\"enable_thinking\": false}' serves a Qwen3 with thinking off unless a request turns it on.",
    ),
]
GenerationConfig = Annotated[
    str,
    typer.Option(
        help="Sampling defaults for the fields a request leaves out: auto (the checkpoint's "
        "generation_config.json or GGUF general.sampling.*), none (temperature 1, no top-k / top-p), or a "
        "generation_config.json file.",
    ),
]
OverrideGenerationConfig = Annotated[
    str | None,
    typer.Option(
        help='Sampling defaults laid over --generation-config\'s, as JSON: \'{"temperature": 0.6, "top_k": 20}\' '
        "(any sampling field: min_p, repetition_penalty, dry_multiplier, xtc_probability, ...).",
    ),
]
