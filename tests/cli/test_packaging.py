"""What `pip install ninfer` puts in site-packages: every package under its installed name (kernels/ as
`ninfer_kernels`, so Hugging Face's `kernels` library, which transformers requires, installs beside it), the C
sources the CPU ops compile from, and nothing named `kernels`."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
INSTALLED_AS = {"ninfer_cli": "ninfer_cli", "engine": "engine", "kernels": "ninfer_kernels"}


def _tree_files(suffixes: tuple[str, ...]) -> set[str]:
    """The tree's files of these suffixes under their installed paths (kernels/x.py -> ninfer_kernels/x.py)."""
    names = set()
    for folder, name in INSTALLED_AS.items():
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in suffixes and "__pycache__" not in path.parts:
                names.add(f"{name}/{path.relative_to(ROOT / folder).as_posix()}")
    return names


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built from a copy of the tree (the build writes build/ and egg-info beside it)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in INSTALLED_AS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    dist = tmp_path_factory.mktemp("dist")
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(dist),
        ".",
    ]
    proc = subprocess.run(cmd, cwd=src, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (path,) = dist.glob("ninfer-*.whl")
    return path


def test_pyproject_lists_every_package_under_its_installed_name():
    """setuptools cannot rename a folder while finding packages, so pyproject lists them: a new package folder
    left off that list would be missing from the install."""
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = []
    for folder, name in INSTALLED_AS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.append(".".join((name, *parts)))
    assert sorted(listed) == sorted(found)


def test_wheel_holds_the_tree_under_installed_names_and_no_kernels_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {name.split("/")[0] for name in names}
    dist_info = "-".join(wheel.name.split("-")[:2]) + ".dist-info"
    assert tops == {"ninfer_cli", "engine", "ninfer_kernels", dist_info}
    shipped = {name for name in names if not name.startswith("ninfer-")}
    assert shipped == _tree_files((".py", ".c", ".h"))


def test_installed_wheel_imports_beside_hugging_face_kernels(wheel, tmp_path):
    """The wheel unpacked as pip installs it, with Hugging Face's `kernels` (transformers' dependency) in the
    same environment: both import, transformers imports, and the CPU ops find their C sources in the
    install."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import kernels, ninfer_kernels, transformers, torch\n"
        "from ninfer_kernels import native_build\n"
        "from transformers import AutoModelForCausalLM\n"
        f"assert ninfer_kernels.__file__.startswith({str(site)!r}), ninfer_kernels.__file__\n"
        "assert not kernels.__file__.startswith({site!r}), kernels.__file__\n"
        "print(kernels.__name__, len(native_build.sources()), len(native_build.headers()))\n"
        "x = torch.randn(3, 64)\n"
        "w = torch.ones(64)\n"
        "y = ninfer_kernels.rmsnorm(x, w, 1e-6)\n"
        "ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)\n"
        "assert torch.allclose(y, ref, atol=1e-5), (y - ref).abs().max()\n"
    ).replace("{site!r}", repr(str(site)))
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    c_sources = {p for p in _tree_files((".c",)) if p.startswith("ninfer_kernels/")}
    h_sources = {p for p in _tree_files((".h",)) if p.startswith("ninfer_kernels/")}
    assert proc.stdout.split() == ["kernels", str(len(c_sources)), str(len(h_sources))]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalized (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def test_the_installed_code_imports_only_its_declared_dependencies():
    """Every import in engine/, ninfer_cli/ and kernels/ (at the top or inside a function) is the standard
    library, the project, or a distribution pyproject depends on (or one of those requires, as FastAPI
    brings Starlette): a dev-only package (transformers, the SDKs) imported by the engine would break a
    plain `pip install ninfer`."""
    declared = {
        _name(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    allowed = set(declared)
    for dist in declared:
        allowed |= {_name(r) for r in importlib.metadata.requires(dist) or () if "extra ==" not in r}
    providers = importlib.metadata.packages_distributions()
    strays: dict[str, set[str]] = {}
    for folder in INSTALLED_AS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for top in {name.split(".")[0] for name in names}:
                    if top in sys.stdlib_module_names or top in INSTALLED_AS.values():
                        continue
                    if not {_name(d) for d in providers.get(top, ())} & allowed:
                        strays.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert not strays, f"imported but not a dependency in pyproject: {strays}"
