"""OPOD attribution: the GRM prompt and reply format (grm), a scripted judge for the workplace suite
(judge), and the resumable attribution job over a trajectory store (job)."""

from porch_jax.attribution.grm import (
    GRM_INSTRUCTION,
    HINT_PREFIX,
    Attribution,
    AttributionUnit,
    GRMReplyError,
    format_reply,
    grm_messages,
    grm_request,
    parse_reply,
    teacher_context,
)
from porch_jax.attribution.job import AttributionStore, JobSummary, attribute_store

__all__ = [
    "GRM_INSTRUCTION",
    "HINT_PREFIX",
    "Attribution",
    "AttributionStore",
    "AttributionUnit",
    "GRMReplyError",
    "JobSummary",
    "attribute_store",
    "format_reply",
    "grm_messages",
    "grm_request",
    "parse_reply",
    "teacher_context",
]
