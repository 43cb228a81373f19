"""Span attribute names: the ``agentlake.*`` keys we write and the foreign keys we read.

This module is the only place attribute names are spelled. It imports nothing.
"""

from __future__ import annotations

# --- span names we write -------------------------------------------------------------------
REWARD_SPAN_NAME = "agentlake.reward"
ROLLOUT_SPAN_NAME = "agentlake.rollout"
LLM_CALL_SPAN_NAME = "agentlake.llm.call"
GATEWAY_SERVICE_NAME = "agentlake-gateway"  # service.name of the gateway's own spans

# --- agentlake.* keys (resource or span) ---------------------------------------------------
ROLLOUT_ID = "agentlake.rollout.id"
ATTEMPT_ID = "agentlake.attempt.id"
TASK_ID = "agentlake.task.id"
AGENT_NAME = "agentlake.agent.name"
TENANT = "agentlake.tenant"
ROLLOUT_STATUS = "agentlake.rollout.status"  # "finished" | "failed" | "running"

REWARD_VALUE = "agentlake.reward.value"
REWARD_NAME = "agentlake.reward.name"
PRIMARY_REWARD_NAME = "primary"

LLM_PROMPT_TOKEN_IDS = "agentlake.llm.prompt_token_ids"
LLM_COMPLETION_TOKEN_IDS = "agentlake.llm.completion_token_ids"
LLM_COMPLETION_LOGPROBS = "agentlake.llm.completion_logprobs"
LLM_RESPONSE_ID = "agentlake.llm.response_id"
LLM_POLICY_VERSION = "agentlake.llm.policy_version"
# sha256 of the served adapter's manifest.json: with the version name, proof of which files served the call
LLM_POLICY_SHA256 = "agentlake.llm.policy_sha256"
LLM_SERVED_MODEL = "agentlake.llm.served_model"
LLM_ADAPTER = "agentlake.llm.adapter"
LLM_UPSTREAM = "agentlake.llm.upstream"
LLM_LATENCY_MS = "agentlake.llm.latency_ms"
LLM_STREAMED = "agentlake.llm.streamed"
LLM_CHOICE_INDEX = "agentlake.llm.choice_index"  # which choice of an answer with several (`n > 1`)
# the request's tool definitions (JSON list of OpenAI tool objects), beside gen_ai.input.messages
LLM_TOOLS = "agentlake.llm.tools"

# --- OpenTelemetry GenAI semantic conventions (new names, then older ones we still read) ---
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"  # JSON list of tool definitions (1.37+)
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
# older (pre-1.37) names: flattened prompt/completion and usage
GEN_AI_PROMPT_PREFIX_OLD = "gen_ai.prompt."  # gen_ai.prompt.{i}.role / .content
GEN_AI_COMPLETION_PREFIX_OLD = "gen_ai.completion."  # gen_ai.completion.{i}.role / .content
# OpenLLMetry's (traceloop) additions to the old layout: gen_ai.prompt.{i}.tool_calls.{j}.{id,name,arguments},
# gen_ai.prompt.{i}.tool_call_id, and the request's tools as llm.request.functions.{i}.{name,description,parameters}
OLD_TOOL_CALLS = "tool_calls."
OLD_TOOL_CALL_ID = "tool_call_id"
LLM_REQUEST_FUNCTIONS_PREFIX = "llm.request.functions."

# --- OpenInference ---------------------------------------------------------------------------
OI_SPAN_KIND = "openinference.span.kind"  # "LLM", "AGENT", "TOOL", "CHAIN", ...
OI_SPAN_KIND_LLM = "LLM"
OI_OUTPUT_VALUE = "output.value"  # an LLM span's raw response; for OpenAI, JSON with the response "id"
OI_LLM_INPUT_MESSAGES_PREFIX = "llm.input_messages."  # llm.input_messages.{i}.message.role / .content
OI_LLM_OUTPUT_MESSAGES_PREFIX = "llm.output_messages."
OI_MESSAGE_ROLE_SUFFIX = "message.role"
OI_MESSAGE_CONTENT_SUFFIX = "message.content"
OI_MESSAGE_CONTENTS = "message.contents."  # message.contents.{j}.message_content.{type,text}
OI_MESSAGE_TOOL_CALLS = "message.tool_calls."  # message.tool_calls.{j}.tool_call.{id,function.name,function.arguments}
OI_MESSAGE_TOOL_CALL_ID = "message.tool_call_id"
OI_MESSAGE_NAME = "message.name"
OI_LLM_TOOLS_PREFIX = "llm.tools."  # llm.tools.{i}.tool.json_schema: the OpenAI tool object as JSON text
OI_TOOL_JSON_SCHEMA = "tool.json_schema"
OI_LLM_MODEL_NAME = "llm.model_name"
OI_AGENT_NAME = "agent.name"

# --- Agent Lightning -------------------------------------------------------------------------
AGL_REWARD_SPAN_NAME = "agentlightning.annotation"
AGL_REWARD_PREFIX = "agentlightning.reward"  # agentlightning.reward.{i}.name / .value
AGL_ROLLOUT_ID = "agentlightning.rollout_id"
AGL_ATTEMPT_ID = "agentlightning.attempt_id"
AGL_PROMPT_TOKEN_IDS = "prompt_token_ids"  # written by Agent Lightning's LLM proxy
AGL_RESPONSE_TOKEN_IDS = "response_token_ids"
# its Weave tracer flattens the call's output object under this prefix (agentlightning 0.2's
# adapter/triplet.py reads these): the ids of old vLLM's patched answer, of vLLM >= 0.10.2's
# ``return_token_ids`` choice, and of that choice through LiteLLM
AGL_WEAVE_OUTPUT = "agentlightning.operation.output."
AGL_WEAVE_PROMPT_TOKEN_IDS = f"{AGL_WEAVE_OUTPUT}prompt_token_ids"
AGL_WEAVE_RESPONSE_TOKEN_IDS: tuple[str, ...] = (
    f"{AGL_WEAVE_OUTPUT}response_token_ids.0",
    f"{AGL_WEAVE_OUTPUT}choices.0.token_ids",
    f"{AGL_WEAVE_OUTPUT}choices.0.provider_specific_fields.token_ids",
)
AGL_WEAVE_RESPONSE_ID = f"{AGL_WEAVE_OUTPUT}id"
AGL_REWARD_VALUE_SUFFIX = "value"  # agentlightning.reward.{i}.value
AGL_REWARD_NAME_SUFFIX = "name"  # agentlightning.reward.{i}.name
AGL_LEGACY_REWARD = "reward"  # older Agent Lightning reward spans carry a bare "reward" attribute

# --- OTel resource -----------------------------------------------------------------------------
SERVICE_NAME = "service.name"

# --- fallbacks, in the order they are tried ----------------------------------------------------
AGENT_NAME_KEYS: tuple[str, ...] = (AGENT_NAME, GEN_AI_AGENT_NAME, OI_AGENT_NAME)
ROLLOUT_ID_KEYS: tuple[str, ...] = (ROLLOUT_ID, AGL_ROLLOUT_ID)
ATTEMPT_ID_KEYS: tuple[str, ...] = (ATTEMPT_ID, AGL_ATTEMPT_ID)
PROMPT_TOKEN_IDS_KEYS: tuple[str, ...] = (LLM_PROMPT_TOKEN_IDS, AGL_PROMPT_TOKEN_IDS, AGL_WEAVE_PROMPT_TOKEN_IDS)
COMPLETION_TOKEN_IDS_KEYS: tuple[str, ...] = (
    LLM_COMPLETION_TOKEN_IDS,
    AGL_RESPONSE_TOKEN_IDS,
    *AGL_WEAVE_RESPONSE_TOKEN_IDS,
)
RESPONSE_ID_KEYS: tuple[str, ...] = (LLM_RESPONSE_ID, GEN_AI_RESPONSE_ID)
MODEL_KEYS: tuple[str, ...] = (LLM_SERVED_MODEL, GEN_AI_RESPONSE_MODEL, GEN_AI_REQUEST_MODEL, OI_LLM_MODEL_NAME)
