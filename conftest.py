"""Test-wide isolation: installed third-party plugins do not leak into tests unless asked.

Core tests see built-in plugins only (``RLCORE_PLUGINS=""``). A plugin package's tests override the
``rlcore_plugins`` fixture in their own conftest to name their distribution(s).
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rlcore_plugins() -> str:
    """Comma-separated distributions whose plugins load in this test ('' = built-ins only)."""
    return ""


@pytest.fixture(autouse=True)
def _isolate_plugins(rlcore_plugins: str, monkeypatch: pytest.MonkeyPatch):
    import rlcore

    monkeypatch.setenv("RLCORE_PLUGINS", rlcore_plugins)
    rlcore.reload_plugins()
    yield
    monkeypatch.setenv("RLCORE_PLUGINS", rlcore_plugins)


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """Path of the offline tiny Qwen2 model (built once, cached)."""
    from rlcore.testing import tiny_model_path

    return tiny_model_path()
