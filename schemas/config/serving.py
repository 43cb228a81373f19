"""``[model]``, ``[vllm]`` and ``[serving]``: the model, the vLLM that serves it, and the release bus."""

from __future__ import annotations

import os
import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from schemas.config.base import Section

# A trained agent's name (trainer.agents): it is matched exactly and becomes part of a served model name.
AGENT_LINE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# A vLLM tool parser's name (`--tool-call-parser`: hermes, llama3_json, mistral, granite-20b-fc, ...).
TOOL_PARSER_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")


def policy_served_name(served_name: str, agent: str | None) -> str:
    """The name vLLM serves an agent's policy line under (``agentlake-policy-planner``); None: the single policy.

    One spelling for the trainer, the publisher and the gateway's routing."""
    return f"{served_name}-{agent}" if agent else served_name


def registry_version(policy_version: str) -> str:
    """The registry's version (``v0004``) of a call's policy version as the gateway records it: the served
    name and the adapter's folder, ``agentlake-policy@v0004`` (a bare ``v0004`` stays as it is)."""
    return policy_version.rpartition("@")[2]


class ModelSettings(Section):
    base: str = "smollm2-135m"  # a name `agentlake model pull` knows, or a local HF folder
    cache_dir: Path = Path(".agentlake/models")
    # Agents call `served_name`: the published policy, a LoRA adapter hot-loaded under that name.
    # vLLM serves the bare base model as `base_served_name`, so the two never shadow each other.
    served_name: str = "agentlake-policy"
    base_served_name: str = "agentlake-base"
    # The chat template (a Jinja file) the trainer, the retokenizer and vLLM all render with. None: the model
    # folder's own; the shipped base model's folder carries ours, which renders tools and tool calls for
    # vLLM's `hermes` parser (trainer/templates). Set it for a model whose own template lacks them.
    chat_template: Path | None = None

    @field_validator("chat_template")
    @classmethod
    def _template_file(cls, v: Path | None) -> Path | None:
        if v is None or str(v).strip() in ("", "."):
            return None
        path = v.expanduser()
        if not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            raise ValueError(
                f"{path} {what}: give the path of a Jinja chat template file, or leave model.chat_template "
                "out to use the model folder's own template"
            )
        return path.absolute()


class VllmSettings(Section):
    enabled: bool = False  # `agentlake up` starts vLLM only when asked
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    venv: Path = Path(".venv-vllm")
    extra_args: list[str] = Field(default_factory=list)
    max_model_len: int = Field(2048, ge=64)
    max_lora_rank: int = Field(16, ge=1)
    startup_timeout_s: float = Field(600.0, gt=0)
    # The tool parser vLLM reads tool calls with (`--enable-auto-tool-choice --tool-call-parser <it>`), so that
    # requests with `tools` and `tool_choice: "auto"` are served. None: the one matching the shipped model's
    # template ("hermes") when model.base is the shipped model, none for a model of your own; "": off.
    # It must read the format the chat template (model.chat_template) renders tool calls in.
    tool_call_parser: str | None = None

    @field_validator("tool_call_parser")
    @classmethod
    def _parser_name(cls, v: str | None) -> str | None:
        if v is None:
            return None
        v = v.strip()
        if v and not TOOL_PARSER_PATTERN.fullmatch(v):
            raise ValueError(
                f"{v!r} is not a vLLM tool parser name (such as hermes, llama3_json, mistral, pythonic): "
                'name one of vLLM\'s, or "" to serve without tool calling'
            )
        return v

    # How a full-weight version is served where no CLI manages this vLLM (the `policy` asset in Dagster):
    # argv run with "{folder}" replaced by the version's local folder; it must return once vLLM restarts on
    # it (serving.restart). Empty: only `agentlake model publish`, which restarts the local vLLM, can.
    restart_command: list[str] = Field(default_factory=list)
    # vLLM started with --api-key wants it on every call: read from this environment variable (vLLM's own
    # name by default), never from a file; unset or empty: no key is sent.
    api_key_env: str = Field("VLLM_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def api_key(self) -> str:
        """The key vLLM wants, from ``api_key_env`` ("" when unset)."""
        return os.environ.get(self.api_key_env, "")


class ServingSettings(Section):
    """The release bus: vLLM replicas, each with a loader beside it (`agentlake loader`, serving.loader).

    A publisher with ``replicas`` sends a release command on ``kafka.models_topic`` and waits up to
    ``ack_timeout_s`` for an ack from each of them on ``kafka.model_acks_topic``; empty ``replicas``:
    the trainer loads its one vLLM (``vllm.url``) directly. ``replica`` and ``vllm_url`` are the loader's
    own: its name in acks and the vLLM beside it (empty: ``vllm.url``). ``loader`` (on by default): `agentlake
    up --vllm` starts a loader beside the local vLLM, which loads the registry's versions into it.
    ``cache_dir``: where the loader keeps downloaded versions (empty:
    ``<model.cache_dir>/serving``).

    Full-weight versions (``trainer.finetune = "full"``) go to one replica at a time: the publisher sends the
    next replica its command only after the previous one acked. A loader serves one by restarting its vLLM:
    ``restart_command`` (the loader's own, an argv with ``{folder}``, run like ``vllm.restart_command``: it must
    return once vLLM runs on that folder, e.g. ``["systemctl", "restart", "vllm@{folder}"]``; empty: this
    replica refuses full-weight versions), ``restart_timeout_s`` (the command, then vLLM's health), and
    ``gateway_url`` (the gateway in front of this replica, paused around the restart with
    ``gateway.admin_token``; empty: none is paused).

    With ``trainer.eval_tasks`` too, the gate runs on one replica before any release: the ``canary`` (empty:
    the first of ``replicas``) scores the candidate beside what it serves (serving.canary), and only a
    candidate that is not worse is released to every replica.
    """

    replica: str = Field("", pattern=r"^[A-Za-z0-9_.-]*$")
    vllm_url: str = ""
    replicas: list[str] = Field(default_factory=list)
    ack_timeout_s: float = Field(120.0, gt=0)
    loader: bool = True
    cache_dir: Path | None = None
    check_prompt: str = "Hello"  # the one generation that proves a loaded adapter answers
    restart_command: list[str] = Field(default_factory=list)
    restart_timeout_s: float = Field(600.0, gt=0)
    gateway_url: str = ""
    canary: str = ""  # the replica whose loader scores candidates on trainer.eval_tasks (empty: replicas[0])
    # A loader loads each policy line's registry version (model_versions) that its vLLM lacks, at start and
    # every resync_s (a vLLM that restarted serves only the base model), holding the gateway's policy names
    # (503 + Retry-After) until then; resync_s is also how often it checks that vLLM serves what was released.
    follow_registry: bool = True
    resync_s: float = Field(5.0, gt=0)
    # How sure the eval gate must be before it rejects: a candidate is `rejected` only when this confidence
    # interval of its paired difference from serving (a bootstrap over tasks, serving.evaluation) lies wholly
    # below zero. 0.95 rejects only what is worse beyond noise; higher is more lenient; 0 rejects any lower mean.
    eval_gate_confidence: float = Field(0.95, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _canary_is_a_replica(self) -> ServingSettings:
        if self.canary and self.canary not in self.replicas:
            raise ValueError(
                f"serving.canary {self.canary!r} is not one of serving.replicas {self.replicas}: "
                "name one of them, or leave it empty for the first"
            )
        return self

    def canary_replica(self) -> str:
        """The replica that scores candidates: ``canary``, else the first of ``replicas`` ("" without replicas)."""
        return self.canary or (self.replicas[0] if self.replicas else "")
