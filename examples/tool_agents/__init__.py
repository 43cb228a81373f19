"""The math task solved with a native function tool, by agents built on three frameworks.

Each agent declares ``calculate`` as a real tool (``tools=[...]`` on the request, ``tool_calls`` in
the reply, a ``role: "tool"`` result) and is traced by its framework's standard OTel instrumentation:

- ``openai_agents``: the OpenAI Agents SDK (``@function_tool``), traced by OpenInference;
- ``langgraph_agent``: LangGraph with ``ChatOpenAI.bind_tools``, traced by OpenInference's LangChain
  instrumentation;
- ``pydantic_ai_agent``: PydanticAI, traced by its own instrumentation (the OTel GenAI conventions).

No agentlake code runs inside their loops: ``agentlake.rollout`` names the rollout, and the reward
is one span at the end. Point ``base_url`` at the gateway for exact token ids, or at vLLM directly
(the lake then retokenizes the recorded messages, tools included).
"""
