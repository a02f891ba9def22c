"""The coordinator role (`intellect-node coordinator --pool ID`): `daemon` (the shell: chain, spec, the
pool's network, its loops), `intake` (invitations, tasks, submissions), `ledger` (recording and
invalidations), `network` (heartbeats, relays, policy announcements), `training` (the GRPO trainer and
the weight broadcast), `state` (its durable tasks, rollouts, steps and refusals behind named methods),
`rules` (pure)."""

from .daemon import Coordinator, CoordinatorConfig

__all__ = ["Coordinator", "CoordinatorConfig"]
