"""marshmallow schemas of every request and response of the REST API (they make the OpenAPI document too)."""

from __future__ import annotations

import datetime as dt

from apiflask import Schema
from apiflask.fields import Boolean, DateTime, Dict, File, Float, Integer, List, Nested, String, Tuple
from apiflask.validators import Length, OneOf, Range, Regexp
from flask import current_app, has_app_context
from marshmallow import ValidationError, post_dump

from aligner.config import ALGORITHM_SUMMARIES, HEALTH_RULES
from aligner.metrics import TRAIN_REWARD
from webapp.catalogue import NAME_PATTERN, TARGET_PATTERN
from webapp.db import (
    ACTIONS,
    ALGORITHMS,
    INT32_MAX,
    MODEL_KINDS,
    SERVER_KINDS,
    STATUSES,
    run_dir_name,
    service_redactor,
)
from webapp.extensions import db

MAX_GPUS_PER_JOB = 64
MAX_PER_PAGE = 100
SPLITS = ("train", "validation")


def no_nul(value: str) -> None:
    """PostgreSQL text cannot hold NUL characters: refuse them (422) instead of failing in the database (500)."""
    if "\x00" in value:
        raise ValidationError("must not contain NUL characters")


# no_nul as an OpenAPI `pattern`, for fields without a pattern of their own (the document says NUL is refused).
NO_NUL = Regexp("^[^\\u0000]*$", error="must not contain NUL characters")


class UTCDateTime(DateTime):
    """The database keeps naive UTC times; the API says so (`2026-11-22T19:00:00+00:00`)."""

    def _serialize(self, value, attr, obj, **kwargs):
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return super()._serialize(value, attr, obj, **kwargs)


class PageQuery(Schema):
    page = Integer(load_default=1, validate=Range(min=1, max=INT32_MAX), metadata={"description": "From 1."})
    per_page = Integer(
        load_default=20, validate=Range(min=1, max=MAX_PER_PAGE), metadata={"description": "At most 100."}
    )


class PageOut(Schema):
    total = Integer(required=True, metadata={"description": "Items matching the filters, on all pages."})
    page = Integer(required=True)
    per_page = Integer(required=True)


# ----------------------------------------------------------------------------------------------------------- jobs
class JobIn(Schema):
    name = String(required=True, validate=[Length(min=1, max=200), NO_NUL], metadata={"example": "rloo-lr1e-6"})
    config = Dict(
        keys=String(),
        required=True,
        metadata={
            "description": "The training config: `aligner train --config`'s shape (aligner/config.py), naming "
            "catalogue entries instead of paths, URLs or code: model.policy (and model.tokenizer), "
            "data.train_dataset and data.val_dataset (dataset ids or names), reward.function (a built-in such as "
            "exact_match, with reward.function_args, or a registered function), reward.model or reward.server, "
            "validation.extra_rewards (gold rewards of the validations by name, each named as reward is), and "
            "for `algorithm: ppo` critic.model (the worker starts a critic server) or critic.server. "
            "reinforce.algorithm picks a preset of the REINFORCE knobs (a knob given explicitly wins): "
            + "; ".join(f"{name}: {line}" for name, line in ALGORITHM_SUMMARIES.items())
            + ". run_dir is set by the server; trainer.keep_checkpoints defaults to 3.",
            "example": {
                "model": {"policy": "tiny-sft"},
                "data": {"train_dataset": 1, "val_dataset": 2},
                "reward": {"function": "exact_match", "function_args": {"ignore_case": True}},
                "trainer": {"max_steps": 50},
            },
        },
    )
    num_processes = Integer(
        load_default=1,
        strict=True,
        validate=Range(min=1, max=8),
        metadata={
            "description": "Training processes the worker starts (torchrun): data parallel with model.backend hf, "
            "the model sharded over them with fsdp. A job that does not fit the worker's device memory is refused."
        },
    )
    num_gpus = Integer(
        load_default=0,
        strict=True,
        validate=Range(min=0, max=MAX_GPUS_PER_JOB),
        metadata={
            "description": "GPUs the job needs (0: the CPU). A worker runs it once it holds that many of its devices "
            "(ALIGNER_WORKER_GPUS), which no other job uses meanwhile; the trainer sees them as CUDA_VISIBLE_DEVICES."
        },
    )


class JobOut(Schema):
    id = Integer(required=True)
    name = String(required=True)
    algorithm = String(
        required=True,
        metadata={"enum": list(ALGORITHMS), "description": "The config's `algorithm`: reinforce or ppo."},
    )
    kind = String(
        required=True,
        attribute="algorithm",
        dump_only=True,  # marshmallow refuses two loaded fields on one attribute; this schema is only dumped
        metadata={
            "enum": list(ALGORITHMS),
            "deprecated": True,
            "description": "Deprecated: use `algorithm`, which holds the same value; `kind` goes in the next release.",
        },
    )
    status = String(required=True, metadata={"enum": list(STATUSES)})
    actions = List(
        String(metadata={"enum": list(ACTIONS)}),
        required=True,
        metadata={
            "description": "What may be done to the job in its state now, each a POST /jobs/{id}/<action>: cancel "
            "(queued or running), resume (finished or paused, with a checkpoint, unless it succeeded after all its "
            "steps), retry (failed, cancelled or paused); and delete, DELETE /jobs/{id} (finished or paused). Another "
            "action gets 409, except a cancel of a job being cancelled, which changes nothing."
        },
    )
    config = Dict(
        keys=String(),
        required=True,
        metadata={"description": "The resolved config (every default), naming catalogue entries; run_dir as below."},
    )
    run_dir = String(
        required=True,
        metadata={
            "deprecated": True,
            "description": "Deprecated: the run folder relative to the server's data folder (`runs/job_12`), never "
            "its path on the server. Goes in the next release.",
        },
    )
    num_processes = Integer(required=True)
    num_gpus = Integer(required=True)
    devices = String(allow_none=True, metadata={"description": "The GPUs its run holds, as host:ids."})
    created_at = UTCDateTime(required=True)
    started_at = UTCDateTime(allow_none=True)
    finished_at = UTCDateTime(allow_none=True)
    error = String(allow_none=True)
    worker = String(allow_none=True, metadata={"description": "The worker running the job (its lease)."})
    heartbeat_at = UTCDateTime(allow_none=True)
    cancel_requested = Boolean(required=True)
    attempts = Integer(required=True)
    step = Integer(required=True, metadata={"description": "Last optimiser step done."})
    max_steps = Integer(required=True)
    latest_reward = Float(allow_none=True, metadata={"description": "Mean train reward of the last step."})
    alarms = List(
        String(),
        required=True,
        metadata={
            "description": f"Run health alarms firing now ({', '.join(HEALTH_RULES)}); each start and end is a "
            "`health` event of the job."
        },
    )

    @post_dump
    def _no_server_paths(self, data, **kwargs):
        """The run folder by its relative name, here and in the config (users never see the server's paths); the
        error through the service's redactor once more: a row stored before errors were redacted is shown so too."""
        if data.get("error") and has_app_context():
            redactor = service_redactor(db.session, data.get("run_dir"), current_app.config["DATA_DIR"])
            data["error"] = redactor.text(data["error"])
        data["run_dir"] = run_dir_name(data.get("run_dir"))
        if isinstance(data.get("config"), dict) and "run_dir" in data["config"]:
            data["config"] = {**data["config"], "run_dir": run_dir_name(data["config"]["run_dir"])}
        return data


class JobListQuery(PageQuery):
    status = String(validate=OneOf(STATUSES), metadata={"description": "Only jobs in this status."})
    algorithm = String(validate=OneOf(ALGORITHMS), metadata={"description": "Only jobs of this algorithm."})


class JobPage(PageOut):
    items = List(Nested(JobOut), required=True)


class DryRunQuery(Schema):
    dry_run = Boolean(
        load_default=False,
        metadata={
            "description": "true: create no job; run the full preflight (the cheap checks, the reward on 2 prompts "
            "x 2 samples, an estimate of the step time) and answer 200 with its checks."
        },
    )


class PreflightCheck(Schema):
    name = String(required=True, metadata={"enum": ["policy", "tokenizer", "datasets", "reward", "step_time"]})
    ok = Boolean(required=True)
    message = String(required=True)
    seconds = Float(required=True, metadata={"description": "How long the check took."})


class PreflightWarning(Schema):
    field = String(required=True, metadata={"description": "The dotted path of the setting, e.g. config.optim.lr."})
    message = String(required=True, metadata={"description": "Why it is likely to train nothing."})


class MemoryPlanOut(Schema):
    backend = String(required=True)
    world_size = Integer(required=True, metadata={"description": "The job's num_processes."})
    per_rank_bytes = Integer(required=True, metadata={"description": "One process's estimated device peak."})
    host_bytes_per_rank = Integer(required=True, metadata={"description": "What one process keeps in host memory."})
    needed_bytes = Integer(
        required=True,
        metadata={"description": "What the device must hold: per_rank_bytes, or every process's device and host bytes "
                  "together where they share the host's RAM (device_shared)."},
    )  # fmt: skip
    device_bytes = Integer(required=True, metadata={"description": "One worker device's memory."})
    device_source = String(required=True, metadata={"description": "declared (ALIGNER_WORKER_DEVICE_MEMORY_GB), or "
                                                    "what was measured on the API's host."})  # fmt: skip
    device_shared = Boolean(required=True, metadata={"description": "The job's processes share the host's RAM."})
    fits = Boolean(required=True)
    trainable_parameters = Integer(required=True)
    device_parts = Dict(keys=String(), values=Integer(), required=True, metadata={"description": "Bytes by part."})
    host_parts = Dict(keys=String(), values=Integer(), required=True)


class PreflightOut(Schema):
    ok = Boolean(required=True, metadata={"description": "Every check passed."})
    checks = List(Nested(PreflightCheck), required=True)
    warnings = List(
        Nested(PreflightWarning),
        required=True,
        metadata={
            "description": "Settings that pass the checks but are likely to train nothing (webapp/advice.py): "
            "validation prompts equal to the training ones, a learning rate far under the policy size's, a run "
            "too short. They never make `ok` false."
        },
    )
    estimated_step_s = Float(
        required=True,
        allow_none=True,
        metadata={"description": "A rough estimate of one step's seconds (null when the reward try failed)."},
    )
    memory = Nested(
        MemoryPlanOut,
        required=True,
        allow_none=True,
        metadata={
            "description": "One process's estimated memory for the job's model.backend and num_processes against the "
            "worker's device (docs/scaling.md, \"Memory: which backend fits\"); null when the policy's config.json "
            "and safetensors headers cannot be read. A job that does not fit is refused with 422."
        },
    )
    config = Dict(keys=String(), required=True, metadata={"description": "The resolved config the job would keep."})


# ------------------------------------------------------------------------------------------------- reward tries
class TryIn(Schema):
    config = Dict(
        keys=String(),
        required=True,
        metadata={
            "description": "A job's config, as POST /api/v1/jobs takes it: model.policy (model.tokenizer), "
            "data.train_dataset (data.val_dataset may be left out), reward.function (function_args) or "
            "reward.model or reward.server, generation.*. generation.max_new_tokens is capped at 256 for a try.",
            "example": {
                "model": {"policy": "tiny-sft"},
                "data": {"train_dataset": 1},
                "reward": {"function": "exact_match"},
                "generation": {"max_new_tokens": 32},
            },
        },
    )
    num_prompts = Integer(
        load_default=4,
        strict=True,
        validate=Range(min=1, max=8),
        metadata={"description": "The first N prompts of data.train_dataset."},
    )
    num_samples = Integer(
        load_default=4, strict=True, validate=Range(min=2, max=8), metadata={"description": "Responses per prompt."}
    )


class TrySample(Schema):
    group = Integer(required=True, metadata={"description": "Index of its prompt (groups[i])."})
    prompt = String(required=True)
    response = String(required=True)
    reward = Float(required=True)
    length = Integer(required=True, metadata={"description": "Response tokens."})


class TryGroup(Schema):
    group = Integer(required=True)
    prompt = String(required=True)
    mean = Float(required=True)
    std = Float(required=True, metadata={"description": "Population standard deviation of its rewards."})
    zero_spread = Boolean(
        required=True, metadata={"description": "All its samples got the same reward: RLOO learns nothing from it."}
    )


class TryOut(Schema):
    samples = List(Nested(TrySample), required=True)
    groups = List(Nested(TryGroup), required=True)
    reward_length_corr = Float(required=True, metadata={"description": "Pearson correlation of reward and length."})
    frac_zero_std_groups = Float(required=True, metadata={"description": "Share of the groups with zero spread."})
    seconds = Float(required=True, metadata={"description": "How long the try took."})
    warnings = List(String(), required=True)


# -------------------------------------------------------------------------------------------------- job results
class MetricsQuery(Schema):
    name = List(
        String(validate=[Length(max=100), NO_NUL]),
        metadata={"description": "Only these metrics (repeat the parameter for several)."},
    )
    since_step = Integer(
        validate=Range(min=-1, max=INT32_MAX), metadata={"description": "Only steps after this one (exclusive)."}
    )


class MetricsOut(Schema):
    job_id = Integer(required=True)
    metrics = Dict(
        keys=String(),
        values=List(
            Tuple(
                (Integer(), Float()),
                metadata={"type": "array", "description": "[step, value]", "minItems": 2, "maxItems": 2},
            )
        ),
        required=True,
        metadata={
            "description": "Each metric's [step, value] pairs in step order.",
            "example": {TRAIN_REWARD: [[1, 0.12], [2, 0.19]]},
        },
    )


class SamplesQuery(PageQuery):
    step = Integer(validate=Range(min=0, max=INT32_MAX))
    split = String(validate=OneOf(SPLITS))
    min_reward = Float(allow_nan=False, metadata={"description": "Only samples with reward >= this."})
    max_reward = Float(allow_nan=False, metadata={"description": "Only samples with reward <= this."})


class SampleOut(Schema):
    step = Integer(required=True)
    split = String(required=True)
    index = Integer(required=True, metadata={"description": "Position within (step, split)."})
    prompt = String(required=True)
    response = String(required=True)
    reward = Float(required=True)
    kl = Float(allow_none=True)
    advantage = Float(allow_none=True)
    is_end = Boolean(required=True, metadata={"description": "The response ended properly (EOS or end string)."})
    extra_rewards = Dict(
        keys=String(),
        values=Float(allow_none=True),
        allow_none=True,
        metadata={"description": "A validation sample's gold rewards (validation.extra_rewards): {name: value}."},
    )


class SamplePage(PageOut):
    items = List(Nested(SampleOut), required=True)


class CheckpointOut(Schema):
    step = Integer(required=True)
    size_bytes = Integer(
        required=True, allow_none=True, metadata={"description": "Bytes of its files (its zip); null: gone."}
    )
    path = String(
        required=True,
        metadata={
            "deprecated": True,
            "description": "Deprecated: the folder in the run (`checkpoints/step_000012`), never the server's path; "
            "use `step` (GET .../checkpoints/{step}/download). Goes in the next release.",
        },
    )
    created_at = UTCDateTime(required=True)


class CheckpointList(Schema):
    items = List(Nested(CheckpointOut), required=True)


class EventsQuery(Schema):
    last_event_id = Integer(
        validate=Range(min=0, max=INT32_MAX),
        metadata={"description": "Send only events after this id (the `Last-Event-ID` header wins if both)."},
    )
    timeout = Float(
        validate=Range(min=0, max=86400),
        metadata={"description": "End the stream after this many seconds even if the job is still running."},
    )


# ----------------------------------------------------------------------------------------------------- datasets
class DatasetIn(Schema):
    file = File(required=True, metadata={"description": "A prompt JSONL file (see aligner/data/prompts.py)."})
    name = String(validate=[Length(min=1, max=200), NO_NUL], metadata={"description": "Default: the file's name."})


class DatasetOut(Schema):
    id = Integer(required=True)
    name = String(required=True)
    path = String(
        required=True,
        metadata={"description": "Where it is stored, relative to the data folder."},
    )
    num_prompts = Integer(required=True)
    size_bytes = Integer(required=True)
    shared = Boolean(required=True, metadata={"description": "Shared by an admin with every user."})
    mine = Boolean(required=True, metadata={"description": "You uploaded it."})
    created_at = UTCDateTime(required=True)


class DatasetPage(PageOut):
    items = List(Nested(DatasetOut), required=True)


# ------------------------------------------------------------------------------------------------------- health
class HealthOut(Schema):
    status = String(required=True, metadata={"enum": ["ok", "error"]})
    database = String(
        required=True, metadata={"description": 'ok, or "database unavailable" (the reason is in the server\'s log).'}
    )
    version = String(required=True)


# ---------------------------------------------------------------------------------------------------- catalogue
CATALOGUE_NAME = {"description": "Letters, digits, '.', '_', '-' (1-100), starting with a letter or digit."}
# The catalogue's rules as OpenAPI `pattern`s; webapp/catalogue.py checks them (for the CLI too), with its messages.
NAME_RULES = [Length(min=1, max=100), no_nul]
NAME_FIELD = {**CATALOGUE_NAME, "pattern": f"^{NAME_PATTERN.pattern}$"}
TARGET_RULES = [Length(min=3, max=300), no_nul]
TARGET_FIELD = {
    "description": "`package.module:function`, importable by the workers.",
    "example": "my.rm:score",
    "pattern": f"^{TARGET_PATTERN.pattern}$",
}
URL_RULES = [Length(min=8, max=2000), no_nul]
URL_FIELD = {"example": "http://rm:8000", "pattern": r"^https?://[^\s/?#\u0000]+([/?#][^\s\u0000]*)?$"}


class ModelIn(Schema):
    name = String(required=True, validate=NAME_RULES, metadata=NAME_FIELD)
    path = String(
        required=True,
        validate=[Length(min=1, max=4096), NO_NUL],
        metadata={"description": "A Hugging Face folder on the server (symlinks are resolved when registered)."},
    )
    kind = String(required=True, validate=OneOf(MODEL_KINDS), metadata={"description": "What jobs may use it as."})
    description = String(load_default="", validate=[Length(max=2000), NO_NUL])


class ModelOut(Schema):
    id = Integer(required=True)
    name = String(required=True)
    kind = String(required=True, metadata={"enum": list(MODEL_KINDS)})
    architecture = String(required=True, metadata={"example": "LlamaForCausalLM"})
    num_parameters = Integer(allow_none=True)
    size_bytes = Integer(required=True)
    description = String(required=True)
    created_at = UTCDateTime(required=True)
    path = String(allow_none=True, metadata={"description": "The server folder: shown to admins only."})


class CatalogueNamePath(Schema):
    name = String(required=True, validate=NAME_RULES, metadata=NAME_FIELD)


class ModelQuery(Schema):
    kind = String(validate=OneOf(MODEL_KINDS), metadata={"description": "Only models of this kind."})


class ModelList(Schema):
    items = List(Nested(ModelOut), required=True)


class RewardFunctionIn(Schema):
    name = String(required=True, validate=NAME_RULES, metadata=NAME_FIELD)
    target = String(
        required=True,
        validate=TARGET_RULES,
        metadata=TARGET_FIELD,
    )
    description = String(load_default="", validate=[Length(max=2000), NO_NUL])


class RewardFunctionOut(Schema):
    id = Integer(allow_none=True, metadata={"description": "None for a built-in."})
    name = String(required=True)
    builtin = Boolean(required=True)
    description = String(required=True)
    params = Dict(
        keys=String(),
        required=True,
        metadata={"description": "JSON schema of `reward.function_args` (a built-in's parameters)."},
    )
    target = String(allow_none=True, metadata={"description": "`module:callable`: shown to admins only."})


class RewardFunctionList(Schema):
    items = List(Nested(RewardFunctionOut), required=True)


class ServerIn(Schema):
    name = String(required=True, validate=NAME_RULES, metadata=NAME_FIELD)
    url = String(required=True, validate=URL_RULES, metadata=URL_FIELD)
    kind = String(required=True, validate=OneOf(SERVER_KINDS))
    model_name = String(
        load_default="reward_model",
        validate=NAME_RULES,
        metadata={**NAME_FIELD, "description": "Model name on a reward server (NeMo-Aligner's `reward_model`)."},
    )
    description = String(load_default="", validate=[Length(max=2000), NO_NUL])


class ServerOut(Schema):
    id = Integer(required=True)
    name = String(required=True)
    kind = String(required=True, metadata={"enum": list(SERVER_KINDS)})
    model_name = String(required=True)
    description = String(required=True)
    created_at = UTCDateTime(required=True)
    url = String(allow_none=True, metadata={"description": "Shown to admins only."})


class ServerList(Schema):
    items = List(Nested(ServerOut), required=True)


class DatasetShareIn(Schema):
    shared = Boolean(required=True, metadata={"description": "Every user may use it (true) or its owner only."})


# ------------------------------------------------------------------------------------------------------ account
class MeOut(Schema):
    name = String(required=True, metadata={"description": "The token's user."})
    is_admin = Boolean(required=True, metadata={"description": "An admin manages the catalogue and every job."})


# -------------------------------------------------------------------------------------------------------- admin
class AdminJobOut(JobOut):
    user = String(required=True, metadata={"description": "The job's owner."})
    deleted_at = UTCDateTime(
        allow_none=True,
        metadata={
            "description": "When the job was deleted (its owner no longer sees it; its config and results are gone, "
            "its events kept); null while it is not."
        },
    )


class AdminJobListQuery(JobListQuery):
    user = String(validate=[Length(min=1, max=100), NO_NUL], metadata={"description": "Only this user's jobs."})


class AdminJobPage(PageOut):
    items = List(Nested(AdminJobOut), required=True)


class AdminEventOut(Schema):
    id = Integer(required=True)
    kind = String(
        required=True,
        metadata={"description": "status, metrics, samples, checkpoint, log, health, or deleted (the job's last)."},
    )
    payload = Dict(keys=String(), required=True)
    created_at = UTCDateTime(required=True)


class AdminEventPage(PageOut):
    items = List(Nested(AdminEventOut), required=True)
