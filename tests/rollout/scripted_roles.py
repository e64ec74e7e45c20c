"""What the engine tests share: the scripted workplace roles without noise, and a backend that records requests."""

from porch_jax.backends import ChatRequest, ScriptedBackend
from porch_jax.envs.workplace import ExpertConfig, SubagentConfig

CLEAN_EXPERT = ExpertConfig(0.0, 0.0, 0.0, 0.0, blind_spots=())
NO_SLIPS = SubagentConfig(slip_base=0.0, p_misread=0.0, p_detour=0.0)


class Spy:
    """A backend that records every request it serves."""

    def __init__(self, policy):
        self.inner, self.requests = ScriptedBackend(policy), []

    async def chat(self, request: ChatRequest):
        self.requests.append(request)
        return await self.inner.chat(request)
