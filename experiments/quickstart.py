"""The OPOD quickstart: the whole loop in miniature on a CPU (launch/pipeline.py).

    python -m launch.pipeline --config=experiments/quickstart.py

The miniature (see DESIGN.md, "The miniature"):
- Suite: three-clause workplace tasks whose success hinges on the first delegation's harness
  (history: a past year's figure needs the archive tool, then the computation needs the fact found
  two delegations earlier; mail/file then text: the item found two delegations earlier must be
  handed over; long files need a budget that grows with their pages). Budgets leave 1-3 steps of
  slack, so every mid-run revision costs real success, not only steps. No notifications: contexts
  stay short, and the mechanism under test is blind-spot attribution.
- Expert: rare random slips (imitation averages them away) and three systematic blind spots
  (handover_2back, archive, long_file) that imitation copies.
- Policy: a ~1M-parameter Qwen3 trained from scratch with make_tiny_model's tokenizer, reading a
  compact view of the context (no fixed system prompt, no quoted evidence).
- Held out: evaluation seeds (new worlds: names, values, pages, years) never seen in training,
  under a reweighted mixture and tighter slack.
"""
from ml_collections import ConfigDict

BLIND_SPOTS = ("handover_2back", "archive", "long_file")
TEMPLATES = {"history": 1.0, "mail_text": 1.0, "file_text": 1.0}


def _trainer(steps: int, batch: int, learning_rate: float, warmup: int, seed: int, **extra) -> ConfigDict:
    return ConfigDict({"steps": steps, "batch": batch, "learning_rate": learning_rate, "warmup_steps": warmup,
                       "seed": seed, **extra})


def _opd(batch: int, seed: int) -> ConfigDict:
    return ConfigDict({"batch": batch, "max_new_tokens": 96, "temperature": 1.0, "top_p": 1.0, "seed": seed})


def get_config() -> ConfigDict:
    c = ConfigDict()
    c.run_dir = "runs/quickstart"
    c.seed = 0
    c.methods = ("sft", "rwr", "opod", "opd_empty", "dagrpo")

    c.suite = ConfigDict({
        "mixture": {"templates": TEMPLATES, "p_change": 0.0, "p_distract": 0.0, "slack": (1, 3), "spare_agents": 2},
        "expert": {"p_omit_context": 0.05, "p_omit_tool": 0.05, "p_misscope": 0.05, "p_underbudget": 0.05,
                   "blind_spots": BLIND_SPOTS, "budget_margin": 1, "file_budget": 4},
        "subagent": {"p_misread": 0.3, "p_detour": 0.3, "p_persist": 0.5, "slip_base": 0.01, "slip_tools": 0.5,
                     "slip_history": 0.2, "max_asks": 2},
        "max_decisions": 12,
        "max_evidence_chars": 160,
    })
    c.expert_rollouts = ConfigDict({"num_tasks": 400, "seed_start": 0, "prefix": "train"})
    c.rollouts = ConfigDict({"num_tasks": 300, "seed_start": 20_000, "prefix": "roll", "temperature": 0.7})
    c.eval = ConfigDict({
        "tasks": {"num_tasks": 200, "seed_start": 100_000, "prefix": "heldout",
                  "mixture": {"templates": {"history": 1.5, "mail_text": 1.0, "file_text": 1.0}, "p_change": 0.0,
                              "p_distract": 0.0, "slack": (1, 2), "spare_agents": 2}},
        "temperature": 0.0, "max_tokens": 96, "concurrency": 64, "seed": 0,
    })

    c.model = ConfigDict({"seed": 0, "vocab_size": 1024, "hf": {
        "hidden_size": 128, "intermediate_size": 384, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 2048, "rope_theta": 10_000.0,
        "initializer_range": 0.02}})
    # buckets: padded prompt lengths (one compilation each); max_len: the sampler's cache (prompt + action).
    c.policy = ConfigDict({"view": "compact", "max_new_tokens": 96, "buckets": (512, 768, 1024), "max_len": 1152})

    c.optimizer = ConfigDict({"learning_rate": 1e-3, "warmup_steps": 10, "final_lr_ratio": 0.1, "weight_decay": 0.01,
                              "b1": 0.9, "b2": 0.95, "eps": 1e-8, "max_grad_norm": 1.0, "checkpoint_every": 50,
                              "log_every": 10})
    c.sft = _trainer(1000, 4, 3e-3, 30, 1, hint_rows=0.3)  # hint_rows: hint-following rows per episode row
    c.rwr = _trainer(80, 8, 3e-4, 5, 2)
    c.opod = _trainer(80, 8, 3e-4, 5, 2, opd_weight=1.0, opd=_opd(8, 3))
    c.opd_empty = _trainer(80, 8, 3e-4, 5, 2, opd_weight=1.0, opd=_opd(8, 3))
    c.dagrpo = _trainer(40, 0, 3e-4, 5, 4, clip_eps=0.2, group=ConfigDict({
        "contexts_per_step": 4, "group_size": 4, "max_new_tokens": 96, "temperature": 1.0, "top_p": 1.0, "seed": 4}))
    return c
