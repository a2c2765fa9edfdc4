"""The suites' door to tool calls: EngineLLMClient reads the served model's calls back, and the tableagent
served agent runs them against its TableEnv and answers from the results. No real engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from offline_suites.llm import BackgroundEngine, ChatReply
from offline_suites.papers.tableagent import AGENT_TOOLS, Config, generate_dialogue, llm_agent
from tests.doubles import ScriptedEngine


def test_engine_client_returns_the_models_calls() -> None:
    call = '<tool_call>\n{"name": "list_folder", "arguments": {}}\n</tool_call>'
    engine = ScriptedEngine(pieces=["Looking. ", call[:15], call[15:]])
    bg = BackgroundEngine(lambda: engine)
    try:
        reply = bg.client().chat([{"role": "user", "content": "which tables?"}], max_tokens=16, tools=AGENT_TOOLS)
    finally:
        bg.close()
    assert reply.text == "Looking. " and reply.finish_reason == "tool_calls"
    (c,) = reply.tool_calls
    assert c["type"] == "function" and c["function"] == {"name": "list_folder", "arguments": "{}"}
    messages, tools = engine.templated[0]
    assert [t["function"]["name"] for t in tools or []] == [t["function"]["name"] for t in AGENT_TOOLS]


def test_served_agent_runs_its_calls_and_answers_from_them(tmp_path: Path) -> None:
    dlg = generate_dialogue(tmp_path / "d", np.random.default_rng(0), "en", "chain", (2021, 2022))
    table = dlg.tables[0]
    sent: list[list[dict[str, Any]]] = []

    def chat(messages: list[dict[str, Any]]) -> ChatReply:
        sent.append(json.loads(json.dumps(messages)))
        if len(sent) == 1:   # two calls in one message, then the answer
            return ChatReply("", "tool_calls", 10, 5, [
                {"id": "c1", "type": "function", "function": {"name": "list_folder", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "table_schema",
                                                              "arguments": json.dumps({"name": table})}}])
        return ChatReply(f"Final Answer: 42 [tables: {table}]", "stop", 20, 5)

    trace = llm_agent(dlg, chat, Config(llm_turns=1, llm_max_steps=2))
    assert [c["tool"] for c in trace.calls] == ["list_folder", "table_schema"]
    assert all(c["ok"] and c["message"] == 0 for c in trace.calls), "both calls belong to the first message"
    second = sent[1]
    assert second[-3]["tool_calls"][1]["function"]["name"] == "table_schema"
    assert [m["tool_call_id"] for m in second[-2:]] == ["c1", "c2"]
    assert table in second[-2]["content"] and '"columns"' in second[-1]["content"]
    assert trace.answers == [f"42 [tables: {table}]"] and trace.declared_tables == [[table]]
