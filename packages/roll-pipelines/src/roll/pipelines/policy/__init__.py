"""The shared RL core: :class:`~roll.pipelines.policy.group.PolicyGroup` (train + infer clusters, model update,
reference, critic, warm-up, training over mini-batches, checkpoints, export, time-sharing) and the critic's use in
a step (:mod:`roll.pipelines.policy.critic`). RL modes compose these; none subclasses another."""
