"""``[judge]``: the LLM judge, a lake-side reward function, and the rubric it scores by."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from schemas.config.base import Section

# The rubric the LLM judge ([judge]) scores by unless the operator gives one: what a good trajectory is.
# It is this setting's default, so it lives here rather than beside the prompt (pipelines.silver.judging.prompt):
# a judgement's source hashes the rubric in force, so the default has to be what settings say.
JUDGE_RUBRIC = """\
A trajectory is better the more fully and correctly it achieves the user's task.
- One that reaches a correct final answer beats one that does not.
- Among correct ones, prefer those that use tools sensibly and reach the answer in fewer steps.
- An answer that contradicts the tool results it was shown, or makes things up, is worse than no answer.
- A trajectory that failed or timed out is worse than one that finished, unless both failed equally."""
_JUDGE_NAME = r"^[A-Za-z0-9_.:-]+$"


class JudgeSettings(Section):
    """The LLM judge: a lake-side reward function that ranks a group of trajectories with the served model.

    Each group (the finished rollouts of one task; rollouts without a task id, or every rollout with
    ``group_by = "agent"``, in windows of one agent's rollouts by end time) is shown to the model with
    ``rubric``, which scores every member; the member's reward ``name`` is its rank in the group, in
    [0, 1] (OpenPipe RULER's relative judging). The judge calls vLLM itself, never through the gateway:
    its calls are not training data. ``url`` empty: the stack's vLLM; ``model`` empty: the bare base
    model (``model.base_served_name``), which training does not change, so a version keeps one meaning.
    The API key, where the server wants one, is read from the environment variable ``api_key_env``.
    """

    enabled: bool = False
    name: str = Field("judge", pattern=_JUDGE_NAME)  # the reward's name: [credit] reward = "judge" trains on it
    version: str = Field("1", pattern=_JUDGE_NAME)  # bump to judge every trajectory again
    url: str = ""
    model: str = ""
    rubric: str = JUDGE_RUBRIC
    group_by: Literal["task", "agent"] = "task"
    window: int = Field(8, ge=2, le=64)  # the most trajectories one judgement ranks
    max_tokens: int = Field(1024, ge=16)  # of the judge's answer
    max_chars: int = Field(3000, ge=200)  # of one trajectory's text in the prompt (the middle is cut)
    temperature: float = Field(0.0, ge=0, le=2)
    timeout_s: float = Field(120.0, gt=0)
    concurrency: int = Field(4, ge=1, le=64)  # judgements in flight at once
    # Constrain the answer to the JSON schema (vLLM's response_format json_schema): small models then
    # always answer in form. Turn off for a server without structured output.
    guided: bool = True
    api_key_env: str = Field("AGENTLAKE_JUDGE_API_KEY", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        v = v.strip()
        if v and (urlsplit(v).scheme not in ("http", "https") or not urlsplit(v).hostname):
            raise ValueError(
                "expected http(s)://host:port of an OpenAI-compatible server (vLLM), or empty: the stack's"
            )
        return v.rstrip("/")

    @field_validator("rubric")
    @classmethod
    def _rubric_given(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the rubric is empty: say what makes a trajectory good (or leave it out for the default)")
        return v

    def resolved(self, vllm_url: str, base_served_name: str) -> JudgeSettings:
        """These settings with an empty ``url`` and ``model`` filled in: the stack's vLLM and base model."""
        url = self.url or vllm_url.rstrip("/")
        return self.model_copy(update={"url": url, "model": self.model or base_served_name})
