"""nnx-ppo: PPO in JAX + Flax NNX for networks that carry state."""

__version__ = "0.1.0"
