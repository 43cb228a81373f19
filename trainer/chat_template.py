"""The policy's chat template: one template for the trainer, the retokenizer and vLLM.

A model folder carries its template (``chat_template.jinja``, and ``tokenizer_config.json["chat_template"]``
for older transformers), and everything that renders a prompt reads it from there: transformers'
``AutoTokenizer`` in the trainer and the retokenizer, vLLM's server. For the shipped base model the model
store installs ``templates/smollm2_tools.jinja`` into the converted folder (``install``): the model's own
ChatML, plus tools, tool calls and tool results in the format of vLLM's ``hermes`` tool parser.

``model.chat_template`` (a Jinja file) replaces the folder's template for all three: vLLM gets it as
``--chat-template``, the trainer and the retokenizer set it on their tokenizer (``apply``).
Importing this module imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from trainer.errors import TrainerError

TEMPLATES = Path(__file__).with_name("templates")
FOLDER_FILE = "chat_template.jinja"  # where transformers 5 keeps a folder's template
TOKENIZER_CONFIG = "tokenizer_config.json"  # where transformers 4.x looks for it


class ChatTemplateError(TrainerError):
    """A chat template could not be read or installed."""


def shipped(name: str) -> str:
    """The text of a template shipped in this package (``templates/<name>``)."""
    path = TEMPLATES / name
    if not path.is_file():
        raise ChatTemplateError(f"no shipped chat template {name!r} in {TEMPLATES}; is the package installed whole?")
    return path.read_text()


def read(path: str | Path) -> str:
    """A template file's text (``model.chat_template``), or an error that says what to fix."""
    path = Path(path).expanduser()
    try:
        text = path.read_text()
    except OSError as exc:
        raise ChatTemplateError(
            f"cannot read the chat template {path} ({exc.strerror or exc}): set model.chat_template to a "
            "Jinja file, or leave it empty for the model folder's own template"
        ) from exc
    if not text.strip():
        raise ChatTemplateError(f"the chat template {path} is empty")
    return text


def folder_template(folder: Path) -> str | None:
    """The template a model folder carries (transformers 5's file first, then tokenizer_config.json's)."""
    file = Path(folder) / FOLDER_FILE
    if file.is_file():
        return file.read_text()
    config = Path(folder) / TOKENIZER_CONFIG
    if config.is_file():
        value = json.loads(config.read_text()).get("chat_template")
        return value if isinstance(value, str) else None
    return None


def _replace(path: Path, text: str) -> None:
    """Write ``text`` through a temporary file and a rename: a reader sees the old file or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def install(folder: Path, template: str) -> bool:
    """Make ``template`` the model folder's own, in both places transformers reads; True when it changed.

    Idempotent and cheap when the folder already carries it (two small reads)."""
    folder = Path(folder)
    file = folder / FOLDER_FILE
    config_path = folder / TOKENIZER_CONFIG
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    current = file.read_text() if file.is_file() else None
    if current == template and config.get("chat_template") == template:
        return False
    _replace(file, template)
    config["chat_template"] = template
    _replace(config_path, json.dumps(config, indent=2) + "\n")
    return True


def apply(tokenizer: Any, chat_template: str | Path | None) -> Any:  # noqa: ANN401 - any HF tokenizer
    """``tokenizer`` with ``model.chat_template`` set on it when one is given (else its folder's own)."""
    if chat_template:
        tokenizer.chat_template = read(chat_template)
    return tokenizer
