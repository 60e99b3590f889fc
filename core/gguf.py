"""GGUF files as models: ``--model path/to/file.gguf`` works wherever a model directory does.

transformers reads a GGUF file (with the ``gguf`` package) and de-quantises its tensors on load, but
the object it returns keeps the file's ``quantization_config``: it refuses ``save_pretrained`` and
``transformers.Trainer`` refuses to train it as a "purely quantized model". So a GGUF file is turned,
once, into an ordinary float32 model directory (config without ``quantization_config``, safetensors
weights, the tokenizer and chat template the file carries) in rlcore's cache, and that directory is
what every part of a run loads: the policy, the reference model, the tokenizer, each sampler, Ray
workers. The cache is keyed by the file's resolved path, size and modification time, so an edited
file is converted again and an unchanged one never is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from .errors import ConfigError, MissingDependencyError

#: bumped when the conversion writes something different, so old cache entries are not reused
FORMAT_VERSION = 1


def is_gguf(path: Any) -> bool:
    """Whether ``path`` names a GGUF file (by its suffix; it need not exist yet)."""
    return isinstance(path, (str, os.PathLike)) and str(path).lower().endswith(".gguf")


def cache_root() -> Path:
    """Where converted models live: ``$RLCORE_CACHE/gguf`` (default ``~/.cache/rlcore/gguf``)."""
    root = os.environ.get("RLCORE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rlcore")
    return Path(root) / "gguf"


def converted_dir(path: str | os.PathLike[str], cache: str | os.PathLike[str] | None = None) -> Path:
    """The cache directory ``path`` converts to (whether or not it exists yet)."""
    file = Path(path).expanduser().resolve()
    st = file.stat()
    key = hashlib.sha1(f"{FORMAT_VERSION}|{file}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    return (Path(cache) if cache is not None else cache_root()) / f"{file.stem}-{key}"


def resolve_model(model: Any, cache: str | os.PathLike[str] | None = None) -> Any:
    """``model`` itself unless it is a GGUF file; for one, the path of its converted float32 model
    directory (converted on first use). Anything that is not a path passes through untouched."""
    if not is_gguf(model):
        return model
    file = Path(model).expanduser()
    if not file.is_file():
        raise ConfigError(f"GGUF file {model} does not exist; pass an existing .gguf file, a model directory or a Hugging Face id")
    target = converted_dir(file, cache)
    if _complete(target):
        return str(target)
    try:
        import gguf  # noqa: F401 - transformers needs it to read the file
    except ImportError as exc:
        raise MissingDependencyError(f"loading {file.name} needs the gguf package: pip install gguf (or 'rlcore[gguf]')") from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    print(f"rlcore: de-quantising {file.name} into {target} (float32, once)", file=sys.stderr, flush=True)
    try:
        convert(file, tmp)
        os.chmod(tmp, 0o755)  # mkdtemp's 0700 would hide the model from other users of a shared cache
        try:
            os.rename(tmp, target)
        except OSError:  # another process converted the same file first; its copy is the same
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(target)


def _complete(target: Path) -> bool:
    return (target / "config.json").is_file() and (target / "model.safetensors").is_file() and (target / "tokenizer_config.json").is_file()


def convert(file: str | os.PathLike[str], out: str | os.PathLike[str]) -> None:
    """Write the GGUF ``file`` as an ordinary float32 transformers model directory at ``out``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    file = Path(file)
    where, name = str(file.parent), file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as exc:
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise ConfigError(f"cannot read {file} as a GGUF model: {reason}") from exc
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)  # the weights are de-quantised: this is a plain model now
    config_dict.pop("_name_or_path", None)
    model_type = config_dict.pop("model_type")
    config = AutoConfig.for_model(model_type, **config_dict)
    with torch.device("meta"):  # no second copy of the weights: the loaded tensors are assigned
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(out)
