"""OpenTelemetry GenAI semantic conventions (``gen_ai.*``): the current names, and the pre-1.37 ones.

The pre-1.37 names flattened messages one attribute per field (``gen_ai.prompt.{i}.role``); they
are a convention of their own because they rank after OpenInference's flattened messages.
"""

from pipelines.bronze.conventions.base import Convention, FlatMessages
from schemas import attributes as A

GEN_AI = Convention(
    name="gen_ai",
    agent_name=(A.GEN_AI_AGENT_NAME,),
    response_id=(A.GEN_AI_RESPONSE_ID,),
    model=(A.GEN_AI_RESPONSE_MODEL, A.GEN_AI_REQUEST_MODEL),
    input_messages=(A.GEN_AI_INPUT_MESSAGES,),
    output_messages=(A.GEN_AI_OUTPUT_MESSAGES,),
)

GEN_AI_PRE_1_37 = Convention(
    name="gen_ai (pre-1.37)",
    flat_messages=FlatMessages(A.GEN_AI_PROMPT_PREFIX_OLD, A.GEN_AI_COMPLETION_PREFIX_OLD, "role", "content"),
)
