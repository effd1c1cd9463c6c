"""The demo's preference rows and GRPO reward (train/assets.py): torch-free, so fast."""

from __future__ import annotations

from steadytune.train.assets import brevity_reward, generate_instructions, generate_preferences


def test_each_preference_row_prefers_the_right_answer_to_a_wrong_one() -> None:
    rows = generate_preferences(200, seed=3)
    plain = generate_instructions(200, seed=3)
    assert rows == generate_preferences(200, seed=3)  # deterministic for a seed
    assert [(r["instruction"], r["input"], r["chosen"]) for r in rows] == [
        (r["instruction"], r["input"], r["output"]) for r in plain
    ]
    assert all(r["rejected"] and r["rejected"] != r["chosen"] for r in rows)
    assert len({r["instruction"] for r in rows}) == 5  # every task has its wrong answers


def test_the_brevity_reward_takes_strings_and_conversations() -> None:
    got = brevity_reward(["", "x" * 32, [{"role": "assistant", "content": "y" * 200}]], prompts=["p"] * 3)
    assert got == [1.0, 0.5, 0.0]
