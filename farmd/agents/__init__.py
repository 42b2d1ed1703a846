"""Agents: the policies that act in a rollout.

``make_agent(spec, endpoints=...)`` builds one from its spec: ``reference``,
``random[:SEED]``, ``skilled:S``, ``openai:MODEL@ENDPOINT`` (an OpenAI-compatible server
such as vLLM or SGLang that the config names, never the job), and ``torch:NAME`` (farm's own
policy, published by a trainer and sampled on this node in batches).
Every agent implements ``Agent.attempt(task, episode, policy_version) -> AgentResult``.
Agents act only through the environment's episode; they run nothing themselves.
"""

from __future__ import annotations

from farmd.agents.base import Agent, AgentResult, Step
from farmd.agents.chat import ChatAgent, ChatLimits, Completion
from farmd.agents.endpoint import ClientPool, EndpointConfig, OpenAIAgent, OpenAIClient
from farmd.agents.registry import FORMS, NamedEndpoint, make_agent
from farmd.agents.scripted import RandomAgent, ReferenceAgent
from farmd.agents.torch_policy import PolicySource, TorchAgent, TorchRuntime
from farmd.errors import AgentError, AgentSpecError, EndpointError

__all__ = ["FORMS", "Agent", "AgentError", "AgentResult", "AgentSpecError", "ChatAgent", "ChatLimits", "ClientPool",
           "Completion", "EndpointConfig", "EndpointError", "NamedEndpoint", "OpenAIAgent", "OpenAIClient", "PolicySource",
           "RandomAgent", "ReferenceAgent", "Step", "TorchAgent", "TorchRuntime", "make_agent"]
