"""The ``nnx-ppo`` command line with one more env source, ``xminigrid:NAME``.

XLand-MiniGrid (``pip install xminigrid``, the ``bench`` extra) is a JAX
port of MiniGrid; its ``MiniGrid-MemoryS8`` .. ``MiniGrid-MemoryS128`` are
memory tasks (see an object, walk down a corridor, pick the matching one of
two). nnx_ppo has no source for it, so this script adds one with
:func:`nnx_ppo.envs.register_source` and then runs the ordinary command
line, as docs/environments.md describes::

    python bench/suite_envs.py train xminigrid:MiniGrid-MemoryS8 --no-preset --network lstm
    python bench/suite_envs.py eval RUN_DIR --episodes 128

Every other spec works as with ``nnx-ppo``. A run directory of an
``xminigrid:`` env is evaluated (and resumed) through this script too: plain
``nnx-ppo`` does not know the prefix.
"""

from __future__ import annotations

import sys

from nnx_ppo.envs import Box, Discrete, EnvState, RLEnv, register_source


class XMiniGridEnv(RLEnv):
    """An XLand-MiniGrid env in nnx_ppo's env API.

    The observation, ``view x view`` cells of (tile, colour) ids, is one-hot
    encoded (13 tiles + 12 colours per cell) and flattened to float32. The
    env ends its own episodes: ``done`` on its last step, ``truncated`` when
    that step is the time limit (discount 1) rather than a termination.
    xminigrid keeps a PRNG key in its state that only its reset uses, so the
    env checks do not ask it to change while stepping.

    Args:
      name: an xminigrid env id, e.g. ``"MiniGrid-MemoryS8"``.
      **params: overrides of its env params (e.g. ``max_steps=200``).
    """

    check_keys_in_data = False

    def __init__(self, name: str, **params):
        import xminigrid
        from xminigrid.core.constants import NUM_COLORS, NUM_TILES

        if name not in xminigrid.registered_environments():
            raise ValueError(f"xminigrid has no {name!r}. Available: {', '.join(xminigrid.registered_environments())}")
        self.name = name
        self._env, self._params = xminigrid.make(name, **params)
        self._n_tiles, self._n_colors = int(NUM_TILES), int(NUM_COLORS)
        view = int(self._params.view_size)
        self._width = view * view * (self._n_tiles + self._n_colors)

    @property
    def observation_space(self):
        return Box((self._width,), 0.0, 1.0)

    @property
    def action_space(self):
        return Discrete(int(self._env.num_actions(self._params)))

    def _encode(self, obs):
        import jax
        import jax.numpy as jnp

        tiles = jax.nn.one_hot(obs[..., 0], self._n_tiles, dtype=jnp.float32)
        colors = jax.nn.one_hot(obs[..., 1], self._n_colors, dtype=jnp.float32)
        return jnp.concatenate([tiles, colors], axis=-1).reshape(-1)

    @staticmethod
    def _strong(ts):
        """``ts`` with every leaf strongly typed: xminigrid's reset makes some
        (``jnp.asarray(0.0)``) weakly typed where its step does not, and the
        trainer would compile its step twice."""
        import jax
        import jax.numpy as jnp

        return jax.tree.map(lambda x: jnp.asarray(x).astype(jnp.asarray(x).dtype), ts)

    def reset(self, key):
        import jax.numpy as jnp

        ts = self._strong(self._env.reset(self._params, key))
        return EnvState(obs=self._encode(ts.observation), reward=jnp.float32(0.0), done=jnp.float32(0.0),
                        metrics={}, info={"truncated": jnp.float32(0.0)}, data=ts)

    def step(self, state, action):
        import jax.numpy as jnp

        ts = self._strong(self._env.step(self._params, state.data, action))
        done = ts.step_type == 2  # StepType.LAST
        truncated = jnp.logical_and(done, ts.discount > 0)
        return state.replace(obs=self._encode(ts.observation), reward=jnp.asarray(ts.reward, jnp.float32),
                             done=done.astype(jnp.float32), info={"truncated": truncated.astype(jnp.float32)},
                             data=ts)

    def __repr__(self):
        return f"XMiniGridEnv({self.name!r})"


def make_xminigrid(name: str, **params) -> RLEnv:
    """The ``xminigrid:NAME`` factory: ``XMiniGridEnv(NAME, **params)``
    (``episode_length`` is a synonym of xminigrid's ``max_steps``)."""
    try:
        import xminigrid  # noqa: F401
    except ImportError as e:
        raise ImportError(f'xminigrid is needed for xminigrid: envs ({e}). pip install "nnx_ppo[bench]"') from e
    if "episode_length" in params:
        params["max_steps"] = int(params.pop("episode_length"))
    return XMiniGridEnv(name, **params)


def register() -> None:
    """Add the ``xminigrid:`` source (once per process)."""
    from nnx_ppo.envs.registry import list_sources

    if "xminigrid" not in {s.prefix for s in list_sources()}:
        register_source("xminigrid", make_xminigrid, description="an XLand-MiniGrid env (bench/suite_envs.py)",
                        example="xminigrid:MiniGrid-MemoryS8")


def main(argv: list[str] | None = None) -> int:
    """``nnx-ppo`` with the ``xminigrid:`` source registered."""
    from nnx_ppo.cli import main as cli_main

    register()
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
