"""The Samples tab: a job's generations as readable rows (chat markup stripped, numbers rounded, a prompt's rollouts
together with their group's mean reward) or one row per group, and one validation prompt followed across steps with
a word diff of two steps' answers.

Gold rewards (a validation sample's `extra_rewards`) have a column of their own, and the "reward high, gold low"
filter shows where the reward model and a gold reward disagree (reward hacking): it fetches the validation samples
(of the step asked, else all of them, as many as `Api.get_all` fetches), keeps those above their step's median
reward and below their step's median of one gold reward, then applies the reward bounds and pages them here, since
the API cannot filter on a JSON column's median.

The functions above `samples_tab` turn API JSON into tables and HTML and are tested without a browser; Gradio loads
in `samples_tab` only.
"""

from __future__ import annotations

import difflib
import html
import re
import statistics
from typing import Any

import pandas as pd

from webapp.ui.api import ApiError

SAMPLE_COLUMNS = ["step", "prompt", "response", "reward", "gold", "advantage", "KL", "ended", "group mean", "split"]
GROUP_COLUMNS = ["step", "split", "prompt", "mean reward", "spread (std)", "n", "note"]
HISTORY_COLUMNS = ["step", "response", "reward", "KL", "gold rewards"]
# Cut to what a table cell shows readably; the full text is one filter away (step + split).
PROMPT_CHARS, RESPONSE_CHARS = 160, 400
REWARD_DECIMALS, KL_DECIMALS = 3, 4
ZERO_SPREAD = "zero spread: no learning signal"
ZERO_SPREAD_STD = 1e-6  # a group's rewards this close are all the same to the RLOO baseline
# Prompt and response take the room; every column fits on screen (none hidden off to the right).
SAMPLE_WIDTHS = ["5%", "18%", "31%", "7%", "9%", "6%", "6%", "5%", "7%", "6%"]
GROUP_WIDTHS = ["6%", "8%", "46%", "10%", "10%", "5%", "15%"]
PER_PAGE = 50
VIEWS = ["samples", "groups"]
FIRST, LATEST = "first", "latest"
GOLD_FILTER = "Reward high, gold low"
GOLD_FILTER_INFO = (
    "validation samples whose reward is above their step's median reward and whose gold reward (one of them) is "
    "below its median at that step: where the reward model and the gold reward disagree"
)

# Chat markup of the common templates: a role marker becomes "role: ", every other special token goes.
_ROLE = r"(system|user|assistant)"
_ROLE_MARKERS = [
    re.compile(rf"<\|im_start\|>\s*{_ROLE}\b"),  # ChatML
    re.compile(rf"<\|start_header_id\|>\s*{_ROLE}\s*<\|end_header_id\|>"),  # Llama 3
    re.compile(rf"<start_of_turn>\s*{_ROLE}\b"),  # Gemma
    re.compile(rf"<\|{_ROLE}\|>"),  # the demo's own (aligner/demo/tokenizer.py), Zephyr, Phi
]
_SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|</?s>|<end_of_turn>|<(?:bos|eos|pad)>")


def clean_text(text: Any) -> str:
    """Model text as a person reads it: role markers as "user: " / "assistant: ", other special tokens (`<|bos|>`,
    `<|eos|>`, `<|endoftext|>`, `<|im_end|>`, `</s>`, ...) removed, whitespace runs as one space, and a role marker
    with nothing after it (a prompt's closing `<|assistant|>`) dropped."""
    text = "" if text is None else str(text)
    for marker in _ROLE_MARKERS:
        text = marker.sub(lambda m: f"\n{m.group(1)}: ", text)
    text = _SPECIAL.sub(" ", text)
    text = re.sub(r"\s+", " ", text).strip()
    return re.sub(rf"(?:^|\s){_ROLE}:$", "", text).strip()


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def rounded(value: Any, decimals: int) -> float | None:
    """A number as shown: rounded (0.20000000298023224 -> 0.2); None for none."""
    try:
        return None if value is None else round(float(value), decimals)
    except (TypeError, ValueError):
        return None


def _key(item: dict) -> tuple:
    return item.get("step", 0), item.get("split", ""), item.get("prompt", "")


def group_samples(items: list[dict]) -> list[list[dict]]:
    """Samples grouped by (step, split, prompt), in order of step, split then first appearance; each group keeps its
    rollouts' order (index)."""
    groups: dict[tuple, list[dict]] = {}
    for item in items:
        groups.setdefault(_key(item), []).append(item)
    ordered = sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1]))  # stable: prompts keep their order
    return [sorted(members, key=lambda i: i.get("index", 0)) for _key_, members in ordered]


def group_stats(members: list[dict]) -> tuple[float, float]:
    """(mean, population std) of a group's rewards: the mean is the RLOO baseline's average, the spread what it
    learns from."""
    rewards = [float(m["reward"]) for m in members if m.get("reward") is not None]
    if not rewards:
        return float("nan"), float("nan")
    return statistics.fmean(rewards), statistics.pstdev(rewards)


def samples_frame(page: dict) -> pd.DataFrame:
    """GET /jobs/{id}/samples -> one row per generation, a prompt's rollouts together (the prompt on the group's first
    row), with the group's mean reward (the advantage is each sample's own: reward less its baseline)."""
    rows = []
    for members in group_samples(page.get("items", [])):
        mean, _std = group_stats(members)
        for n, item in enumerate(members):
            rows.append([
                item.get("step"),
                cut(clean_text(item.get("prompt")), PROMPT_CHARS) if n == 0 else "",
                cut(clean_text(item.get("response")), RESPONSE_CHARS),
                rounded(item.get("reward"), REWARD_DECIMALS),
                gold_rewards(item),
                rounded(item.get("advantage"), REWARD_DECIMALS),
                rounded(item.get("kl"), KL_DECIMALS),
                "yes" if item.get("is_end") else "no",
                rounded(mean, REWARD_DECIMALS),
                item.get("split"),
            ])  # fmt: skip
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def groups_frame(page: dict) -> pd.DataFrame:
    """One row per prompt of a step: its mean reward, spread and number of samples; a group whose samples all scored
    the same is marked (RLOO's baseline then cancels every reward: no learning signal)."""
    rows = []
    for members in group_samples(page.get("items", [])):
        mean, std = group_stats(members)
        note = ZERO_SPREAD if len(members) > 1 and std <= ZERO_SPREAD_STD else ""
        first = members[0]
        rows.append([first.get("step"), first.get("split"), cut(clean_text(first.get("prompt")), PROMPT_CHARS),
                     rounded(mean, REWARD_DECIMALS), rounded(std, REWARD_DECIMALS), len(members), note])  # fmt: skip
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def reward_bound(text: Any, label: str) -> float | None:
    """A min/max reward box: blank is no bound; ValueError naming the box for anything but a number."""
    text = str(text if text is not None else "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{label} must be a number or blank (no bound), not {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{label} must be a finite number")
    return value


def sample_query(step: Any, split: str, min_reward: Any, max_reward: Any, page: Any) -> dict[str, Any]:
    """The GET /jobs/{id}/samples parameters of the tab's filters (a blank filter is no filter)."""
    try:
        number = int(float(page)) if page not in (None, "") else 1
    except (TypeError, ValueError):
        number = 1
    params: dict[str, Any] = {"per_page": PER_PAGE, "page": max(1, number)}
    if str(step or "").strip().isdigit():
        params["step"] = int(str(step).strip())
    if split in ("train", "validation"):
        params["split"] = split
    for key, value, label in (("min_reward", min_reward, "Min reward"), ("max_reward", max_reward, "Max reward")):
        bound = reward_bound(value, label)
        if bound is not None:
            params[key] = bound
    return params


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def reward_high_gold_low(items: list[dict]) -> list[dict]:
    """The validation samples whose reward is above the median reward of their step's validation samples and one of
    whose gold rewards is below that gold reward's median at the step (GOLD_FILTER_INFO), in their order. A step's
    medians are over every validation sample of it in `items`, so `items` must hold whole steps."""
    steps: dict[Any, list[dict]] = {}
    for item in items:
        if item.get("split") == "validation":
            steps.setdefault(item.get("step"), []).append(item)
    kept = set()
    for members in steps.values():
        rewards = [r for m in members if (r := _number(m.get("reward"))) is not None]
        golds: dict[str, list[float]] = {}
        for member in members:
            extra = member.get("extra_rewards")
            for name, value in extra.items() if isinstance(extra, dict) else ():
                if (number := _number(value)) is not None:
                    golds.setdefault(name, []).append(number)
        if not rewards or not golds:
            continue
        reward_median = statistics.median(rewards)
        gold_medians = {name: statistics.median(values) for name, values in golds.items()}
        for member in members:
            reward, extra = _number(member.get("reward")), member.get("extra_rewards")
            if reward is None or reward <= reward_median or not isinstance(extra, dict):
                continue
            golds_below = (_number(extra.get(name)) for name in gold_medians)
            if any(g is not None and g < median for g, median in zip(golds_below, gold_medians.values(), strict=True)):
                kept.add(id(member))
    return [item for item in items if id(item) in kept]


def local_page(items: list[dict], params: dict[str, Any]) -> dict:
    """`items` filtered by `params`' reward bounds (sample_query's) and cut to its page, as GET /jobs/{id}/samples
    answers."""
    low, high = params.get("min_reward"), params.get("max_reward")
    shown = [i for i in items if (low is None or i["reward"] >= low) and (high is None or i["reward"] <= high)]
    per_page, page = params.get("per_page", PER_PAGE), params.get("page", 1)
    start = (page - 1) * per_page
    return {"items": shown[start : start + per_page], "total": len(shown), "page": page, "per_page": per_page}


def validation_prompts(items: list[dict]) -> list[tuple[str, str]]:
    """The distinct prompts of validation samples, in order of first appearance, as (readable label, prompt)."""
    prompts = dict.fromkeys(i["prompt"] for i in items if i.get("split") == "validation")
    return [(cut(clean_text(p), 120) or "(empty prompt)", p) for p in prompts]


def prompt_samples(items: list[dict], prompt: str | None) -> list[dict]:
    """The validation samples of one prompt, by step (the first of a step when there are several)."""
    by_step: dict[int, dict] = {}
    for item in items:
        if item.get("split") == "validation" and item["prompt"] == prompt:
            by_step.setdefault(int(item["step"]), item)
    return [by_step[step] for step in sorted(by_step)]


def gold_rewards(item: dict) -> str:
    """A sample's extra (gold) rewards: `rule 1.000, judge 0.250`; empty without any."""
    extra = item.get("extra_rewards") or {}
    if not isinstance(extra, dict):
        return ""
    return ", ".join(f"{name} {value:.3f}" if isinstance(value, int | float) else f"{name} {value}"
                     for name, value in sorted(extra.items()))  # fmt: skip


def prompt_history(items: list[dict], prompt: str | None) -> pd.DataFrame:
    """How the answer to one validation prompt changed: one row per step (step, response, reward, KL, gold
    rewards)."""
    rows = [
        [s["step"], cut(clean_text(s["response"]), RESPONSE_CHARS), rounded(s.get("reward"), REWARD_DECIMALS),
         rounded(s.get("kl"), KL_DECIMALS), gold_rewards(s)]
        for s in prompt_samples(items, prompt)
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=HISTORY_COLUMNS)


def pick_step(choice: Any, steps: list[int]) -> int | None:
    """A step picker's value -> a step of `steps`: "first", "latest" or a step number (one not there: None)."""
    if not steps:
        return None
    if choice in (None, "", FIRST):
        return steps[0]
    if choice == LATEST:
        return steps[-1]
    try:
        step = int(choice)
    except (TypeError, ValueError):
        return None
    return step if step in steps else None


def step_choices(steps: list[int]) -> list[tuple[str, str]]:
    """A step picker's choices: first and latest (named with their steps), then each step."""
    if not steps:
        return [("first", FIRST), ("latest", LATEST)]
    return [(f"first ({steps[0]})", FIRST), (f"latest ({steps[-1]})", LATEST), *[(str(s), str(s)) for s in steps]]


DEL_STYLE = "color:#c0392b;text-decoration:line-through;background:#fdecea"
INS_STYLE = "color:#1e8449;text-decoration:none;background:#e9f7ef"


def word_diff_html(old: str, new: str) -> str:
    """The words of `new` against `old` (difflib on words) as HTML: removed words struck through in red, added ones
    in green; every word escaped."""
    a, b = old.split(), new.split()
    parts = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op == "equal":
            parts.append(html.escape(" ".join(a[i1:i2])))
            continue
        if op in ("delete", "replace"):
            parts.append(f'<del style="{DEL_STYLE}">{html.escape(" ".join(a[i1:i2]))}</del>')
        if op in ("insert", "replace"):
            parts.append(f'<ins style="{INS_STYLE}">{html.escape(" ".join(b[j1:j2]))}</ins>')
    return " ".join(parts)


def _step_line(sample: dict) -> str:
    gold = gold_rewards(sample)
    reward = rounded(sample.get("reward"), REWARD_DECIMALS)
    return f"step {int(sample['step'])}: reward {reward}" + (f" · gold: {html.escape(gold)}" if gold else "")


def follow_diff(items: list[dict], prompt: str | None, choice_a: Any, choice_b: Any) -> str:
    """The answers to one validation prompt at two steps, with each step's reward (and gold rewards), then the
    second answer as a word diff against the first; a line saying what is missing otherwise."""
    history = prompt_samples(items, prompt)
    by_step = {int(s["step"]): s for s in history}
    steps = list(by_step)
    a, b = pick_step(choice_a, steps), pick_step(choice_b, steps)
    if a is None or b is None:
        return "<p><em>No validation answers to compare yet.</em></p>"
    old, new = by_step[a], by_step[b]
    old_text, new_text = clean_text(old["response"]), clean_text(new["response"])
    return (
        f'<div class="follow-diff"><p><strong>{_step_line(old)}</strong><br>{html.escape(old_text)}</p>'
        f"<p><strong>{_step_line(new)}</strong><br>{html.escape(new_text)}</p>"
        f"<p><strong>changes from step {a} to step {b}</strong><br>{word_diff_html(old_text, new_text)}</p></div>"
    )


def samples_info(job_id: int, result: dict, view: str, gold_low: bool = False) -> str:
    shown = len(result.get("items", []))
    groups = len(group_samples(result.get("items", [])))
    what = f"{groups} groups" if view == "groups" else f"{shown} samples"
    which = f" ({GOLD_FILTER.lower()}: {GOLD_FILTER_INFO})" if gold_low else ""
    return f"Job {job_id}: {result.get('total', 0)} samples match{which}; page {result.get('page', 1)} shows {what}."


def samples_tab(session) -> None:
    """The selected job's generations filtered by step, split and reward (blank: no bound), a page at a time, as
    samples or as groups; one validation prompt followed across steps, two of its answers diffed."""
    import gradio as gr

    with gr.Tab("Samples", id="samples") as tab:
        with gr.Row():
            s_step = gr.Textbox(label="Step (empty: all)", elem_id="s-step")
            s_split = gr.Radio(["all", "train", "validation"], value="all", label="Split", elem_id="s-split")
            s_min = gr.Textbox(label="Min reward", placeholder="no bound", elem_id="s-min")
            s_max = gr.Textbox(label="Max reward", placeholder="no bound", elem_id="s-max")
            s_page = gr.Number(label="Page", value=1, precision=0, minimum=1, elem_id="s-page")
            s_view = gr.Radio(VIEWS, value="samples", label="View", elem_id="s-view")
        s_gold = gr.Checkbox(value=False, label=GOLD_FILTER, info=GOLD_FILTER_INFO, elem_id="s-gold-low")
        samples_info_md = gr.Markdown(elem_id="samples-info")
        samples_table = gr.Dataframe(
            value=samples_frame({}),
            interactive=False,
            wrap=True,
            elem_id="samples-table",
            column_widths=SAMPLE_WIDTHS,
        )
        gr.Markdown("**Follow one validation prompt across steps**")
        with gr.Row():
            # allow_custom_value: a refresh may send the previous job's pick against the new job's choices (the
            # handler falls back to a choice), which Gradio would otherwise refuse with an error toast.
            follow = gr.Dropdown(
                [], label="Validation prompt", elem_id="follow-prompt", scale=4, allow_custom_value=True
            )
            step_a = gr.Dropdown(step_choices([]), value=FIRST, label="From step", elem_id="follow-a", scale=1,
                                 allow_custom_value=True)  # fmt: skip
            step_b = gr.Dropdown(step_choices([]), value=LATEST, label="To step", elem_id="follow-b", scale=1,
                                 allow_custom_value=True)  # fmt: skip
        follow_diff_html = gr.HTML(elem_id="follow-diff")
        follow_table = gr.Dataframe(
            value=prompt_history([], None), interactive=False, wrap=True, elem_id="follow-table"
        )

    def refresh_samples(token: str, selected, step, split, min_reward, max_reward, page, view, gold_low):
        from webapp.ui.tabs import job_id_of

        jid = job_id_of(selected)
        if not token or jid is None:
            return gr.update(), gr.update()
        try:
            params = sample_query(step, split, min_reward, max_reward, page)
        except ValueError as err:
            return f"**Filter**: {err}", gr.update()
        try:
            if gold_low:  # the medians need whole steps: every validation sample (of the step asked)
                whole = {"step": params["step"]} if "step" in params else {}
                items = session.api(token).get_all(f"/jobs/{jid}/samples", split="validation", **whole)
                result = local_page(reward_high_gold_low(items), params)
            else:
                result = session.api(token).get(f"/jobs/{jid}/samples", **params)
        except ApiError as err:
            return f"Samples of job {jid}: {err.describe()}", gr.update()
        if view == "groups":
            table = gr.update(value=groups_frame(result), column_widths=GROUP_WIDTHS)
        else:
            table = gr.update(value=samples_frame(result), column_widths=SAMPLE_WIDTHS)
        return samples_info(jid, result, view, bool(gold_low)), table

    def refresh_follow(token: str, selected, prompt: str | None, choice_a, choice_b):
        from webapp.ui.tabs import job_id_of

        jid = job_id_of(selected)
        if not token or jid is None:
            return [gr.update()] * 5
        try:
            items = session.api(token).get_all(f"/jobs/{jid}/samples", split="validation")
        except ApiError:
            return [gr.update()] * 5
        choices = validation_prompts(items)
        prompts = [value for _label, value in choices]
        prompt = prompt if prompt in prompts else (prompts[0] if prompts else None)
        steps = [int(s["step"]) for s in prompt_samples(items, prompt)]
        picks = step_choices(steps)
        choice_a = choice_a if pick_step(choice_a, steps) is not None else FIRST
        choice_b = choice_b if pick_step(choice_b, steps) is not None else LATEST
        return [
            gr.update(choices=choices, value=prompt),
            gr.update(choices=picks, value=choice_a),
            gr.update(choices=picks, value=choice_b),
            follow_diff(items, prompt, choice_a, choice_b),
            prompt_history(items, prompt),
        ]

    sample_inputs = [session.token, session.job_id, s_step, s_split, s_min, s_max, s_page, s_view, s_gold]
    sample_outputs = [samples_info_md, samples_table]
    session.every_tick(refresh_samples, sample_inputs, sample_outputs, tab="samples")
    session.follow_tab(tab, "samples", refresh_samples, sample_inputs, sample_outputs)
    for trigger in (session.job_id.change, s_step.submit, s_split.change, s_min.submit, s_max.submit,
                    s_page.change, s_view.change, s_gold.change):  # fmt: skip
        trigger(refresh_samples, sample_inputs, sample_outputs, show_progress="hidden")
    follow_inputs = [session.token, session.job_id, follow, step_a, step_b]
    follow_outputs = [follow, step_a, step_b, follow_diff_html, follow_table]
    session.every_tick(refresh_follow, follow_inputs, follow_outputs, tab="samples")
    tab.select(refresh_follow, follow_inputs, follow_outputs, show_progress="hidden")
    for trigger in (session.job_id.change, follow.input, step_a.input, step_b.input):
        trigger(refresh_follow, follow_inputs, follow_outputs, show_progress="hidden")
