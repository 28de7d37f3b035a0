"""The peers of ``suite_peers.py``: how each library is trained on a suite task.

Runs in the peers' venv. Importing this module imports nothing heavy (the
configurations below are plain data, which ``suite_peers.py list`` shows);
each ``train_*`` imports its library. Every ``train_*`` takes a
:class:`~suite_peer_envs.SuiteEnv`, the task's kind (``"memory"`` or
``"control"``), the seed, the env-step budget and the env steps between
periodic evaluations, and returns a :class:`Trained`: the configuration it
used, the periodic evaluations ``[env_steps, mean return, wall seconds since
training started (compilation included)]``, the env steps trained, and the
final policy as a function :func:`suite_peer_envs.evaluator` can play.

Periodic evaluations: ``PERIODIC_EPISODES`` deterministic episodes (the
number ``nnx-ppo train`` uses by default, whose evaluations give this
library's time to threshold), through each library's own evaluation where
it has one (the original's ``eval_rollout``, Brax's evaluator with
``deterministic_eval``); rejax's training is one compiled program that
evaluates stochastically inside it, so it is trained here in compiled
chunks of ``every`` env steps with :func:`suite_peer_envs.evaluator` in
between.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable

PERIODIC_EPISODES = 16

# ----------------------------------------------------------------------------- configurations

# The original nnx-ppo 0.3.0: its PPOConfig defaults (256 envs x 20 steps, Adam 1e-4, 4 epochs x 4 minibatches,
# gamma 0.99, lambda 0.95, clip 0.2, advantages normalized); MLP: its README's network (actor 4 x 64, critic
# 2 x 256, relu, observations normalized; make_mlp_actor_critic's tanh-Gaussian head, min std 0.1, entropy 1e-2);
# LSTM: Dense(64, swish) -> LSTM(64) -> head for actor and critic, as bench/peers/original_run.py.
ORIGINAL = {
    "ppo": {"n_envs": 256, "rollout_length": 20, "learning_rate": 1e-4, "n_epochs": 4, "n_minibatches": 4,
            "discounting_factor": 0.99, "gae_lambda": 0.95, "clip_range": 0.2, "source": "PPOConfig defaults"},
    "mlp": {"actor_hidden_sizes": [64] * 4, "critic_hidden_sizes": [256] * 2, "activation": "relu",
            "normalize_obs": True, "entropy_weight": 1e-2, "min_std": 0.1, "source": "the original's README example"},
    "lstm": {"trunk": "Dense(64, swish) -> LSTM(64)", "separate_actor_critic": True, "normalize_obs": True,
             "entropy_weight": 1e-2, "source": "bench/peers/original_run.py"},
}
ORIGINAL_DISCRETE_NOTE = ("0.3.0 ships only a tanh-Gaussian sampler; discrete actions use a categorical sampler "
                          "written here on its ActionSampler interface (softmax over logits, entropy 1e-2)")

# rejax 0.1.3's PPO defaults (rejax.algos.ppo.PPO and its mixins) and the tuned PPO configs of rejax's repository
# (keraJLi/rejax, configs/gymnax/*.yaml at commit 4954fbf), without their env, total_timesteps and eval_freq.
REJAX_DEFAULTS = {"num_envs": 64, "num_steps": 64, "num_epochs": 8, "num_minibatches": 16, "learning_rate": 3e-4,
                  "max_grad_norm": float("inf"), "gamma": 0.99, "gae_lambda": 0.95, "clip_eps": 0.2,
                  "ent_coef": 0.01, "vf_coef": 0.5, "normalize_observations": False,
                  "agent_kwargs": {"activation": "swish", "hidden_layer_sizes": [64, 64]}}
_REJAX_CLASSIC = {"agent_kwargs": {"activation": "tanh"}, "num_envs": 5, "num_steps": 100, "num_epochs": 5,
                  "num_minibatches": 5, "learning_rate": 0.00075, "max_grad_norm": 0.5, "gamma": 0.99,
                  "gae_lambda": 0.95, "clip_eps": 0.2, "ent_coef": 0.01, "vf_coef": 0.5}
REJAX_CONFIGS = {
    "CartPole-v1": ("configs/gymnax/cartpole.yaml", dict(_REJAX_CLASSIC)),
    "Acrobot-v1": ("configs/gymnax/acrobot.yaml", {**_REJAX_CLASSIC, "normalize_observations": True}),
    "Pendulum-v1": ("configs/gymnax/pendulum.yaml", {
        "agent_kwargs": {"activation": "swish"}, "num_envs": 100, "num_steps": 100, "num_epochs": 10,
        "num_minibatches": 10, "learning_rate": 0.001, "max_grad_norm": 10, "gamma": 0.995, "gae_lambda": 0.95,
        "clip_eps": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "normalize_observations": True}),
    "MountainCarContinuous-v0": ("configs/gymnax/continuous_mountaincar.yaml", {
        "agent_kwargs": {"activation": "relu"}, "num_envs": 5, "num_steps": 100, "num_epochs": 10,
        "num_minibatches": 10, "learning_rate": 0.0003, "max_grad_norm": 10, "gamma": 0.9, "gae_lambda": 0.95,
        "clip_eps": 0.2, "ent_coef": 0.0, "vf_coef": 0.5}),
}
REJAX_REPO = "keraJLi/rejax@4954fbf6a765ca5fe17b3037fc20a6f217291271"

# Brax PPO 0.14.2: the settings of bench/peers/brax_run.py (gymnax) and bench/peers/brax_playground_run.py
# (Playground; the benchmark MLP), with deterministic evaluations.
BRAX = {"num_envs": 256, "unroll_length": 32, "batch_size": 64, "num_minibatches": 4, "num_updates_per_batch": 4,
        "learning_rate": 3e-4, "entropy_cost": 1e-2, "discounting": 0.99, "gae_lambda": 0.95,
        "normalize_observations": True, "reward_scaling": 1.0, "policy_hidden_layer_sizes": [64, 64],
        "value_hidden_layer_sizes": [64, 64], "source": "bench/peers/brax_run.py"}
BRAX_PLAYGROUND = {**BRAX, "unroll_length": 30, "policy_hidden_layer_sizes": [64] * 4,
                   "value_hidden_layer_sizes": [256] * 2, "source": "bench/peers/brax_playground_run.py"}


def rejax_config(spec: str) -> tuple[str, dict]:
    """``(source, config)``: rejax's tuned PPO config for the gymnax env of ``spec``, else its PPO defaults."""
    prefix, _, name = spec.partition(":")
    if prefix == "gymnax" and name in REJAX_CONFIGS:
        path, overrides = REJAX_CONFIGS[name]
        cfg = {**REJAX_DEFAULTS, **overrides,
               "agent_kwargs": {**REJAX_DEFAULTS["agent_kwargs"], **overrides.get("agent_kwargs", {})}}
        return f"{REJAX_REPO}:{path} (ppo)", cfg
    return "rejax 0.1.3 PPO defaults", dict(REJAX_DEFAULTS)


def brax_config(spec: str) -> dict:
    """Brax's settings for ``spec``: brax_playground_run.py's for Playground, brax_run.py's otherwise."""
    return dict(BRAX_PLAYGROUND if spec.startswith("playground:") else BRAX)


@dataclasses.dataclass
class Trained:
    """What one training run gives: see the module docstring."""

    network: str
    config: dict
    evals: list
    env_steps: int
    wall_s: float
    policy_params: Any  # passed to act
    act: Callable  # act(policy_params, carry, obs, key) -> (env actions, carry)
    carry: Callable[[int], Any]  # carry(batch): the policy's initial recurrent state
    deterministic: bool = True
    notes: list = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------- the original nnx-ppo 0.3.0


@functools.cache
def _categorical_sampler():
    """A categorical action sampler on the original's ``ActionSampler``
    interface (the original has none): logits in, an int action and its log
    likelihood out; the drawn action is the rollout extra that loss replay
    scores again; the RNG stream advances in every phase, as its samplers do."""
    import jax
    import jax.numpy as jnp

    from nnx_ppo.networks.sampling_layers import ActionSampler
    from nnx_ppo.networks.types import StatefulModuleOutput

    class CategoricalSampler(ActionSampler):
        def __init__(self, rng, entropy_weight: float):
            self.rng = rng
            self.entropy_weight = entropy_weight
            self.deterministic = False

        def __call__(self, state, logits, rollout_extras=None):
            log_p = jax.nn.log_softmax(logits, axis=-1)
            key = self.rng()
            if self.deterministic:
                drawn = jnp.argmax(logits, axis=-1)
            else:
                drawn = jax.random.categorical(key, logits, axis=-1)
            action = jax.lax.stop_gradient(drawn) if rollout_extras is None else rollout_extras
            action = action.astype(jnp.int32)
            log_likelihood = jnp.take_along_axis(log_p, action[..., None], axis=-1)[..., 0]
            entropy = -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)
            return StatefulModuleOutput(next_state=(), output={"action": action, "log_likelihood": log_likelihood},
                                        regularization_loss=-self.entropy_weight * entropy,
                                        metrics={"entropy": entropy}, rollout_extras=action)

        def initialize_state(self, batch_size: int):
            return ()

    return CategoricalSampler


def _original_network(env, network: str, rngs):
    from flax import nnx

    from nnx_ppo.networks.adapter import PPOAdapter
    from nnx_ppo.networks.containers import Sequential
    from nnx_ppo.networks.factories import make_mlp, make_mlp_actor_critic, make_mlp_layers
    from nnx_ppo.networks.feedforward import Dense
    from nnx_ppo.networks.normalizer import Normalizer
    from nnx_ppo.networks.recurrent import LSTM
    from nnx_ppo.networks.sampling_layers import NormalTanhSampler

    obs, actions = env.obs_size, env.action_size
    mlp = ORIGINAL["mlp"]
    if network == "mlp" and not env.discrete:
        return make_mlp_actor_critic(obs, actions, actor_hidden_sizes=mlp["actor_hidden_sizes"],
                                     critic_hidden_sizes=mlp["critic_hidden_sizes"], rngs=rngs, normalize_obs=True)
    if network == "mlp":  # make_mlp_actor_critic's layers with a categorical head
        init = nnx.initializers.variance_scaling(1.0, "fan_in", "uniform")
        actor = make_mlp_layers([obs, *mlp["actor_hidden_sizes"], actions], rngs, nnx.relu,
                                activation_last_layer=False, kernel_init=init)
        critic = make_mlp([obs, *mlp["critic_hidden_sizes"], 1], rngs, nnx.relu, activation_last_layer=False,
                          kernel_init=init)
        sampler = _categorical_sampler()(rngs, entropy_weight=mlp["entropy_weight"])
        return Sequential([Normalizer(obs), PPOAdapter(action=Sequential([*actor, sampler]), value=critic)])

    def trunk():
        return [Dense(obs, 64, rngs, activation=nnx.swish), LSTM(64, 64, rngs)]

    if env.discrete:
        head, sampler = Dense(64, actions, rngs), _categorical_sampler()(rngs, entropy_weight=1e-2)
    else:
        head, sampler = Dense(64, 2 * actions, rngs), NormalTanhSampler(rngs, entropy_weight=1e-2)
    return Sequential([Normalizer(obs), PPOAdapter(action=Sequential([*trunk(), head, sampler]),
                                                   value=Sequential([*trunk(), Dense(64, 1, rngs)]))])


def train_original(env, kind: str, seed: int, budget: int, every: int) -> Trained:
    """The original nnx-ppo 0.3.0 (PyPI): its LSTM on memory tasks, its MLP on control tasks."""
    import jax
    from flax import nnx
    from suite_peer_envs import StateView, evaluator

    from nnx_ppo.algorithms import ppo
    from nnx_ppo.algorithms.config import EvalConfig, PPOConfig, TrainConfig

    network = "lstm" if kind == "memory" else "mlp"
    view = StateView(env)
    nets = _original_network(env, network, nnx.Rngs(seed))
    p = ORIGINAL["ppo"]
    cfg = TrainConfig(
        ppo=PPOConfig(n_envs=p["n_envs"], rollout_length=p["rollout_length"], total_steps=budget,
                      learning_rate=p["learning_rate"], n_epochs=p["n_epochs"], n_minibatches=p["n_minibatches"],
                      discounting_factor=p["discounting_factor"], gae_lambda=p["gae_lambda"],
                      clip_range=p["clip_range"]),
        eval=EvalConfig(enabled=True, every_steps=every, n_envs=PERIODIC_EPISODES, max_episode_length=env.max_steps),
        seed=seed)
    evals = []
    t0 = time.perf_counter()

    def log_fn(metrics, steps):
        if "eval/episode_reward/mean" in metrics:
            evals.append([int(steps), float(metrics["eval/episode_reward/mean"]), round(time.perf_counter() - t0, 2)])

    result = ppo.train_ppo(view, nets, cfg, log_fn=log_fn, eval_env=view)
    wall = time.perf_counter() - t0
    trained = result.training_state.networks
    trained.eval()
    graphdef, state = nnx.split(trained)

    def act(params, carry, obs, key):
        module = nnx.merge(graphdef, params, copy=True)
        out = module(carry, obs.reshape(obs.shape[0], -1))
        return jax.vmap(env.from_unit)(out.output.actions), out.next_state

    if not evals or evals[-1][0] < int(result.total_steps):  # the original does not evaluate at the end; the others do
        last = evaluator(env, act, PERIODIC_EPISODES)(state, trained.initialize_state(PERIODIC_EPISODES),
                                                      jax.random.PRNGKey(seed))
        evals.append([int(result.total_steps), last["mean"], round(wall, 2)])

    config = {"ppo": dict(p), "network": dict(ORIGINAL[network]), "periodic_eval_episodes": PERIODIC_EPISODES}
    notes = [ORIGINAL_DISCRETE_NOTE] if env.discrete else []
    if env.discrete:
        config["action_head"] = "categorical (written here)"
    return Trained(network=network, config=config, evals=evals, env_steps=int(result.total_steps), wall_s=wall,
                   policy_params=state, act=act, carry=trained.initialize_state, notes=notes)


# ----------------------------------------------------------------------------- rejax 0.1.3


def train_rejax(env, kind: str, seed: int, budget: int, every: int) -> Trained:
    """rejax's PPO (an MLP: rejax has no recurrent PPO), its tuned gymnax config where it ships one."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from rejax import PPO
    from suite_peer_envs import evaluator

    source, cfg = rejax_config(env.spec)
    algo = PPO.create(env=env, env_params=env.default_params, total_timesteps=every, eval_freq=every,
                      skip_initial_evaluation=True, **cfg)
    algo = algo.replace(eval_callback=lambda algo, ts, rng: jnp.zeros(()))  # evaluations happen between chunks
    low, high = (None, None) if env.discrete else (jnp.asarray(env.low), jnp.asarray(env.high))

    def act(ts, carry, obs, key):
        if algo.normalize_observations:
            obs = algo.normalize_obs(ts.obs_rms_state, obs)
        mode = algo.actor.apply(ts.actor_ts.params, obs, method=lambda m, o: m._action_dist(o).mode())
        if not env.discrete:
            mode = jnp.clip(mode.reshape((obs.shape[0], *env.action_shape)), low, high)
        return mode, carry

    periodic = evaluator(env, act, PERIODIC_EPISODES)
    eval_key = jax.random.PRNGKey(seed)
    evals = []
    t0 = time.perf_counter()
    ts = jax.jit(algo.init_state)(jax.random.PRNGKey(seed))
    chunk = jax.jit(lambda ts: algo.train(train_state=ts)[0])

    def evaluate(ts):
        steps = int(ts.global_step)
        wall = time.perf_counter() - t0
        evals.append([steps, periodic(ts, (), eval_key)["mean"], round(wall, 2)])
        return steps

    steps = evaluate(ts)
    while steps < budget:
        ts = chunk(ts)
        jax.block_until_ready(ts)
        steps = evaluate(ts)
    wall = time.perf_counter() - t0
    iteration = algo.num_envs * algo.num_steps
    config = {"source": source, **cfg, "iterations_per_chunk": int(np.ceil(every / iteration)),
              "env_steps_per_iteration": iteration, "periodic_eval_episodes": PERIODIC_EPISODES}
    notes = []
    if kind == "memory":
        notes.append("MLP on a memory task: rejax 0.1.3 has no recurrent PPO")
    if env.spec.startswith("playground:"):
        notes.append("rejax 0.1.3 has no MuJoCo Playground adapter: the env goes through suite_peer_envs.SuiteEnv")
    return Trained(network="mlp", config=config, evals=evals, env_steps=steps, wall_s=wall, policy_params=ts,
                   act=act, carry=lambda batch: (), notes=notes)


# ----------------------------------------------------------------------------- Brax 0.14.2


def train_brax(env, kind: str, seed: int, budget: int, every: int) -> Trained:
    """Brax PPO, MLP (Brax has no recurrent policy), continuous actions only."""
    import brax_compat  # noqa: F401  (jax.device_put_replicated, which brax 0.14.2 calls)
    import jax
    from brax.training.agents.ppo import networks as ppo_networks
    from brax.training.agents.ppo import train as ppo_train
    from suite_peer_envs import brax_env

    if env.discrete:
        raise ValueError("Brax PPO 0.14.2 has no discrete action distribution")
    cfg = brax_config(env.spec)
    source = cfg.pop("source")
    evals, last = [], [0]
    t0 = time.perf_counter()

    def progress(step, metrics):
        last[0] = int(step)
        if "eval/episode_reward" in metrics:
            evals.append([int(step), float(metrics["eval/episode_reward"]), round(time.perf_counter() - t0, 2)])

    network_factory = functools.partial(ppo_networks.make_ppo_networks,
                                        policy_hidden_layer_sizes=tuple(cfg["policy_hidden_layer_sizes"]),
                                        value_hidden_layer_sizes=tuple(cfg["value_hidden_layer_sizes"]))
    settings = {k: v for k, v in cfg.items() if not k.endswith("hidden_layer_sizes")}
    make_policy, params, _ = ppo_train.train(
        environment=brax_env(env), num_timesteps=budget, episode_length=env.max_steps,
        num_evals=max(1, budget // every) + 1, num_eval_envs=PERIODIC_EPISODES, deterministic_eval=True, seed=seed,
        network_factory=network_factory, progress_fn=progress, **settings)
    wall = time.perf_counter() - t0

    def act(params, carry, obs, key):
        actions, _ = make_policy(params, deterministic=True)(obs.reshape(obs.shape[0], -1), key)
        return jax.vmap(env.from_unit)(actions), carry

    notes = ["MLP on a memory task: Brax PPO has no recurrent policy"] if kind == "memory" else []
    config = {"source": source, **cfg, "episode_length": env.max_steps, "deterministic_eval": True,
              "periodic_eval_episodes": PERIODIC_EPISODES}
    return Trained(network="mlp", config=config, evals=evals, env_steps=last[0], wall_s=wall, policy_params=params,
                   act=act, carry=lambda batch: (), notes=notes)


TRAIN = {"original": train_original, "rejax": train_rejax, "brax": train_brax}
