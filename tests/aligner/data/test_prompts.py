import json

import pytest

from aligner.data.prompts import PromptSampler, build_prompt_dataset, read_prompt_file
from aligner.errors import PromptDataError
from aligner.modeling.hf import load_tokenizer


def write_lines(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    return path


def test_reads_both_formats_and_keeps_metadata(tmp_path):
    path = write_lines(
        tmp_path / "p.jsonl",
        [{"prompt": "hi", "answer": "42"}, "", {"messages": [{"role": "user", "content": "yo"}]}],
    )
    records = read_prompt_file(path)
    assert [r.text for r in records] == ["hi", None]
    assert records[0].metadata == {"answer": "42"}
    assert records[1].messages == [{"role": "user", "content": "yo"}]


def test_bad_lines_are_reported_with_file_line_and_reason(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl",
        [
            {"prompt": "fine"},
            "{not json",
            {"text": "wrong field"},
            {"prompt": ""},
            {"messages": [{"role": "robot", "content": "x"}]},
            {"prompt": "a", "messages": []},
            "[1, 2]",
        ],
    )
    with pytest.raises(PromptDataError) as err:
        read_prompt_file(path)
    text = str(err.value)
    assert "6 bad line(s)" in text
    assert f"{path}:2: invalid JSON" in text
    assert f'{path}:3: needs exactly one of the fields "prompt" or "messages"' in text
    assert f'{path}:4: field "prompt" must be a non-empty string' in text
    assert f"{path}:5: messages[0].role 'robot' is not one of" in text
    assert f"{path}:7: expected a JSON object, got list" in text


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(PromptDataError, match="has no prompts"):
        read_prompt_file(write_lines(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(PromptDataError, match="prompt file not found"):
        read_prompt_file(tmp_path / "missing.jsonl")
    (tmp_path / "latin1.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(PromptDataError, match="not valid UTF-8"):
        read_prompt_file(tmp_path / "latin1.jsonl")


def test_text_no_tokenizer_or_database_takes_is_a_bad_line(tmp_path):
    # JSON escapes parse into strings with lone surrogates or NUL: every job using the file would fail on them later.
    path = write_lines(
        tmp_path / "odd.jsonl",
        [
            r'{"prompt": "fine \ud83d\ude00"}',  # a surrogate pair: one valid character
            r'{"prompt": "a\ud800b"}',
            r'{"messages": [{"role": "user", "content": "\udfff"}]}',
            r'{"prompt": "x", "answer\ud800": 1}',
            r'{"prompt": "a\u0000b"}',
        ],
    )
    with pytest.raises(PromptDataError) as err:
        read_prompt_file(path)
    text = str(err.value)
    assert "4 bad line(s)" in text
    assert f"{path}:2: prompt: must be valid Unicode: lone surrogate \\ud800 at position 1" in text
    assert f"{path}:3: messages.0.content: must be valid Unicode: lone surrogate \\udfff" in text
    assert f"{path}:4: answer\\ud800: key must be valid Unicode" in text
    assert f"{path}:5: prompt: must not contain NUL characters" in text


def test_chat_template_applies_when_the_tokenizer_has_one(tmp_path, tiny_policy_dir):
    tokenizer = load_tokenizer(tiny_policy_dir)
    records = read_prompt_file(write_lines(tmp_path / "p.jsonl", [{"prompt": "describe the cat."}]))
    with_template = build_prompt_dataset(records, tokenizer, None, 512)
    assert with_template.texts == ["<|user|>\ndescribe the cat.\n<|assistant|>\n"]
    plain = build_prompt_dataset(records, tokenizer, False, 512)
    assert plain.texts == ["describe the cat."]
    truncated = build_prompt_dataset(records, tokenizer, None, 3)
    assert truncated.num_truncated == 1 and len(truncated.token_ids[0]) == 3
    assert truncated.token_ids[0] == with_template.token_ids[0][-3:]


def test_sampler_covers_each_epoch_and_resumes_exactly():
    sampler = PromptSampler(5, seed=3)
    first = [sampler.next_batch(2) for _ in range(5)]  # 10 draws = two full epochs
    epoch0 = [i for b in first for i in b][:5]
    assert sorted(epoch0) == list(range(5))
    assert sampler.epoch == 1 and sampler.index == 5

    a = PromptSampler(7, seed=1)
    a.next_batch(4)
    state = a.state_dict()
    b = PromptSampler(7, seed=1)
    b.load_state_dict(state)
    assert [a.next_batch(3) for _ in range(4)] == [b.next_batch(3) for _ in range(4)]
    with pytest.raises(PromptDataError, match="made with 7 training prompts"):
        PromptSampler(8, seed=1).load_state_dict(state)
