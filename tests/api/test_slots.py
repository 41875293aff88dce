"""llama-server's GET /slots (engine/api/slots.py): a slot per --max-concurrency, idle or running a request
with its sampling and counts; a running request keeps its slot number; fail_on_no_slot; behind the key."""

from __future__ import annotations

import time

import httpx2 as httpx
import openai
import pytest
from server import RunningServer

from engine.api.slots import SlotNumbers
from engine.async_llm import AsyncLLM

KEY = {"Authorization": "Bearer k"}


def _slots(s, until=None, query=""):
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(f"{s.url}/slots{query}", headers=KEY, timeout=10)
        if until is None or until(r.json()):
            return r
        assert time.monotonic() < deadline, r.json()
        time.sleep(0.05)


def test_each_slot_shows_the_request_it_runs_and_keeps_its_number():
    with RunningServer(AsyncLLM(max_concurrency=2), api_key="k") as s:
        assert httpx.get(f"{s.url}/slots").status_code == 401
        idle = _slots(s).json()
        assert [(x["id"], x["is_processing"], x["id_task"]) for x in idle] == [(0, False, -1), (1, False, -1)]
        assert idle[0]["n_ctx"] == s.engine.llm.max_context and idle[0]["next_token"]["n_decoded"] == 0
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="k", max_retries=0)

        def start(temperature):
            return client.responses.create(
                model="m",
                input="Count to a thousand.",
                background=True,
                max_output_tokens=3000,
                temperature=temperature,
                extra_body={"ignore_eos": True},  # runs until cancelled
            )

        first = start(0.5)
        busy = _slots(s, lambda v: v[0]["is_processing"] and v[0]["next_token"]["n_decoded"] > 0).json()
        slot = busy[0]
        assert slot["params"]["temperature"] == 0.5 and slot["params"]["n_predict"] == 3000
        assert slot["next_token"]["n_remain"] + slot["next_token"]["n_decoded"] == 3000
        assert slot["n_prompt_tokens_processed"] == slot["n_prompt_tokens"] > 0
        assert not busy[1]["is_processing"]
        assert _slots(s, query="?fail_on_no_slot=1").status_code == 200
        second = start(0.9)
        both = _slots(s, lambda v: all(x["is_processing"] for x in v)).json()
        assert both[1]["params"]["temperature"] == 0.9 and both[0]["id_task"] != both[1]["id_task"]
        full = httpx.get(f"{s.url}/slots?fail_on_no_slot=1", headers=KEY, timeout=10)
        assert full.status_code == 503 and "no slot available" in full.json()["error"]["message"]
        client.responses.cancel(first.id)
        after = _slots(s, lambda v: not v[0]["is_processing"]).json()
        assert after[1]["is_processing"] and after[1]["request_id"] == both[1]["request_id"]  # it kept slot 1
        client.responses.cancel(second.id)
        s.wait_idle(10)
        bad = httpx.get(f"{s.url}/slots?fail_on_no_slot=maybe", headers=KEY, timeout=10)
        assert bad.status_code == 400 and "fail_on_no_slot must be 1 or 0" in bad.json()["error"]["message"]
        assert httpx.get(f"{s.url}/props", headers=KEY, timeout=10).json()["endpoint_slots"] is True


@pytest.mark.parametrize(
    ("rounds", "want"),
    [
        ([["a", "b"], ["b"], ["b", "c"]], {"b": 1, "c": 0}),  # c takes the slot a left; b keeps its own
        ([["a"], [], ["b", "a"]], {"b": 0, "a": 1}),  # a finished and came back: a new request, a new slot
    ],
)
def test_slot_numbers_are_the_lowest_free_and_stay(rounds, want):
    numbers = SlotNumbers()
    for ids in rounds:
        numbers.assign(ids)
    assert numbers.slot == want and len(set(numbers.task.values())) == len(want)
