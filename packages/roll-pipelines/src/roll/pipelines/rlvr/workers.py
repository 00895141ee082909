"""RLVR's worker roles: roll-workers' roles already have everything RLVR needs.

:class:`~roll.workers.roles.actor.ActorTrainWorker` and :class:`~roll.workers.roles.critic.CriticWorker` both have
``train_step`` (the loss's own metrics come back with the step's, as ``actor/*`` and ``critic/*``) and
``threads``; the actor also has ``set_lr`` for a warm-up at its own rate. The names stay for readers.
"""

from __future__ import annotations

from roll.workers.roles.actor import ActorTrainWorker
from roll.workers.roles.critic import CriticWorker

__all__ = ["RLVRActorWorker", "RLVRCriticWorker"]

RLVRActorWorker = ActorTrainWorker
RLVRCriticWorker = CriticWorker
