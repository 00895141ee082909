"""Env managers: run episodes of many envs against a policy and turn them into training samples.

- :mod:`.config`: :class:`~.config.EnvManagerConfig` (light).
- :mod:`.slots`: :class:`~.slots.EnvSlots`, many envs in one process with a deadline per call (hung envs are cut
  off); :mod:`.worker`: the ``EnvWorker`` Ray actor holding slots, and :class:`~.worker.ClusterEnvPool`.
- :mod:`.chat`: token-in/token-out chat encoding (template segments around the model's own tokens).
- :mod:`.episode`: episodes, and the two sample layouts: trajectory-wise (one sample per episode) and step-wise
  (one per turn, with a history window and GiGPO anchor states).
- :mod:`.manager`: :class:`~.manager.RolloutManager`, the turn loop (observations -> one batched generate ->
  parse -> step), group sizes, redundancy, format penalty.
- :mod:`.batching`: samples to a padded Batch (imports torch).

Nothing here imports torch but :mod:`.batching`.
"""
