"""MMLU-Pro and ARC-Challenge: multiple choice, scored by the extracted option letter."""

from __future__ import annotations

import string

from porch_jax.envs.benchmarks.answers import extract_choice
from porch_jax.envs.benchmarks.base import Benchmark, BenchmarkTask, HubSource, read_jsonl, read_parquet

QA_INSTRUCTION = "Choose the correct option. End with 'The answer is <letter>.'"


def _qa_task(
    benchmark: str, task_id: str, question: str, options: list[str], answer: str, extra: dict
) -> BenchmarkTask:
    letters = string.ascii_uppercase[: len(options)]
    if answer not in letters:
        raise ValueError(f"{benchmark} {task_id}: answer {answer!r} is not one of the {len(options)} options")
    listed = "\n".join(f"{letter}. {text}" for letter, text in zip(letters, options, strict=False))
    return BenchmarkTask(
        benchmark=benchmark,
        task_id=task_id,
        family="qa",
        prompt=f"{question.strip()}\n\n{listed}\n\n{QA_INSTRUCTION}",
        reference=f"The answer is {answer}.",
        data={"answer": answer, "n_options": len(options), "options": list(options), "question": question, **extra},
    )


def check_choice(task: BenchmarkTask, completion: str) -> bool:
    return extract_choice(completion, task.data["n_options"]) == task.data["answer"]


def _mmlu_pro_task(row: dict, index: int) -> BenchmarkTask:
    return _qa_task(
        "mmlu_pro",
        str(row["question_id"]),
        row["question"],
        list(row["options"]),
        row["answer"],
        {"category": row["category"], "src": row["src"]},
    )


def _arc_task(row: dict, index: int) -> BenchmarkTask:
    labels = [o["label"] for o in row["options"]]
    if labels != list(string.ascii_uppercase[: len(labels)]):
        raise ValueError(f"arc_challenge {row['id']}: option labels {labels} are not A, B, ... in order")
    return _qa_task("arc_challenge", row["id"], row["question"], [o["text"] for o in row["options"]], row["answer"], {})


def _arc_hub_row(row: dict) -> dict:
    """allenai/ai2_arc rows -> the local file's schema (numeric labels "1".."4" become A..D, as there)."""
    labels = list(row["choices"]["label"])
    letters = string.ascii_uppercase[: len(labels)]
    answer = row["answerKey"]
    return {
        "id": row["id"],
        "question": row["question"],
        "options": [{"label": letters[i], "text": t} for i, t in enumerate(row["choices"]["text"])],
        "answer": letters[labels.index(answer)],
    }


MMLU_PRO = Benchmark(
    name="mmlu_pro",
    family="qa",
    metric="accuracy",
    read_local=lambda d: read_parquet(d / "mmlu_pro" / "test.parquet"),
    to_task=_mmlu_pro_task,
    check=check_choice,
    hub=HubSource("TIGER-Lab/MMLU-Pro", None, ("test",)),
)

ARC_CHALLENGE = Benchmark(
    name="arc_challenge",
    family="qa",
    metric="accuracy",
    read_local=lambda d: read_jsonl(d / "arc_challenge" / "arc_challenge_test.jsonl"),
    to_task=_arc_task,
    check=check_choice,
    hub=HubSource("allenai/ai2_arc", "ARC-Challenge", ("test",)),
    hub_row=_arc_hub_row,
)
