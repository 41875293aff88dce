"""ninfer's engine: `from engine import LLM, SamplingParams`."""

from engine.async_llm import AsyncLLM
from engine.errors import EngineOverloaded, NinferError
from engine.llm import LLM
from engine.request import RequestOutput, SamplingParams

__all__ = ["LLM", "AsyncLLM", "EngineOverloaded", "NinferError", "RequestOutput", "SamplingParams"]
