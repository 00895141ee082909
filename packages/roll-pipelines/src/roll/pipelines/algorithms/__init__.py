"""RL and preference algorithms as pure tensor functions, one module per family.

- :mod:`.aggregate`: masked reductions and the loss-aggregation modes (token-mean, seq-mean-*).
- :mod:`.estimators`: every advantage estimator (GAE, GRPO, Dr. GRPO, RLOO, REINFORCE++(-baseline), GiGPO), each
  with its formula and paper, and ``estimate_advantages``, the one entry rlvr, agentic and on-policy
  distillation call (rows grouped by id).
- :mod:`.stats`: the tensor helpers the estimators share: masked whitening, group statistics by id, discounted
  returns, reward normalization (batch, group, tag, running) and clipping.
- :mod:`.policy_loss`: PPO (clip-higher, dual-clip), GSPO, CISPO, TOPR, SAPO, GMPO, entropy bonus.
- :mod:`.mismatch`: the train/infer mismatch: its per-step metrics and the corrections (truncated IS, masked IS,
  the IcePop token mask).
- :mod:`.covariance`: Clip-Cov and KL-Cov, entropy control on the tokens of highest log-prob/advantage covariance.
- :mod:`.kl`: KL estimators (k1, k2, k3, low-variance, straight-through) and KL in the loss; :mod:`.kl_control`:
  the fixed and adaptive KL controllers (torch-free).
- :mod:`.value_loss`: the critic's clipped value loss.
- :mod:`.dapo`: overlong filtering, soft overlong punishment, dynamic-sampling group filter.
- :mod:`.preference`: DPO, cDPO, IPO, Bradley-Terry reward-model loss, SFT cross-entropy.
- :mod:`.divergence`: distillation divergences on the teacher's top-k (forward/reverse/skewed KL, JS, AKL).
- :mod:`.presets` and :mod:`.choices`: ``AlgorithmConfig`` with named presets; torch-free.
- :mod:`.registry`: the advantage estimators and policy losses by name, each with what it needs (critic, groups,
  reference) and a description; torch-free, so pipelines' configs declare and check what they support.
- :mod:`.losses`: the LossFn objects of the RL modes: ``PolicyLoss`` (every registered loss, KL, entropy, TIS),
  ``ValueLoss``, ``MaskedNLLLoss`` (the warm-up).
- :mod:`.distill`: on-policy distillation's advantage (the student's negative log-ratio to the teacher).

This package imports nothing itself, so importing the config (``presets``) does not import torch.
"""
