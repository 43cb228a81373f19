"""Agent Lightning (``agentlightning.*``): rollout and attempt ids, its LLM proxy's token ids, and
its reward spans (``agentlightning.annotation`` with ``agentlightning.reward.{i}.value``)."""

from pipelines.bronze.conventions.base import Convention
from schemas import attributes as A

AGENT_LIGHTNING = Convention(
    name="agentlightning",
    rollout_id=(A.AGL_ROLLOUT_ID,),
    attempt_id=(A.AGL_ATTEMPT_ID,),
    prompt_token_ids=(A.AGL_PROMPT_TOKEN_IDS,),
    completion_token_ids=(A.AGL_RESPONSE_TOKEN_IDS,),
    reward_span_name=A.AGL_REWARD_SPAN_NAME,
    reward_name_key=f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_NAME_SUFFIX}",
)
