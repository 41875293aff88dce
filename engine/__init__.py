"""ninfer's engine: `from engine import LLM, SamplingParams`."""

from engine.errors import NinferError
from engine.llm import LLM
from engine.request import RequestOutput, SamplingParams

__all__ = ["LLM", "NinferError", "RequestOutput", "SamplingParams"]
