"""Agent Lightning (``agentlightning.*``): rollout and attempt ids, the token ids vLLM returned, and
its reward spans (``agentlightning.annotation`` with ``agentlightning.reward.{i}.value``).

Token ids are where its LLM proxy's LiteLLM patch writes them (``prompt_token_ids``,
``response_token_ids``), or where its Weave tracer flattens the call's output
(``agentlightning.operation.output.*``, with vLLM >= 0.10.2's ``choices.0.token_ids``), in the order
its own triplet adapter reads them.
"""

from pipelines.bronze.conventions.base import Convention
from schemas import attributes as A

AGENT_LIGHTNING = Convention(
    name="agentlightning",
    rollout_id=(A.AGL_ROLLOUT_ID,),
    attempt_id=(A.AGL_ATTEMPT_ID,),
    response_id=(A.AGL_WEAVE_RESPONSE_ID,),
    prompt_token_ids=(A.AGL_PROMPT_TOKEN_IDS, A.AGL_WEAVE_PROMPT_TOKEN_IDS),
    completion_token_ids=(A.AGL_RESPONSE_TOKEN_IDS, *A.AGL_WEAVE_RESPONSE_TOKEN_IDS),
    reward_span_name=A.AGL_REWARD_SPAN_NAME,
    reward_name_key=f"{A.AGL_REWARD_PREFIX}.0.{A.AGL_REWARD_NAME_SUFFIX}",
)
