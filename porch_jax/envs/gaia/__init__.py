"""GAIA tools: web search (provider interface, offline corpus and Serper providers), page extraction, code
execution on the sandbox, GAIA's answer scorer, the GAIA and TaskCraft task loaders, and the environment
that combines them."""

from porch_jax.envs.gaia.code import CODE_LIMITS, execute
from porch_jax.envs.gaia.env import GaiaEnvironment
from porch_jax.envs.gaia.pages import CorpusFetcher, HTTPFetcher, PageFetcher, extract, passages_for
from porch_jax.envs.gaia.score import exact_match, score_answer
from porch_jax.envs.gaia.search import CorpusSearch, SearchHit, SearchProvider, SerperSearch, search_provider
from porch_jax.envs.gaia.tasks import GaiaTask, load_gaia, load_taskcraft
from porch_jax.envs.gaia.text import Page, html_to_text

__all__ = [
    "CODE_LIMITS",
    "execute",
    "GaiaEnvironment",
    "GaiaTask",
    "CorpusFetcher",
    "HTTPFetcher",
    "PageFetcher",
    "extract",
    "html_to_text",
    "passages_for",
    "exact_match",
    "score_answer",
    "CorpusSearch",
    "Page",
    "SearchHit",
    "SearchProvider",
    "SerperSearch",
    "search_provider",
    "load_gaia",
    "load_taskcraft",
]
