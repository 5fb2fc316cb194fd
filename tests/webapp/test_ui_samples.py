"""The Samples tab's tables and HTML (webapp/ui/samples.py) on hand-made API JSON: chat markup stripped, numbers
rounded, a prompt's rollouts grouped, blank reward bounds, the followed prompt's word diff."""

from __future__ import annotations

import pytest

from webapp.ui import samples

DEMO_PROMPT = "<|bos|><|user|>\nthe cat\n<|assistant|>\n"


def sample(step, prompt, index, reward, split="train", **extra):
    return {"step": step, "split": split, "index": index, "prompt": prompt, "response": f"r{index}<|eos|>",
            "reward": reward, "kl": 0.0123456, "advantage": reward - 0.5, "is_end": True, **extra}  # fmt: skip


def test_chat_markup_is_stripped_and_roles_read_as_words():
    assert samples.clean_text(DEMO_PROMPT) == "user: the cat"  # the closing assistant marker has nothing after it
    assert samples.clean_text("a nice cat<|eos|><|pad|><|pad|>") == "a nice cat"
    chatml = "<|im_start|>system\nBe brief<|im_end|>\n<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n"
    assert samples.clean_text(chatml) == "system: Be brief user: hi there"
    llama3 = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhello<|eot_id|>"
    assert samples.clean_text(llama3) == "user: hello"
    assert samples.clean_text("<s> done </s><|endoftext|>") == "done"
    assert samples.clean_text("a < b and c|d, x <| y") == "a < b and c|d, x <| y"  # not markup: kept
    assert samples.clean_text(None) == ""


def test_the_samples_table_groups_a_prompts_rollouts_with_rounded_numbers():
    items = [
        sample(1, DEMO_PROMPT, 0, 0.20000000298023224),
        sample(1, "<|user|>\nthe sea\n<|assistant|>\n", 1, 1.0),
        sample(1, DEMO_PROMPT, 2, 0.6),
        sample(0, DEMO_PROMPT, 0, 0.0, split="validation"),
    ]
    frame = samples.samples_frame({"items": items})
    assert list(frame.columns[:8]) == ["step", "prompt", "response", "reward", "gold", "advantage", "KL", "ended"]
    assert frame["step"].tolist() == [0, 1, 1, 1]  # by step, then a prompt's rollouts together
    assert frame["prompt"].tolist() == ["user: the cat", "user: the cat", "", "user: the sea"]
    assert frame["response"].tolist() == ["r0", "r0", "r2", "r1"]
    assert frame["reward"].tolist() == [0.0, 0.2, 0.6, 1.0]
    assert frame["KL"].tolist() == [0.0123] * 4 and frame["advantage"].tolist()[1] == -0.3
    assert frame["group mean"].tolist() == [0.0, 0.4, 0.4, 1.0]
    long = samples.samples_frame({"items": [sample(1, "word " * 200, 0, 1.0)]})["prompt"][0]
    assert len(long) == samples.PROMPT_CHARS and long.endswith("…")

    groups = samples.groups_frame({"items": items + [sample(1, "<|user|>\nthe sea\n<|assistant|>\n", 3, 1.0)]})
    assert groups["prompt"].tolist() == ["user: the cat", "user: the cat", "user: the sea"]
    assert groups["n"].tolist() == [1, 2, 2]
    assert groups["spread (std)"].tolist() == [0.0, 0.2, 0.0]
    assert groups["note"].tolist() == ["", "", samples.ZERO_SPREAD]  # one sample alone is not a zero-spread group


def test_blank_reward_bounds_are_no_filter():
    assert samples.sample_query("", "all", "", None, 1) == {"per_page": samples.PER_PAGE, "page": 1}
    query = samples.sample_query(" 3 ", "validation", "-0.5", "1", "2")
    assert query == {"per_page": samples.PER_PAGE, "page": 2, "step": 3, "split": "validation",
                     "min_reward": -0.5, "max_reward": 1.0}  # fmt: skip
    with pytest.raises(ValueError, match="Max reward must be a number or blank"):
        samples.sample_query("", "all", "", "lots", 1)


def test_the_word_diff_marks_removed_and_added_words_and_escapes_the_text():
    shown = samples.word_diff_html("the cat sat <b>down</b>", "the dog sat <b>down</b> & left")
    assert '<del style="' in shown and ">cat</del>" in shown and ">dog</ins>" in shown
    assert ">&amp; left</ins>" in shown
    assert "<b>" not in shown and "&lt;b&gt;down&lt;/b&gt;" in shown
    assert samples.word_diff_html("same words", "same words") == "same words"


def test_a_followed_prompt_compares_two_steps_with_their_gold_rewards():
    items = [
        sample(0, DEMO_PROMPT, 0, 0.1, split="validation"),
        sample(4, DEMO_PROMPT, 0, 0.9, split="validation", response="a <happy> cat", extra_rewards={"rule": 1.0}),
        sample(2, DEMO_PROMPT, 0, 0.5, split="validation"),
        sample(2, "<|user|>\nthe sea\n<|assistant|>\n", 1, 0.5, split="validation"),
        sample(3, DEMO_PROMPT, 0, 9.0),  # a train sample: not followed
    ]
    assert samples.validation_prompts(items) == [("user: the cat", DEMO_PROMPT), ("user: the sea", items[3]["prompt"])]
    history = samples.prompt_history(items, DEMO_PROMPT)
    assert history["step"].tolist() == [0, 2, 4] and history["gold rewards"].tolist() == ["", "", "rule 1.000"]
    assert samples.step_choices([0, 2, 4])[:2] == [("first (0)", "first"), ("latest (4)", "latest")]

    shown = samples.follow_diff(items, DEMO_PROMPT, samples.FIRST, samples.LATEST)
    assert "step 0: reward 0.1" in shown and "step 4: reward 0.9 · gold: rule 1.000" in shown
    assert "changes from step 0 to step 4" in shown and "&lt;happy&gt;" in shown and "<happy>" not in shown
    assert "step 2: reward 0.5" in samples.follow_diff(items, DEMO_PROMPT, "2", "latest")
    assert "No validation answers" in samples.follow_diff(items, DEMO_PROMPT, "7", "latest")  # a step not there
    assert "No validation answers" in samples.follow_diff([], None, samples.FIRST, samples.LATEST)


def test_the_samples_table_has_a_gold_column_and_the_reward_high_gold_low_filter_finds_the_disagreements():
    val = "validation"
    items = [  # step 2: rewards 0.1, 0.5, 0.9, 0.8 (median 0.65); rule golds 1, 1, 0, 1 (median 1)
        sample(2, DEMO_PROMPT, 0, 0.1, split=val, extra_rewards={"rule": 1.0}),
        sample(2, DEMO_PROMPT, 1, 0.5, split=val, extra_rewards={"rule": 1.0}),
        sample(2, DEMO_PROMPT, 2, 0.9, split=val, extra_rewards={"rule": 0.0, "judge": 0.5}),  # kept
        sample(2, DEMO_PROMPT, 3, 0.8, split=val, extra_rewards={"rule": 1.0}),  # reward high, gold not low
        # step 4: rewards 2, 3, 4 (median 3): judge 0.2, 0.9, 0.95 (median 0.9); the third's rule alone is missing
        sample(4, DEMO_PROMPT, 0, 2.0, split=val, extra_rewards={"judge": 0.2}),  # gold low, reward not high
        sample(4, DEMO_PROMPT, 1, 3.0, split=val, extra_rewards={"judge": 0.9}),  # at the median: not above it
        sample(4, DEMO_PROMPT, 2, 4.0, split=val, extra_rewards={"judge": 0.95, "rule": None}),
        sample(4, DEMO_PROMPT, 3, 9.0, split="train"),  # train samples have no gold rewards
    ]
    frame = samples.samples_frame({"items": items})
    gold = dict(zip(zip(frame["step"], frame["reward"]), frame["gold"], strict=True))
    assert gold[(2, 0.9)] == "judge 0.500, rule 0.000" and gold[(4, 9.0)] == ""
    kept = samples.reward_high_gold_low(items)
    assert kept == [items[2]]
    items[6]["extra_rewards"]["judge"] = 0.1  # step 4's median judge is now 0.2: its best reward has the worst gold
    assert samples.reward_high_gold_low(items) == [items[2], items[6]]
    assert samples.reward_high_gold_low([sample(1, DEMO_PROMPT, 0, 1.0, split=val)]) == []  # no gold: nothing

    # the reward bounds and the page apply to what the filter kept
    query = samples.sample_query("", "all", "3", "", 1)
    page = samples.local_page(samples.reward_high_gold_low(items), query)
    assert page == {"items": [items[6]], "total": 1, "page": 1, "per_page": samples.PER_PAGE}
    many = [sample(1, DEMO_PROMPT, i, float(i)) for i in range(samples.PER_PAGE + 3)]
    second = samples.local_page(many, samples.sample_query("", "all", "", "", 2))
    assert second["total"] == samples.PER_PAGE + 3 and second["items"] == many[samples.PER_PAGE :]
    info = samples.samples_info(3, page, "samples", gold_low=True)
    assert "1 samples match" in info and samples.GOLD_FILTER_INFO in info
