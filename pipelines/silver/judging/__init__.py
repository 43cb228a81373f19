"""The LLM judge: a group reward function that ranks trajectories with the served model (``[judge]``).

prompt   what the judge is shown and asked, how its answer is read, scores -> ranks (pure)
client   the HTTP call to vLLM itself (not the gateway: judging is not training data)
cache    the `judgements` table: a question asked before is answered from the lake
judge    ``LlmJudge``: the three together, as `pipelines.silver.reward_functions` calls a group function
"""
