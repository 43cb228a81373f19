"""The math task with LangGraph: ``ChatOpenAI`` with the ``calculate`` tool bound, a two-node graph (the
model, then LangGraph's ``ToolNode`` while the model calls tools), traced by OpenInference's LangChain
instrumentation."""

from __future__ import annotations

from typing import Any

import httpx
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.errors import GraphRecursionError
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

import agentlake
from examples.math_agent.calculator import is_correct
from examples.math_agent.tasks import MathTask
from examples.tool_agents import calculator_tool as calc
from examples.tool_agents.plumbing import ToolRolloutResult, gather_limited, rollout_http_client, traced_provider

AGENT_NAME = "langgraph-tools"


@tool(calc.TOOL_NAME)
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression such as 12 * 34 and return the result."""
    return calc.calculate(expression)


def setup(endpoint: str | None = None, *, exporter: SpanExporter | None = None) -> TracerProvider:
    """Trace to the collector (or ``exporter``) through OpenInference's LangChain instrumentation."""
    provider = traced_provider(AGENT_NAME, endpoint, exporter)
    instrumentor = LangChainInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    instrumentor.instrument(tracer_provider=provider)
    return provider


def worked_example() -> list[BaseMessage]:
    """The worked example as LangChain messages."""
    call = {"name": calc.TOOL_NAME, "args": {"expression": "23 * 47"}, "id": calc.EXAMPLE_CALL_ID}
    return [
        SystemMessage(calc.AGENT_SYSTEM_PROMPT),
        HumanMessage(calc.EXAMPLE_QUESTION),
        AIMessage(content="", tool_calls=[call]),
        ToolMessage(calc.EXAMPLE_RESULT, tool_call_id=calc.EXAMPLE_CALL_ID),
        AIMessage(calc.EXAMPLE_ANSWER),
    ]


def make_graph(model: ChatOpenAI) -> CompiledStateGraph[Any, Any, Any, Any]:
    """model -> (tools -> model)* -> end, the loop LangGraph's ReAct agents run."""
    bound = model.bind_tools([calculate])

    async def call_model(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", ToolNode([calculate]))
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", tools_condition)
    graph.add_edge("tools", "model")
    return graph.compile()


async def run_rollout(
    graph: CompiledStateGraph[Any, Any, Any, Any], task: MathTask, *, max_turns: int = 4
) -> ToolRolloutResult:
    """One task inside ``agentlake.rollout``; reward 1 for the exact final answer (0 when the graph runs out
    of turns)."""
    with agentlake.rollout(task_id=task.task_id, agent_name=AGENT_NAME) as r:
        assert r.rollout_id is not None
        result = ToolRolloutResult(task_id=task.task_id, rollout_id=r.rollout_id)
        start = [*worked_example(), HumanMessage(task.question)]
        try:
            state = await graph.ainvoke({"messages": start}, {"recursion_limit": 2 * max_turns})
            new = state["messages"][len(start) :]
            replies = [m for m in new if isinstance(m, AIMessage)]
            result.calls = len(replies)
            result.tool_calls = sum(len(m.tool_calls) for m in replies)
            result.answer = calc.final_answer(str(replies[-1].content) if replies else None)
            result.transcript = [m.model_dump() for m in new]
        except GraphRecursionError as exc:
            result.error = f"{type(exc).__name__}: {exc}"
        result.reward = 1.0 if is_correct(result.answer, task.answer) else 0.0
        r.emit_reward(result.reward)
    return result


async def run_batch_async(
    base_url: str,
    tasks: list[MathTask],
    *,
    model: str,
    concurrency: int = 4,
    temperature: float = 0.8,
    max_tokens: int = 48,
    max_turns: int = 4,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[ToolRolloutResult]:
    """Run ``tasks`` against ``base_url`` (the gateway or vLLM); call ``setup`` first."""
    http = rollout_http_client(transport)
    chat = ChatOpenAI(
        model=model,
        base_url=f"{base_url.rstrip('/')}/v1",
        api_key="agentlake",
        temperature=temperature,
        max_completion_tokens=max_tokens,
        http_async_client=http,
        max_retries=0,
    )
    graph = make_graph(chat)
    try:
        return await gather_limited(tasks, lambda t: run_rollout(graph, t, max_turns=max_turns), concurrency)
    finally:
        await http.aclose()
