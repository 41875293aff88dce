"""Sleep on CUDA (gpu-marked: skipped without a device): the weights, KV pool, LoRA adapters and CUDA graphs'
memory goes back to the device (torch's allocated memory falls by at least what the walk found), the graphs
are captured again on waking, and a request after waking generates what it did before, from the prefix
cache at level 1."""

from __future__ import annotations

import pytest
import torch
from conftest import save_tiny, tiny_hf_model, write_lora_adapter

from engine import LLM, SamplingParams

pytestmark = pytest.mark.gpu

GEN = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0)
ADAPTED = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0, adapter="a")


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_5"])
def test_sleep_gives_the_device_memory_back_and_waking_captures_the_graphs_again(arch, tmp_path):
    model = tiny_hf_model(arch, tied=False, seed=3)
    save_tiny(model, tmp_path / "m")
    shapes = {"mlp.down_proj": (128, 64), "mlp.up_proj": (64, 128)}
    adapter = write_lora_adapter(tmp_path / "a", shapes, model.config.num_hidden_layers, scale=0.5)
    llm = LLM(
        tmp_path / "m", device="cuda", dtype="float32", max_context=1024, lora_modules={"a": str(adapter)}
    )
    assert llm.runner.graphs is not None and llm.adapters.graph_lanes == 1
    prompt = torch.randint(3, 500, (100,), generator=torch.Generator().manual_seed(0)).tolist()
    first = llm.generate(prompt_token_ids=[prompt, prompt[:50]], sampling_params=GEN)
    with_adapter = llm.generate(prompt_token_ids=prompt, sampling_params=ADAPTED)
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    llm.sleep(1)
    memory = llm.runner.asleep
    assert llm.runner.graphs is None and llm.adapters.graph_lanes == 0
    # every storage found freed (and the graphs' pools); whole segments handed back to the driver
    assert allocated - torch.cuda.memory_allocated() >= memory.device_bytes
    assert torch.cuda.memory_reserved() < reserved
    assert all(p.untyped_storage().nbytes() == 0 for p in llm.model.parameters())
    again = llm.generate(prompt_token_ids=[prompt, prompt[:50]], sampling_params=GEN)
    assert llm.runner.graphs is not None and llm.adapters.graph_lanes == 1
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    assert again[0].num_cached_tokens == 96
    adapted = llm.generate(prompt_token_ids=prompt, sampling_params=ADAPTED)
    assert adapted[0].token_ids == with_adapter[0].token_ids
    # an adapter loaded while serving runs eagerly; after a sleep it is a lane of the graphs captured anew
    llm.unload_adapter("a")
    llm.load_adapter("late", str(adapter))
    assert llm.adapters.slots == {"late": 1} and llm.adapters.graph_lanes == 1
    late = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=0, adapter="late")
    eager = llm.generate(prompt_token_ids=prompt, sampling_params=late)
    llm.sleep(1)
    llm.wake_up()
    assert llm.adapters.graph_lanes == 2
    assert llm.generate(prompt_token_ids=prompt, sampling_params=late)[0].token_ids == eager[0].token_ids
    assert eager[0].token_ids == with_adapter[0].token_ids  # the same weights as "a"
