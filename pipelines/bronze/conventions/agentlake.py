"""Ours: ``agentlake.*``, written by the SDK and the gateway (exact token ids, policy version)."""

from pipelines.bronze.conventions.base import Convention
from schemas import attributes as A

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
    reward_span_name=A.REWARD_SPAN_NAME,
    reward_name_key=A.REWARD_NAME,
    reward_columns=(A.REWARD_VALUE, A.REWARD_NAME),
)
