"""Durable backends for agent frameworks people already use.

* :mod:`stepstone.integrations.pydantic_ai`: ``StepstoneDurability``, a pydantic-ai
  durability capability (``pip install stepstone[pydantic-ai]``);
* :mod:`stepstone.integrations.openai_agents`: ``DurableRunner``, a drop-in for the
  OpenAI Agents SDK's ``Runner`` (``pip install stepstone[openai-agents]``).

Both record each model request and tool call as an operation of the workflow run they are
in (the kernel's operation journal, :mod:`stepstone.durable._operations`), so a resumed run
replays what was committed and runs only what was not. See ``docs/integrations.md``.
"""
