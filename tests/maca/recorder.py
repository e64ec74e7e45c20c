"""A scripted model that keeps every call, for the multi-agent systems' tests (test_multi_agent.py,
test_adaptive.py): what each call saw, which pool agent's system prompt it ran with, and what the run should
cost."""

from __future__ import annotations

import dataclasses

from porch_jax.backends import ScriptedBackend
from porch_jax.maca.pools import load_pool

POOL = load_pool()


@dataclasses.dataclass
class Call:
    role: str
    agent: str | None  # the pool agent whose system prompt the call ran with
    prompt: str
    reply: str


class Recorder:
    """`model(call, n)` answers a call, n: how many calls the same agent made before it."""

    def __init__(self, model):
        self.model, self.calls = model, []
        by_prompt = {a.prompt: a.name for a in POOL}
        self.backend = ScriptedBackend(self._reply)
        self._agent = lambda r: by_prompt.get(r.messages[0]["content"]) if r.messages[0]["role"] == "system" else None

    def _reply(self, request):
        call = Call(request.role, self._agent(request), request.messages[-1]["content"], "")
        call.reply = self.model(call, len([c for c in self.calls if c.agent == call.agent]))
        self.calls.append(call)
        return call.reply

    def cost(self) -> int:
        """Words in, words out, over every call (the scripted backend's token count)."""
        agents = {a.name: a.prompt for a in POOL}
        return sum(
            len(c.prompt.split()) + len(agents.get(c.agent, "").split()) + len(c.reply.split()) for c in self.calls
        )


def check_cost(result, recorder):
    """A run's result counts every call the recorder saw, and their tokens."""
    assert result.calls == len(recorder.calls) and result.cost == recorder.cost()
