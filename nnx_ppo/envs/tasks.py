"""Built-in pure-JAX tasks, registered under plain names in :func:`nnx_ppo.envs.make`.

All are tiny and fast, designed to test stateful (recurrent) agents:

* ``cue_memory`` (:class:`CueMemory`): remember a cue over a delay. Optimal
  return 1.0; any memoryless policy gets exactly ``1 / n_cues`` in expectation.
* ``cartpole_no_velocity`` (:class:`CartpoleNoVelocity`): continuous-action
  cart-pole balancing observing only cart position and pole angle. Optimal
  return = episode length (200 by default, all episodes truncated).
* ``constant_reward`` (:class:`ConstantReward`): reward 1 every step, never
  terminates; with a time limit, tests value learning with truncation bootstrapping.
* ``limb_reacher`` (:class:`LimbReacher`): a planar body of several two-joint
  limbs, each reaching for its own target: dict observations, one action and
  one reward per limb (the modular-body workload, docs/modular_body.md).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from nnx_ppo.envs.spaces import Box, Discrete
from nnx_ppo.envs.types import EnvState, RLEnv, as_f32

__all__ = ["CueMemory", "CartpoleNoVelocity", "ConstantReward", "LimbReacher"]


def _first_state(obs, data, metrics: dict | None = None) -> EnvState:
    """An episode's first state: no reward, not done, not truncated."""
    return EnvState(obs=obs, reward=as_f32(0.0), done=as_f32(0.0), metrics={} if metrics is None else metrics,
                    info={"truncated": as_f32(0.0)}, data=data)


def _next_state(state: EnvState, obs, reward, done, data, metrics: dict | None = None) -> EnvState:
    """The state after ``state``. These tasks never truncate by themselves (a
    ``TimeLimit`` wrapper may), so ``info["truncated"]`` is 0."""
    return EnvState(obs=obs, reward=reward, done=done, metrics={} if metrics is None else metrics,
                    info={**state.info, "truncated": as_f32(0.0)}, data=data)


class CueMemory(RLEnv):
    """Remember a cue across a delay, then report it.

    Timeline of one episode (``delay + 2`` steps, always *terminated*, never
    truncated). The observation has ``n_cues + 1`` channels: a one-hot cue and
    a query flag.

    * reset (t = 0): obs = one-hot(cue), query flag 0. The cue is drawn
      uniformly from the reset key.
    * t = 1 .. delay: obs = all zeros.
    * t = delay + 1: obs = zeros with the query flag set to 1.
    * The action taken at the query (``Discrete(n_cues)``) is scored: reward 1
      if it equals the cue, else 0, and the episode terminates (``done = 1``,
      ``info["truncated"] = 0``). Actions before the query are ignored (reward 0).

    ``metrics["success"]`` is 1.0 on the final step if the answer was right,
    0 otherwise (and 0 on all other steps).

    **Optimal return: 1.0.** A memoryless policy sees the same query
    observation whatever the cue, so it gets exactly ``1 / n_cues`` in
    expectation (0.5 for the default two cues).
    """

    def __init__(self, n_cues: int = 2, delay: int = 4):
        if n_cues < 2 or delay < 0:
            raise ValueError(f"CueMemory needs n_cues >= 2 and delay >= 0, got {n_cues}, {delay}")
        self.n_cues = int(n_cues)
        self.delay = int(delay)

    @property
    def observation_space(self):
        return Box((self.n_cues + 1,), 0.0, 1.0)

    @property
    def action_space(self):
        return Discrete(self.n_cues)

    def _obs(self, cue, t):
        cue_part = jax.nn.one_hot(cue, self.n_cues, dtype=jnp.float32) * as_f32(t == 0)
        query = as_f32(t == self.delay + 1).reshape((1,))
        return jnp.concatenate([cue_part, query])

    def reset(self, key):
        cue = jax.random.randint(key, (), 0, self.n_cues, dtype=jnp.int32)
        t = jnp.zeros((), jnp.int32)
        return _first_state(self._obs(cue, t), {"cue": cue, "t": t}, metrics={"success": as_f32(0.0)})

    def step(self, state, action):
        cue, t = state.data["cue"], state.data["t"]
        already_done = state.done > 0
        is_query = jnp.logical_and(t == self.delay + 1, jnp.logical_not(already_done))
        correct = jnp.asarray(action, jnp.int32).reshape(()) == cue
        reward = as_f32(jnp.logical_and(is_query, correct))
        t_next = t + 1
        done = jnp.maximum(state.done, as_f32(t_next >= self.delay + 2))
        return _next_state(state, self._obs(cue, t_next), reward, done, {"cue": cue, "t": t_next},
                           metrics={"success": reward})

    def __repr__(self):
        return f"CueMemory(n_cues={self.n_cues}, delay={self.delay})"


class CartpoleNoVelocity(RLEnv):
    """Cart-pole balancing with a continuous force, observing no velocities.

    Classic cart-pole dynamics (gravity 9.8, cart 1 kg, pole 0.1 kg, half-length
    0.5 m, Euler step 0.02 s). The action in ``[-1, 1]`` is scaled to a force
    in ``[-force_mag, force_mag]`` (10 N). The initial state is uniform in
    ``[-0.05, 0.05]`` for all four state variables (drawn from the reset key).
    The episode terminates when ``|x| > 2.4`` or ``|theta| > 12 deg``. Reward
    is 1.0 for every step taken while the pole is up (including the step that
    terminates), 0 afterwards.

    The observation is ``[x, theta]`` only (``full_observation=True`` gives the
    full state ``[x, x_dot, theta, theta_dot]``), so a policy has to infer velocities from the
    history: a memory task. Use with a time limit: ``make("cartpole_no_velocity")``
    applies ``TimeLimit(200)``, so episodes that keep the pole up are truncated.

    **Optimal return: the episode length (200 by default).** A linear state-
    feedback controller that sees velocities achieves it from every initial
    state; the same controller with velocities zeroed (a good memoryless
    policy) drops the pole before the time limit in most episodes (mean
    return about 100 of 200).
    """

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    length = 0.5
    tau = 0.02
    x_threshold = 2.4
    theta_threshold = 12 * 2 * math.pi / 360

    def __init__(self, force_mag: float = 10.0, full_observation: bool = False):
        self.force_mag = float(force_mag)
        self.full_observation = bool(full_observation)

    @property
    def observation_space(self):
        if self.full_observation:  # [x, x_dot, theta, theta_dot]
            low = [-2 * self.x_threshold, -np.inf, -2 * self.theta_threshold, -np.inf]
        else:  # [x, theta]
            low = [-2 * self.x_threshold, -2 * self.theta_threshold]
        high = [-v for v in low]
        return Box((len(low),), np.array(low), np.array(high))

    @property
    def action_space(self):
        return Box((1,), -1.0, 1.0)

    def _obs(self, phys):
        if self.full_observation:
            return phys
        return jnp.stack([phys[0], phys[2]])

    def reset(self, key):
        phys = jax.random.uniform(key, (4,), minval=-0.05, maxval=0.05, dtype=jnp.float32)
        return _first_state(self._obs(phys), phys)

    def step(self, state, action):
        phys = state.data
        x, x_dot, theta, theta_dot = phys[0], phys[1], phys[2], phys[3]
        a = jnp.clip(jnp.asarray(action, jnp.float32).reshape(-1)[0], -1.0, 1.0)
        force = a * self.force_mag
        total_mass = self.masscart + self.masspole
        polemass_length = self.masspole * self.length
        cos, sin = jnp.cos(theta), jnp.sin(theta)
        temp = (force + polemass_length * theta_dot**2 * sin) / total_mass
        effective_length = self.length * (4.0 / 3.0 - self.masspole * cos**2 / total_mass)
        theta_acc = (self.gravity * sin - cos * temp) / effective_length
        x_acc = temp - polemass_length * theta_acc * cos / total_mass
        new = jnp.stack([x + self.tau * x_dot, x_dot + self.tau * x_acc, theta + self.tau * theta_dot,
                         theta_dot + self.tau * theta_acc]).astype(jnp.float32)
        was_done = state.done > 0
        new = jnp.where(was_done, phys, new)  # frozen once the pole has fallen
        reward = as_f32(jnp.logical_not(was_done))
        terminated = jnp.logical_or(jnp.abs(new[0]) > self.x_threshold, jnp.abs(new[2]) > self.theta_threshold)
        done = jnp.maximum(state.done, as_f32(terminated))
        return _next_state(state, self._obs(new), reward, done, new)

    def __repr__(self):
        return f"CartpoleNoVelocity(force_mag={self.force_mag}, full_observation={self.full_observation})"


class ConstantReward(RLEnv):
    """Reward 1.0 every step; never terminates; the observation is constant (all ones).

    Meant to be wrapped in a time limit: ``make("constant_reward", episode_length=8)``
    gives 8-step episodes that are all truncated (``info["truncated"] = 1``). With
    truncation bootstrapping the true value of every state is ``1 / (1 - gamma)``
    (50 for gamma = 0.98); without it, the return of the first state is
    ``(1 - gamma**T) / (1 - gamma)``. **Optimal return: the episode length.**
    """

    def __init__(self, obs_size: int = 2, continuous: bool = False):
        self.obs_size = int(obs_size)
        self.continuous = bool(continuous)

    @property
    def observation_space(self):
        return Box((self.obs_size,), 1.0, 1.0)

    @property
    def action_space(self):
        # Actions are ignored; pick the kind of policy head to exercise.
        return Box((1,), -1.0, 1.0) if self.continuous else Discrete(2)

    def reset(self, key):
        del key
        return _first_state(jnp.ones((self.obs_size,), jnp.float32), None)

    def step(self, state, action):
        del action
        return state.replace(reward=as_f32(1.0), done=as_f32(0.0), info={**state.info, "truncated": as_f32(0.0)})

    def __repr__(self):
        return f"ConstantReward(obs_size={self.obs_size}, continuous={self.continuous})"


class LimbReacher(RLEnv):
    """A planar body of ``n_limbs`` two-joint arms, each reaching for its own target.

    The limbs are attached around a torso, each pointing outwards when its
    joints are at 0. Each has a shoulder and an elbow joint (links of
    ``link_lengths``, reach ``sum(link_lengths)``) and no joint limits.
    The control is kinematic: the action of a limb, ``[-1, 1]^2``, is its
    joint velocities, ``q <- q + max_joint_step * a`` (radians per step).

    Everything a limb observes is in its own frame (origin at its base, x
    pointing outwards), so every limb faces the same problem (and where the
    limbs sit on the torso does not matter). Keys are
    ``limb_0 .. limb_{n-1}``; per step:

    * observation: ``{"target": {limb: [2]}, "proprioception": {limb: [4]}}``:
      the vector from the limb's fingertip to its target, and
      ``[cos q1, sin q1, cos q2, sin q2]`` of its shoulder and elbow angles;
    * action: ``{limb: Box((2,), -1, 1)}``, the joint velocities;
    * reward: ``{limb: -|fingertip - target| - control_cost * |a|^2}``, per limb.

    At reset the joint angles are uniform in ``[-pi/4, pi/4]`` and each target
    is drawn uniformly in the outward half of the annulus between 0.2 and 0.9
    times the reach around its limb's base. The body never terminates; use it
    with a time limit (``make("limb_reacher")`` truncates at 50 steps).
    ``metrics["distance"]`` is the mean fingertip-to-target distance over the
    limbs after the step, ``metrics["reached"]`` the fraction of limbs within
    ``0.1`` of their target.

    **Returns** (the sum over limbs; 3 limbs, 50 steps): a uniformly random
    policy gets about -120, keeping still about -117, a hand-written
    controller (a Jacobian-transpose step towards the target) about -17 and
    the ``limb_reacher`` preset about -14. 0 is out of reach: a limb needs a
    few steps to get to its target.
    """

    def __init__(self, n_limbs: int = 3, link_lengths: tuple[float, float] = (0.5, 0.5),
                 max_joint_step: float = 0.2, control_cost: float = 0.01):
        if int(n_limbs) < 1:
            raise ValueError(f"LimbReacher needs n_limbs >= 1, got {n_limbs}")
        if len(link_lengths) != 2 or min(link_lengths) <= 0:
            raise ValueError(f"LimbReacher: link_lengths must be two positive lengths, got {link_lengths!r}")
        self.n_limbs = int(n_limbs)
        self.link_lengths = (float(link_lengths[0]), float(link_lengths[1]))
        self.max_joint_step = float(max_joint_step)
        self.control_cost = float(control_cost)

    @property
    def limbs(self) -> tuple[str, ...]:
        """The limbs' keys, ``("limb_0", ..., "limb_{n-1}")``: of the actions, rewards and observations."""
        return tuple(f"limb_{i}" for i in range(self.n_limbs))

    @property
    def observation_space(self):
        return {"target": {k: Box((2,)) for k in self.limbs},
                "proprioception": {k: Box((4,), -1.0, 1.0) for k in self.limbs}}

    @property
    def action_space(self):
        return {k: Box((2,), -1.0, 1.0) for k in self.limbs}

    def _fingertips(self, q):
        """Fingertip positions ``[L, 2]`` in each limb's frame, for joint angles ``q`` ``[L, 2]``."""
        l1, l2 = self.link_lengths
        a1, a2 = q[:, 0], q[:, 0] + q[:, 1]
        return jnp.stack([l1 * jnp.cos(a1) + l2 * jnp.cos(a2), l1 * jnp.sin(a1) + l2 * jnp.sin(a2)], axis=-1)

    def _obs(self, q, targets):
        to_target = targets - self._fingertips(q)
        proprio = jnp.stack([jnp.cos(q), jnp.sin(q)], axis=-1).reshape(self.n_limbs, 4)  # [cos q1, sin q1, ...]
        return {"target": {k: to_target[i] for i, k in enumerate(self.limbs)},
                "proprioception": {k: proprio[i] for i, k in enumerate(self.limbs)}}

    def _metrics(self, distances):
        return {"distance": jnp.mean(distances), "reached": jnp.mean(as_f32(distances < 0.1))}

    def reset(self, key):
        reach = sum(self.link_lengths)
        k_q, k_r, k_a = jax.random.split(key, 3)
        q = jax.random.uniform(k_q, (self.n_limbs, 2), minval=-math.pi / 4, maxval=math.pi / 4)
        radius = reach * jax.random.uniform(k_r, (self.n_limbs,), minval=0.2, maxval=0.9)
        angle = jax.random.uniform(k_a, (self.n_limbs,), minval=-math.pi / 2, maxval=math.pi / 2)
        targets = jnp.stack([radius * jnp.cos(angle), radius * jnp.sin(angle)], axis=-1)
        distances = jnp.linalg.norm(targets - self._fingertips(q), axis=-1)
        state = _first_state(self._obs(q, targets), {"q": q, "targets": targets}, self._metrics(distances))
        return state.replace(reward={k: as_f32(0.0) for k in self.limbs})

    def step(self, state, action):
        a = jnp.stack([jnp.clip(jnp.asarray(action[k], jnp.float32).reshape(2), -1.0, 1.0) for k in self.limbs])
        q = state.data["q"] + self.max_joint_step * a
        q = jnp.mod(q + math.pi, 2 * math.pi) - math.pi  # keep the angles in [-pi, pi)
        targets = state.data["targets"]
        distances = jnp.linalg.norm(targets - self._fingertips(q), axis=-1)
        rewards = -distances - self.control_cost * jnp.sum(a**2, axis=-1)
        return _next_state(state, self._obs(q, targets), {k: rewards[i] for i, k in enumerate(self.limbs)},
                           state.done, {"q": q, "targets": targets}, self._metrics(distances))

    def __repr__(self):
        return (f"LimbReacher(n_limbs={self.n_limbs}, link_lengths={self.link_lengths}, "
                f"max_joint_step={self.max_joint_step}, control_cost={self.control_cost})")
