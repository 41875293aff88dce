"""Bad input at the CLI: one line, exit code 2, no traceback."""

from __future__ import annotations

import json

import pytest
from conftest import save_tiny, tiny_hf_model
from typer.testing import CliRunner

from ninfer_cli.main import app

runner = CliRunner()


def _run(*args):
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_help_lists_only_working_commands():
    code, out = _run("--help")
    assert code == 0
    for command in ("bench", "chat", "convert", "fetch", "plan", "serve"):
        assert command in out


def test_missing_model_path():
    code, out = _run("chat", "/no/such/model", "--prompt", "hi")
    assert code == 2
    assert (
        out.strip()
        == "error: /no/such/model does not exist; pass an HF checkpoint directory, a .gguf or a .ninfer file"
    )


def test_serve_names_a_missing_model_before_it_binds_its_port_or_says_it_is_loading(tmp_path, monkeypatch):
    bound = []
    monkeypatch.setattr("ninfer_cli.serve.bind", lambda *a: bound.append(a))
    for model, words in (
        ("/no/such/model", "does not exist; pass an HF checkpoint directory"),
        (str(tmp_path), "has no config.json; point ninfer at an HF checkpoint directory"),
        (str(tmp_path / "x.bin"), "does not exist"),
    ):
        code, out = _run("serve", model, "--port", "0")
        assert code == 2 and out.startswith(f"error: {model} {words}") and "loading" not in out, out
    (tmp_path / "x.bin").write_bytes(b"x")
    code, out = _run("serve", str(tmp_path / "x.bin"), "--port", "0")
    assert code == 2 and out.startswith(f"error: cannot tell the format of {tmp_path / 'x.bin'}"), out
    assert bound == []


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny(
        tiny_hf_model("llama", tied=False), tmp_path_factory.mktemp("tiny"), max_shard_size="200KB"
    )


def test_unsupported_architecture(tiny_dir, tmp_path):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out = _run("chat", str(tmp_path), "--prompt", "hi")
    assert code == 2
    line = out.strip()
    assert "\n" not in line
    assert "MistralForCausalLM" in line
    assert "LlamaForCausalLM" in line and "Qwen3ForCausalLM" in line and "Qwen3_5ForCausalLM" in line


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_vision_on_a_text_model_is_one_line(tiny_dir, command):
    args = ["--prompt", "hi"] if command == "chat" else ["--port", "0"]
    code, out = _run(command, str(tiny_dir), "--vision", *args)
    assert code == 2 and "Traceback" not in out
    line = out.strip().splitlines()[-1]
    assert line.startswith("error: this LlamaForCausalLM checkpoint has no vision tower (no vision_config")
    assert line.endswith("drop --vision, or serve a multimodal HF checkpoint (Qwen3.5, Qwen3-VL)")


@pytest.mark.parametrize("command", ["chat", "serve", "bench"])
def test_rope_scaling_flag_is_taken_and_checked(tiny_dir, command):
    args = {"chat": ["--prompt", "hi"], "serve": ["--port", "0"], "bench": ["--ctx", "2k", "--gen", "8"]}
    code, out = _run(command, str(tiny_dir), "--rope-scaling", "yarn:fast", *args[command])
    assert code == 2 and "Traceback" not in out
    assert (
        out.strip().splitlines()[-1].startswith("error: --rope-scaling 'yarn:fast': the factor is a number")
    )
    if command == "bench":  # the tiny model takes 1024 positions; stretched x4 it takes the 2K prompt
        code, out = _run(command, str(tiny_dir), *args[command], "--concurrency", "1", "--repeat", "1")
        assert code == 2 and "beyond the model's 1024 positions" in out and "--rope-scaling yarn:3" in out
    if command == "chat":  # the embedded SmolLM2 takes 8192 positions
        ask = ("chat", "--max-context", "12k", "--max-tokens", "4", "-p", "hi")
        code, out = _run(*ask)
        assert code == 2 and "beyond the model's 8192 positions" in out and "--rope-scaling yarn:2" in out
        code, out = _run(*ask, "--rope-scaling", "yarn:2")
        assert code == 0 and out.strip(), out


def _copy(src, dst):
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_missing_shard_is_named(tiny_dir, tmp_path):
    d = _copy(tiny_dir, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.unlink()
    code, out = _run("chat", str(d), "--prompt", "hi")
    assert code == 2
    assert str(shard) in out and "missing" in out
    assert "Traceback" not in out


@pytest.mark.parametrize("keep", [4, 200, -100])
def test_truncated_shard_is_named(tiny_dir, tmp_path, keep):
    d = _copy(tiny_dir, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[:keep])
    code, out = _run("chat", str(d), "--prompt", "hi")
    assert code == 2
    assert str(shard) in out and "truncated" in out
    assert "Traceback" not in out


def test_bad_sampling_flag():
    code, out = _run("chat", "--prompt", "hi", "--top-p", "1.5")
    assert code == 2
    assert "top_p" in out


@pytest.mark.parametrize("flag", ["--max-context", "--prefill-chunk", "--max-concurrency"])
def test_a_size_of_zero_names_its_flag(flag, monkeypatch):
    monkeypatch.setattr("ninfer_cli.serve.bind", lambda *a: pytest.fail("bound a port"))
    code, out = _run("serve", flag, "0", "--port", "0")
    name = flag[2:].replace("-", "_")
    assert code == 2 and out.strip() == f"error: {name} ({flag}) must be positive (got 0)", out


@pytest.mark.parametrize("command", ["chat", "bench"])
def test_int8_prefill_without_packed_weights_is_one_line(tiny_dir, command):
    """The flag reaches the engine from chat and bench; on the CPU a quantized model is dequantized at load
    (the embedded GGUF), an HF checkpoint is not quantized at all: both refused before loading."""
    extra = ["--prompt", "hi"] if command == "chat" else ["--ctx", "64", "--concurrency", "1", "--gen", "2"]
    code, out = _run(command, "--int8-prefill", *extra)
    assert code == 2 and out.count("\n") == 1, out
    assert "dequantized at load (use --device cuda)" in out and "drop --int8-prefill" in out
    code, out = _run(command, str(tiny_dir), "--int8-prefill", *extra)
    assert code == 2 and "not quantized" in out, out


@pytest.mark.parametrize("command", ["chat", "serve"])
def test_checkpoint_overrides_are_checked_in_one_line(command, tmp_path):
    args = ["--prompt", "hi"] if command == "chat" else ["--port", "0"]
    code, out = _run(command, "--chat-template", str(tmp_path / "none.jinja"), *args)
    assert code == 2 and out.strip().splitlines()[-1].startswith("error: --chat-template ")
    assert "cannot read it" in out and "Traceback" not in out
    code, out = _run(command, "--generation-config", "nowhere.json", *args)
    assert code == 2 and "error: --generation-config nowhere.json: no such file" in out
    code, out = _run(command, "--chat-template-kwargs", "{enable_thinking: false}", *args)
    assert code == 2 and out.count("\n") == 1 and "error: --chat-template-kwargs is not JSON" in out, out
    template = tmp_path / "strict.jinja"
    template.write_text("{% if greeting is defined %}{{ raise_exception('no greeting here') }}{% endif %}x")
    code, out = _run(
        command, "--chat-template", str(template), "--default-chat-template-kwargs", '{"greeting": 1}', *args
    )
    assert code == 2 and out.count("\n") == 1, out
    assert "error: --chat-template-kwargs: the chat template does not render a conversation with them" in out
    assert "no greeting here" in out


def test_serve_refuses_a_port_in_use_or_a_foreign_host_before_loading(monkeypatch):
    """The socket is bound before the weights load: a port in use is said at once, in one line."""
    import socket

    import engine.async_llm

    monkeypatch.setattr(engine.async_llm, "AsyncLLM", lambda *a, **k: pytest.fail("the model loaded first"))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = _run("serve", "--host", "127.0.0.1", "--port", str(port))
    assert (
        code == 2
        and out.strip()
        == f"error: port {port} on 127.0.0.1 is in use (another server?); stop it, or pick another --port"
    )
    code, out = _run("serve", "--host", "192.0.2.1", "--port", "0")  # TEST-NET-1: no machine's own
    assert code == 2 and "--host 192.0.2.1 is not an address of this machine; use 127.0.0.1" in out
    code, out = _run("serve", "--port", "70000")
    assert code == 2 and "--port 70000 is not a port; use 1-65535" in out


@pytest.mark.parametrize("command", ["chat", "serve", "bench"])
def test_an_unknown_device_is_one_line(command):
    """A device torch would name in a traceback (tpu, mps, ...) is refused in a sentence, in every command
    that loads a model."""
    args = {"chat": ["--prompt", "hi"], "serve": ["--port", "0"], "bench": ["--ctx", "64", "--gen", "2"]}
    code, out = _run(command, "--device", "tpu", *args[command])
    assert code == 2 and "Traceback" not in out
    assert (
        out.strip().splitlines()[-1]
        == "error: unknown device 'tpu'; use cpu, or cuda (cuda:N for the N-th GPU)"
    )


def test_a_gpu_index_past_the_machines_is_refused():
    from engine.config import EngineConfig
    from engine.errors import NinferError

    with pytest.raises(NinferError, match=r"device cuda:9 is not here: this machine has \d+ CUDA device"):
        EngineConfig(model=None, device="cuda:9")


def test_version_flag():
    from engine.version import ninfer_version

    code, out = _run("--version")
    assert ninfer_version() != "unknown"
    assert code == 0 and out.startswith(f"ninfer {ninfer_version()} (torch ") and "triton " in out


def test_serve_takes_vllm_and_llama_server_flag_names(monkeypatch):
    """A user coming from vLLM or llama-server types their flags: the same options reach the engine."""
    seen = {}

    class Loaded(Exception):
        """Stands for the engine: what serve would load it with is all this test reads."""

    def engine(model, **options):
        seen.update(options)
        raise Loaded

    monkeypatch.setattr("engine.async_llm.AsyncLLM", engine)
    for flags in (
        [
            "--served-model-name",
            "m",
            "--max-model-len",
            "4k",
            "--max-num-seqs",
            "2",
            "--kv-cache-dtype",
            "fp8_e4m3",
        ],
        ["--alias", "m", "--ctx-size", "4096", "--parallel", "2", "--kv-dtype", "fp8"],
    ):
        seen.clear()
        _, out = _run("serve", "--port", "0", *flags)
        assert seen["max_context"] == 4096 and seen["max_concurrency"] == 2, (flags, out)
        assert seen["kv_dtype"] in ("fp8", "fp8_e4m3")
    code, out = _run("serve", "--served-model-name")
    assert code == 2 and "--served-model-name" in out  # a missing value is named by the flag typed


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA says so")
def test_llm_on_cuda_without_a_gpu_is_a_sentence():
    from engine import LLM
    from engine.errors import NinferError

    with pytest.raises(NinferError, match="device cuda was asked for but no CUDA device is visible; use cpu"):
        LLM(device="cuda")
