"""YAML templates of the configs `aligner demo-assets` writes: REINFORCE, PPO and reward-model training."""

from __future__ import annotations

# ---------------------------------------------------------------------------------------------------------------
# Files

CONFIG_TEMPLATE = """\
# Demo REINFORCE / RLOO run on the tiny policy built by `aligner demo-assets` (see aligner/demo/).
# Run it with
#     aligner train --config DIR/reinforce.yaml
# where DIR is this folder. Relative paths below resolve against this folder; the run goes to DIR/runs/reinforce.
# Reward (aligner.demo:reward): (#positive - #negative adjectives) / #adjectives of the response, minus 0.5 when
# it never names the prompt's subject; about 0 on average for this SFT policy, at most 1.
run_dir: runs/reinforce
seed: 1234
model:
  policy_path: policy
  dtype: float32
  device: auto
  attn_implementation: eager
data:
  train_file: prompts_train.jsonl
  val_file: prompts_val.jsonl
  max_prompt_length: 64
reward:
  function: aligner.demo:reward
  # server_url: http://127.0.0.1:8000   # instead of function: score with DIR/reward_model served by
  #                                     #   aligner serve-reward --model reward_model      (run in DIR)
# validation:                           # with the reward model: score validation with this rule too, the gold
#   extra_rewards:                      #   reward (val/extra_rewards/rule) that falls when the policy games the model
#     rule: {function: aligner.demo:reward}
generation:
  max_new_tokens: 48
  temperature: 1.0
  batch_size: 64
reinforce:
  # A preset of the knobs (docs/training.md): rloo, nemo, grpo, dr_grpo, dapo, gspo, cispo, reinforce_pp. A knob
  # written here (initial_policy_kl_penalty, baseline, ...) would override every preset's.
  algorithm: rloo
  num_prompts_per_step: 8
  num_rollouts_per_prompt: 4
optim:
  lr: 3.0e-4
  min_lr: 3.0e-5
  warmup_steps: 5
  weight_decay: 0.0
  max_grad_norm: 1.0
  micro_batch_size: 16
trainer:
  max_steps: 80
  val_check_interval: 10
  save_interval: 20
  keep_checkpoints: 2
"""

PPO_CONFIG_HEADER = """\
# Demo PPO run: the settings of reinforce.yaml with `algorithm: ppo` and a critic (see aligner/trainers/ppo.py).
# Run it with
#     aligner train --config DIR/ppo.yaml
# where DIR is this folder. `aligner train` starts a critic server (aligner serve-critic) from DIR/reward_model,
# trains it beside the policy and stops it at the end; its log goes to DIR/runs/ppo/critic_server.log.
# Rewards still come from aligner.demo:reward (as in reinforce.yaml), so the two runs' rewards compare directly.
"""
PPO_CONFIG_EXTRA = """\
algorithm: ppo
ppo:
  initial_policy_kl_penalty: 0.02
  gae_lambda: 0.95
  normalize_advantages: true
critic:
  model_path: reward_model
  # The critic starts from the reward model, whose scale is not this reward's: a high rate lets it catch up.
  server_overrides: [lr=1.0e-3]
"""


def ppo_config_text() -> str:
    """ppo.yaml: reinforce.yaml's settings (its comment header replaced) plus the PPO sections."""
    body = CONFIG_TEMPLATE[CONFIG_TEMPLATE.index("run_dir:") :].replace("run_dir: runs/reinforce", "run_dir: runs/ppo")
    return PPO_CONFIG_HEADER + body + PPO_CONFIG_EXTRA


RM_CONFIG_TEMPLATE = """\
# Demo reward-model training (Bradley-Terry) on the preference pairs built by `aligner demo-assets` (aligner/demo/).
# `aligner demo-assets DIR` already ran it into DIR/reward_model; run it again (after editing) with
#     aligner train-rm --config DIR/reward_model.yaml
# Relative paths below resolve against this folder. A pair is two SFT-style responses to one chat-formatted prompt,
# chosen = the one with the higher aligner.demo:reward (ties left out). The reward model starts from the SFT policy
# (its body, plus a new score head) and scores prompt + response. Use it in reinforce.yaml with
# `model_path: reward_model` in place of `function:` under `reward:`, or serve it (in DIR) with
#     aligner serve-reward --model reward_model
output_dir: reward_model
seed: 1234
model:
  init_path: policy
  dtype: float32
  device: cpu
data:
  train_file: preferences_train.jsonl
  val_file: preferences_val.jsonl
  max_length: 128
optim:
  lr: {lr}
  weight_decay: 0.0
  warmup_steps: 10
  max_grad_norm: 1.0
  batch_size: {batch_size}
trainer:
  max_steps: {max_steps}
  val_check_interval: 50
  progress_bar: true
"""
