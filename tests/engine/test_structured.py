"""Structured outputs in the engine: grammars (JSON schema, regex, choice, forced tool calls), the token
masks, drafts verified under them, and the answer constrained only after a thinking section.

A random-initialised model writes noise, so a schema-valid reply from one is the grammar's doing."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
import torch
from conftest import CITY_SCHEMA as SCHEMA
from conftest import byte_tokenizer, save_thinking_mtp_model, save_tiny, tiny_hf_model
from conftest import follows_city_schema as valid
from tokenizers import AddedToken
from tokenizers import Tokenizer as HFTokenizer

from engine import LLM, NinferError, SamplingParams
from engine.parsers.reply import parse_reply
from engine.structured import grammars
from engine.structured.matcher import GrammarCompiler, apply_token_bitmask
from engine.tokenizer import Tokenizer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"enum": ["Paris", "Rome"]},
                    "days": {"type": "integer", "maximum": 9},
                },
                "required": ["city", "days"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
QUESTION = [{"role": "user", "content": "Tell me about the capital of France, as JSON."}]
GREEDY = dict(temperature=0.0, max_tokens=60)


@pytest.fixture(scope="module")
def llm():
    return LLM()


@pytest.mark.parametrize("max_tokens", [1, 2, 3])
def test_an_output_cut_inside_a_character_ends_in_a_replacement_character(llm, max_tokens):
    """The emoji is two tokens: a length stop after the first gives its bytes as U+FFFD (llama-server's
    way) rather than dropping them, streamed or not."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, grammar=grammars.regex("🙂{4}"))
    want = "🙂" * (max_tokens // 2) + "\ufffd" * (max_tokens % 2)
    smile = [{"role": "user", "content": "Smile."}]
    out = llm.chat(smile, params)
    assert (out.text, out.finish_reason) == (want, "length")
    assert "".join(delta for delta, _ in llm.stream_chat(smile, params)) == want


def test_json_schema_regex_and_choice_on_the_default_model(llm):
    out = llm.chat(QUESTION, SamplingParams(**GREEDY, grammar=grammars.json_schema(SCHEMA)))
    assert out.finish_reason == "stop" and valid(out.text), out.text
    out = llm.chat(QUESTION, SamplingParams(**GREEDY, grammar=grammars.regex(r"(yes|no), [a-z ]{1,30}\.")))
    assert re.fullmatch(r"(yes|no), [a-z ]{1,30}\.", out.text), out.text
    out = llm.chat(
        QUESTION, SamplingParams(**GREEDY, grammar=grammars.choice(["Paris", "Lyon", 'a "quoted" one']))
    )
    assert out.text in ("Paris", "Lyon", 'a "quoted" one')
    for seed in range(3):  # sampled tokens too
        params = SamplingParams(temperature=1.0, top_p=0.95, seed=seed, max_tokens=60)
        out = llm.chat(
            QUESTION, SamplingParams(**{**params.__dict__, "grammar": grammars.json_schema(SCHEMA)})
        )
        assert valid(out.text), out.text


def test_without_the_grammar_the_model_does_not_write_it(llm):
    """The check above can fail: unconstrained, the same request is not schema JSON."""
    out = llm.chat(QUESTION, SamplingParams(**GREEDY))
    with pytest.raises((ValueError, KeyError)):
        assert valid(out.text)


def test_forced_tool_calls_in_both_forms(llm):
    for form in ("json", "xml"):
        # any tool, as many calls as the model writes (this small one repeats them to the token limit)
        out = llm.chat(
            QUESTION,
            SamplingParams(
                temperature=0.0,
                max_tokens=80,
                grammar=grammars.tool_calls(TOOLS, None, True, grammars.CallSyntax(form)),
            ),
        )
        calls = parse_reply(out.text, False, TOOLS)[2]
        assert calls and all(c.name in ("get_weather", "get_time") for c in calls), out.text
        # the one named tool, once: then only the end may follow
        grammar = grammars.tool_calls(TOOLS, "get_weather", False, grammars.CallSyntax(form))
        out = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=80, grammar=grammar))
        _, text, calls = parse_reply(out.text, False, TOOLS)
        assert out.finish_reason == "stop" and not text.strip(), out.text
        assert len(calls) == 1 and calls[0].name == "get_weather"
        assert calls[0].arguments["city"] in ("Paris", "Rome")
        assert isinstance(calls[0].arguments["days"], int) and calls[0].arguments["days"] <= 9


def test_drafts_are_verified_under_the_grammar(llm):
    """n-gram drafts: the same greedy tokens as without drafting, and drafts accepted."""
    drafting = LLM(spec="ngram", draft_tokens=3)
    for grammar in (grammars.json_schema(SCHEMA), grammars.json_object()):
        params = SamplingParams(temperature=0.0, max_tokens=48, grammar=grammar)
        assert drafting.chat(QUESTION, params).token_ids == llm.chat(QUESTION, params).token_ids
    assert drafting.scheduler.num_accepted_tokens > 0


def test_masks_of_the_draft_rows(default_tokenizer):
    """Row k holds the tokens allowed after k drafts; a refused draft leaves the later rows untouched."""
    tok = default_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    matcher = compiler.matcher(grammars.choice(["red apple", "green pear"]), [1, 2])
    red, apple, green = (tok.encode(w, add_special_tokens=False) for w in ("red", " apple", "green"))
    assert len(red) == len(apple) == 1

    def allowed(mask_row):
        row = torch.zeros(1, tok.vocab_size)
        return set(torch.nonzero(apply_token_bitmask(row, mask_row[None])[0] == 0).flatten().tolist())

    masks = torch.full((4, compiler.num_words), -1, dtype=torch.int32)
    matcher.fill_masks(masks, 1, (red[0], apple[0]))
    assert (masks[0] == -1).all()  # another request's row
    assert red[0] in allowed(masks[1]) and apple[0] not in allowed(masks[1])
    assert allowed(masks[2]) == {apple[0]}
    assert allowed(masks[3]) == set(tok.eos_token_ids)  # after "red apple": only the end
    again = torch.full((3, compiler.num_words), -1, dtype=torch.int32)
    matcher.fill_masks(again, 0, (green[0], apple[0]))  # green then apple: apple is refused at row 1
    assert apple[0] not in allowed(again[1]) and (again[2] == -1).all()
    assert allowed(again[0]) == allowed(masks[1])  # the masks were computed without moving the matcher
    matcher.consume(red)
    after = torch.full((1, compiler.num_words), -1, dtype=torch.int32)
    matcher.fill_masks(after, 0, ())
    assert allowed(after[0]) == {apple[0]}
    matcher.consume(apple)
    assert matcher.done and not matcher.error


def test_drafts_are_cut_where_the_grammar_refuses(default_tokenizer, thinking_tokenizer):
    tok = default_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    matcher = compiler.matcher(grammars.choice(["red apple", "green pear"]), [1, 2])
    red, apple, green = (tok.encode(w, add_special_tokens=False)[0] for w in ("red", " apple", "green"))
    assert matcher.valid_prefix([red, apple, apple]) == 2  # nothing may follow "red apple" but the end
    assert matcher.valid_prefix([green, apple]) == 1 and matcher.valid_prefix([apple]) == 0
    assert matcher.valid_prefix([red, apple]) == 2  # and the matcher has not moved
    # a thinking budget of 3: the fourth reasoning token must be </think>, then the grammar holds
    tok = thinking_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    think, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    hmm = tok.encode("hmm", add_special_tokens=False)[0]
    budget = compiler.matcher(None, [5, think], 3)
    assert budget.valid_prefix([hmm, hmm, hmm, hmm]) == 3 and budget.valid_prefix([hmm, end, hmm, hmm]) == 4
    held = compiler.matcher(grammars.regex("[0-9]+"), [5, think], 3)
    digit, letter = tok.encode("7", add_special_tokens=False)[0], tok.encode("x", add_special_tokens=False)[0]
    assert held.valid_prefix([hmm, end, digit, letter, digit]) == 3


def test_apply_token_bitmask_against_a_loop():
    gen = torch.Generator().manual_seed(0)
    vocab = 77  # not a multiple of 32
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 3), dtype=torch.int32, generator=gen)
    logits = torch.randn(3, vocab, generator=gen)
    got = apply_token_bitmask(logits, bitmask)
    for r in range(3):
        for t in range(vocab):
            on = (int(bitmask[r, t // 32]) >> (t % 32)) & 1
            assert got[r, t] == (logits[r, t] if on else float("-inf"))


def test_grammar_waits_for_the_end_of_thinking(thinking_tokenizer):
    tok = thinking_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    think, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    newline = tok.encode("\n", add_special_tokens=False)
    grammar = grammars.choice(["yes"])
    assert compiler.matcher(grammar, [5, 6]).waiting_for is None
    assert compiler.matcher(grammar, [5, think, end, *newline]).waiting_for is None  # thinking off
    matcher = compiler.matcher(grammar, [5, think, *newline])
    assert matcher.waiting_for == end
    masks = torch.full((3, compiler.num_words), -1, dtype=torch.int32)
    hmm = tok.encode("hmm", add_special_tokens=False)[0]
    matcher.fill_masks(masks, 0, (hmm, end))
    assert (masks[0] == -1).all() and (masks[1] == -1).all()  # free while thinking, up to </think>
    assert not (masks[2] == -1).all()  # the answer: "yes" only
    matcher.consume([hmm, end])
    assert matcher.waiting_for is None and not matcher.done


def test_bad_grammars_are_refused_in_one_line(llm):
    for grammar, words in (
        (grammars.regex("(unclosed"), "does not compile"),
        ("start: undefined_rule", "does not compile"),
    ):
        with pytest.raises(NinferError, match=words) as e:
            llm.chat(QUESTION, SamplingParams(max_tokens=4, grammar=grammar))
        assert "\n" not in str(e.value)
    for call, words in (
        (
            lambda: grammars.tool_calls(TOOLS, "nope", True, grammars.CallSyntax()),
            "'nope', which is not among",
        ),
        (lambda: grammars.tool_calls([], None, True, grammars.CallSyntax()), "at least one tool"),
        (lambda: grammars.choice([]), "non-empty list"),
        (lambda: grammars.json_schema([1]), "must be an object"),
        (lambda: grammars.grammar("root ::= (unclosed"), "neither Lark nor GBNF"),
    ):
        with pytest.raises(NinferError, match=words):
            call()
    assert not llm.scheduler.has_unfinished_requests()


def test_gbnf_is_taken_as_llama_cpp_writes_it(llm):
    gbnf = 'root ::= "answer: " ("yes" | "no")'
    out = llm.chat(QUESTION, SamplingParams(**GREEDY, grammar=grammars.grammar(gbnf)))
    assert out.text in ("answer: yes", "answer: no")


PROMPTS = ("a", "b c", "d e f")


def test_mtp_drafts_under_a_schema(tmp_path, thinking_tokenizer):
    """A random model with its MTP head writes schema JSON, the same greedy tokens as without drafts."""
    path = save_thinking_mtp_model(tmp_path, thinking_tokenizer, think=False)
    plain, drafting = LLM(path), LLM(path, spec="mtp", draft_tokens=3)
    propose, proposed = drafting.scheduler.proposer.propose, []

    def counted(req, most):
        drafts = propose(req, most)
        proposed.extend(drafts)
        return drafts

    drafting.scheduler.proposer.propose = counted
    for prompt in PROMPTS:
        params = SamplingParams(temperature=0.0, max_tokens=60, grammar=grammars.json_schema(SCHEMA))
        ref = plain.chat([{"role": "user", "content": prompt}], params)
        assert drafting.chat([{"role": "user", "content": prompt}], params).token_ids == ref.token_ids
        assert ref.finish_reason == "stop" and valid(ref.text), ref.text
    # the head drafted; those the schema refuses (a random head's, mostly) were cut before the step
    assert proposed and drafting.scheduler.num_draft_tokens < len(proposed)


def test_thinking_is_left_free_until_it_ends(tmp_path, thinking_tokenizer):
    """With the prompt inside <think>, the output follows the model up to </think> and the schema after."""
    path = save_thinking_mtp_model(tmp_path, thinking_tokenizer, think=True)
    end = thinking_tokenizer.token_to_id("</think>")
    llm = LLM(path, spec="mtp", draft_tokens=3)
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        free = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=40))
        got = llm.chat(
            messages, SamplingParams(temperature=0.0, max_tokens=40, grammar=grammars.json_schema(SCHEMA))
        )
        if end not in free.token_ids:
            assert got.token_ids == free.token_ids
        else:
            cut = free.token_ids.index(end) + 1
            assert got.token_ids[:cut] == free.token_ids[:cut]
            assert got.token_ids[cut:] != free.token_ids[cut:]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_masks_on_the_device_with_graphs_and_drafts(tmp_path, device):
    """A tiny random model over a byte-level tokenizer (no embedded model needed: a GPU lease has none):
    schema JSON, the same greedy tokens with n-gram drafts as without; on CUDA the masks come from pinned
    memory and the decode steps replay CUDA graphs."""
    tok = byte_tokenizer()
    end = tok.token_to_id("<|im_end|>")
    model = tiny_hf_model("qwen3", tied=False, vocab_size=tok.vocab_size, eos_token_id=end, bos_token_id=end)
    path = save_tiny(model, tmp_path)
    tok.backend.save(str(path / "tokenizer.json"))
    template = "{% for m in messages %}{{ m.content }}\n{% endfor %}"
    (path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, "eos_token": "<|im_end|>"})
    )
    dtype = "bfloat16" if device == "cuda" else "float32"
    params = SamplingParams(temperature=0.0, max_tokens=80, grammar=grammars.json_schema(SCHEMA))
    ref = LLM(path, device=device, dtype=dtype).chat(QUESTION, params)
    drafting = LLM(path, device=device, dtype=dtype, spec="ngram", draft_tokens=3)
    assert drafting.chat(QUESTION, params).token_ids == ref.token_ids
    assert ref.finish_reason == "stop" and valid(ref.text), ref.text
    assert drafting.scheduler.num_draft_tokens > 0


def test_strict_calls_in_free_text(default_tokenizer):
    """Text is free; from `<tool_call>` on, the call must name a tool and pass arguments its schema allows."""
    tok = default_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'
    for form, good, bad in (
        ("json", f"Let me look.\n{call}\nIt is sunny.", 'Sure <tool_call>\n{"name": "get_moon"'),
        (
            "xml",
            "Hm.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
            "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call> ok",
            "<tool_call>\n<function=get_weather>\n<parameter=days>\nlots",
        ),
    ):
        grammar = grammars.tool_calls_in_text(TOOLS, grammars.CallSyntax(form))
        for text, accepted in (("No tools needed: 2 < 3 > 1.", True), (good, True), (bad, False)):
            matcher = compiler.matcher(grammar, [1])
            matcher.consume(tok.encode(text, add_special_tokens=False))
            assert (not matcher.error) == accepted, (form, text, matcher.error)


def test_strict_calls_from_a_model_pushed_to_call(tmp_path, thinking_tokenizer):
    """A random model pushed toward `<tool_call>` (logit_bias) writes only valid calls under the grammar;
    without it, noise follows the tag."""
    backend = HFTokenizer.from_str(thinking_tokenizer.backend.to_str())
    backend.add_tokens([AddedToken("<tool_call>", special=False), AddedToken("</tool_call>", special=False)])
    tok = Tokenizer(backend=backend, eos_token=thinking_tokenizer.eos_token)
    path = save_thinking_mtp_model(tmp_path, tok, think=False)
    llm = LLM(path)
    push = {tok.token_to_id("<tool_call>"): 30.0}
    ask = dict(temperature=0.0, max_tokens=80, logit_bias=push)
    grammar = grammars.tool_calls_in_text(TOOLS, grammars.call_syntax(tok))
    out = llm.chat(QUESTION, SamplingParams(**ask, grammar=grammar))
    calls = parse_reply(out.text, False, TOOLS)[2]
    assert calls and out.text.count("<tool_call>") - (out.finish_reason == "length") <= len(calls), out.text
    assert all(c.name in ("get_weather", "get_time") for c in calls)
    free = llm.chat(QUESTION, SamplingParams(**ask))
    assert "<tool_call>" in free.text and not parse_reply(free.text, False, TOOLS)[2]


def test_call_tags_that_are_tokens(tmp_path, thinking_tokenizer):
    """Where the tokenizer has `<tool_call>` as a token of its own (Qwen's do), llguidance counts it as
    special: the grammars name the token, and the model writes it as that one token."""
    backend = HFTokenizer.from_str(thinking_tokenizer.backend.to_str())
    backend.add_tokens([AddedToken("<tool_call>", special=False), AddedToken("</tool_call>", special=False)])
    tok = Tokenizer(
        backend=backend, eos_token=thinking_tokenizer.eos_token, chat_template="{{ '<function=' }}"
    )
    open_id, close_id = tok.token_to_id("<tool_call>"), tok.token_to_id("</tool_call>")
    syntax = grammars.call_syntax(tok)
    assert syntax == grammars.CallSyntax("xml", f"<[{open_id}]>", f"<[{close_id}]>")
    assert grammars.call_syntax(thinking_tokenizer) == grammars.CallSyntax()  # tags spelled out, JSON form
    path = save_thinking_mtp_model(tmp_path, tok, think=False)
    llm = LLM(path)
    for form in ("json", "xml"):
        grammar = grammars.tool_calls(TOOLS, "get_weather", False, replace(syntax, form=form))
        out = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=80, grammar=grammar))
        assert out.finish_reason == "stop" and out.token_ids[0] == open_id and close_id in out.token_ids
        (call,) = parse_reply(out.text, False, TOOLS)[2]
        assert call.name == "get_weather" and call.arguments["city"] in ("Paris", "Rome")


def test_thinking_budget_masks(thinking_tokenizer):
    """Budget 3: the reasoning's fourth token can only be </think>; after it nothing is masked."""
    tok = thinking_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    think, end = tok.token_to_id("<think>"), tok.token_to_id("</think>")
    hmm = tok.encode("hmm", add_special_tokens=False)[0]
    assert compiler.matcher(None, [5, think], None) is None  # no budget, no grammar: nothing to hold
    assert compiler.matcher(None, [5, 6], 3) is None  # thinking off: no reasoning to limit
    matcher = compiler.matcher(None, [5, think], 3)
    early = torch.full((3, compiler.num_words), -1, dtype=torch.int32)
    assert not matcher.fill_masks(early, 0, (hmm, hmm))  # the budget not reached: no mask to copy
    masks = torch.full((4, compiler.num_words), -1, dtype=torch.int32)
    assert matcher.fill_masks(masks, 0, (hmm, hmm, hmm))
    assert all((masks[k] == -1).all() for k in range(3))
    allowed = torch.nonzero(apply_token_bitmask(torch.zeros(1, tok.vocab_size), masks[3:])[0] == 0).flatten()
    assert allowed.tolist() == [end]
    matcher.consume([hmm, hmm, end])
    after = torch.full((2, compiler.num_words), -1, dtype=torch.int32)
    assert not matcher.fill_masks(after, 0, (hmm,))
    assert (after == -1).all() and matcher.waiting_for is None and not matcher.done


@pytest.mark.parametrize("with_grammar", [False, True])
def test_thinking_budget_ends_the_reasoning(tmp_path, thinking_tokenizer, with_grammar):
    """A random model thinks exactly `budget` tokens, then </think> (and the schema's JSON, with one);
    MTP drafts give the same tokens."""
    path = save_thinking_mtp_model(tmp_path, thinking_tokenizer, think=True)
    end = thinking_tokenizer.token_to_id("</think>")
    grammar = grammars.json_schema(SCHEMA) if with_grammar else None
    params = SamplingParams(temperature=0.0, max_tokens=60, thinking_budget=5, grammar=grammar)
    plain, drafting = LLM(path), LLM(path, spec="mtp", draft_tokens=3)
    checked = 0
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        free = plain.chat(messages, SamplingParams(temperature=0.0, max_tokens=6))
        out = plain.chat(messages, params)
        assert drafting.chat(messages, params).token_ids == out.token_ids
        if end in free.token_ids[:5] or set(free.token_ids[:5]) & set(plain.eos_token_ids):
            continue  # the model ended its reasoning (or reply) before the budget did
        assert out.token_ids[:5] == free.token_ids[:5] and out.token_ids[5] == end
        if with_grammar:
            assert valid(thinking_tokenizer.decode(out.token_ids[6:])), out.text
        checked += 1
    assert checked


def test_requests_with_different_grammars_in_one_batch(llm):
    """Rows of one step carry each request's own mask (and none for a free request): the same replies
    batched as alone."""
    tok = llm.tokenizer
    asks = [
        ("Is Paris in France?", grammars.choice(["yes", "no"])),
        ("Give a number.", grammars.regex(r"[0-9]{2,4}")),
        ("Tell me about a city.", grammars.json_schema(SCHEMA)),
        ("Say hello.", None),
    ]
    prompts = [tok.encode_chat([{"role": "user", "content": q}]) for q, _ in asks]
    params = [SamplingParams(temperature=0.0, max_tokens=40, grammar=g) for _, g in asks]
    alone = [
        llm.generate(prompt_token_ids=p, sampling_params=sp)[0].token_ids for p, sp in zip(prompts, params)
    ]
    ids = [llm.add_request(p, sp) for p, sp in zip(prompts, params)]
    done = {}
    while llm.has_unfinished_requests():
        for out, _ in llm.step():
            if out.finished:
                done[out.request_id] = out
    assert [done[i].token_ids for i in ids] == alone
    assert done[ids[0]].text in ("yes", "no") and re.fullmatch(r"[0-9]{2,4}", done[ids[1]].text)
    assert valid(done[ids[2]].text)


# a custom tool (OpenAI's freeform tools), shown as a function of one string `input`
SHIP = {
    "type": "function",
    "function": {
        "name": "ship",
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
        },
    },
}
SHIP_LARK = 'start: "BEGIN\\n" item+ "END"\nitem: ("+" | "-") /[a-z]+/ "\\n"'


def _xml_call(name: str, value: str) -> str:
    return (
        f"<tool_call>\n<function={name}>\n<parameter=input>\n{value}\n</parameter>\n</function>\n</tool_call>"
    )


@pytest.mark.parametrize("in_text", [False, True])
def test_custom_tool_formats_hold_the_input(default_tokenizer, in_text):
    """A custom tool's Lark format holds its input where calls are XML (the input is text there: a named
    grammar of its own); a regex format in either form (in JSON, the string's pattern); a Lark format in
    the JSON form is told, not enforced (the input is a JSON string)."""
    tok = default_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    tools = [SHIP, TOOLS[0]]

    def accepts(grammar: str, text: str) -> bool:
        matcher = compiler.matcher(grammar, [1])
        matcher.consume(tok.encode(text, add_special_tokens=False))
        return not matcher.error

    def build(form: str, fmt: tuple[str, str]) -> str:
        syntax, formats = grammars.CallSyntax(form), {"ship": fmt}
        if in_text:
            return grammars.tool_calls_in_text(tools, syntax, formats)
        return grammars.tool_calls(tools, "ship", False, syntax, formats)

    lead = "Shipping now.\n" if in_text else ""
    lark = build("xml", ("lark", SHIP_LARK))
    assert lark.startswith("{") and "@input_0" in lark  # top-level JSON: the main grammar and the input's
    assert accepts(lark, lead + _xml_call("ship", "BEGIN\n+apple\n-pear\nEND"))
    assert not accepts(lark, lead + _xml_call("ship", "BEGIN\n*apple"))
    assert not accepts(lark, lead + _xml_call("ship", "just text"))
    regex = build("xml", ("regex", "[0-9]{3}-[a-z]{2}"))
    assert accepts(regex, lead + _xml_call("ship", "123-ab"))
    assert not accepts(regex, lead + _xml_call("ship", "12-ab"))
    as_json = build("json", ("regex", "[0-9]{3}-[a-z]{2}"))
    call = '<tool_call>\n{"name": "ship", "arguments": {"input": "%s"}}\n</tool_call>'
    assert accepts(as_json, lead + call % "123-ab") and not accepts(as_json, lead + call % "123-abc")
    told = build("json", ("lark", SHIP_LARK))
    assert not told.startswith("{") and accepts(told, lead + call % "anything at all")


def test_forced_xml_calls_hold_optional_and_referenced_values(default_tokenizer):
    """Under tool_choice, an Optional[int] (anyOf with null) is an integer or null and a $ref'd model an
    object of its schema, as the XML form writes them; a value that may be text is free."""
    tok = default_tokenizer
    compiler = GrammarCompiler(tok, tok.vocab_size, tok.eos_token_ids)
    tool = {
        "type": "function",
        "function": {
            "name": "edit",
            "parameters": {
                "type": "object",
                "$defs": {
                    "Span": {
                        "type": "object",
                        "properties": {"start": {"type": "integer"}},
                        "required": ["start"],
                        "additionalProperties": False,
                    }
                },
                "properties": {
                    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                    "span": {"$ref": "#/$defs/Span"},
                    "note": {"type": ["string", "null"]},
                },
                "required": ["limit", "span", "note"],
            },
        },
    }
    grammar = grammars.tool_calls([tool], "edit", False, grammars.CallSyntax("xml"))

    def call(limit: str, span: str, note: str = "any text") -> str:
        params = "".join(
            f"<parameter={k}>\n{v}\n</parameter>\n"
            for k, v in (("limit", limit), ("span", span), ("note", note))
        )
        return f"<tool_call>\n<function=edit>\n{params}</function>\n</tool_call>"

    def accepts(text: str) -> bool:
        matcher = compiler.matcher(grammar, [1])
        matcher.consume(tok.encode(text, add_special_tokens=False))
        return not matcher.error

    assert accepts(call("12", '{"start": 3}')) and accepts(call("null", '{"start": 3}', "null"))
    assert not accepts(call("twelve", '{"start": 3}'))
    assert not accepts(call("12", '{"start": "three"}'))
    assert not accepts(call("12", '{"end": 3}'))
