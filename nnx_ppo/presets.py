"""Tuned presets: an env, a network and a training config that learn it.

``nnx-ppo train ENV`` starts from the preset of ``ENV`` (and of
``--network``, when given) and lets every flag override it; ``nnx-ppo envs``
lists them. In Python::

    from nnx_ppo.presets import get_preset

    preset = get_preset("gymnax:Pendulum-v1")
    env, eval_env = preset.make_envs()
    network = preset.build_network(eval_env, seed=0)
    # train_ppo(env, network, preset.config, eval_env=eval_env)

Each preset's ``target`` is a return that the final policy of every one of
seeds 0-9 reached on 128 fresh evaluation episodes, each seed trained in its
own ``nnx-ppo train ENV --seed S`` process; the measurements are in
``docs/training.md`` ("Presets: what they reach").
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig
from nnx_ppo.network_spec import NetworkSpec

__all__ = ["Preset", "PRESETS", "DEFAULT_CONFIG", "NETWORK_DEFAULTS", "library_defaults", "get_preset", "find_preset"]


@dataclasses.dataclass(frozen=True)
class Preset:
    """A tuned recipe for one env and one kind of network.

    Attributes:
      env: env spec for :func:`nnx_ppo.envs.make`.
      network: ``"mlp"``, ``"lstm"``, ``"gru"``, or a network function
        ``"MODULE:FUNCTION"`` (built with its own sizes).
      hidden_size: hidden width (as ``nnx-ppo train --hidden-size``).
      network_kwargs: extra keyword arguments of the network factory (as
        ``nnx-ppo train --network-kwargs``), e.g. ``{"forget_bias": 3.0}``.
      config: the training configuration.
      env_kwargs: keyword arguments for ``make`` (training and evaluation).
      train_env_kwargs: keyword arguments for the training env only (e.g.
        ``random_reset_steps``; ``random_initial_steps`` is always on).
      target: evaluation return the final policy of every one of seeds 0-9
        reached, each seed a solo CLI run (``None``: a setup for hardware
        this library was not measured on).
      description: one line for listings.
    """

    env: str
    network: str
    hidden_size: int
    config: TrainConfig
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    network_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    train_env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    target: float | None = 0.0
    description: str = ""

    def make_envs(self):
        """``(train_env, eval_env)`` (see :func:`nnx_ppo.runner.make_run_envs`):
        the training env has de-synchronized episodes; the evaluation env is
        plain. A reward scale is the config's ``ppo.reward_scale``."""
        from nnx_ppo.runner import make_run_envs

        return make_run_envs(self.env, self.env_kwargs, self.train_env_kwargs)

    def network_spec(self, seed: int = 0) -> NetworkSpec:
        """The preset's actor-critic as a :class:`~nnx_ppo.network_spec.NetworkSpec`."""
        spec = NetworkSpec.sized(self.env, self.network, self.hidden_size, seed=seed, env_kwargs=self.env_kwargs)
        return dataclasses.replace(spec, kwargs={**spec.kwargs, **self.network_kwargs})

    def build_network(self, env, seed: int = 0):
        """The preset's actor-critic for ``env``, initialized from ``seed``."""
        return self.network_spec(seed).build(env)


def _config(total_steps: int, eval_every: int, eval_envs: int, eval_length: int, *,
            learning_rate: float = 1e-3, **ppo: Any) -> TrainConfig:
    """A preset's training config: PPO for ``total_steps`` (learning rate
    1e-3 unless the preset gives another), an evaluation of ``eval_envs``
    episodes of at most ``eval_length`` steps every ``eval_every`` steps, and
    a checkpoint every quarter of the run."""
    return TrainConfig(
        ppo=PPOConfig(total_steps=total_steps, learning_rate=learning_rate, **ppo),
        eval=EvalConfig(every_steps=eval_every, n_envs=eval_envs, max_episode_length=eval_length),
        checkpoint_every_steps=max(total_steps // 4, 1),
    )


DEFAULT_CONFIG: TrainConfig = _config(150_000, 10_000, 64, 1000, n_envs=64, rollout_length=24)
"""The library's defaults: the training config ``nnx-ppo train`` starts from
for an env without a preset, or with ``--no-preset`` (64 envs x 24 steps, Adam
1e-3, 150k steps). A candidate change is kept only if it scores better over
the task suite of ``bench/suite.py`` (docs/training.md, "The defaults over a
suite of tasks"), never on one task."""

NETWORK_DEFAULTS: dict[str, dict[str, Any]] = {
    # bench/suite.py, label lstm_long against the defaults, seeds 0-2 of the 8 memory tasks with --network lstm:
    # pairs solved 6 of 8 against 4 of 8 (docs/training.md, "The defaults over a suite of tasks")
    "lstm": {"network_kwargs": {"forget_bias": 3.0}, "ppo": {"n_envs": 16, "rollout_length": 128}},
    # label mlp_tanh_ent, seeds 0-2 of the 6 control tasks with --network mlp: pairs solved 3 of 6 against 1 of 6
    # (Acrobot and PointMass gained, none lost), leave-one-out 0.60 against 0.41
    "mlp": {"network_kwargs": {"entropy_weight": 0.01, "activation": "tanh"}},
    # label gru_long_ub, seeds 0-2 of the 8 memory tasks with --network gru: update-gate bias 3 (the GRU's
    # counterpart of the forget bias) and the LSTM's 16 envs x 128 steps (docs/training.md)
    "gru": {"network_kwargs": {"update_bias": 3.0}, "ppo": {"n_envs": 16, "rollout_length": 128}},
}
"""Where the library defaults of one kind of network differ from
:data:`DEFAULT_CONFIG` and its factory's defaults: ``network_kwargs`` for the
factory and ``ppo`` fields. Each entry was chosen over the task suite
(docs/training.md); the factories keep their own defaults, so the presets
do not move."""


def library_defaults(env: str, network: str, hidden_size: int) -> "Preset | None":
    """What ``nnx-ppo train ENV --network NETWORK`` starts from when ENV has
    no preset (or with ``--no-preset``): :data:`DEFAULT_CONFIG` with the
    network's entry of :data:`NETWORK_DEFAULTS`, as a preset of ``env``
    (``target`` ``None``), or ``None`` where the network has no entry."""
    own = NETWORK_DEFAULTS.get(network)
    if own is None:
        return None
    config = dataclasses.replace(DEFAULT_CONFIG, ppo=dataclasses.replace(DEFAULT_CONFIG.ppo, **own.get("ppo", {})))
    return Preset(env=env, network=network, hidden_size=hidden_size, config=config,
                  network_kwargs=dict(own.get("network_kwargs", {})), target=None,
                  description=f"the library defaults for --network {network}")


def _pendulum(network: str, total_steps: int, eval_every: int, description: str, **ppo: Any) -> Preset:
    """A gymnax Pendulum preset: both networks share the env, the width, the
    reward scale (0.1, ``ppo.reward_scale``), the target and most PPO settings."""
    return Preset(
        env="gymnax:Pendulum-v1",
        network=network,
        hidden_size=64,
        config=_config(total_steps, eval_every, 64, 200, n_envs=256, rollout_length=32,
                       discounting_factor=0.95, reward_scale=0.1, **ppo),
        target=-250.0,
        description=description,
    )


def _cheetah(network: str, description: str, **network_kwargs: Any) -> Preset:
    """A Playground CheetahRun preset: the work of the CheetahRun comparison
    with Brax PPO in bench/README.md (256 envs x 30 steps, 10M steps, Adam
    3e-4, discount 0.995, entropy weight 1e-2), for an MLP or an LSTM.

    Training episodes start at a random step of the 1000-step limit at every
    reset (``random_reset_steps``), and resets come from a pool of 1024
    initial states: CheetahRun's reset runs 200 physics steps, which would
    otherwise dominate a rollout with de-synchronized episodes. The target,
    500, is what the final policy of each of seeds 0-9 reached on 128 fresh
    episodes (bench/README.md, "A body that runs").
    """
    return Preset(
        env="playground:CheetahRun",
        network=network,
        hidden_size=64,
        network_kwargs={"entropy_weight": 1e-2, **network_kwargs},
        train_env_kwargs={"random_reset_steps": 500, "reset_pool": 1024},
        config=_config(10_000_000, 1_000_000, 32, 1000, learning_rate=3e-4, n_envs=256, rollout_length=30,
                       discounting_factor=0.995),
        target=500.0,
        description=description,
    )


def _rodent_imitation(network: str, config: TrainConfig, target: float | None, description: str) -> Preset:
    """A ``rodent_imitation`` preset with an intention network
    (:mod:`nnx_ppo.networks.factories`) that encodes the observation's
    ``imitation_target`` window; discount 0.95 and 4 epochs, as the users'
    published setups."""
    return Preset(env="rodent_imitation", network=network, hidden_size=64,
                  network_kwargs={"reference_key": "imitation_target"}, config=config, target=target,
                  description=description)


PRESETS: tuple[Preset, ...] = (
    Preset(
        env="cue_memory",
        env_kwargs={"n_cues": 4, "delay": 8},
        network="lstm",
        hidden_size=32,
        # learning_rate_decay: the final policy at 1.0 on 20 of 20 solo seeds (19 of 20 without); bench/README
        config=dataclasses.replace(DEFAULT_CONFIG, ppo=dataclasses.replace(DEFAULT_CONFIG.ppo,
                                                                           learning_rate_decay=True)),
        target=1.0,
        description="report a cue (1 of 4) after 8 blank steps; a memoryless policy scores 0.25",
    ),
    Preset(
        env="cue_memory_long",
        network="lstm",
        hidden_size=32,
        # forget-gate bias 3 (from 1) and a rollout holding the whole episode: 10 of 10 seeds solved, against
        # 3 of 5 with bias 1 (docs/training.md "Memory past the rollout")
        network_kwargs={"forget_bias": 3.0},
        config=_config(600_000, 100_000, 64, 1000, n_envs=64, rollout_length=96),
        target=1.0,
        description="report a cue (1 of 4) 40 steps later, past a default rollout; a memoryless policy scores 0.25",
    ),
    Preset(
        env="gymnax:CartPole-v1",
        network="mlp",
        hidden_size=64,
        # value_clip_range: the final policy at 500 on 20 of 20 seeds of one batched program (7 of seeds 0-9
        # without), and on 19 of 20 solo CLI seeds (seed 10: 473.3); docs/training.md
        config=_config(300_000, 25_000, 16, 500, n_envs=8, rollout_length=128,
                       learning_rate_decay=True, clip_range=0.1, value_clip_range=0.2),
        target=500.0,
        description="balance a pole (discrete actions); 500 is the maximum",
    ),
    _pendulum("mlp", 1_000_000, 50_000, "swing a pendulum up and hold it", clip_range=0.1),
    _pendulum("lstm", 2_000_000, 100_000, "the same with a Dense + LSTM actor and critic"),
    Preset(
        env="playground:CartpoleBalance",
        network="lstm",
        hidden_size=32,
        train_env_kwargs={"random_reset_steps": 500},
        # value_clip_range (as in the CartPole preset): the final policy above 900 on 20 of 20 solo seeds (worst
        # 923.0), seeds 10-19 held out; 9 of seeds 0-9 without (seed 7: 892.2); bench/README, solo runs
        config=_config(3_000_000, 250_000, 32, 1000, n_envs=64, rollout_length=24, value_clip_range=0.2),
        target=900.0,
        description="MuJoCo Playground cart-pole, keep the pole upright for 1000 steps",
    ),
    Preset(
        env="limb_reacher",
        # one 64x64 actor per limb and one critic per limb's reward (docs/modular_body.md); the function's own
        # sizes (a network function takes no --hidden-size). 5 solo seeds, final policy on 128
        # episodes: -14.2, -13.9, -14.7, -14.0, -14.4; each seed's evaluation at -17 or better from 130k steps on
        network="nnx_ppo.networks.factories:make_modular_actor_critic",
        hidden_size=64,
        config=_config(150_000, 25_000, 128, 50, learning_rate=3e-3, n_envs=64, rollout_length=25,
                       discounting_factor=0.95, combine_advantages=True),
        target=-17.0,
        description="three two-joint limbs reach for their own targets (dict obs, actions, rewards); random: -120",
    ),
    _cheetah("mlp", "MuJoCo Playground half-cheetah, run forward (4x64 actor, 2x256 critic)",
             actor_hidden_sizes=[64] * 4, critic_hidden_sizes=[256] * 2),
    _cheetah("lstm", "the same with a Dense(64) + LSTM(64) actor and critic"),
    _rodent_imitation(
        "nnx_ppo.networks.factories:make_intention_network",  # the CPU size (INTENTION_CPU_SIZE)
        _config(1_000_000, 100_000, 32, 150, learning_rate=3e-4, n_envs=64, rollout_length=20,
                discounting_factor=0.95, n_epochs=4, n_minibatches=4),
        # 300, about twice the zero-action score (160.4): set after solo CPU seeds 0-7 (final 327.1-349.9),
        # before seeds 8-9 were done, which are held out; docs/training.md "Presets: what they reach"
        target=300.0,
        description="the virtual rodent tracks reference clips; CPU-size intention network (docs/rodent.md)"),
    _rodent_imitation(
        "nnx_ppo.networks.factories:make_users_intention_network",  # INTENTION_USERS_SIZE, 3.5M parameters
        _config(500_000_000, 10_000_000, 256, 150, learning_rate=1e-4, n_envs=1024, rollout_length=20,
                discounting_factor=0.95, n_epochs=4, n_minibatches=8),
        target=None,
        description="the users' GPU setup (1024 envs x 20, lr 1e-4); 20M steps on a TPU chip in docs/rodent.md"),
)


def find_preset(env: str, network: str | None = None) -> Preset | None:
    """The preset for ``env`` (and ``network``, when given), or ``None``."""
    return next((p for p in PRESETS if p.env == env and (network is None or p.network == network)), None)


def get_preset(env: str, network: str | None = None) -> Preset:
    """Like :func:`find_preset` but raises a ``KeyError`` naming the presets there are."""
    preset = find_preset(env, network)
    if preset is None:
        have = ", ".join(f"{p.env} ({p.network})" for p in PRESETS)
        what = env if network is None else f"{env} with network {network!r}"
        raise KeyError(f"no preset for {what}; presets: {have}")
    return preset
