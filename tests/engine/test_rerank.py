"""Rerankers (engine/rerank.py): a Qwen3-Reranker scores a query-document pair as its model card's recipe
does (P(yes) over the yes / no next-token logits, the prompt tokenized in three parts), whether it comes as
the causal LM (recognised by its model card, or forced by --rerank), as a one-row classifier conversion
(transformers' Qwen3ForSequenceClassification) or as a llama.cpp GGUF pooled by rank with its own pair
template; what is not a reranker is refused in one line."""

from __future__ import annotations

import json

import gguf
import pytest
import torch
import transformers as tf
from conftest import save_tiny, tiny_hf_model
from test_gguf_qwen35 import close_gguf, gguf_writer

from engine import LLM, NinferError, SamplingParams
from engine.config import EngineConfig, ModelConfig
from engine.formats import gguf as gguf_format
from engine.formats.source import ModelSource
from engine.models.loader import default_model_path
from engine.quant.groupwise import dequantize, quantize
from engine.rerank import HeadTap, pair_prompt

QUERY = "What is the capital of China?"
DOCS = [
    "The capital of China is Beijing.",
    "Gravity is a force that attracts two bodies towards each other.",
    "Beijing",
]
TASK = "Given a question, find the passage that answers it"
CARD = "---\nlicense: apache-2.0\npipeline_tag: text-ranking\n---\n# Qwen3-Reranker-0.6B\n\n## Highlights\n"
# the model card's recipe, written out here (not taken from engine/rerank.py)
PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_TASK = "Given a web search query, retrieve relevant passages that answer the query"


@pytest.fixture(scope="module")
def causal(default_tokenizer):
    return tiny_hf_model("qwen3", tied=False, seed=4, vocab_size=default_tokenizer.vocab_size)


@pytest.fixture(scope="module")
def hf_tokenizer(default_tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    default_tokenizer.backend.save(str(path))
    return tf.PreTrainedTokenizerFast(tokenizer_file=str(path))


def _save(model, tokenizer, path, card: bool = True):
    save_tiny(model, path)
    tokenizer.backend.save(str(path / "tokenizer.json"))
    if card:
        (path / "README.md").write_text(CARD)
    return path


def _expected(model, hf_tokenizer, document: str, instruction: str | None = None) -> float:
    """The model card's recipe on the causal LM."""
    pair = f"<Instruct>: {instruction or DEFAULT_TASK}\n<Query>: {QUERY}\n<Document>: {document}"
    ids = [i for part in (PREFIX, pair, SUFFIX) for i in hf_tokenizer.encode(part, add_special_tokens=False)]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    yes, no = hf_tokenizer.convert_tokens_to_ids("yes"), hf_tokenizer.convert_tokens_to_ids("no")
    return torch.log_softmax(torch.stack([logits[no], logits[yes]]).float(), dim=0)[1].exp().item()


def _all_close(got: list[float], want: list[float], tol: float = 1e-5) -> bool:
    return len(got) == len(want) and all(abs(a - b) < tol for a, b in zip(got, want))


@pytest.fixture(scope="module")
def expected(causal, hf_tokenizer):
    scores = [_expected(causal, hf_tokenizer, d) for d in DOCS]
    assert max(scores) - min(scores) > 1e-3  # the documents score apart, so an order mix-up shows
    return scores


def test_a_qwen3_reranker_scores_as_its_model_card_recipe(
    causal, hf_tokenizer, default_tokenizer, expected, tmp_path
):
    llm = LLM(_save(causal, default_tokenizer, tmp_path), block_size=8, prefill_chunk=16)
    assert llm.model_config.rerank == "yes_no" and not llm.text_refusal  # a causal LM still generates
    assert _all_close(llm.rerank(QUERY, DOCS), expected)
    with_task = [_expected(causal, hf_tokenizer, d, TASK) for d in DOCS]
    assert _all_close(llm.rerank(QUERY, DOCS, instruction=TASK), with_task)
    assert not _all_close(with_task, expected)


def test_without_its_card_the_flag_makes_a_causal_lm_a_reranker(
    causal, default_tokenizer, expected, tmp_path
):
    path = _save(causal, default_tokenizer, tmp_path, card=False)
    plain = LLM(path)
    assert plain.rerank_head is None
    with pytest.raises(NinferError, match="not a reranker; serve a Qwen3-Reranker .* or add --rerank"):
        plain.rerank(QUERY, DOCS)
    llm = LLM(path, rerank=True)
    assert _all_close(llm.rerank(QUERY, DOCS), expected)
    # the pairs share their prompt up to the document: the later ones wait for the first, then take that
    # part from the prefix cache (side by side, all three would compute it)
    query = " ".join(f"term{i}" for i in range(30))  # a query not asked before
    prompts = [llm.rerank_ids(query, d) for d in DOCS]
    block = llm.engine_config.block_size
    shared = next(i for i, ids in enumerate(zip(*prompts)) if len(set(ids)) > 1) // block * block
    stats = llm.scheduler.block_pool.stats
    before = stats.hits
    llm.rerank(query, DOCS)
    assert stats.hits - before >= (len(DOCS) - 1) * shared


def test_a_classifier_conversion_scores_the_same_and_makes_no_text(
    causal, default_tokenizer, expected, tmp_path
):
    """Qwen3-Reranker converted to one logit, l_yes - l_no (as its -seq-cls conversions are)."""
    cfg = tf.Qwen3Config(**{**causal.config.to_dict(), "num_labels": 1})
    seq = tf.Qwen3ForSequenceClassification(cfg).eval()
    seq.model.load_state_dict(causal.model.state_dict())
    head = causal.lm_head.weight
    yes, no = default_tokenizer.token_to_id("yes"), default_tokenizer.token_to_id("no")
    with torch.no_grad():
        seq.score.weight.copy_((head[yes] - head[no]).unsqueeze(0))
    path = _save(seq, default_tokenizer, tmp_path, card=False)
    assert json.loads((path / "config.json").read_text())["architectures"] == [
        "Qwen3ForSequenceClassification"
    ]
    llm = LLM(path)
    assert llm.model_config.rerank == "classifier" and llm.model.headless
    got = llm.rerank(QUERY, DOCS)
    assert _all_close(got, expected)
    ids = llm.rerank_ids(QUERY, DOCS[0])
    with torch.no_grad():
        want = torch.sigmoid(seq(torch.tensor([ids])).logits[0, 0]).item()  # transformers' own classifier
    assert abs(got[0] - want) < 1e-5
    with pytest.raises(NinferError, match="is a reranker .* not text"):
        llm.generate(prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=2))


def _copy_tokenizer(writer: gguf.GGUFWriter) -> None:
    """The embedded default model's tokenizer keys (a BPE vocabulary holding yes, no and ChatML's tokens)."""
    source = gguf.GGUFReader(str(default_model_path()))

    def key(name: str):
        return gguf_format._field(source, f"tokenizer.ggml.{name}")

    writer.add_tokenizer_model(key("model"))
    writer.add_tokenizer_pre(key("pre"))
    writer.add_token_list(key("tokens"))
    writer.add_token_types(key("token_type"))
    writer.add_token_merges(key("merges"))


def _rank_gguf(causal, default_tokenizer, path, template: str | None, classifier: bool = True):
    """A Qwen3-Reranker GGUF as llama.cpp's converter writes one: pooled by rank, a two-row classifier of the
    yes / no rows labelled so, the pair template under tokenizer.chat_template.rerank, no output matrix."""
    cfg, blocks = causal.config, causal.config.num_hidden_layers
    writer = gguf_writer(path, "qwen3", cfg, blocks)
    writer.add_uint32("qwen3.pooling_type", 4)
    writer.add_array("qwen3.classifier.output_labels", ["yes", "no"])
    if template is not None:
        writer.add_string("tokenizer.chat_template.rerank", template)
    _copy_tokenizer(writer)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, blocks)
    for hf_name, tensor in causal.state_dict().items():
        if hf_name != "lm_head.weight":
            writer.add_tensor(
                names.get_name(hf_name, try_suffixes=(".weight", ".bias")), tensor.float().numpy()
            )
    if classifier:
        rows = [default_tokenizer.token_to_id(a) for a in ("yes", "no")]
        writer.add_tensor("cls.output.weight", causal.lm_head.weight[rows].detach().float().numpy())
    return close_gguf(writer, path)


def test_a_rank_gguf_scores_with_its_own_template(
    causal, hf_tokenizer, default_tokenizer, expected, tmp_path
):
    template = f"{PREFIX}<Instruct>: {DEFAULT_TASK}\n<Query>: {{query}}\n<Document>: {{document}}{SUFFIX}"
    llm = LLM(_rank_gguf(causal, default_tokenizer, tmp_path / "rank.gguf", template))
    assert llm.model_config.rerank == "classifier" and llm.model_config.rerank_labels == ("yes", "no")
    assert llm.model.headless and llm.rerank_head.positive == 0
    assert _all_close(llm.rerank(QUERY, DOCS), expected)
    with_task = [_expected(causal, hf_tokenizer, d, TASK) for d in DOCS]
    assert _all_close(llm.rerank(QUERY, DOCS, instruction=TASK), with_task)  # the default task replaced


def test_a_template_is_filled_in_one_pass_and_keeps_its_task_unless_it_has_one():
    template = "Q: {query}\nD: {document}"
    assert (
        pair_prompt("find {document}", "text {query}", None, template)
        == "Q: find {document}\nD: text {query}"
    )
    with pytest.raises(NinferError, match="has no instruction to replace; leave 'instruction' out"):
        pair_prompt("q", "d", "a task", template)
    default = pair_prompt("q", "d")
    assert default.startswith(PREFIX) and default.endswith(SUFFIX) and DEFAULT_TASK in default


def test_what_is_not_a_reranker_is_refused(causal, default_tokenizer, tmp_path):
    bare = tiny_hf_model("qwen3", tied=False, vocab_size=default_tokenizer.vocab_size)
    path = _save(bare.model, default_tokenizer, tmp_path / "bare", card=False)  # an embedding model
    with pytest.raises(NinferError, match="--rerank judges .* has no LM head"):
        LLM(path, rerank=True)
    gguf_path = _rank_gguf(causal, default_tokenizer, tmp_path / "nocls.gguf", None, classifier=False)
    with pytest.raises(NinferError, match="pooled by rank but holds no classifier"):
        LLM(gguf_path)
    cfg = tf.Qwen3Config(**{**causal.config.to_dict(), "num_labels": 3})
    three = _save(tf.Qwen3ForSequenceClassification(cfg), default_tokenizer, tmp_path / "three", card=False)
    with pytest.raises(NinferError, match="classifier has 3 labels; a reranker's has one .* or two"):
        LLM(three)


@pytest.mark.parametrize("bits", [4, 6, 8])
def test_the_head_rows_of_a_quantized_lm_head_are_its_dequantized_rows(causal, default_tokenizer, bits):
    """A .ninfer or block-quantized GGUF on a GPU streams lm_head packed: only the yes / no rows are
    dequantized, and they equal the whole matrix's dequantized rows."""
    head = quantize(causal.lm_head.weight.detach()[:, :48], bits, group_size=32)  # K not a whole group
    source = ModelSource(
        config=ModelConfig.from_hf_dict({**causal.config.to_dict(), "architectures": ["Qwen3ForCausalLM"]}),
        tokenizer=default_tokenizer,
        weights=lambda: iter(()),
        description="quantized",
        quantized_weights=lambda: iter([("lm_head.weight", head)]),
        unquantized_weights=lambda: iter([("model.norm.weight", torch.ones(64))]),
    )
    tap = HeadTap(source.config, default_tokenizer, EngineConfig(model="", rerank=True))
    wrapped = tap.wrap(source)
    assert [name for name, _ in wrapped.quantized_weights()] == ["lm_head.weight"]  # passed on unchanged
    assert [name for name, _ in wrapped.unquantized_weights()] == ["model.norm.weight"]
    rows = [default_tokenizer.token_to_id(a) for a in ("no", "yes")]
    assert torch.equal(tap.head().weight, dequantize(head)[rows])


def test_a_reranker_quantized_as_it_loads(causal, default_tokenizer, expected, tmp_path, kernel_backend):
    """--weight-quant int8 where the fused kernels run: lm_head is quantized as it loads, and the head's
    yes / no rows are those of the packed matrix, dequantized (on the CPU, beside the pooled rows)."""
    from engine.quant.convert import convert

    src = _save(causal, default_tokenizer, tmp_path)
    convert(src, tmp_path / "w8.ninfer", "w8g128", method="rtn")
    kernel_backend("triton")
    llm = LLM(src, weight_quant="int8", dtype="float32")
    assert llm.model.lm_head.qweight is not None and llm.rerank_head.weight.device.type == "cpu"
    got = llm.rerank(QUERY, DOCS)
    artifact = LLM(tmp_path / "w8.ninfer", dtype="float32")  # the same codes, stored
    assert artifact.rerank_head is not None and _all_close(got, artifact.rerank(QUERY, DOCS), tol=1e-6)
    assert sorted(range(3), key=got.__getitem__) == sorted(range(3), key=expected.__getitem__)
