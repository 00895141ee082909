"""RL and preference algorithms as pure tensor functions, one module per family.

- :mod:`.aggregate`: masked reductions and the loss-aggregation modes (token-mean, seq-mean-*).
- :mod:`.advantages`: GAE, GRPO, Dr. GRPO, RLOO, REINFORCE++(-baseline), GiGPO group helpers, reward
  normalization (batch, group, running) and clipping, masked whitening.
- :mod:`.policy_loss`: PPO (clip-higher, dual-clip), GSPO, CISPO, TOPR, truncated IS for the train/infer
  mismatch, entropy bonus.
- :mod:`.kl`: KL estimators (k1, k2, k3, low-variance, straight-through), KL in the reward or the loss, fixed
  and adaptive KL controllers.
- :mod:`.value_loss`: the critic's clipped value loss.
- :mod:`.dapo`: overlong filtering, soft overlong punishment, dynamic-sampling group filter.
- :mod:`.preference`: DPO, cDPO, IPO, Bradley-Terry reward-model loss, SFT cross-entropy.
- :mod:`.divergence`: distillation divergences on the teacher's top-k (forward/reverse/skewed KL, JS, AKL).
- :mod:`.presets` and :mod:`.choices`: ``AlgorithmConfig`` with named presets; torch-free.

This package imports nothing itself, so importing the config (``presets``) does not import torch.
"""
