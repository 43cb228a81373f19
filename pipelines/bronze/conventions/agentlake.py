"""Ours: ``agentlake.*``, written by the SDK and the gateway (exact token ids, policy version).

The gateway records the request's messages under the GenAI keys (read by `gen_ai`, in the internal
shape already) and the request's tools under ``agentlake.llm.tools``, read here.
"""

from __future__ import annotations

from pipelines.bronze.conventions.base import Attributes, Convention, Direction, MessageReader
from pipelines.bronze.conventions.internal import Message, Tool, list_of_objects, load_json, openai_tool
from schemas import attributes as A


def _no_messages(attrs: Attributes, direction: Direction) -> list[Message] | None:
    return None


def read_tools(attrs: Attributes) -> list[Tool] | None:
    raw = attrs.get(A.LLM_TOOLS)
    if raw is None:
        return None
    return [t for d in list_of_objects(A.LLM_TOOLS, load_json(A.LLM_TOOLS, raw)) if (t := openai_tool(d)) is not None]


AGENTLAKE = Convention(
    name="agentlake",
    rollout_id=(A.ROLLOUT_ID,),
    attempt_id=(A.ATTEMPT_ID,),
    task_id=(A.TASK_ID,),
    agent_name=(A.AGENT_NAME,),
    rollout_status=(A.ROLLOUT_STATUS,),
    response_id=(A.LLM_RESPONSE_ID,),
    model=(A.LLM_SERVED_MODEL,),
    policy_version=(A.LLM_POLICY_VERSION,),
    policy_sha256=(A.LLM_POLICY_SHA256,),
    prompt_token_ids=(A.LLM_PROMPT_TOKEN_IDS,),
    completion_token_ids=(A.LLM_COMPLETION_TOKEN_IDS,),
    completion_logprobs=(A.LLM_COMPLETION_LOGPROBS,),
    messages=MessageReader(_no_messages, read_tools, keys=(A.LLM_TOOLS,)),
    reward_span_name=A.REWARD_SPAN_NAME,
    reward_name_key=A.REWARD_NAME,
    reward_columns=(A.REWARD_VALUE, A.REWARD_NAME),
)
